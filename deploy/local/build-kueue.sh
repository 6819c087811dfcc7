#!/usr/bin/env bash
# Builds Kueue's manager from its Go module (a pinned release, the newest the module proxy serves) once
# into gpudra's cache outside the repo, with the module's manifests beside it, and prints the directory:
#   $dir/manager        the Kueue controller manager
#   $dir/crds/          config/components/crd/bases of the same release
#   $dir/webhooks.yaml  config/components/webhook/manifests.yaml (tests/localcluster/kueue.py points
#                       them at the manager's URL)
# `go install pkg@version` builds with Kueue's own go.mod, so its libraries never meet the local
# cluster's pins in deploy/local/go.mod.
set -euo pipefail
cd "$(dirname "$0")"
source ./env.sh
KUEUE_VERSION=v0.17.0
# Without Go's optimiser and inliner (-N -l): the tests check what Kueue decides, never how fast, and
# the build takes about 15% less CPU (it is on a cold machine's path: make test waits for it). The
# flags are in the directory's name, so a change of them builds again.
GCFLAGS="all=-N -l"
out=$GPUDRA_CACHE/kueue-$KUEUE_VERSION-noopt
if [ -x "$out/manager" ] && [ -d "$out/crds" ] && [ -f "$out/webhooks.yaml" ]; then
  echo "$out"
  exit 0
fi
build_lock kueue
if [ -x "$out/manager" ] && [ -d "$out/crds" ] && [ -f "$out/webhooks.yaml" ]; then  # built by another run while this one waited
  echo "$out"
  exit 0
fi
start=$(date +%s)
mkdir -p "$out"
if [ ! -x "$out/manager" ]; then
  echo "building Kueue $KUEUE_VERSION into $out (cold: about 4.5 CPU-minutes, a few minutes on 2 idle cores)" >&2
  rm -rf "$out.tmp"
  GOBIN=$out.tmp go install -trimpath -gcflags "$GCFLAGS" \
    -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
    "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION" >&2
  mv "$out.tmp/kueue" "$out/manager" && rmdir "$out.tmp"
fi
src=$(cd / && go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
rm -rf "$out/crds" && mkdir "$out/crds.tmp"
cp "$src"/config/components/crd/bases/*.yaml "$out/crds.tmp/"
mv "$out/crds.tmp" "$out/crds"
cp "$src/config/components/webhook/manifests.yaml" "$out/webhooks.yaml.tmp"
mv "$out/webhooks.yaml.tmp" "$out/webhooks.yaml"
echo "built in $(( $(date +%s) - start ))s" >&2
find "$GPUDRA_CACHE" -maxdepth 1 -name 'kueue-*' ! -path "$out" -exec rm -rf {} +
echo "$out"
