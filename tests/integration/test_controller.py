"""`gpudra controller` as a real process against the real control plane and the three simulated nodes:
admission through the API server, certificates it manages itself, `gpudra status` against a hand count,
idle GPUs, and two replicas electing a leader."""

from __future__ import annotations

import base64
import json
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from kubernetes import client, utils
from kubernetes.client.exceptions import ApiException

from gpudra import sim
from gpudra.model import claim_usage
from gpudra.model.manifests import validate_documents
from tests.localcluster import LocalCluster, examples
from tests.localcluster.clock_step import stepped_clock_env
from tests.localcluster.cluster import free_port
from tests.localcluster.controller import NAMESPACE, ControllerProcess
from tests.localcluster.node_plugin import DRIVER, PluginProcess
from tests.localcluster.processes import http_get

from .kube_helpers import (
    DEEP,
    RESOURCE,
    Resources,
    claim_pod,
    claim_template,
    new_namespace,
    pod_running,
    raw_request,
    wait_for,
    wait_scale,
)

REPO = Path(__file__).resolve().parents[2]
IDLE_AFTER = 5.0
LEASE_SECONDS = 6.0
WEBHOOK_CONFIGURATION = "gpudra"
SECRET = "gpudra-webhook-tls"


@pytest.fixture(scope="module")
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture(scope="module")
def resources(api: client.ApiClient) -> Resources:
    return Resources(api)


@pytest.fixture(scope="module")
def controller(
    cluster: LocalCluster, api: client.ApiClient, gpudra: dict[str, PluginProcess]
) -> Iterator[ControllerProcess]:
    core = client.CoreV1Api(api)
    try:
        core.create_namespace({"metadata": {"name": NAMESPACE}})
    except ApiException as err:
        if err.status != 409:
            raise
    replica = ControllerProcess(
        cluster,
        "ctl-a",
        webhook_url_port=free_port(),
        idle_after_seconds=IDLE_AFTER,
        lease_seconds=LEASE_SECONDS,
    )
    replica.start()
    try:
        wait_for("the webhook configuration", lambda: _webhook_configuration(api))
        yield replica
    finally:
        replica.stop()
        # With the controller gone, a Fail policy would refuse every claim with a gpudra config that
        # later tests create: the configuration goes with it, as `helm uninstall` would take it.
        admission = client.AdmissionregistrationV1Api(api)
        admission.delete_validating_webhook_configuration(WEBHOOK_CONFIGURATION)


def _webhook_configuration(api: client.ApiClient) -> dict[str, Any] | None:
    try:
        found = client.AdmissionregistrationV1Api(api).read_validating_webhook_configuration(
            WEBHOOK_CONFIGURATION
        )
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return dict(api.sanitize_for_serialization(found))


def _secret(core: client.CoreV1Api) -> client.V1Secret:
    return core.read_namespaced_secret(SECRET, NAMESPACE)


def _bad_config() -> dict[str, Any]:
    return {
        "apiVersion": "resource.gpudra.io/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "Sometimes"},
    }


def _claim(name: str, parameters: dict[str, Any], *, driver: str = DRIVER) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpudra.io"}}],
                "config": [{"requests": ["gpu"], "opaque": {"driver": driver, "parameters": parameters}}],
            }
        },
    }


def _rejection(create: Any) -> str:
    with pytest.raises(ApiException) as err:
        create()
    body = json.loads(err.value.body)
    assert body["reason"] != "InternalError", body
    return str(body["message"])


# --- admission -----------------------------------------------------------------------------------


def test_a_bad_gpudra_config_is_rejected_with_the_field_path_and_allowed_values(
    controller: ControllerProcess, resources: Resources, core: client.CoreV1Api
) -> None:
    namespace = new_namespace(core, "admission")
    bad = _claim("bad", _bad_config())
    message = _rejection(lambda: resources.create("resourceclaims", bad, namespace))
    [problem] = validate_documents(
        [("", {**bad, "metadata": {"name": "bad", "namespace": namespace}})], driver=DRIVER
    )
    # The same words `gpudra validate` and the plugin use.
    assert problem.field == "spec.devices.config[0].opaque.parameters.sharing.strategy"
    assert problem.field in message and problem.message in message, message
    assert "TimeSlicing" in message and "MPS" in message

    good = _claim("good", {"apiVersion": "resource.gpudra.io/v1beta1", "kind": "GpuConfig"})
    resources.create("resourceclaims", good, namespace)
    other = _claim("other", {"whatever": ["not", "ours"]}, driver="nic.example.com")
    resources.create("resourceclaims", other, namespace)

    template = claim_template("bad-template", _bad_config())
    message = _rejection(lambda: resources.create("resourceclaimtemplates", template, namespace))
    assert "spec.spec.devices.config[0].opaque.parameters.sharing.strategy" in message, message
    resources.create("resourceclaimtemplates", claim_template("good-template", None), namespace)

    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "bad-class.gpudra.io"},
        "spec": {"config": [{"opaque": {"driver": DRIVER, "parameters": _bad_config()}}]},
    }
    message = _rejection(lambda: resources.create("deviceclasses", device_class))
    assert "spec.config[0].opaque.parameters.sharing.strategy" in message, message


