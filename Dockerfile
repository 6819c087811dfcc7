# gpudra image: the `gpudra` CLI (kubelet-plugin; inventory and validate for debugging).
# NVML comes from the host driver at run time (libnvidia-ml.so.1 mounted by the NVIDIA Container
# Toolkit or the GPU Operator); nothing NVIDIA is baked in.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir /wheels/*.whl && useradd --system --uid 10001 gpudra
# The kubelet plugin needs root on the node (kubelet sockets, /dev, nvidia-smi); the chart sets it.
USER 10001
ENTRYPOINT ["gpudra"]
CMD ["--help"]
