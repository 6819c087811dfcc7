# gpudra developer entry points. Every install step lives here so a fresh machine needs nothing else.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# Tests start hundreds of Python processes (daemons, crash children, stand-in tools); where the machine
# sets PYTHONDONTWRITEBYTECODE each of them compiles every module it imports again. Bytecode goes to
# __pycache__ (ignored by git and by the image's build context).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install packages ci-builds lint check test unit integration faults e2e k8s kueue chromium gpu-map-screenshot bench-gpu-map helm prometheus chart-lint chart-schema manifests render-manifests bench bench-scale compat cluster-up cluster-down demo proto schemas clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	touch $(STAMP)

install: $(STAMP)

# Every Debian package the targets use, in one apt-get run (root; warm, one dpkg query each).
packages:
	bash -c 'source deploy/packages.sh && ensure_packages "$${GPUDRA_PACKAGES[@]}"'

lint: $(STAMP)
	$(BIN)/ruff check src tests scripts
	$(BIN)/ruff format --check src tests scripts
	$(BIN)/mypy
	$(BIN)/lint-imports

# pytest-xdist workers: 3 on the 2 cores, since many tests wait on the processes they drive; each worker
# that draws a cluster test starts its own control plane (about 1.5 GiB), and tests/workers.py keeps a
# module with a module- or class-scoped fixture (and the compat layer) on one worker.
WORKERS ?= 3
PYTEST_PARALLEL = $(BIN)/pytest -n $(WORKERS) --dist loadgroup
# make test's cluster layers on 4 workers: most of a cluster test is waiting on the processes it drives,
# so 4 workers keep the 2 cores busy (18 minutes instead of 40 serially); their bounded waits allow 3
# times as long there (tests/integration/kube_helpers.py wait_scale). TEST_WORKERS=0 runs them serially.
TEST_WORKERS ?= 4

# The contributor's answer within 3 minutes: lint, type check, import contracts and the unit tests
# (which start no process, daemon or cluster).
check: lint unit

# The test command named in README.md (and run by .ci/run): `make check`, then the integration tests on
# a real local control plane and kubelets (built once into ~/.cache/gpudra), the fault suite and the
# compat tests on the pinned release, one pytest run over the three layers.
test: check k8s kueue chart-lint chromium prometheus
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup --durations=30 tests/compat tests/integration tests/faults

unit: $(STAMP)
	$(PYTEST_PARALLEL) tests/unit

integration: $(STAMP) k8s kueue chromium prometheus
	$(PYTEST_PARALLEL) tests/integration

# The fault suite (also part of `make test`): random SIGKILLs with an auditor, disk full at every
# write, damaged checkpoints, a read-only CDI root, and the node's tests that start processes: crash
# children SIGKILLed at each step of prepare and unprepare, MPS daemons a tenant tampers with, mps-host,
# the MPS trash. Simulated GPUs, no cluster.
faults: $(STAMP)
	$(PYTEST_PARALLEL) tests/faults

k8s:
	bash deploy/local/build.sh >/dev/null

# Issue 36: Kueue's manager and manifests from its Go module (pinned in deploy/local/build-kueue.sh),
# built once into ~/.cache/gpudra for tests/integration/test_kueue.py (docs/quota.md).
kueue:
	bash deploy/local/build-kueue.sh >/dev/null

# Chromium from Debian for the GPU map's browser test (tests/integration/test_gpu_map_browser.py), its
# screenshot and its benchmark. Needs root the first time; cold about 30 s, warm instant.
chromium:
	bash deploy/local/install-chromium.sh >/dev/null

# docs/gpu-map.png: the GPU map page as the controller serves it in `make demo`'s state (fake CRI),
# taken by headless Chromium after the demo's pods run, before they are deleted, and beside it
# docs/gpu-map.state.json, what that page load drew (tests/integration/test_demo.py fails when the demo's
# page no longer draws it: run this again and commit both). About 3 minutes.
gpu-map-screenshot: $(STAMP) k8s chromium
	$(BIN)/python -m tests.localcluster.demo --runtime fakecri --gpu-map-screenshot docs/gpu-map.png

# The GPU map's load time at 1,000 simulated DGX nodes' slices: survey, one page's JSON, and headless
# Chromium drawing it; prints a table. About a minute on 2 cores.
bench-gpu-map: $(STAMP) chromium
	$(BIN)/python -m tests.bench.gpu_map

# Issue 13: the chart installed with Helm on the local cluster with containerd (real containers, CDI,
# the webhook behind its Service, a rolling upgrade, clean teardown). Needs root; builds the image and
# containerd first (deploy/local/build-runtime.sh). CI runs it after `make test`.
# Issue 31: the user's path: `make release` of pyproject.toml's version, published to a loopback
# registry (Debian's docker-registry, installed here), pulled by containerd, installed from oci://, and
# upgraded to from the previous release (deploy/release/previous.sh).
PROJECT_VERSION := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml | head -n 1)
e2e: $(STAMP) k8s image prometheus
	bash -c 'source deploy/packages.sh && ensure_packages docker-registry'
	bash deploy/release/release.sh $(PROJECT_VERSION)
	bash deploy/local/build-runtime.sh >/dev/null
	bash deploy/local/build-helm.sh >/dev/null
	$(BIN)/pytest -m e2e tests/e2e

