#!/usr/bin/env bash
# `make image`: builds the repo's Dockerfile with buildah, with no registry and no Docker engine, against
# the local Debian base (base.sh), into gpudra's own image store ($GPUDRA_CACHE/image/storage-<driver>).
# Tags localhost/gpudra:<version>, :<version>-<git sha>[-dirty] and :dev (env.sh says why).
# `make image-check` then runs the image; `make image-archive` writes it out for containerd.
set -euo pipefail
cd "$(dirname "$0")"
source ./env.sh
need_root
ensure_packages debootstrap buildah  # one apt-get run for both on a fresh machine

bash ./base.sh
repo=$(cd ../.. && pwd)
version=$(image_version)
tag=$(image_tag)
start=$(date +%s)

# The build stage's pip reaches PyPI over TLS with the image's CA bundle. Behind a TLS-inspecting proxy
# (as in gpudra's CI sandbox, whose egress re-signs with a CA only the host trusts) that bundle fails
# verification, so the host's bundle is mounted over it for RUN steps. A mount is not part of any layer:
# the image keeps Debian's bundle. (Debian's pip reads /etc/ssl/certs/ca-certificates.crt; pip from
# PyPI would read its own certifi copy and needs PIP_CERT instead.)
ca=()
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  ca=(--volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
fi

# --pull=never: both bases are local (base.sh); a registry is never asked. --layers: unchanged steps
# (the locked dependencies above all) are reused from the last build. The isolation is chroot (env.sh).
bah bud --pull=never --layers "${ca[@]}" \
  --ignorefile "$PWD/build.ignore" \
  --label "org.opencontainers.image.title=gpudra" \
  --label "org.opencontainers.image.version=$tag" \
  --label "org.opencontainers.image.revision=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)" \
  --tag "$IMAGE_REPO:$version" --tag "$IMAGE_REPO:$tag" --tag "$IMAGE_REPO:dev" \
  --file "$repo/Dockerfile" "$repo" >&2

# Older version tags go, so the store holds this build, its cached layers and the bases.
bah images --noheading --format '{{.Name}}:{{.Tag}}' | while read -r ref || [ -n "$ref" ]; do
  case $ref in
    "$IMAGE_REPO:$version" | "$IMAGE_REPO:$tag" | "$IMAGE_REPO:dev") ;;
    "$IMAGE_REPO":*) bah rmi "$ref" >/dev/null ;;
  esac
done
echo "built $IMAGE_REPO:$tag in $(($(date +%s) - start))s (store: $STORAGE_ROOT, driver $STORAGE_DRIVER)" >&2
