"""The scheduler's side, ported (gpudra.scheduling): CEL, the allocator and explain, node fit, the cluster
view."""
