#!/usr/bin/env bash
# Builds the peer that `make bench` measures gpudra against: the kubelet plugin of
# sigs.k8s.io/dra-example-driver (8 simulated GPUs, driver gpu.example.com), from the Go module proxy,
# once into a cache directory outside the repo, and prints the binary's path. The directory is keyed by
# the peer's version and a hash of this script, so a changed pin or recipe rebuilds and an unchanged one
# is reused.
#
# `go install <pkg>@<version>` does not work here (the proxy refuses the module's version list), so the
# module is downloaded at its exact version and built inside a writable copy of it; it has no replace
# directives, so its own go.mod and go.sum pin everything it needs.
set -euo pipefail
cd "$(dirname "$0")"
source ./env.sh
module=sigs.k8s.io/dra-example-driver
version=v0.4.0
key=$(cat build-peer.sh | sha256sum | cut -c1-12)
out=$GPUDRA_CACHE/peer-dra-example-driver-$version-$key
binary=$out/bin/dra-example-kubeletplugin
if [ -f "$out/.complete" ]; then
  echo "$binary"
  exit 0
fi
# One build at a time (make bench and the bench smoke test may both ask): the second waits, then finds
# the first's build complete.
build_lock peer
if [ -f "$out/.complete" ]; then
  echo "$binary"
  exit 0
fi
start=$(date +%s)
echo "building $module $version's kubelet plugin into $out" >&2
# Outside any module, so that the download is not resolved against deploy/local's go.mod.
dir=$(cd / && go mod download -json "$module@$version" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
rm -rf "$out"
mkdir -p "$out/bin"
cp -r "$dir" "$out/src"
chmod -R u+w "$out/src"  # files in the module cache are read-only; the build may write go.sum entries
(cd "$out/src" && go build -trimpath -ldflags "-s -w" -o "$binary" ./cmd/dra-example-kubeletplugin) >&2
echo "built in $(( $(date +%s) - start ))s" >&2
touch "$out/.complete"
# Older builds of the peer are dead weight.
find "$GPUDRA_CACHE" -maxdepth 1 -name 'peer-*' ! -path "$out" -exec rm -rf {} +
echo "$binary"