def test_a_request_no_node_can_match_is_admitted_with_a_warning(
    controller: ControllerProcess, api: client.ApiClient, core: client.CoreV1Api
) -> None:
    namespace = new_namespace(core, "warning")
    custom = client.CustomObjectsApi(api)
    h200 = f'device.attributes["{DRIVER}"].productName == "NVIDIA H200"'
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "h200"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.gpudra.io",
                            "selectors": [{"cel": {"expression": h200}}],
                        },
                    }
                ]
            }
        },
    }
    _, status, headers = custom.create_namespaced_custom_object_with_http_info(
        *RESOURCE, namespace, "resourceclaims", body
    )
    assert status == 201
    warning = headers.get("Warning", "")
    assert "spec.devices.requests[0] (gpu): no GPU published by any node matches" in warning, headers
    body["metadata"]["name"] = "h100"
    body["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"] = h200.replace(
        "H200", "H100 80GB HBM3"
    )
    _, _, headers = custom.create_namespaced_custom_object_with_http_info(
        *RESOURCE, namespace, "resourceclaims", body
    )
    assert "Warning" not in headers


def test_time_slicing_a_mig_device_is_admitted_with_the_config_webhooks_warning(
    controller: ControllerProcess, api: client.ApiClient, core: client.CoreV1Api
) -> None:
    namespace = new_namespace(core, "mig-time-slicing")
    parameters = {
        "apiVersion": "resource.gpudra.io/v1beta1",
        "kind": "MigDeviceConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
    }
    body = _claim("mig-ts", parameters)
    body["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "mig.gpudra.io"
    _, status, headers = client.CustomObjectsApi(api).create_namespaced_custom_object_with_http_info(
        *RESOURCE, namespace, "resourceclaims", body
    )
    assert status == 201
    warning = headers.get("Warning", "")
    assert (
        "spec.devices.config[0].opaque.parameters.sharing.strategy: TimeSlicing on a MIG device sets "
        "nothing" in warning
    ), headers
    assert "interval Long is not applied" in warning, headers


def test_the_certificate_is_made_once_trusted_and_survives_a_restart(
    controller: ControllerProcess, api: client.ApiClient, core: client.CoreV1Api, resources: Resources
) -> None:
    secret = _secret(core)
    configuration = _webhook_configuration(api)
    assert configuration is not None
    bundles = {w["clientConfig"]["caBundle"] for w in configuration["webhooks"]}
    assert bundles == {secret.data["ca.crt"]}  # the API server trusts the controller's own CA
    controller.stop()
    controller.start()
    assert _secret(core).metadata.resource_version == secret.metadata.resource_version
    again = _webhook_configuration(api)
    assert again is not None
    assert again["metadata"]["resourceVersion"] == configuration["metadata"]["resourceVersion"]
    namespace = new_namespace(core, "restart")
    message = _rejection(lambda: resources.create("resourceclaims", _claim("bad", _bad_config()), namespace))
    assert "sharing.strategy" in message
    assert base64.b64decode(secret.data["tls.crt"]).startswith(b"-----BEGIN CERTIFICATE-----")


STEP_DAYS = 250


def test_a_leader_whose_wall_clock_runs_250_days_ahead_issues_certificates_the_api_server_accepts(
    cluster: LocalCluster,
    controller: ControllerProcess,
    api: client.ApiClient,
    core: client.CoreV1Api,
    resources: Resources,
) -> None:
    """Issue 44: a leader whose wall clock was stepped 250 days ahead (its monotonic clock and the API
    server's clock right) makes the webhook's CA and serving certificate afresh, dated by the API
    server's time: the API server accepts them, so a good claim is admitted and a bad one refused with
    gpudra's words. Dated by the local clock, the certificate was not yet valid to the API server
    and every claim with a gpudra config was refused."""
    controller.stop()
    core.delete_namespaced_secret(SECRET, NAMESPACE)  # nothing left to keep: all issued while stepped
    stepped = ControllerProcess(
        cluster,
        "ctl-stepped",
        webhook_url_port=controller.webhook_url_port,
        idle_after_seconds=IDLE_AFTER,
        lease_seconds=LEASE_SECONDS,
        env=stepped_clock_env(f"+{STEP_DAYS}d"),
    )
    try:
        stepped.start()
        wait_for("the stepped replica to lead", stepped.leading, timeout=3 * LEASE_SECONDS)

        def issued() -> client.V1Secret | None:
            try:
                return _secret(core)
            except ApiException as err:
                if err.status == 404:
                    return None
                raise

        secret = wait_for("the webhook Secret made again", issued)
        assert secret is not None

        def bundles() -> set[str]:
            configuration = _webhook_configuration(api) or {}
            return {w["clientConfig"]["caBundle"] for w in configuration.get("webhooks", [])}

        wait_for("the configuration to trust the new CA", lambda: bundles() == {secret.data["ca.crt"]})
        now = datetime.now(UTC)
        for key in ("ca.crt", "tls.crt"):
            certificate = x509.load_pem_x509_certificate(base64.b64decode(secret.data[key]))
            assert certificate.not_valid_before_utc <= now <= certificate.not_valid_after_utc, key
            assert now - certificate.not_valid_before_utc < timedelta(hours=1), key  # not the local clock
        namespace = new_namespace(core, "stepped-clock")
        good = _claim("good", {"apiVersion": "resource.gpudra.io/v1beta1", "kind": "GpuConfig"})
        resources.create("resourceclaims", good, namespace)
        message = _rejection(
            lambda: resources.create("resourceclaims", _claim("bad", _bad_config()), namespace)
        )
        assert "sharing.strategy" in message, message
        skew = stepped.metrics().get("gpudra_clock_skew_seconds")
        assert skew is not None and abs(skew - STEP_DAYS * 86400) < 120, skew
        assert "this node's clock differs from the API server's" in stepped.log.read_text()
    finally:
        stepped.stop()
        controller.start()
    wait_for("the first replica to lead again", controller.leading, timeout=3 * LEASE_SECONDS)


# --- the cluster view ----------------------------------------------------------------------------


def _hand_count(resources: Resources) -> dict[str, dict[str, int]]:
    """Per node: physical GPUs (gpu-N, whatever devices of it are published), those some claim holds,
    those held by more than one claim or pod, and the free ones. Counted here from the API's objects,
    independently of gpudra.scheduling.cluster_view."""
    gpus: dict[str, set[str]] = defaultdict(set)
    for piece in resources.list("resourceslices"):
        if piece["spec"]["driver"] == DRIVER:
            for device in piece["spec"].get("devices", []):
                gpus[piece["spec"]["nodeName"]].add(re.match(r"gpu-\d+", device["name"]).group())
    holders: dict[tuple[str, str], set[str]] = defaultdict(set)
    pods: dict[str, int] = {}
    for claim in resources.list("resourceclaims"):
        uid = claim["metadata"]["uid"]
        pods[uid] = sum(1 for r in claim["status"].get("reservedFor", []) if r["resource"] == "pods")
        for result in (claim["status"].get("allocation") or {}).get("devices", {}).get("results", []):
            if result["driver"] == DRIVER and not result.get("adminAccess"):
                gpu = re.match(r"gpu-\d+", result["device"]).group()
                holders[(result["pool"], gpu)].add(uid)
    counts = {}
    for node, names in gpus.items():
        held = {g: holders[(node, g)] for g in names if holders.get((node, g))}
        shared = sum(1 for h in held.values() if len(h) > 1 or pods[next(iter(h))] > 1)
        counts[node] = {
            "gpus": len(names),
            "allocated": len(held),
            "shared": shared,
            "free": len(names) - len(held),
        }
    return counts


def _view_counts(rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = defaultdict(
        lambda: dict.fromkeys(("gpus", "allocated", "shared", "free"), 0)
    )
    for row in rows:
        for key in ("gpus", "allocated", "shared", "free"):
            counts[row["node"]][key] += row[key]
    return dict(counts)


def test_status_equals_a_hand_count_after_the_examples_run(
    controller: ControllerProcess, api: client.ApiClient, core: client.CoreV1Api, resources: Resources
) -> None:
    namespace = new_namespace(core, "examples")
    for example in examples.files(REPO):
        for obj in examples.objects(example, namespace=namespace):
            if obj["kind"] == "Pod":
                core.create_namespaced_pod(namespace, obj)
            else:
                resources.create(obj["kind"].lower() + "s", obj, namespace)
    names = [p.metadata.name for p in core.list_namespaced_pod(namespace).items]
    try:
        for name in names:
            wait_for(f"pod {name} running", partial(pod_running, core, name, namespace), timeout=180)
        hand = _hand_count(resources)
        assert sum(c["allocated"] for c in hand.values()) >= 10  # the examples hold GPUs on every node
        wait_for(
            "the controller's view to match the hand count",
            lambda: _view_counts(controller.status()["nodes"]) == hand,
            timeout=30,
        )
        shown = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpudra",
                "status",
                "-o",
                "json",
                *controller.endpoint().cli_args(controller.log.parent),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        view = json.loads(shown.stdout)
        assert (view["apiVersion"], view["kind"]) == ("gpudra.io/v1alpha1", "ClusterStatus")
        assert _view_counts(view["nodes"]) == hand
        # The default path: built from the API server's objects, as a user with a kubeconfig runs it.
        shown_table = subprocess.run(
            [sys.executable, "-m", "gpudra", "status", f"--kubeconfig={controller.cluster.kubeconfig}"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert shown_table.returncode == 0, shown_table.stderr
        table = shown_table.stdout
        total = next(line for line in table.splitlines() if line.startswith("TOTAL")).split()
        assert total[1:5] == [
            str(sum(c[k] for c in hand.values())) for k in ("gpus", "allocated", "shared", "free")
        ]
        assert "MIG GPUs with partitions allocated" in table
        metrics = controller.metrics()
        for node, counts in hand.items():
            for state, key in (("published", "gpus"), ("allocated", "allocated"), ("free", "free")):
                scraped = sum(
                    value
                    for sample, value in metrics.items()
                    if sample.startswith("gpudra_cluster_gpus{")
                    and f'node="{node}"' in sample
                    and f'state="{state}"' in sample
                )
                assert scraped == counts[key], (node, state, scraped, counts)
    finally:
        core.delete_namespace(namespace)
        for name in names:
            wait_for(f"pod {name} gone", partial(_pod_gone, core, name, namespace), timeout=120)


def _pod_gone(core: client.CoreV1Api, name: str, namespace: str) -> bool:
    try:
        core.read_namespaced_pod(name, namespace)
    except ApiException as err:
        return err.status == 404
    return False


def test_a_pending_gpu_claim_is_listed(
    controller: ControllerProcess, core: client.CoreV1Api, resources: Resources
) -> None:
    namespace = new_namespace(core, "pending")
    _pending_claim_and_pod(namespace, core, resources)
    pending = wait_for(
        "the claim among the pending ones",
        lambda: [p for p in controller.status()["pending"] if p["namespace"] == namespace],
        timeout=30,
    )
    assert pending[0]["name"] == "waits" and pending[0]["deviceClasses"] == ["gpu.gpudra.io"]


def _pending_claim_and_pod(namespace: str, core: client.CoreV1Api, resources: Resources) -> None:
    """Claim and pod "waits" in `namespace`: the claim asks an H200, which no node has, so both stay
    pending."""
    h200 = f'device.attributes["{DRIVER}"].productName == "NVIDIA H200"'
    body = _claim("waits", {"apiVersion": "resource.gpudra.io/v1beta1", "kind": "GpuConfig"})
    body["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": h200}}]
    resources.create("resourceclaims", body, namespace)
    spec = _pod_spec_for_claim("waits")
    core.create_namespaced_pod(
        namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "waits"}, "spec": spec}
    )


