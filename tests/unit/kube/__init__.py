"""The Kubernetes boundary (gpudra.kube): the client's errors and requests, claim reads, events, slice
sync."""
