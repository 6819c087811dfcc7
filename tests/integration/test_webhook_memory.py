"""The controller's memory under a burst of the largest admission reviews the API server can send: a
real `gpudra controller` process on the real control plane, 32 reviews at once straight to its webhook
port (as 32 concurrent UPDATEs of claims as large as etcd stores would arrive), and 32 more over the
body limit. It prints the process's peak resident memory (VmHWM); nothing is timed, and the only
memory assertion is the chart's limit (256 Mi)."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import ssl
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpudra.controller.webhook import ETCD_MAX_REQUEST_BYTES, MAX_BODY_BYTES
from tests.localcluster import LocalCluster
from tests.localcluster.cluster import free_port
from tests.localcluster.controller import NAMESPACE, ControllerProcess

from .kube_helpers import wait_for

CONCURRENT = 32
CHART_MEMORY_LIMIT_MIB = 256
DRIVER = "gpu.gpudra.io"
# The flooding pod's address: loopback, but not the API server's 127.0.0.1.
FLOODING_POD = "127.0.0.2"


@pytest.fixture(scope="module")
def controller(cluster: LocalCluster, api: client.ApiClient) -> Iterator[ControllerProcess]:
    core = client.CoreV1Api(api)
    try:
        core.create_namespace({"metadata": {"name": NAMESPACE}})
    except ApiException as err:
        if err.status != 409:
            raise
    replica = ControllerProcess(cluster, "ctl-memory", webhook_url_port=free_port())
    try:
        replica.start()
        yield replica
    finally:
        replica.stop()
        admission = client.AdmissionregistrationV1Api(api)
        try:  # what the replica registered, so that later tests' claims do not call it
            admission.delete_validating_webhook_configuration("gpudra")
        except ApiException as err:
            if err.status != 404:  # not registered, or already removed: nothing to clean up
                raise


def _memory_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields


def _review(size: int) -> bytes:
    """An UPDATE of a claim with a gpudra config, object and oldObject each about `size` bytes."""
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "big", "namespace": "default", "annotations": {"pad": "x" * (size - 1024)}},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}],
                "config": [
                    {
                        "opaque": {
                            "driver": DRIVER,
                            "parameters": {"apiVersion": "resource.gpudra.io/v1beta1", "kind": "GpuConfig"},
                        }
                    }
                ],
            }
        },
    }
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0d6cbd0c-0000-4000-8000-000000000001",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "operation": "UPDATE",
            "object": claim,
            "oldObject": claim,
        },
    }
    return json.dumps(review).encode()


def _trusting_the_webhook(api: client.ApiClient) -> ssl.SSLContext:
    """A TLS context that trusts the CA in the webhook's Secret, once the controller has written it."""
    core = client.CoreV1Api(api)
    secret = wait_for(
        "the webhook secret",
        lambda: _or_none(lambda: core.read_namespaced_secret("gpudra-webhook-tls", NAMESPACE)),
    )
    return ssl.create_default_context(cadata=base64.b64decode(secret.data["ca.crt"]).decode())


def _post(port: int, context: ssl.SSLContext, body: bytes, *, source: str = "127.0.0.1") -> int:
    """POST `body` to the webhook from the loopback address `source` (all of 127/8 is this host's)."""
    connection = http.client.HTTPSConnection(
        "127.0.0.1", port, context=context, timeout=60, source_address=(source, 0)
    )
    try:
        connection.putrequest("POST", "/validate")
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders()
        with contextlib.suppress(OSError):  # refused unread: the server may close before all is sent
            connection.send(body)
        return connection.getresponse().status
    finally:
        connection.close()