def _pod_spec_for_claim(claim: str) -> dict[str, Any]:
    return {
        "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
    }


# --- leader election -----------------------------------------------------------------------------


def test_two_replicas_one_leads_and_a_killed_leader_hands_over_within_the_lease_time(
    cluster: LocalCluster, controller: ControllerProcess, api: client.ApiClient, core: client.CoreV1Api
) -> None:
    # The second replica serves its webhook on a port of its own; the API server calls the first's URL.
    standby = ControllerProcess(
        cluster,
        "ctl-b",
        webhook_url_port=controller.webhook_url_port,
        bind_webhook_port=free_port(),
        idle_after_seconds=IDLE_AFTER,
        lease_seconds=LEASE_SECONDS,
    )
    standby.start()
    try:
        wait_for("one replica to lead", controller.leading, timeout=2 * LEASE_SECONDS)
        for _ in range(20):
            assert controller.leading() != standby.leading() or not controller.leading()
            time.sleep(0.1)
        assert not standby.leading()
        secret = _secret(core).metadata.resource_version
        configuration = _webhook_configuration(api)
        assert configuration is not None

        killed = time.monotonic()
        controller.kill()
        wait_for("the standby to lead", standby.leading, timeout=3 * LEASE_SECONDS)
        # Once the lease runs out, at the standby's next retry (a retry period of 0.8 s): the slack grows
        # with the machine's load as every bounded wait here does (wait_scale). The exact hand-over
        # times are tests/unit/controller/test_leader.py's, on a fake clock.
        assert time.monotonic() - killed <= LEASE_SECONDS + 3 * wait_scale()
        # Nothing written twice: the new leader found the Secret and the configuration as they must be.
        time.sleep(2)
        assert _secret(core).metadata.resource_version == secret
        again = _webhook_configuration(api)
        assert (
            again is not None
            and again["metadata"]["resourceVersion"] == configuration["metadata"]["resourceVersion"]
        )
        writes = {
            sample: value
            for sample, value in standby.metrics().items()
            if sample.startswith("gpudra_api_requests")
            and any(f'verb="{v}"' in sample for v in ("create", "update", "patch"))
            and ("secrets" in sample or "validatingwebhookconfigurations" in sample)
        }
        assert not any(writes.values()), writes
    finally:
        controller.start()  # as the follower; the standby's graceful stop hands the lease back at once
        standby.stop()
    wait_for("the first replica to lead again", controller.leading, timeout=2 * LEASE_SECONDS)


