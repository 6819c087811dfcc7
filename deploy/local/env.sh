# Sourced by the build scripts: keeps Go's module and build caches in gpudra's cache directory
# (outside the repo) so that a cold Kubernetes build happens once per machine.
export GPUDRA_CACHE=${GPUDRA_CACHE:-$HOME/.cache/gpudra}
export GOMODCACHE=$GPUDRA_CACHE/go/mod
export GOCACHE=$GPUDRA_CACHE/go/build
export GOFLAGS=-modcacherw
export GOTOOLCHAIN=local
export CGO_ENABLED=0
