# Sourced by deploy/image/env.sh and deploy/local/build-runtime.sh: the one place that installs Debian
# packages (every install step lives in the repo, so a fresh machine needs nothing by hand).
# shellcheck shell=bash

# Installs the Debian packages named when missing; a fresh machine has none of them.
ensure_packages() {
  local missing=() pkg
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local log=/tmp/gpudra-apt.log
  echo "installing ${missing[*]} (log: $log)" >&2
  { apt-get update && DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "${missing[@]}"; } >"$log" 2>&1 || {
    tail -n 30 "$log" >&2
    return 1
  }
}

# What running another architecture's programs needs: qemu-user-static, registered with the kernel's
# binfmt_misc (Debian's package registers its handlers with the F flag, so the emulator is found from
# inside a chroot or a build container without a copy there). binfmt_misc must be mounted for that.
ensure_foreign_arch() {
  local qemu
  case $1 in
    arm64) qemu=aarch64 ;;
    *) echo "ensure_foreign_arch: no emulator known for $1 (allowed: arm64)" >&2; return 2 ;;
  esac
  if [ ! -e /proc/sys/fs/binfmt_misc/status ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  fi
  ensure_packages qemu-user-static binfmt-support
  if [ ! -e "/proc/sys/fs/binfmt_misc/qemu-$qemu" ]; then
    update-binfmts --enable "qemu-$qemu" >/dev/null
  fi
  grep -q '^flags: .*F' "/proc/sys/fs/binfmt_misc/qemu-$qemu" || {
    echo "ensure_foreign_arch: qemu-$qemu is registered without the F flag: chroots cannot find it" >&2
    return 1
  }
}

# Every Debian package some make target installs on first use, for `make packages`: .ci/run installs them
# in one apt-get run before anything starts, so that the builds it runs beside the tests never wait on
# (or fail at) another apt-get's dpkg lock. Each script still ensures its own, for a target run alone.
GPUDRA_PACKAGES=(
  mmdebstrap arch-test buildah                             # deploy/image: the base image and the build
  qemu-user-static binfmt-support                          # the arm64 base and image (make release)
  runc containernetworking-plugins iptables                # deploy/local/build-runtime.sh: containerd's nodes
  prometheus                                               # deploy/local/build-prometheus.sh
  docker-registry                                          # make e2e's loopback registry
  chromium fonts-dejavu-core                               # deploy/local/install-chromium.sh
  libfaketime                                              # tests/localcluster/clock_step.py: a stepped clock
)
