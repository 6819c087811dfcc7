"""Generated kubelet gRPC stubs (from proto/); regenerate with `python scripts/gen_proto.py`."""