# Prometheus and promtool from Debian's package (tests/integration/test_monitoring.py, and the e2e's
# Prometheus scraping the chart's monitors): cold about 30 s, warm a dpkg query.
prometheus:
	@bash deploy/local/build-prometheus.sh >/dev/null

# Helm from its Go module (pinned in deploy/local/build-helm.sh), built once into ~/.cache/gpudra.
HELM  = $(shell bash deploy/local/build-helm.sh)
CHART := deploy/helm/gpudra

helm:
	@bash deploy/local/build-helm.sh

# The Prometheus Operator's kinds, for the objects the chart renders only where its CRDs are installed.
MONITORING_APIS := $(foreach kind,PodMonitor ServiceMonitor PrometheusRule,-a monitoring.coreos.com/v1/$(kind))

# helm lint --strict and helm template for the default values and every example in the chart's ci/
# (with the Prometheus Operator's kinds, so its objects render too);
# the schema and deploy/manifests must be current. tests/integration/test_chart.py sends every
# rendered object to the real API server (server-side dry run).
chart-lint: $(STAMP)
	$(BIN)/python scripts/gen_chart_schema.py --check
	$(HELM) lint --strict $(CHART)
	for values in $(CHART)/ci/*.yaml; do \
	  $(HELM) lint --strict $(CHART) -f $$values && \
	  $(HELM) template gpudra $(CHART) -n gpudra -f $$values $(MONITORING_APIS) >/dev/null || exit 1; \
	done
	for classes in deploy/manifests/deviceclasses.yaml $(PACKAGED_CLASSES); do \
	  $(MAKE) -s render-manifests | diff -u $$classes - \
	  || { echo "$$classes is stale: run make manifests"; exit 1; }; \
	done

chart-schema: $(STAMP)
	$(BIN)/python scripts/gen_chart_schema.py

# The DeviceClasses for clusters without Helm, rendered from the chart with its default values; the
# same file is package data of the CLI (gpudra explain's offline default, wherever the wheel is installed).
PACKAGED_CLASSES := src/gpudra/cli/deviceclasses.yaml
manifests:
	$(MAKE) -s render-manifests > deploy/manifests/deviceclasses.yaml
	cp deploy/manifests/deviceclasses.yaml $(PACKAGED_CLASSES)

render-manifests:
	@echo "# gpudra's DeviceClasses, rendered from deploy/helm/gpudra by make manifests (do not edit)."
	@echo "# Claims name one of them in spec.devices.requests[].exactly.deviceClassName."
	@$(HELM) template gpudra $(CHART) --show-only templates/deviceclasses.yaml | grep -v '^# Source:' | cat -s | sed '1{/^---$$/d}'

# Issue 15: gpudra's kubelet plugin side by side with dra-example-driver's (built from the Go module
# proxy into ~/.cache/gpudra), interleaved rounds on the local control plane; prints the table and
# rewrites its section of BENCHMARKS.md and docs/bench-latency.png. About 12 minutes on 2 cores.
# Issue 27: gpudra on the Kubernetes releases people run. tests/compat on each release with default
# gates, and on 1.34/1.35 with the DRA gates on: `make demo`'s steps (every example judged by gpudra
# explain, those the release serves allocated and prepared, the others reported and left unscheduled),
# the support matrix of docs/install.md, the chart's server-side dry run; the pinned release runs it in
# `make test`. Each release is built once into ~/.cache/gpudra (about 6 minutes cold on 2 cores each);
# warm, 40 to 55 s a release, about 4.5 minutes in all. `pytest -s` shows the demo's output.
COMPAT_RELEASES ?= v1.34.12 v1.35.8 v1.36.3
GATED_RELEASES  ?= v1.34.12 v1.35.8
DRA_GATES := DRAPartitionableDevices=true,DRAConsumableCapacity=true,DRADeviceTaints=true,DRAExtendedResource=true,ResourceHealthStatus=true
# .ci/run's background builds (.ci/builds): Kueue, containerd, the image for both architectures and the
# compat releases, at the lowest CPU priority, while `make test` runs (root).
ci-builds:
	nice -n 19 bash .ci/builds $(COMPAT_RELEASES)

compat: $(STAMP) helm
	for r in $(COMPAT_RELEASES); do K8S=$$r bash deploy/local/build.sh >/dev/null || exit 1; done
	for r in $(COMPAT_RELEASES); do \
	  echo "== Kubernetes $$r, default feature gates"; \
	  K8S=$$r $(BIN)/pytest tests/compat || exit 1; \
	done
	for r in $(GATED_RELEASES); do \
	  echo "== Kubernetes $$r with $(DRA_GATES)"; \
	  K8S=$$r GPUDRA_FEATURE_GATES=$(DRA_GATES) \
	    GPUDRA_RUNTIME_CONFIG=$$(case $$r in v1.34.*) echo resource.k8s.io/v1alpha3=true;; esac) \
	    $(BIN)/pytest tests/compat || exit 1; \
	done

# The cluster-scale benchmark (issue 26): the real kube-scheduler of the pinned release (1.37) and of 1.36
# against 50, 200 and 500 fake DGX H100 nodes with each publishing layout, whole GPUs as the
# reference in the same run; rewrites the "Cluster scale" section of BENCHMARKS.md. About 40 minutes on
# 2 cores (the layouts with counter sets on 1.36 are the slow part); SCALE_ARGS narrows it, e.g.
# SCALE_ARGS="--nodes 200 --releases pinned".
SCALE_ARGS ?=
bench-scale: $(STAMP) k8s
	$(BIN)/python -m tests.scale --report BENCHMARKS.md $(SCALE_ARGS)

bench: $(STAMP) k8s
	bash deploy/local/build-peer.sh >/dev/null
	$(BIN)/python -m tests.bench

# RUNTIME=containerd: real containers (containerd, runc, CNI bridge, kube-proxy), the image imported.
RUNTIME ?= fakecri

# README's demo command: a real local cluster, simulated GPUs, gpudra installed, the examples prepared.
# RUNTIME=containerd: gpudra installed with Helm from the image, every example container run (root).
demo: $(STAMP) k8s $(if $(filter containerd,$(RUNTIME)),image)
	$(if $(filter containerd,$(RUNTIME)),bash deploy/local/build-runtime.sh >/dev/null)
	$(if $(filter containerd,$(RUNTIME)),bash deploy/local/build-helm.sh >/dev/null)
	$(BIN)/python -m tests.localcluster.demo --runtime $(RUNTIME) \
	  $(if $(filter containerd,$(RUNTIME)),--image $$(bash deploy/image/archive.sh))

cluster-up: $(STAMP) k8s $(if $(filter containerd,$(RUNTIME)),image)
	@$(BIN)/python -m tests.localcluster up $(if $(NODES),--nodes $(NODES)) --runtime $(RUNTIME) \
	  $(if $(filter containerd,$(RUNTIME)),--image $$(bash deploy/image/archive.sh))

cluster-down: $(STAMP)
	@$(BIN)/python -m tests.localcluster down

proto: $(STAMP)
	$(BIN)/python scripts/gen_proto.py

schemas: $(STAMP)
	$(BIN)/python -m gpudra.api.schema

# Issue 12: the image. The Dockerfile built by buildah (chroot isolation, no registry, no Docker engine)
# on a Debian base made with mmdebstrap, into ~/.cache/gpudra/image; needs root, installs mmdebstrap
# and buildah when missing. Cold about 2 minutes, then seconds. Ends with image-check, which runs
# `gpudra --help` in the image and prints its names and size. See deploy/image/.
.PHONY: image image-check image-archive image-push lock

image:
	bash deploy/image/build.sh
	bash deploy/image/check.sh

image-check:
	bash deploy/image/check.sh

# A docker-archive of the image for `ctr -n k8s.io images import`; prints its path.
image-archive: image
	bash deploy/image/archive.sh

# The newest build to a registry: make image-push IMAGE=registry.example.com/gpudra:0.1.0
image-push:
	bash deploy/image/push.sh $(IMAGE)

# deploy/image/requirements.lock from pyproject.toml's runtime dependencies; UPGRADE=1 takes the newest.
lock:
	PYTHON=$(PYTHON) bash deploy/image/lock.sh $(if $(UPGRADE),--upgrade)

# Issue 31: a release. `make release VERSION=x.y.z` (x.y.z: pyproject.toml's version) builds the wheel,
# sdist, the chart package, the image for linux/amd64 and linux/arm64 (arm64 under qemu-user emulation,
# every ELF checked to be aarch64) as one manifest list, an SBOM per image and SHA256SUMS into
# dist/release/x.y.z/ (deploy/release/release.sh); root. `make publish REGISTRY=host[:port]` pushes the
# image and the chart (an OCI artifact, oci://REGISTRY/charts/gpudra) there; PLAIN_HTTP=1 for a registry
# without TLS.
.PHONY: release publish
release: $(STAMP) helm
	@test -n "$(VERSION)" || { echo "make release: give VERSION=x.y.z (pyproject.toml's version)"; exit 2; }
	bash deploy/release/release.sh $(VERSION)

publish: helm
	@test -n "$(REGISTRY)" || { echo "make publish: give REGISTRY=host[:port][/path]"; exit 2; }
	PLAIN_HTTP=$(PLAIN_HTTP) bash deploy/release/publish.sh $(REGISTRY)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
