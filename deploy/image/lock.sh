#!/usr/bin/env bash
# `make lock`: regenerates deploy/image/requirements.lock, the image's pinned dependency set:
# pyproject.toml's runtime dependencies (no extras) and everything they need, resolved for CPython 3.11
# on Linux (the image's Python), each an exact version with the sha256 of every file PyPI has for it
# (pip-compile --generate-hashes), so the Dockerfile installs it with pip --require-hashes.
# Existing pins are kept unless pyproject.toml needs others; `make lock UPGRADE=1` (--upgrade) takes the
# newest versions pyproject.toml allows. pip-tools lives in a venv in the cache, not in the dev venv.
set -euo pipefail
cd "$(dirname "$0")"
cache=${GPUDRA_CACHE:-$HOME/.cache/gpudra}/image
python=${PYTHON:-python3.11}
PIP_VERSION=26.3
PIP_TOOLS_VERSION=7.6.2

"$python" -c 'import sys; assert sys.version_info[:2] == (3, 11), "the image runs Python 3.11"' || {
  echo "lock.sh: $python is not Python 3.11 (set PYTHON=...)" >&2
  exit 1
}
venv=$cache/lock-venv-pip-tools-$PIP_TOOLS_VERSION
if [ ! -x "$venv/bin/pip-compile" ]; then
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet "pip==$PIP_VERSION" "pip-tools==$PIP_TOOLS_VERSION"
fi
cd ../..
# --allow-unsafe: pip or setuptools, should a dependency ever need them, are pinned like the rest
# (--require-hashes refuses an unpinned one). --strip-extras: plain names are what pip checks hashes for.
CUSTOM_COMPILE_COMMAND="make lock" "$venv/bin/pip-compile" --quiet --generate-hashes --allow-unsafe \
  --strip-extras --no-emit-index-url --no-emit-find-links --output-file deploy/image/requirements.lock \
  "$@" pyproject.toml
echo "deploy/image/requirements.lock: $(grep -c '^[a-z0-9]' deploy/image/requirements.lock) packages" >&2
