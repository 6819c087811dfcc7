#!/usr/bin/env bash
# The release before this one, for the e2e upgrade test (tests/e2e): gpudra had no published release
# before 0.1.0, so "previous" is a fixed earlier commit, PREVIOUS_COMMIT (default: main just before the
# release work, the last commit whose image was installed from an archive). Its Dockerfile and chart,
# as that commit has them, are built and published to REGISTRY as version <its version>-<short commit>
# (a SemVer pre-release of that version): the image REGISTRY/gpudra:<that> for the host's architecture
# (on the current base image; the dependency layer is shared with `make image`'s while the lock is the
# same) and the chart oci://REGISTRY/charts/gpudra. Prints the version. Root; plain HTTP when PLAIN_HTTP=1.
#   deploy/release/previous.sh 127.0.0.1:5000
set -euo pipefail
cd "$(dirname "$0")/../.."
source deploy/image/env.sh
need_root
registry=${1:?usage: previous.sh REGISTRY}
commit=$(git rev-parse --verify "${PREVIOUS_COMMIT:-adca557c1163640d4a039c18e4426200dea32340}^{commit}")
tls=(--tls-verify=true)
plain=()
if [ "${PLAIN_HTTP:-}" = 1 ]; then
  tls=(--tls-verify=false)
  plain=(--plain-http)
fi
helm=$(bash deploy/local/build-helm.sh)
bash deploy/image/base.sh

tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
git archive "$commit" | tar -x -C "$tree"
version="$(sed -n '/^version = "/{s/^version = "\(.*\)"$/\1/p;q}' "$tree/pyproject.toml")-${commit:0:7}"
ca=()
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then  # as in deploy/image/build.sh
  ca=(--volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
fi
bah bud --quiet --pull=never --layers "${ca[@]}" --arch "$ARCH" --os linux --build-arg "BASE=$BASE_REF" \
  --ignorefile "$tree/deploy/image/build.ignore" \
  --label "org.opencontainers.image.version=$version" --label "org.opencontainers.image.revision=$commit" \
  --tag "localhost/gpudra-previous:$version" --file "$tree/Dockerfile" "$tree" >/dev/null
bah push --quiet "${tls[@]}" "localhost/gpudra-previous:$version" "docker://$registry/gpudra:$version"
"$helm" package "$tree/deploy/helm/gpudra" --version "$version" --app-version "$version" --destination "$tree" >/dev/null
"$helm" push "$tree/gpudra-$version.tgz" "oci://$registry/charts" "${plain[@]}" >&2
echo "previous: $commit as $registry/gpudra:$version and oci://$registry/charts/gpudra --version $version" >&2
echo "$version"