def test_32_concurrent_largest_reviews_stay_under_the_charts_memory_limit(
    controller: ControllerProcess, api: client.ApiClient
) -> None:
    context = _trusting_the_webhook(api)
    port = controller.webhook_url_port
    assert controller.process is not None
    pid = controller.process.pid
    before = _memory_kib(pid)

    largest = _review(ETCD_MAX_REQUEST_BYTES)
    assert len(largest) <= MAX_BODY_BYTES
    with ThreadPoolExecutor(CONCURRENT) as pool:
        statuses = list(pool.map(lambda _: _post(port, context, largest), range(CONCURRENT)))
    after_largest = _memory_kib(pid)

    over = b"x" * (MAX_BODY_BYTES + 1)
    with ThreadPoolExecutor(CONCURRENT) as pool:
        refused = list(pool.map(lambda _: _post(port, context, over), range(CONCURRENT)))
    after_over = _memory_kib(pid)

    print(
        f"\ncontroller memory, {CONCURRENT} concurrent reviews of {len(largest) / 2**20:.2f} MiB "
        f"(statuses {sorted(set(statuses))}), then {CONCURRENT} of {len(over) / 2**20:.2f} MiB "
        f"(statuses {sorted(set(refused))}):\n"
        f"  RSS before {before['VmRSS'] / 1024:.0f} MiB; peak (VmHWM) after the largest "
        f"{after_largest['VmHWM'] / 1024:.0f} MiB, after the oversized {after_over['VmHWM'] / 1024:.0f} MiB; "
        f"RSS at the end {after_over['VmRSS'] / 1024:.0f} MiB"
    )
    assert set(statuses) <= {200, 503} and 200 in statuses
    assert set(refused) == {413}
    assert after_over["VmHWM"] / 1024 < CHART_MEMORY_LIMIT_MIB


def _or_none(read: Any) -> Any:
    try:
        return read()
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def _dense_review() -> bytes:
    """A CREATE of a claim whose gpudra config is 900,000 empty objects: 2.6 MiB of JSON, which Python
    would decode into some 80 MiB of dicts."""
    review = json.loads(_review(4096))
    review["request"]["operation"] = "CREATE"
    review["request"]["oldObject"] = None
    review["request"]["object"]["spec"]["devices"]["config"][0]["opaque"]["parameters"]["pad"] = [
        {}
    ] * 900_000
    return json.dumps(review, separators=(",", ":")).encode()


def test_an_object_dense_flood_neither_exhausts_memory_nor_crowds_out_the_api_servers_reviews(
    controller: ControllerProcess, api: client.ApiClient
) -> None:
    """40 clients of one pod sending object-dense reviews straight to the webhook port without pause:
    each is denied unread; meanwhile the API server's own reviews are answered (a good claim is created,
    a bad one refused with gpudra's words), and the process stays under the chart's memory limit.

    The flood comes from another address than the API server's, as a pod's does: the bodies being read
    are bounded per address, so that a flooding pod never holds the API server's turn. (From the API
    server's own address the flood took that turn on a loaded machine, 5 s and a 503, and the bad claim
    was let through by the failurePolicy.)"""
    context = _trusting_the_webhook(api)
    port = controller.webhook_url_port
    assert controller.process is not None
    pid = controller.process.pid
    dense = _dense_review()
    assert len(dense) <= MAX_BODY_BYTES
    flooding = threading.Event()
    flooding.set()
    statuses: list[int] = []

    def flood() -> None:
        while flooding.is_set():
            statuses.append(_post(port, context, dense, source=FLOODING_POD))

    resources = client.CustomObjectsApi(api)

    def claim(name: str, strategy: str) -> dict[str, Any]:
        parameters = {"apiVersion": "resource.gpudra.io/v1beta1", "kind": "GpuConfig"}
        parameters["sharing"] = {"strategy": strategy}
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpudra.io"}}],
                    "config": [{"opaque": {"driver": DRIVER, "parameters": parameters}}],
                }
            },
        }

    def create(name: str, strategy: str) -> None:
        resources.create_namespaced_custom_object(
            "resource.k8s.io", "v1", "default", "resourceclaims", claim(name, strategy)
        )

    with ThreadPoolExecutor(40) as pool:
        for _ in range(40):
            pool.submit(flood)
        try:
            wait_for("the flood under way", lambda: len(statuses) >= 40, timeout=60)
            create("flood-good", "TimeSlicing")
            with pytest.raises(ApiException) as refused:
                create("flood-bad", "Sometimes")
        finally:
            flooding.clear()
    memory = _memory_kib(pid)
    resources.delete_namespaced_custom_object(
        "resource.k8s.io", "v1", "default", "resourceclaims", "flood-good"
    )
    print(
        f"\nobject-dense flood: {len(statuses)} reviews of {len(dense) / 2**20:.2f} MiB from 40 clients "
        f"(statuses {sorted(set(statuses))}); controller peak (VmHWM) {memory['VmHWM'] / 1024:.0f} MiB"
    )
    assert refused.value.status == 400 and "sharing.strategy" in str(refused.value.body)
    assert set(statuses) <= {200, 503} and 200 in statuses
    assert memory["VmHWM"] / 1024 < CHART_MEMORY_LIMIT_MIB
