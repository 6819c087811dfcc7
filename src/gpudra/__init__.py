"""gpudra: a Kubernetes Dynamic Resource Allocation driver for NVIDIA GPUs. Its version: gpudra.build."""
