"""`make bench`: gpudra's kubelet plugin measured side by side with the reference DRA driver (issue 15).

Both plugins run as processes against one real API server and are driven over their sockets by the
same gRPC client, which plays the kubelet; `python -m tests.bench --help` lists the knobs.
"""
