#!/usr/bin/env bash
# Makes gpudra's base image from Debian packages, with no registry: localhost/gpudra-base:bookworm-<arch>,
# mmdebstrap minbase + python3 (3.11) + ca-certificates, each package at its newest version across
# bookworm, its point-release updates and its security fixes; no python3-venv, so no pip (the
# Dockerfile's build stage adds it for itself).
# GPUDRA_ARCH=arm64 on an amd64 host: the packages' maintainer scripts run in the chroot under
# qemu-user-static, registered with binfmt_misc. mmdebstrap installs the whole set in one dpkg run, so
# the emulated part is about 2 minutes of one core; debootstrap's second stage, one dpkg run per package
# and then an apt upgrade, took 13 minutes of it.
# The trimmed root filesystem is cached as a tarball in $GPUDRA_CACHE/image/base-<arch>-<hash of this script>/
# and the image carries that hash as a label: an unchanged script costs one `buildah inspect`, and a
# changed one builds again. To pick up newer Debian updates, delete that directory.
set -euo pipefail
cd "$(dirname "$0")"
source ./env.sh
need_root

SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
KEY_LABEL=io.gpudra.base-key

key=$(sha256sum base.sh | cut -c1-12)
dir=$IMAGE_CACHE/base-$ARCH-$key
rootfs=$dir/rootfs
log=$IMAGE_CACHE/base.log

label_of() {
  bah inspect --type image --format "{{index .OCIv1.Config.Labels \"$KEY_LABEL\"}}" "$1" 2>/dev/null || true
}
if [ "$(label_of "$BASE_REF")" = "$key" ]; then
  exit 0
fi

ensure_packages mmdebstrap arch-test buildah
if [ "$ARCH" != "$HOST_ARCH" ]; then
  ensure_foreign_arch "$ARCH"
fi
# One base build at a time per cache (two `make image` runs would share the root filesystem's directory).
mkdir -p "$IMAGE_CACHE"
exec 9>"$IMAGE_CACHE/.base.lock"
flock 9
start=$(date +%s)

# mmdebstrap and apt are chatty: their output goes to a log, shown only when a step fails.
quiet() {
  "$@" >>"$log" 2>&1 || {
    echo "base.sh: failed: $*; the end of $log:" >&2
    tail -n 30 "$log" >&2
    exit 1
  }
}
# A failed mmdebstrap can leave /proc or /sys mounted inside the tree: unmount before deleting it.
unmount_under() {
  findmnt --list --noheadings --output TARGET | { grep "^$1/" || true; } | sort -r | xargs -r -n 1 umount -l
}

# Every path below is inside $rootfs; refuse to go on if it is not an absolute path under the cache.
case $rootfs in
  /*/image/base-"$ARCH"-*/rootfs) ;;
  *) echo "base.sh: unexpected rootfs path '$rootfs'" >&2; exit 1 ;;
esac

if [ ! -f "$dir/.complete" ]; then
  unmount_under "$dir"
  rm -rf --one-file-system "$dir"
  mkdir -p "$dir"
  : >"$log"
  echo "mmdebstrap $SUITE $ARCH (minbase + python3) into $rootfs (log: $log)" >&2
  # minbase: essential packages + apt, no init system; --include resolves Depends only (no Recommends).
  # The merged-usr hook makes /bin, /lib and /sbin links into /usr and installs usr-is-merged, as
  # bookworm's own images are (without it apt picks usrmerge, which pulls perl in).
  quiet mmdebstrap --mode=root --arch="$ARCH" --variant=minbase --include=python3,ca-certificates \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr --format=directory "$SUITE" "$rootfs" \
    "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" "deb $SECURITY_MIRROR $SUITE-security main"
  # Later apt installs (the build stage's python3-venv) leave out docs, as Debian's slim images do.
  printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-include /usr/share/doc/*/copyright' \
    'path-exclude /usr/share/man/*' 'path-exclude /usr/share/info/*' 'path-exclude /usr/share/locale/*' \
    >"$rootfs/etc/dpkg/dpkg.cfg.d/01-gpudra-nodoc"
  # Trim what a container never reads: downloaded .debs, package lists (apt-get update rebuilds them),
  # docs (copyright files stay), man pages, translations, logs; and the host's resolv.conf and hostname,
  # which the bootstrap copies in and a container runtime mounts anyway.
  chroot "$rootfs" apt-get clean
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
    "$rootfs"/usr/share/locale/* "$rootfs"/var/log/* "$rootfs"/var/cache/debconf/*-old \
    "$rootfs"/var/lib/dpkg/*-old "$rootfs"/etc/resolv.conf "$rootfs"/etc/hostname
  find "$rootfs/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
  find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
  # /dev, /proc and /sys are the runtime's to provide.
  tar -C "$rootfs" --numeric-owner --exclude=./dev/* --exclude=./proc/* --exclude=./sys/* \
    -cf "$dir/rootfs.tar" .
  rm -rf --one-file-system "$rootfs"
  touch "$dir/.complete"
  # Older keys of this architecture are dead weight (~120 MB each).
  find "$IMAGE_CACHE" -maxdepth 1 -name "base-$ARCH-*" ! -path "$dir" -exec rm -rf --one-file-system {} +
fi

echo "importing $dir/rootfs.tar as $BASE_REF" >&2
c=$(bah from scratch)
trap 'bah rm "$c" >/dev/null 2>&1 || true' EXIT
mnt=$(bah mount "$c")
if [ ! -d "$mnt" ] || [ "$mnt" = / ]; then echo "base.sh: buildah mount gave '$mnt'" >&2; exit 1; fi
tar -C "$mnt" --numeric-owner -xf "$dir/rootfs.tar"
bah umount "$c" >/dev/null
bah config --os linux --arch "$ARCH" --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --env LANG=C.UTF-8 --cmd /bin/bash --label "$KEY_LABEL=$key" "$c"
bah commit --quiet --rm "$c" "$BASE_REF" >/dev/null
trap - EXIT
echo "base image ready in $(($(date +%s) - start))s" >&2
