#!/usr/bin/env bash
# `make image-archive`: writes the newest build (localhost/gpudra:dev) to a docker-archive tarball in
# $GPUDRA_CACHE/image/gpudra-<version>-<sha>.tar and prints its path. The archive's manifest names the
# image localhost/gpudra:<version> (the Helm chart's default image, its appVersion) and
# localhost/gpudra:<version>-<sha> (this exact build); `ctr -n k8s.io images import PATH` registers both
# as they are, and a kubelet then finds the chart's image with imagePullPolicy IfNotPresent.
# docker-archive because ctr takes the names from its manifest.json whole (checked with containerd 1.6:
# import, then `ctr run` prints the usage as uid 10001). Layers are uncompressed (~ the image's size).
set -euo pipefail
cd "$(dirname "$0")"
source ./env.sh
need_root
ensure_packages buildah

# The exact build's tag, which build.sh also wrote into the image's io.gpudra.build label.
tag=$(bah inspect --type image --format '{{index .OCIv1.Config.Labels "io.gpudra.build"}}' \
  "$IMAGE_REPO:dev" 2>/dev/null) || {
  echo "archive.sh: no $IMAGE_REPO:dev in $STORAGE_ROOT (run make image)" >&2
  exit 1
}
version=$(image_version)
out=$IMAGE_CACHE/gpudra-$tag.tar
rm -f "$IMAGE_CACHE"/gpudra-*.tar
# buildah names the archive's image by the source and the destination reference (one more name each
# is not possible with buildah 1.28's push): the version tag and the exact build's.
bah push --quiet "$IMAGE_REPO:$version" "docker-archive:$out:$IMAGE_REPO:$tag" >&2
names=$(tar -xOf "$out" manifest.json | python3 -c 'import json, sys; print(" ".join(json.load(sys.stdin)[0]["RepoTags"]))')
echo "archive: $out ($(du -h "$out" | cut -f1); names: $names)" >&2
echo "$out"
