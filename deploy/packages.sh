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
