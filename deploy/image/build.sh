#!/usr/bin/env bash
# `make image`: builds the repo's Dockerfile with buildah, with no registry and no Docker engine, against
# the local Debian base (base.sh), into gpudra's own image store ($GPUDRA_CACHE/image/storage-<driver>).
# Tags localhost/gpudra:<version>, :<version>-<git sha>[-dirty] and :dev (env.sh says why), and
# :<version>-<arch>, the image `make release` puts in its manifest list. GPUDRA_ARCH=arm64 builds for
# arm64 under qemu-user emulation (base.sh) and tags :<version>-arm64 only.
# `make image-check` then runs the image; `make image-archive` writes it out for containerd.
set -euo pipefail
cd "$(dirname "$0")"
source ./env.sh
need_root
ensure_packages mmdebstrap arch-test buildah  # one apt-get run for all on a fresh machine
[ "$ARCH" = "$HOST_ARCH" ] || ensure_foreign_arch "$ARCH"

bash ./base.sh
# The wheel stage runs on the host's own base (the Dockerfile says why): made too when ARCH is foreign.
[ "$ARCH" = "$HOST_ARCH" ] || GPUDRA_ARCH=$HOST_ARCH bash ./base.sh
repo=$(cd ../.. && pwd)
version=$(image_version)
tag=$(image_tag)
revision=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$ARCH" = "$HOST_ARCH" ]; then
  tags=("$IMAGE_REPO:$version" "$IMAGE_REPO:$tag" "$IMAGE_REPO:dev" "$IMAGE_REPO:$version-$ARCH")
else
  tags=("$IMAGE_REPO:$version-$ARCH")
fi
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
# The OCI annotation keys as labels (what `docker inspect` and registries show); the source is the
# chart's home. io.gpudra.build names the exact build for archive.sh.
bah bud --pull=never --layers "${ca[@]}" \
  --arch "$ARCH" --os linux --build-arg "BASE=$BASE_REF" \
  --build-arg "WHEEL_BASE=localhost/gpudra-base:bookworm-$HOST_ARCH" --build-arg "WHEEL_PLATFORM=linux/$HOST_ARCH" \
  --build-arg "REVISION=$revision" \
  --ignorefile "$PWD/build.ignore" \
  --label "org.opencontainers.image.title=gpudra" \
  --label "org.opencontainers.image.version=$version" \
  --label "org.opencontainers.image.revision=$revision" \
  --label "org.opencontainers.image.source=$SOURCE_URL" \
  --label "org.opencontainers.image.licenses=$LICENSE" \
  --label "io.gpudra.build=$tag" \
  "${tags[@]/#/--tag=}" \
  --file "$repo/Dockerfile" "$repo" >&2

# Older version tags go, so the store holds this build, its cached layers and the bases (and the
# other architecture's build of this version).
bah images --noheading --format '{{.Name}}:{{.Tag}}' | while read -r ref || [ -n "$ref" ]; do
  case $ref in
    "$IMAGE_REPO:$version"-* | "$IMAGE_REPO:$version" | "$IMAGE_REPO:$tag" | "$IMAGE_REPO:dev") ;;
    "$IMAGE_REPO":*) bah rmi "$ref" >/dev/null ;;
  esac
done
echo "built $IMAGE_REPO:$tag for $ARCH in $(($(date +%s) - start))s (store: $STORAGE_ROOT, driver $STORAGE_DRIVER)" >&2
