# gpudra image: one `gpudra` CLI; `gpudra kubelet-plugin` (DaemonSet) and `gpudra controller` (Deployment).
# NVML comes from the host driver at run time (libnvidia-ml.so.1 mounted by the NVIDIA Container
# Toolkit or the GPU Operator); nothing NVIDIA is baked in.
#
# BASE: any Debian-based image with python3 3.11 and CA certificates. `make image` makes it from Debian
# packages (deploy/image/base.sh) and builds with buildah --pull=never; with a registry instead:
#   docker build --build-arg BASE=python:3.11-slim .
ARG BASE=localhost/gpudra-base:bookworm-amd64
# WHEEL_BASE: the base for the building machine's own architecture, where gpudra's wheel is made. The
# wheel is pure Python, the same for every architecture: built natively, it costs seconds, where under
# qemu-user emulation (an arm64 image on an amd64 host) pip's build of it took minutes per commit.
# `make image` passes the host's base and platform (buildah 1.28 sets no BUILDPLATFORM, and takes a
# base of another architecture than --arch only with FROM --platform); by default it is BASE, on the
# platform `docker build` runs on.
ARG WHEEL_BASE=${BASE}
ARG WHEEL_PLATFORM=${BUILDPLATFORM}
# The stages after it name the target platform again: buildah 1.28 keeps a stage's FROM --platform for
# the stages that follow, and would look for an arm64 BASE as amd64.
ARG TARGETPLATFORM

FROM --platform=${WHEEL_PLATFORM} ${WHEEL_BASE} AS wheel
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# A venv needs ensurepip, which Debian's python3 keeps in python3-venv: the build stages add it when the
# base lacks it (gpudra's base leaves it out so the final image has no pip; python:3.11-slim has it).
RUN python3 -m venv /opt/wheel 2>/dev/null \
 || { apt-get update && apt-get install -y --no-install-recommends python3-venv \
      && rm -rf /var/lib/apt/lists/* && python3 -m venv --clear /opt/wheel; }
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN /opt/wheel/bin/pip wheel --no-deps --wheel-dir /tmp/wheels .

FROM --platform=${TARGETPLATFORM} ${BASE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/gpudra 2>/dev/null \
 || { apt-get update && apt-get install -y --no-install-recommends python3-venv \
      && rm -rf /var/lib/apt/lists/* && python3 -m venv --clear /opt/gpudra; }
# The pinned dependency set first (`make lock`), so its layer is reused until the lock changes. Every
# file is checked against the lock's sha256 and every dependency of a dependency must be in the lock;
# binary wheels only, so nothing is compiled.
COPY deploy/image/requirements.lock /tmp/requirements.lock
RUN /opt/gpudra/bin/pip install --require-hashes --only-binary=:all: -r /tmp/requirements.lock
# gpudra's own wheel, without dependencies: `pip check` proves the locked set satisfies it. Then pip and
# setuptools leave the venv, which is all the final stage takes.
COPY --from=wheel /tmp/wheels /tmp/wheels
RUN /opt/gpudra/bin/pip install --no-deps --no-index /tmp/wheels/gpudra-*.whl \
 && /opt/gpudra/bin/pip check \
 && /opt/gpudra/bin/pip uninstall --yes --quiet pip setuptools

FROM --platform=${TARGETPLATFORM} ${BASE}
COPY --from=build /opt/gpudra /opt/gpudra
RUN groupadd --gid 10001 gpudra \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin gpudra
ENV PATH=/opt/gpudra/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin PYTHONUNBUFFERED=1
# The git revision built (`make image` passes it): `gpudra --version`, the start-up log line and the
# gpudra_build_info series name it (gpudra.build). Last, so a new commit rebuilds no layer above.
ARG REVISION=unknown
ENV GPUDRA_REVISION=${REVISION}
# The kubelet plugin needs root on the node (kubelet sockets, /dev, nvidia-smi); the chart sets it.
USER 10001:10001
ENTRYPOINT ["gpudra"]
CMD ["--help"]
