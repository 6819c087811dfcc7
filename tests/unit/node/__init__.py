"""The kubelet plugin (gpudra.node): prepare and unprepare, CDI, the checkpoint, sharing, MIG, device
health, usage."""
