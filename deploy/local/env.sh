# Sourced by the build scripts: keeps Go's module and build caches in gpudra's cache directory
# (outside the repo) so that a cold Kubernetes build happens once per machine.
export GPUDRA_CACHE=${GPUDRA_CACHE:-$HOME/.cache/gpudra}
export GOMODCACHE=$GPUDRA_CACHE/go/mod
export GOCACHE=$GPUDRA_CACHE/go/build
export GOFLAGS=-modcacherw
export GOTOOLCHAIN=local
export CGO_ENABLED=0
# The compiler and linker collect no garbage until a process holds 3 GiB (then as usual): measured on
# 2 cores, kube-scheduler from an empty build cache took 12% less CPU-time in user space (308 s instead
# of 350) and 6% less wall-clock time; with the checks flavour's -N -l (build.sh) 287 CPU-s instead of
# 419 in all. Two compilers at a time (one per core) stay within 6 GiB of the machine's 24.
export GOGC=off GOMEMLIMIT=3GiB

# One build of a thing at a time per cache: .ci/run builds some things in the background while the tests
# that need them may ask for them too (they then wait here for that build, and find it done). Call it
# after the fast path that finds a complete build, and check again once the lock is held.
build_lock() {
  mkdir -p "$GPUDRA_CACHE"
  exec 9>"$GPUDRA_CACHE/.build-$1.lock"
  flock 9
}
