#!/usr/bin/env bash
# `make publish REGISTRY=host[:port][/path]`: pushes what `make release` made for pyproject.toml's version
# to an OCI registry: the image's manifest list (linux/amd64 + linux/arm64) as REGISTRY/gpudra:<version>
# and the chart as an OCI artifact, REGISTRY/charts/gpudra:<version> (`helm install gpudra
# oci://REGISTRY/charts/gpudra --version <version>`). Credentials: `buildah login` and `helm registry
# login` (or $REGISTRY_AUTH_FILE). PLAIN_HTTP=1 talks HTTP to a registry without TLS (a loopback one).
set -euo pipefail
cd "$(dirname "$0")/../.."
source deploy/image/env.sh
need_root

registry=${1:-}
case $registry in
  "" | *://* | */ | *" "*)
    echo "publish: REGISTRY='$registry': give host[:port][/path] with no scheme, e.g. ghcr.io/gpudra" >&2
    exit 2
    ;;
esac
version=$(image_version)
chart=dist/release/$version/gpudra-$version.tgz
list=$RELEASE_REPO:$version
if [ ! -f "$chart" ] || ! bah manifest inspect "$list" >/dev/null 2>&1; then
  echo "publish: no release $version here (run make release VERSION=$version)" >&2
  exit 2
fi
tls=(--tls-verify=true)
plain=()
if [ "${PLAIN_HTTP:-}" = 1 ]; then
  tls=(--tls-verify=false)
  plain=(--plain-http)
fi
helm=$(bash deploy/local/build-helm.sh)

# --all: the list and both images it names, so a node of either architecture finds its own.
bah manifest push --all --quiet "${tls[@]}" "$list" "docker://$registry/gpudra:$version"
echo "publish: $registry/gpudra:$version (linux/amd64, linux/arm64)" >&2
"$helm" push "$chart" "oci://$registry/charts" "${plain[@]}" >&2
echo "publish: oci://$registry/charts/gpudra --version $version" >&2
