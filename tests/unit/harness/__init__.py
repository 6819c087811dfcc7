"""What the unit tests of the node plugin share, kept out of the test modules.

- node: a simulated node's files (machine state, stand-in tools, CDI root, checkpoint, claims) and the
  DeviceState built on them as the plugin builds it at start-up.
- crash: the child process that runs one prepare or unprepare and SIGKILLs itself at a crash step.
- gpu_faults: one plugin instance's GPU health and fault recording in its publisher turn, to run two on
  a simulated node (a rolling update), one of them as a child that may SIGKILL itself.
- kube: fakes of the API server: the claims a node reads, its events, and the ResourceSlice half of
  the client.
- slices: the slice controller on the fake API server: device models, slice builder, controller.
- mps: the stand-in MPS daemons of a node: configs, their directories, what runs, and cleaning up.
- tools: fakes of the GPU tools and of Sharing: counting runs, failing on one GPU, recording only.

Claim objects and hand-built inventories stay in tests/unit/claims.py and tests/unit/inventories.py.
"""
