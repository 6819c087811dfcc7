#!/usr/bin/env bash
# Installs Chromium from Debian once (the GPU map's browser test, its screenshot and its benchmark load
# the page in headless Chromium) and prints the binary's path. Idempotent: a present binary is reused.
# Needs root the first time (apt-get); about a minute cold, instant warm.
set -euo pipefail
if ! command -v chromium >/dev/null; then
  start=$(date +%s)
  echo "installing chromium from Debian (cold: about a minute)" >&2
  export DEBIAN_FRONTEND=noninteractive
  # Another engineer's (or CI step's) apt-get may hold the lock: wait for it rather than fail.
  apt-get -o DPkg::Lock::Timeout=300 update -qq >&2
  apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends chromium fonts-dejavu-core >&2
  echo "installed in $(( $(date +%s) - start ))s" >&2
fi
command -v chromium
