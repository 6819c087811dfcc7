# Sourced by deploy/image/*.sh: where the image work lives, how buildah is run on this kind of machine,
# and the image's names. Nothing here touches /var/lib/containers: the image store is gpudra's cache.
# shellcheck disable=SC2034  # the names are for the scripts that source this file
export GPUDRA_CACHE=${GPUDRA_CACHE:-$HOME/.cache/gpudra}
IMAGE_CACHE=$GPUDRA_CACHE/image
IMAGE_REPO=localhost/gpudra
RELEASE_REPO=localhost/gpudra-release  # `make release`'s manifest list of both architectures
# Stamped into the image's labels; the chart's home and pyproject.toml's license.
SOURCE_URL=https://github.com/gpudra/gpudra
LICENSE=Apache-2.0
# The architecture built: the host's unless GPUDRA_ARCH names another (Debian's names: amd64, arm64).
# A foreign one is built under qemu-user emulation (base.sh registers it with the kernel's binfmt_misc).
HOST_ARCH=$(dpkg --print-architecture)
ARCH=${GPUDRA_ARCH:-$HOST_ARCH}
case $ARCH in
  amd64 | arm64) ;;
  *) echo "GPUDRA_ARCH=$ARCH: the allowed values are amd64 and arm64" >&2; exit 2 ;;
esac
BASE_REF=localhost/gpudra-base:bookworm-$ARCH  # python3 + CA certificates, from Debian packages (base.sh)

# Building needs no container runtime and no daemon: buildah's chroot isolation runs each RUN step in a
# chroot with the host's network. The default "oci" isolation needs runc/crun (buildah only recommends
# them, so --no-install-recommends leaves none: "exec: no command") and a network namespace set up by
# CNI; chroot works here and inside most unprivileged sandboxes as well.
export BUILDAH_ISOLATION=chroot

need_root() {
  # mmdebstrap, chroot and buildah's storage mounts (rootful). Rootless buildah would need subuid ranges
  # and fuse-overlayfs, which a fresh machine does not have.
  if [ "$(id -u)" != 0 ]; then
    echo "$(basename "$0"): must run as root (mmdebstrap, chroot, buildah mounts)" >&2
    exit 1
  fi
}

# ensure_packages: the Debian packages the scripts need, installed when missing.
source "$(dirname "${BASH_SOURCE[0]}")/../packages.sh"

# The storage driver, chosen once per machine. overlay stores each layer as a diff and mounts them stacked:
# fast commits, little disk. It needs a kernel overlay mount on the cache's filesystem, which fails where
# that filesystem is itself an overlay (gpudra built inside a container) or mounts are not allowed; then
# vfs, which copies the whole tree per layer (slower, a few hundred MB more) but works anywhere.
# Each driver gets its own store: one store cannot switch drivers.
storage_driver() {
  if [ -n "${GPUDRA_STORAGE_DRIVER:-}" ]; then
    echo "$GPUDRA_STORAGE_DRIVER"
    return
  fi
  if [ -d "$IMAGE_CACHE/storage-overlay" ]; then echo overlay; return; fi
  if [ -d "$IMAGE_CACHE/storage-vfs" ]; then echo vfs; return; fi
  local probe driver=vfs
  mkdir -p "$IMAGE_CACHE"
  probe=$(mktemp -d "$IMAGE_CACHE/.overlay-probe.XXXXXX")
  mkdir "$probe/lower" "$probe/upper" "$probe/work" "$probe/merged"
  if mount -t overlay overlay \
    -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" "$probe/merged" 2>/dev/null; then
    umount "$probe/merged"
    driver=overlay
  fi
  rm -rf "$probe"
  echo "$driver"
}

STORAGE_DRIVER=$(storage_driver)
STORAGE_ROOT=$IMAGE_CACHE/storage-$STORAGE_DRIVER
# Run-time state (locks, mount counts) belongs on a filesystem that a reboot clears.
RUN_ROOT=/run/gpudra-buildah

# buildah with gpudra's own image store; every script goes through this.
bah() {
  buildah --root "$STORAGE_ROOT" --runroot "$RUN_ROOT" --storage-driver "$STORAGE_DRIVER" "$@"
}

# Each build is tagged three ways: localhost/gpudra:<pyproject version> (the Helm chart's default tag is
# its appVersion, the same number), :<version>-<git short sha> ("-dirty" when the files the image is built
# from differ from that commit), which names this exact build, and :dev, always the newest build.
image_version() {
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  sed -n '/^version = "/{s/^version = "\(.*\)"$/\1/p;q}' "$root/pyproject.toml"
}
image_tag() {
  local root version sha
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  version=$(image_version)
  if sha=$(git -C "$root" rev-parse --short=7 HEAD 2>/dev/null); then
    if [ -n "$(git -C "$root" status --porcelain -- src pyproject.toml README.md Dockerfile deploy/image)" ]; then
      sha=$sha-dirty
    fi
    echo "$version-$sha"
  else
    echo "$version"
  fi
}
