"""What the unit tests (and the fault layer's) share, kept out of the test modules: no test module
imports another (tests/unit/repo/test_layering.py).

- node: a simulated node's files (machine state, stand-in tools, CDI root, checkpoint, claims) and the
  DeviceState built on them as the plugin builds it at start-up.
- crash: the child process that runs one prepare or unprepare and SIGKILLs itself at a crash step.
- gpu_faults: one plugin instance's GPU health and fault recording in its publisher turn, to run two on
  a simulated node (a rolling update), one of them as a child that may SIGKILL itself.
- kube: fakes of the API server, one per part of it that gpudra calls: the claims a node reads, its
  events, the ResourceSlice half of the client, a claim's GET, the Event calls, Kube.request.
- api_client: the kubernetes ApiClient under Kube, and the responses it returns.
- leases: the leader elector's Leases, in memory.
- slices: the slice controller on the fake API server: device models, slice builder, controller, and
  the model a node serves.
- mig: a node's MIG partitions as the card and the checkpoint have them, and a MIG claim.
- cluster: a cluster as the controller sees it: slices of hand-built nodes, claims, DeviceClasses.
- tls: the webhook's serving certificate for 127.0.0.1, and a client that trusts it.
- mps: the stand-in MPS daemons of a node: configs, their directories, what runs, and cleaning up.
- tools: fakes of the GPU tools and of Sharing: counting runs, failing on one GPU, recording only.

Claim objects and hand-built inventories stay in tests/unit/claims.py and tests/unit/inventories.py.
"""
