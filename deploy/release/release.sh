#!/usr/bin/env bash
# `make release VERSION=x.y.z`: everything a release publishes, into dist/release/<version>/:
#   gpudra-<version>-py3-none-any.whl, gpudra-<version>.tar.gz   the wheel and the sdist
#   gpudra-<version>.tgz                                        the Helm chart (helm package, with its schema)
#   gpudra-<version>-<arch>.sbom.cdx.json                       each image's packages, CycloneDX JSON
#   SHA256SUMS                                                   the checksums of all of the above
# and, in gpudra's image store, the manifest list localhost/gpudra-release:<version> of the linux/amd64
# and linux/arm64 images (localhost/gpudra:<version>-<arch>), which `make publish` pushes.
# The arm64 image is built under qemu-user emulation (deploy/image/base.sh); its every ELF file is
# checked to be aarch64 (scripts/elf_arch.py) and `gpudra --help` is run in it (deploy/image/check.sh).
# VERSION must be pyproject.toml's version: the one place it is set. Needs root (buildah, mmdebstrap).
set -euo pipefail
cd "$(dirname "$0")/../.."
source deploy/image/env.sh
need_root

version=${1:-}
if [ "$version" != "$(image_version)" ]; then
  echo "release: VERSION='$version' is not pyproject.toml's version '$(image_version)': set project.version" \
    "there (and version/appVersion in deploy/helm/gpudra/Chart.yaml) and commit first" >&2
  exit 2
fi
python=${RELEASE_PYTHON:-.venv/bin/python}
helm=$(bash deploy/local/build-helm.sh)
out=dist/release/$version
rm -rf "$out"
mkdir -p "$out"
arches=(${RELEASE_ARCHES:-amd64 arm64})
step() {
  echo "release: $1 in $(($(date +%s) - $2))s" >&2
}

t=$(date +%s)
"$python" -m pip wheel --quiet --no-deps --wheel-dir "$out" .
"$python" -c 'import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])' "$out" >/dev/null
rm -rf src/gpudra.egg-info
step "wheel and sdist" "$t"

t=$(date +%s)
"$helm" package deploy/helm/gpudra --version "$version" --app-version "$version" --destination "$out" >/dev/null
# helm package takes values.schema.json along: `helm install` from the registry checks values with it.
# (grep reads the whole list: -q would stop early and fail tar with SIGPIPE under pipefail.)
tar -tzf "$out/gpudra-$version.tgz" | grep -x 'gpudra/values.schema.json' >/dev/null ||
  { echo "release: the chart package has no values.schema.json" >&2; exit 1; }
step "chart" "$t"

for arch in "${arches[@]}"; do
  t=$(date +%s)
  GPUDRA_ARCH=$arch bash deploy/image/build.sh
  GPUDRA_ARCH=$arch bash deploy/image/check.sh "$IMAGE_REPO:$version-$arch" >/dev/null
  step "image linux/$arch (built, gpudra --help run in it)" "$t"
  machine=$(case $arch in amd64) echo x86-64 ;; arm64) echo aarch64 ;; esac)
  c=$(bah from --pull=never "$IMAGE_REPO:$version-$arch")
  mnt=$(bah mount "$c")
  ok=0
  "$python" scripts/elf_arch.py "$mnt" --machine "$machine" >&2 &&
    "$python" scripts/sbom.py "$mnt" --name gpudra --version "$version" --arch "$arch" \
      -o "$out/gpudra-$version-$arch.sbom.cdx.json" || ok=$?
  bah umount "$c" >/dev/null
  bah rm "$c" >/dev/null
  [ "$ok" = 0 ] || exit "$ok"
  image_arch=$(bah inspect --type image --format '{{.OCIv1.Architecture}}' "$IMAGE_REPO:$version-$arch")
  [ "$image_arch" = "$arch" ] || { echo "release: $IMAGE_REPO:$version-$arch says architecture $image_arch" >&2; exit 1; }
done

list=$RELEASE_REPO:$version
bah manifest rm "$list" >/dev/null 2>&1 || true
bah manifest create "$list" >/dev/null
for arch in "${arches[@]}"; do
  bah manifest add --os linux --arch "$arch" "$list" "containers-storage:$IMAGE_REPO:$version-$arch" >/dev/null
done

(cd "$out" && sha256sum -- * >SHA256SUMS)
echo "release $version: $list (${arches[*]/#/linux/}) and $out:" >&2
for arch in "${arches[@]}"; do
  echo "  image linux/$arch: $(bah images --noheading --format '{{.Size}}' "$IMAGE_REPO:$version-$arch" | awk 'NR == 1') uncompressed" >&2
done
(cd "$out" && ls -l --block-size=K -- * | awk '{print "  " $5 "\t" $9}') >&2
