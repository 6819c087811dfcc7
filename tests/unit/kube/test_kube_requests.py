"""`Kube` counts every request it sends (gpudra_api_requests_total), by the verb and resource the API
server would name: no caller counts by hand. The labels are the ones dashboards already use."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest
import urllib3

from gpudra.errors import ClusterError
from gpudra.kube.admission import AdmissionObjects, cluster_role_owner
from gpudra.kube.claim_status import ClaimStatus
from gpudra.kube.client import Kube, NotFound, request_kind
from gpudra.kube.lease import LeaseRecord, Leases
from tests.unit.harness.api_client import FakeApiClient


def kube(api: FakeApiClient | None = None) -> Kube:
    return Kube(api or FakeApiClient())


CLAIM = {"metadata": {"namespace": "ns", "name": "c", "uid": "u-1", "resourceVersion": "7"}, "status": {}}
RECORD = LeaseRecord("me", 15, datetime(2026, 1, 1, tzinfo=UTC), None, 0)

# Every call gpudra makes, and the (verb, resource) it was counted as when callers counted by hand.
CALLS: list[tuple[str, Callable[[Kube], object], tuple[str, str]]] = [
    ("server_minor", lambda k: k.server_minor(), ("get", "version")),
    ("node_uid", lambda k: k.node_uid("n1"), ("get", "nodes")),
    ("list_slices", lambda k: k.list_slices(driver="d", node_name="n1"), ("list", "resourceslices")),
    (
        "watch_slices",
        lambda k: k.watch_slices(driver="d", node_name="n1", resource_version="7", timeout_seconds=300),
        ("watch", "resourceslices"),
    ),
    (
        "watch",
        lambda k: k.watch(
            "resourceclaims",
            "/apis/resource.k8s.io/v1/resourceclaims",
            resource_version="7",
            timeout_seconds=1,
        ),
        ("watch", "resourceclaims"),
    ),
    (
        "list_page",
        lambda k: k.list_page("deviceclasses", "/apis/resource.k8s.io/v1/deviceclasses"),
        ("list", "deviceclasses"),
    ),
    ("create_slice", lambda k: k.create_slice({"metadata": {"name": "s"}}), ("create", "resourceslices")),
    ("replace_slice", lambda k: k.replace_slice({"metadata": {"name": "s"}}), ("update", "resourceslices")),
    ("delete_slice", lambda k: k.delete_slice("s"), ("delete", "resourceslices")),
    ("get_claim", lambda k: k.get_claim("ns", "c"), ("get", "resourceclaims")),
    (
        "create_node_event",
        lambda k: k.create_node_event(node_name="n1", node_uid="u", event={}),
        ("create", "events"),
    ),
    ("patch_node_event", lambda k: k.patch_node_event("n1.abc", {"count": 2}), ("patch", "events")),
    ("list_node_events", lambda k: k.list_node_events("n1"), ("list", "events")),
    ("list_device_classes", lambda k: k.list_device_classes(), ("list", "deviceclasses")),
    ("list_all_slices", lambda k: k.list_all_slices(), ("list", "resourceslices")),
    ("list_all_claims", lambda k: k.list_all_claims(), ("list", "resourceclaims")),
    ("get_claim_template", lambda k: k.get_claim_template("ns", "t"), ("get", "resourceclaimtemplates")),
    ("get_pod", lambda k: k.get_pod("ns", "p"), ("get", "pods")),
    ("lease get", lambda k: Leases(k).get("ns", "l"), ("get", "leases")),
    ("lease create", lambda k: Leases(k).create("ns", "l", RECORD), ("create", "leases")),
    ("lease replace", lambda k: Leases(k).replace("ns", "l", RECORD), ("update", "leases")),
    ("get_secret", lambda k: AdmissionObjects(k).get_secret("ns", "s"), ("get", "secrets")),
    (
        "create_secret",
        lambda k: AdmissionObjects(k).create_secret("ns", {"metadata": {"name": "s"}}),
        ("create", "secrets"),
    ),
    (
        "replace_secret",
        lambda k: AdmissionObjects(k).replace_secret("ns", {"metadata": {"name": "s"}}),
        ("update", "secrets"),
    ),
    (
        "get_webhook_configuration",
        lambda k: AdmissionObjects(k).get_webhook_configuration("w"),
        ("get", "validatingwebhookconfigurations"),
    ),
    (
        "create_webhook_configuration",
        lambda k: AdmissionObjects(k).create_webhook_configuration({"metadata": {"name": "w"}}),
        ("create", "validatingwebhookconfigurations"),
    ),
    (
        "replace_webhook_configuration",
        lambda k: AdmissionObjects(k).replace_webhook_configuration({"metadata": {"name": "w"}}),
        ("update", "validatingwebhookconfigurations"),
    ),
    ("cluster_role_owner", lambda k: cluster_role_owner(k, "r"), ("get", "clusterroles")),
    (
        "apply_node_devices",
        lambda k: ClaimStatus(k).apply_node_devices(
            node_name="n1", namespace="ns", name="c", uid="u", devices=[]
        ),
        ("patch", "resourceclaims/status"),
    ),
    (
        "replace_devices",
        lambda k: ClaimStatus(k).replace_devices(CLAIM, []),
        ("update", "resourceclaims/status"),
    ),
]


@pytest.mark.parametrize(("call", "counted"), [(c, k) for _, c, k in CALLS], ids=[n for n, _, _ in CALLS])
def test_every_call_is_counted_once_under_the_labels_it_always_had(
    call: Callable[[Kube], object], counted: tuple[str, str]
) -> None:
    k = kube()
    call(k)
    assert k.request_counts() == {counted: 1}


@pytest.mark.parametrize(
    "api",
    [FakeApiClient(status=500), FakeApiClient(error=urllib3.exceptions.ProtocolError("reset"))],
    ids=["HTTP 500", "connection reset"],
)
def test_a_failed_request_is_counted_too(api: FakeApiClient) -> None:
    k = kube(api)
    with pytest.raises(ClusterError):
        k.get_claim("ns", "c")
    with pytest.raises(ClusterError):
        k.get_claim("ns", "c")
    assert k.request_counts() == {("get", "resourceclaims"): 2}


def test_a_slice_gone_already_is_deleted_quietly_and_counted() -> None:
    k = kube(FakeApiClient(status=404))
    k.delete_slice("s")
    assert k.request_counts() == {("delete", "resourceslices"): 1}
    with pytest.raises(NotFound):
        k.get_claim("ns", "c")


def test_slice_writes_go_to_the_collection_and_the_named_slice_with_dry_run_as_asked() -> None:
    api = FakeApiClient()
    k = kube(api)
    k.create_slice({"metadata": {"name": "s"}}, dry_run=True)
    k.replace_slice({"metadata": {"name": "a/b"}})
    k.delete_slice("s")
    k.list_slices(driver="d", node_name="n1")
    base = "/apis/resource.k8s.io/v1/resourceslices"
    assert api.sent == [
        ("POST", base, [("dryRun", "All")]),
        ("PUT", f"{base}/a%2Fb", []),
        ("DELETE", f"{base}/s", []),
        ("GET", base, [("fieldSelector", "spec.driver=d,spec.nodeName=n1")]),
    ]


@pytest.mark.parametrize(
    ("method", "path", "watch", "kind"),
    [
        ("GET", "/version", False, ("get", "version")),
        ("GET", "/api/v1/namespaces", False, ("list", "namespaces")),
        ("GET", "/api/v1/namespaces/ns", False, ("get", "namespaces")),
        ("GET", "/api/v1/namespaces/ns/pods", True, ("watch", "pods")),
        ("DELETE", "/api/v1/namespaces/ns/pods", False, ("deletecollection", "pods")),
        (
            "PATCH",
            "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status",
            False,
            ("patch", "resourceclaims/status"),
        ),
        ("PUT", "/apis/resource.k8s.io/v1/resourceslices/s?dryRun=All", False, ("update", "resourceslices")),
        ("HEAD", "/apis/resource.k8s.io/v1/deviceclasses/c", False, ("head", "deviceclasses")),
    ],
)
def test_request_kind_names_verb_and_resource_as_the_api_server_does(
    method: str, path: str, watch: bool, kind: tuple[str, str]
) -> None:
    assert request_kind(method, path, watch=watch) == kind
