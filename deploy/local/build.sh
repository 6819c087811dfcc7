#!/usr/bin/env bash
# Builds the local cluster's binaries (etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager, kubelet, kube-proxy, fakecri) once into a cache directory outside the repo and
# prints that directory's bin/ path. The directory is keyed by the Kubernetes version and a hash
# of this module, so a changed pin or harness rebuilds and an unchanged one is reused.
set -euo pipefail
cd "$(dirname "$0")"
source ./env.sh
version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2}' go.mod)
key=$(cat go.mod go.sum build.sh fakecri/*.go | sha256sum | cut -c1-12)
out=$GPUDRA_CACHE/k8s-$version-$key
if [ -f "$out/.complete" ]; then
  echo "$out/bin"
  exit 0
fi
minor=${version#v1.}; minor=${minor%%.*}
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version \
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean"
mkdir -p "$out/bin"
start=$(date +%s)
echo "building Kubernetes $version components into $out (cold: tens of minutes on 2 cores)" >&2
# One package per go build keeps peak memory to one linker at a time.
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
  go build -trimpath -ldflags "$ldflags" -o "$out/bin/$cmd" "k8s.io/kubernetes/cmd/$cmd" >&2
done
go build -trimpath -ldflags "-s -w" -o "$out/bin/etcd" go.etcd.io/etcd/server/v3 >&2
go build -trimpath -ldflags "-s -w" -o "$out/bin/fakecri" ./fakecri >&2
echo "built in $(( $(date +%s) - start ))s" >&2
touch "$out/.complete"
# Older builds of this harness are dead weight (a few hundred MB each).
find "$GPUDRA_CACHE" -maxdepth 1 -name 'k8s-*' ! -path "$out" -exec rm -rf {} +
echo "$out/bin"