# --- metrics -------------------------------------------------------------------------------------

CONTROLLER_LOOPS = (
    "watch-resourceslices",
    "watch-resourceclaims",
    "watch-deviceclasses",
    "leader-election",
    "housekeeping",
    "webhook-certificates",
)


def test_the_controller_exports_its_loops_health_and_its_api_requests(controller: ControllerProcess) -> None:
    """Every background loop of the controller has its health series, each has got through at least once,
    and the requests it made are counted under the API server's verbs and resources."""
    wait_for("the controller to lead", controller.leading, timeout=2 * LEASE_SECONDS)
    metrics = controller.metrics()
    for loop in CONTROLLER_LOOPS:
        assert metrics[f'gpudra_background_healthy{{loop="{loop}"}}'] == 1, loop
        assert f'gpudra_background_failures{{loop="{loop}"}}' in metrics, loop
        last_success = metrics[f'gpudra_background_last_success_timestamp_seconds{{loop="{loop}"}}']
        assert 0 < last_success <= time.time(), loop
    for verb, resource in (("get", "leases"), ("list", "resourceclaims"), ("watch", "resourceclaims")):
        requests = f'gpudra_api_requests_total{{resource="{resource}",verb="{verb}"}}'
        assert metrics.get(requests, 0) >= 1, requests


