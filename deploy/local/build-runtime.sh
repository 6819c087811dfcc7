#!/usr/bin/env bash
# Builds what `make cluster-up RUNTIME=containerd` adds to the local cluster, once into a cache
# directory outside the repo, and prints that directory's bin/ path:
#   - containerd 2.x (containerd, containerd-shim-runc-v2, ctr) from its Go module: CDI injection is on
#     by default there (Debian's containerd 1.6 has none), and it implements the CRI RuntimeConfig call
#     that kubelets after 1.36 require;
#   - the pause (sandbox) image: pause.c from the pinned Kubernetes source, `gcc -static`, as an OCI
#     archive for `ctr images import` (no registry is asked for anything).
# runc and the CNI plugins come from Debian's packages (runc; containernetworking-plugins, installed
# under /usr/lib/cni), installed here when missing. The directory is keyed by the versions and a hash of
# this script, so a changed pin or recipe rebuilds and an unchanged one is reused.
set -euo pipefail
cd "$(dirname "$0")"
source ./env.sh
containerd_module=github.com/containerd/containerd/v2
containerd_version=v2.4.2
k8s_version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2}' go.mod)
# The key: the pinned module (the pause image's source and tag) and RECIPE, what is built and how; this
# script's own text is left out, so that a change to how it runs rebuilds nothing (change RECIPE instead).
RECIPE="containerd containerd-shim-runc-v2 ctr; -trimpath; tags no_btrfs netgo osusergo; -s -w; \
pause: gcc -Os -static, strip, image_archive.py"
key=$( { cat go.mod go.sum image_archive.py; echo "$RECIPE"; } | sha256sum | cut -c1-12)
out=$GPUDRA_CACHE/runtime-containerd-$containerd_version-$k8s_version-$key

source ../packages.sh
ensure_packages runc containernetworking-plugins iptables

if [ -f "$out/.complete" ]; then
  echo "$out/bin"
  exit 0
fi
build_lock runtime
if [ -f "$out/.complete" ]; then  # built by another run while this one waited
  echo "$out/bin"
  exit 0
fi
rm -rf "$out"
mkdir -p "$out/bin" "$out/images"
start=$(date +%s)
echo "building containerd $containerd_version and the pause image into $out" >&2

# containerd: built inside a writable copy of its module (its own go.mod and go.sum pin everything; the
# proxy may refuse `go install pkg@version`). No cgo: btrfs (cgo-only) is left out by its build tag.
src=$(cd / && go mod download -json "$containerd_module@$containerd_version" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$src" "$work/containerd"
chmod -R u+w "$work/containerd"
(
  cd "$work/containerd"
  for cmd in containerd containerd-shim-runc-v2 ctr; do
    go build -trimpath -tags "no_btrfs netgo osusergo" \
      -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd_version" \
      -o "$out/bin/$cmd" "./cmd/$cmd"
  done
) >&2

# The pause image: one static binary in an otherwise empty OCI image, written by hand (an OCI image
# layout is three JSON files and a tarball), so no image builder is needed.
kdir=$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)
gcc -Os -static -DVERSION="gpudra-$k8s_version" -o "$work/pause" "$kdir/build/pause/linux/pause.c"
strip "$work/pause"
python3 ./image_archive.py --binary "$work/pause" --entrypoint /pause \
  --name "localhost/pause:$k8s_version" --out "$out/images/pause.tar" >&2
echo "localhost/pause:$k8s_version" > "$out/images/pause.ref"

echo "built in $(( $(date +%s) - start ))s" >&2
touch "$out/.complete"
find "$GPUDRA_CACHE" -maxdepth 1 -name 'runtime-*' ! -path "$out" -exec rm -rf {} +
echo "$out/bin"
