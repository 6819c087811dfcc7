"""50 pods created at once, each with its own claim for a whole GPU: all are prepared in turn, and no
device is ever prepared for two claims at the same time.

The two nodes with whole GPUs have 14 between them, so pods run in waves: the test deletes each pod as
soon as it runs, which frees its GPU for a pending one, while it samples the plugins' checkpoints.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter

from kubernetes import client, utils

from tests.localcluster.node_plugin import PluginProcess

from .kube_helpers import claim_pod, claim_template, wait_for

PODS = 50


def test_fifty_pods_at_once_all_prepared_never_sharing_a_device(
    api: client.ApiClient, gpudra: dict[str, PluginProcess]
) -> None:
    core = client.CoreV1Api(api)
    ns = f"load-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    utils.create_from_yaml(api, yaml_objects=[claim_template("gpu")], namespace=ns)

    overlaps: list[str] = []
    stop = threading.Event()

    def watch_checkpoints() -> None:
        while not stop.is_set():
            for name, plugin in gpudra.items():
                held = Counter(d["device"] for c in plugin.checkpoint_claims().values() for d in c["devices"])
                overlaps.extend(f"{name}/{dev}" for dev, n in held.items() if n > 1)
            time.sleep(0.05)

    sampler = threading.Thread(target=watch_checkpoints)
    sampler.start()
    started = time.monotonic()
    try:
        for i in range(PODS):
            core.create_namespaced_pod(ns, claim_pod(f"p{i:02d}", {"gpu": "gpu"}))
        ran: dict[str, str] = {}

        def churn() -> bool:
            for pod in core.list_namespaced_pod(ns).items:
                if pod.status.phase == "Running" and pod.metadata.name not in ran:
                    ran[pod.metadata.name] = pod.spec.node_name
                    core.delete_namespaced_pod(pod.metadata.name, ns, grace_period_seconds=0)
            return len(ran) == PODS

        wait_for(f"all {PODS} pods to run", churn, timeout=400)
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        sampler.join()
    print(f"{PODS} pods prepared in {elapsed:.1f}s across {sorted(Counter(ran.values()).items())}")
    assert overlaps == []
    assert set(ran.values()) <= {"node-h100", "node-mixed"}
    wait_for(
        "every claim unprepared", lambda: all(not p.checkpoint_claims() for p in gpudra.values()), timeout=120
    )
    core.delete_namespace(ns)