def _claim_reviews(controller: ControllerProcess) -> float:
    return sum(
        value
        for sample, value in controller.metrics().items()
        if sample.startswith("gpudra_admission_reviews_total{") and 'kind="ResourceClaim"' in sample
    )


def _class_claim(name: str, device_class: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}},
    }


def test_a_claim_of_another_drivers_class_never_reaches_the_webhook_even_when_the_controller_hangs(
    controller: ControllerProcess, api: client.ApiClient, core: client.CoreV1Api, resources: Resources
) -> None:
    """The warnings webhook's matchCondition, as the real API server evaluates it: a claim of a class that
    does not select gpudra is not sent to the controller at all (no review counted), so a hung controller
    (SIGSTOP) costs it nothing, while a claim of gpudra's class waits out the 1 s timeout and is admitted
    (failurePolicy Ignore)."""
    namespace = new_namespace(core, "other-driver")
    other_class = f"gpu.other-{namespace}.example.com"
    resources.create(
        "deviceclasses",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": other_class},
            "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.other.example.com"'}}]},
        },
    )
    custom = client.CustomObjectsApi(api)
    try:
        wait_for("the controller to lead", controller.leading, timeout=2 * LEASE_SECONDS)
        before = _claim_reviews(controller)
        custom.create_namespaced_custom_object(
            *RESOURCE, namespace, "resourceclaims", _class_claim("ours", "gpu.gpudra.io")
        )
        wait_for("the warnings webhook to see gpudra's claim", lambda: _claim_reviews(controller) > before)
        before = _claim_reviews(controller)
        custom.create_namespaced_custom_object(
            *RESOURCE, namespace, "resourceclaims", _class_claim("theirs", other_class)
        )
        time.sleep(1)  # a review, had there been one, is counted by now
        assert _claim_reviews(controller) == before

        assert controller.process is not None
        controller.process.send_signal(signal.SIGSTOP)
        try:
            took = {}
            for name, device_class in (("theirs-hung", other_class), ("ours-hung", "gpu.gpudra.io")):
                began = time.monotonic()
                custom.create_namespaced_custom_object(
                    *RESOURCE, namespace, "resourceclaims", _class_claim(name, device_class)
                )
                took[name] = time.monotonic() - began
        finally:
            controller.process.send_signal(signal.SIGCONT)
        # Bounded by the webhook's 1 s timeout, not by a speed: gpudra's claim waits it out and is then
        # admitted; the other driver's claim is never sent to the webhook, so it does not wait it.
        assert took["theirs-hung"] < 0.9 <= took["ours-hung"], took
    finally:
        core.delete_namespace(namespace)
        resources.delete("deviceclasses", other_class)


