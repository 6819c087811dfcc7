"""The GPU boundary (gpudra.gpu: NVML, the tools, the driver root) and the simulated driver behind it
(gpudra.sim)."""
