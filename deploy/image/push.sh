#!/usr/bin/env bash
# `make image-push IMAGE=registry.example.com/gpudra:0.1.0`: copies the newest build (localhost/gpudra:dev)
# from gpudra's own image store to a registry (or any transport buildah knows, e.g. docker-archive:PATH),
# with the registry credentials buildah finds (`buildah login`, $REGISTRY_AUTH_FILE).
set -euo pipefail
cd "$(dirname "$0")"
source ./env.sh
need_root
ensure_packages buildah
destination=${1:?usage: push.sh REGISTRY/NAME:TAG (or TRANSPORT:DESTINATION)}
case $destination in
  *:/*|docker://*|oci-archive:*|docker-archive:*|oci:*|dir:*) ;;
  *) destination=docker://$destination ;;
esac
bah push "$IMAGE_REPO:dev" "$destination"
echo "pushed $IMAGE_REPO:dev ($(bah inspect --type image --format '{{index .OCIv1.Config.Labels "io.gpudra.build"}}' "$IMAGE_REPO:dev")) to $destination" >&2
