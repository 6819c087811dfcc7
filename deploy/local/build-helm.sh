#!/usr/bin/env bash
# Builds Helm from its Go module (a pinned release) once into gpudra's cache outside the repo and
# prints the binary's path. `go install pkg@version` builds with Helm's own go.mod, so its
# Kubernetes library versions never meet the local cluster's pins in deploy/local/go.mod.
set -euo pipefail
cd "$(dirname "$0")"
source ./env.sh
HELM_VERSION=v4.3.1
out=$GPUDRA_CACHE/helm-$HELM_VERSION
if [ -x "$out/helm" ]; then
  echo "$out/helm"
  exit 0
fi
build_lock helm
if [ -x "$out/helm" ]; then  # built by another run while this one waited
  echo "$out/helm"
  exit 0
fi
start=$(date +%s)
echo "building Helm $HELM_VERSION into $out (cold: a few minutes on 2 cores)" >&2
mkdir -p "$out"
GOBIN=$out.tmp go install -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
  "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" >&2
mv "$out.tmp/helm" "$out/helm" && rmdir "$out.tmp"
echo "built in $(( $(date +%s) - start ))s" >&2
find "$GPUDRA_CACHE" -maxdepth 1 -name 'helm-*' ! -path "$out" -exec rm -rf {} +
echo "$out/helm"