def test_an_idle_time_is_bounded_by_the_claims_creation_time_when_the_node_clock_runs_behind(
    controller: ControllerProcess, api: client.ApiClient, core: client.CoreV1Api
) -> None:
    """The Idle condition a plugin whose clock runs a day behind would write (lastTransitionTime a day
    before the claim existed), put on a claim the real scheduler allocated: the controller reports it
    idle for no longer than the claim has existed, by the API server's clock."""
    namespace = new_namespace(core, "idle-clock")
    custom = client.CustomObjectsApi(api)
    try:
        utils.create_from_yaml(
            api,
            yaml_objects=[claim_template("one-gpu"), claim_pod("behind", {"gpu": "one-gpu"}, "node-mixed")],
            namespace=namespace,
        )
        pod = wait_for("pod running", partial(pod_running, core, "behind", namespace), timeout=90)
        name = pod.status.resource_claim_statuses[0].resource_claim_name
        claim = custom.get_namespaced_custom_object(*RESOURCE, namespace, "resourceclaims", name)
        created = datetime.fromisoformat(claim["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
        [result] = claim["status"]["allocation"]["devices"]["results"]
        key = (result["pool"], result["device"], None)
        behind = claim_usage.no_activity(created - timedelta(days=1), mig=False)
        entry = claim_usage.device_entry(driver=DRIVER, key=key, idleness=behind)
        custom.patch_namespaced_custom_object_status(
            *RESOURCE, namespace, "resourceclaims", name, {"status": {"devices": [entry]}}
        )

        def idle() -> list[dict[str, Any]]:
            return [d for d in controller.status()["idle"] if d["namespace"] == namespace]

        [reported] = wait_for("the claim reported idle", idle, timeout=30 + IDLE_AFTER)
        existed = (datetime.now(UTC) - created).total_seconds()
        assert IDLE_AFTER <= reported["idleSeconds"] <= existed + 2, (reported, existed)
    finally:
        core.delete_namespace(namespace)
        wait_for("pod gone", partial(_pod_gone, core, "behind", namespace), timeout=120)


# --- housekeeping --------------------------------------------------------------------------------


def test_usage_reports_of_a_pool_that_is_gone_are_removed(
    controller: ControllerProcess, api: client.ApiClient, core: client.CoreV1Api, resources: Resources
) -> None:
    """A node's plugin reported on a claim, then the node's pool went (its slices deleted): the leader
    removes that node's reports, and leaves another driver's entry alone."""
    namespace = new_namespace(core, "housekeeping")
    pool = f"gone-{namespace}"
    device = {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}
    resources.create(
        "resourceslices",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": pool},
            "spec": {
                "driver": DRIVER,
                "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                "allNodes": True,
                "devices": [device],
            },
        },
    )
    other_pool = {"driver": "other.example.com", "pool": "p", "device": "d"}
    try:
        created = resources.create(
            "resourceclaims",
            _claim("reported", {"apiVersion": "resource.gpudra.io/v1beta1", "kind": "GpuConfig"}),
            namespace,
        )
        results = [
            {"request": "gpu", "driver": DRIVER, "pool": pool, "device": "gpu-0"},
            {"request": "gpu", **other_pool},
        ]
        idle = claim_usage.device_entry(
            driver=DRIVER,
            key=(pool, "gpu-0", None),
            idleness=claim_usage.no_activity(datetime.now(UTC), mig=False),
        )
        created["status"] = {"allocation": {"devices": {"results": results}}, "devices": [idle, other_pool]}
        client.CustomObjectsApi(api).replace_namespaced_custom_object_status(
            *RESOURCE, namespace, "resourceclaims", "reported", created
        )
    finally:
        resources.delete("resourceslices", pool)

    def entries() -> list[dict[str, Any]] | None:
        found = resources.get("resourceclaims", "reported", namespace)["status"].get("devices", [])
        return found if len(found) == 1 else None

    [left] = wait_for("the gone pool's report removed", entries, timeout=30)
    assert {k: left[k] for k in other_pool} == other_pool


# --- idle GPUs -----------------------------------------------------------------------------------


def test_an_allocated_gpu_without_activity_is_reported_idle_after_the_idle_time(
    controller: ControllerProcess,
    api: client.ApiClient,
    core: client.CoreV1Api,
    gpudra: dict[str, PluginProcess],
) -> None:
    plugin = gpudra["node-mixed"]
    plugin.stop()
    plugin.start(usage_interval=1)
    namespace = new_namespace(core, "idle")
    gpu_uuid = None
    try:
        utils.create_from_yaml(
            api,
            yaml_objects=[claim_template("one-gpu"), claim_pod("sleepy", {"gpu": "one-gpu"}, "node-mixed")],
            namespace=namespace,
        )
        pod = wait_for("pod running", partial(pod_running, core, "sleepy", namespace), timeout=90)
        claim = pod.status.resource_claim_statuses[0].resource_claim_name
        (prepared,) = next(iter(plugin.checkpoint_claims().values()))["devices"]
        (gpu_uuid,) = prepared["gpu_uuids"]

        def idle() -> list[dict[str, Any]]:
            return [d for d in controller.status()["idle"] if d["namespace"] == namespace]

        # The simulated GPU runs nothing: Idle=True on the claim at the first sample, idle once that is
        # IDLE_AFTER seconds old.
        [reported] = wait_for("the claim reported idle", idle, timeout=30)
        assert (reported["claim"], reported["pods"], reported["node"]) == (claim, ["sleepy"], "node-mixed")
        assert reported["idleSeconds"] >= IDLE_AFTER
        sample = next(
            s
            for s in controller.metrics()
            if s.startswith("gpudra_cluster_idle_device_seconds{") and claim in s
        )
        assert 'pod="sleepy"' in sample and 'node="node-mixed"' in sample
        assert any(r["idle"] >= 1 for r in controller.status()["nodes"] if r["node"] == "node-mixed")

        sim.set_utilization(state_file=plugin.sim_state, gpu_uuid=gpu_uuid, percent=40)
        wait_for("the claim no longer idle", lambda: not idle(), timeout=30)
    finally:
        if gpu_uuid is not None:
            sim.set_utilization(state_file=plugin.sim_state, gpu_uuid=gpu_uuid, percent=0)
        core.delete_namespace(namespace)
        wait_for("pod gone", partial(_pod_gone, core, "sleepy", namespace), timeout=120)
        plugin.stop()
        plugin.start()


# --- a poisoned claim ----------------------------------------------------------------------------

SKIPPED_CLAIMS = 'gpudra_skipped_objects_total{reason="too-deep",resource="resourceclaims"}'


def _pending_names(controller: ControllerProcess, namespace: str) -> set[str]:
    return {p["name"] for p in controller.status()["pending"] if p["namespace"] == namespace}


def test_a_claim_nested_too_deeply_is_left_out_and_the_picture_stays_current_across_a_restart(
    controller: ControllerProcess, cluster: LocalCluster, core: client.CoreV1Api, resources: Resources
) -> None:
    """Any namespace user can create a claim of another driver whose opaque parameters nest 3000 levels
    deep: the API server stores it, Python's JSON decoder cannot read it. The controller leaves that one
    claim out (counted, logged once), keeps `/status` current, and a restarted controller lists and turns
    ready while the claim exists. The webhook refuses such a claim only when it carries a gpudra config."""
    namespace = new_namespace(core, "poison")
    claims = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    poisoned = _claim("poisoned", {"deep": DEEP}, driver="other.example.com")
    status, body = raw_request(cluster, "POST", claims, poisoned)
    assert status == 201, body[:300]
    try:
        wait_for("the poisoned claim counted", lambda: controller.metrics().get(SKIPPED_CLAIMS, 0) >= 1)
        resources.create(
            "resourceclaims",
            _claim("fresh", {"apiVersion": "resource.gpudra.io/v1beta1", "kind": "GpuConfig"}),
            namespace,
        )
        assert wait_for(
            "the new claim in /status", lambda: _pending_names(controller, namespace), timeout=30
        ) == {"fresh"}
        assert (
            f"left out resourceclaims {namespace}/poisoned: the object nests too deeply to decode"
            in controller.tail(200)
        )

        # a gpudra config nobody can check is refused at admission, with the reason
        ours = _claim("ours", {"apiVersion": "resource.gpudra.io/v1beta1", "kind": "GpuConfig", "deep": DEEP})
        status, body = raw_request(cluster, "POST", claims, ours)
        assert status == 400, body[:300]
        reason = b"nests too deeply to decode (more than 100 levels), so its gpu.gpudra.io config cannot be"
        assert reason in body, body[:300]

        controller.stop()
        controller.start()  # waits for /readyz: the first LIST of every watch went through
        readyz = http_get(f"{controller.url}/readyz")
        assert readyz[0] == 200 and b"[+]cluster-watches ok" in readyz[1], readyz
        assert _pending_names(controller, namespace) == {"fresh"}
        assert controller.metrics()[SKIPPED_CLAIMS] == 1  # the LIST left it out once
        resources.create(
            "resourceclaims",
            _claim("later", {"apiVersion": "resource.gpudra.io/v1beta1", "kind": "GpuConfig"}),
            namespace,
        )
        wait_for(
            "the later claim in /status",
            lambda: _pending_names(controller, namespace) == {"fresh", "later"},
            timeout=30,
        )
    finally:
        core.delete_namespace(namespace)
        # later tests list every claim with the kubernetes client, which cannot decode this one
        wait_for(
            "the poisoned claim gone",
            lambda: raw_request(cluster, "GET", f"{claims}/poisoned")[0] == 404,
            timeout=120,
        )


def _service_account_token(core: client.CoreV1Api, namespace: str, name: str) -> str:
    core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    request = core.create_namespaced_service_account_token(
        name, namespace, {"spec": {"expirationSeconds": 600}}
    )
    return str(request.status.token)


def test_status_answers_each_token_what_rbac_lets_it_list_and_nothing_anonymously(
    controller: ControllerProcess, core: client.CoreV1Api, resources: Resources, api: client.ApiClient
) -> None:
    """/status on the controller's HTTPS port (its webhook's): no token is 401; a ServiceAccount allowed
    to list claims cluster-wide sees every namespace's and the nodes, one allowed in one namespace only
    that one's claims and no nodes (they need list resourceslices), one allowed only in a namespace
    without claims an empty view (200), one with no rights 403 — decided by the real API server's
    TokenReview and SubjectAccessReview."""
    team_a, team_b = new_namespace(core, "status-a"), new_namespace(core, "status-b")
    team_c = new_namespace(core, "status-c")  # no claims
    for namespace in (team_a, team_b):
        _pending_claim_and_pod(namespace, core, resources)
    rbac = client.RbacAuthorizationV1Api(api)
    reader = f"claim-reader-{team_a}"
    rbac.create_cluster_role(
        {
            "metadata": {"name": reader},
            "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["list"]}],
        }
    )
    role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": reader}
    everything = _service_account_token(core, team_a, "everything")
    own = _service_account_token(core, team_a, "team-a")
    nobody = _service_account_token(core, team_a, "nobody")
    quiet = _service_account_token(core, team_c, "quiet")
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": reader},
            "roleRef": role_ref,
            "subjects": [{"kind": "ServiceAccount", "name": "everything", "namespace": team_a}],
        }
    )
    rbac.create_namespaced_role_binding(
        team_a,
        {
            "metadata": {"name": "team-a-reads-claims"},
            "roleRef": role_ref,
            "subjects": [{"kind": "ServiceAccount", "name": "team-a", "namespace": team_a}],
        },
    )
    rbac.create_namespaced_role_binding(
        team_c,
        {
            "metadata": {"name": "team-c-reads-claims"},
            "roleRef": role_ref,
            "subjects": [{"kind": "ServiceAccount", "name": "quiet", "namespace": team_c}],
        },
    )
    try:
        ours = {team_a, team_b}
        wait_for(
            "both claims among the pending ones",
            lambda: {p["namespace"] for p in controller.status()["pending"]} >= ours,
            timeout=30,
        )
        url = f"{controller.endpoint().url}/status"
        assert http_get(url)[0] == 401
        assert http_get(url, token="not-a-token")[0] == 401
        status, body = http_get(url, token=nobody)
        assert status == 403, body
        status, body = http_get(url, token=own)
        assert status == 200, body
        assert {p["namespace"] for p in json.loads(body)["pending"]} == {team_a}
        assert {d["namespace"] for d in json.loads(body)["idle"]} <= {team_a}
        assert json.loads(body)["nodes"] == json.loads(body)["unhealthy"] == []  # no list resourceslices
        # rights in a namespace that has no claims: the right answered, with nothing in it
        status, body = http_get(url, token=quiet, timeout=10)
        assert status == 200, body
        empty = json.loads(body)
        assert empty["pending"] == empty["idle"] == empty["nodes"] == empty["mig"] == empty["unhealthy"] == []
        status, body = http_get(url, token=everything)
        assert status == 200, body
        assert {p["namespace"] for p in json.loads(body)["pending"]} >= ours
        assert json.loads(body)["nodes"]  # the local cluster's simulated GPUs
        assert http_get(f"{controller.endpoint().url}/", token=own)[0] == 403  # the map: cluster-wide only
        assert http_get(f"{controller.endpoint().url}/", token=everything)[0] == 200
        # the plain-HTTP port keeps the probes and metrics and serves no claim
        assert http_get(f"{controller.url}/readyz")[0] == 200
        assert b"waits" not in http_get(f"{controller.url}/status")[1]
        # gpudra status says in one line why it was refused
        refused = subprocess.run(
            # the last --token wins over the admin's that cli_args gives
            [
                sys.executable,
                "-m",
                "gpudra",
                "status",
                *controller.endpoint().cli_args(controller.log.parent),
                f"--token={nobody}",
            ],
            check=False,
            capture_output=True,
            text=True,
        )
        assert refused.returncode != 0 and "(403" in refused.stderr and len(refused.stderr.splitlines()) == 1
        # and, for the empty view, why it is empty
        shown = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpudra",
                "status",
                *controller.endpoint().cli_args(controller.log.parent),
                f"--token={quiet}",
                "--output=json",
            ],
            check=False,
            capture_output=True,
            text=True,
        )
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["pending"] == []
        assert "none of the namespaces where you may list resourceclaims has a claim" in shown.stderr
    finally:
        rbac.delete_cluster_role_binding(reader)
        rbac.delete_cluster_role(reader)
        for namespace in (team_a, team_b, team_c):
            core.delete_namespace(namespace)
