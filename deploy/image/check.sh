#!/usr/bin/env bash
# `make image-check`: what `docker run IMAGE --help` would show, without a Docker engine. Reads the
# image's own config (entrypoint, user), runs the entrypoint with --help in a container made from the
# image (buildah run, chroot isolation, as the image's user), and fails unless it prints the usage naming
# both daemons, runs as uid 10001, and the image holds no pip or compiler. Prints the image's names and size.
set -euo pipefail
cd "$(dirname "$0")"
source ./env.sh
need_root
ensure_packages buildah

image=${1:-$IMAGE_REPO:dev}
fail() {
  echo "image-check: $image: $*" >&2
  exit 1
}
config() { bah inspect --type image --format "$1" "$image"; }

entrypoint=$(config '{{.OCIv1.Config.Entrypoint}}') || fail "not in $STORAGE_ROOT (run make image)"
user=$(config '{{.OCIv1.Config.User}}')
[ "$entrypoint" = '[gpudra]' ] || fail "entrypoint is $entrypoint, not [gpudra]"
[ "$user" = 10001:10001 ] || fail "user is '$user', not 10001:10001"

c=$(bah from --pull=never "$image")
trap 'bah rm "$c" >/dev/null 2>&1 || true' EXIT
# buildah run takes no entrypoint: the one just checked is spelled out. It runs as the image's USER.
usage=$(bah run "$c" -- gpudra --help) || fail "gpudra --help failed: $usage"
echo "$usage"
for word in kubelet-plugin controller; do
  grep -q -- "$word" <<<"$usage" || fail "usage does not name $word"
done
# Both daemons' options parse, which imports their code and the native wheels they load.
for cmd in kubelet-plugin controller; do
  bah run "$c" -- gpudra "$cmd" --help >/dev/null || fail "gpudra $cmd --help failed"
done
bah run "$c" -- python3 -c 'import grpc, cryptography.x509, pydantic_core, google.protobuf, yaml, celpy' ||
  fail "a native dependency does not import"
uid=$(bah run "$c" -- id -u)
[ "$uid" = 10001 ] || fail "runs as uid $uid, not 10001"
extra=$(bah run "$c" -- /bin/sh -c \
  'command -v pip pip3 gcc cc c++ make; python3 -c "import pip" 2>/dev/null && echo "pip module"; true')
[ -z "$extra" ] || fail "holds build tools: $extra"

id=$(bah inspect --type image --format '{{.FromImageID}}' "$image")
names=$(bah images --noheading --format '{{.Name}}:{{.Tag}} {{.ID}}' | awk -v id="${id:0:12}" '$2 == id {print $1}')
size=$(bah images --noheading --format '{{.Size}}' "$image" | awk 'NR == 1')  # awk reads all: no SIGPIPE
echo "image-check: ok, uid 10001, no pip or compiler"
echo "image: $(echo "$names" | tr '\n' ' ')($size uncompressed; store $STORAGE_ROOT)"
