"""The admission webhook: `review` (pure), the ValidatingWebhookConfiguration it asks for (its CEL
conditions run through cel-python), the HTTPS server on a real socket, and `CertificateKeeper` against
an in-memory API server."""

from __future__ import annotations

import base64
import copy
import dataclasses
import http.client
import json
import socket
import ssl
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import celpy
import pytest

from gpudra.controller import certs
from gpudra.controller.certs import Material, read_certificates
from gpudra.controller.metrics import ControllerMetrics
from gpudra.controller.options import ControllerOptions
from gpudra.controller.webhook import (
    JUDGED_KINDS,
    MAX_BODY_BYTES,
    MAX_CONCURRENT_REVIEWS,
    MAX_REVIEW_VALUES,
    MAX_WARNING_CHARS,
    MAX_WARNINGS_CHARS,
    ClientSlots,
    WebhookServer,
    desired_configuration,
    review,
)
from gpudra.controller.webhook_tls import PERIOD, SHORT_PERIOD, CertificateKeeper, serving_names
from gpudra.errors import ConfigError
from gpudra.kube.client import Conflict, Obj
from gpudra.model.manifests import validate_documents
from tests.unit.harness.tls import client_context, material_for

DRIVER = "gpu.gpudra.io"
GPU_CONFIG = {"apiVersion": "resource.gpudra.io/v1beta1", "kind": "GpuConfig"}
BAD = {**GPU_CONFIG, "sharing": {"strategy": "Sometimes"}}
GOOD = {**GPU_CONFIG, "sharing": {"strategy": "TimeSlicing"}}
CLASSES = ["mig.gpudra.io", "gpu.gpudra.io"]
OPTIONS = ControllerOptions(
    driver=DRIVER,
    kubeconfig=None,
    namespace="gpudra",
    identity="controller-0",
    webhook_port=8443,
    webhook_address="127.0.0.1",
    webhook_service="gpudra-webhook",
    webhook_url=None,
    webhook_configuration="gpudra",
    webhook_secret="gpudra-webhook-tls",
    failure_policy="Fail",
    metrics_port=8080,
    metrics_address="127.0.0.1",
    gpu_map=True,
    idle_after_seconds=600,
    lease_name="gpudra-controller",
    lease_seconds=15,
)


def no_warnings(obj: Mapping[str, Any]) -> list[str]:
    return []


def opaque(parameters: Any, driver: str = DRIVER) -> dict[str, Any]:
    return {"opaque": {"driver": driver, "parameters": parameters}}


def claim(*config: dict[str, Any], name: str = "c") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpudra.io"}}],
                "config": list(config),
            }
        },
    }


def template(*config: dict[str, Any]) -> dict[str, Any]:
    inner = claim(*config)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "ns"},
        "spec": {"spec": inner["spec"]},
    }


def device_class(*config: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "shared.gpudra.io"},
        "spec": {"config": list(config)},
    }


def admission_review(
    obj: Mapping[str, Any] | None, *, operation: str = "CREATE", old: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    source = obj or old or {}
    group, _, version = str(source.get("apiVersion", "resource.k8s.io/v1")).rpartition("/")
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": group, "version": version, "kind": source.get("kind", "")},
            "operation": operation,
            "object": obj,
            "oldObject": old,
        },
    }


def judge(obj: Mapping[str, Any] | None, **kwargs: Any) -> dict[str, Any]:
    warnings = kwargs.pop("warnings", no_warnings)
    answer = review(admission_review(obj, **kwargs), driver=DRIVER, warnings=warnings)
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    return dict(answer["response"])


# --- review ----------------------------------------------------------------------------------


def test_a_bad_config_is_denied_with_every_problem_as_gpudra_validate_words_it() -> None:
    bad = claim(opaque(BAD), opaque({**GPU_CONFIG, "colour": "blue"}))
    response = judge(bad)
    assert response["allowed"] is False
    status = response["status"]
    assert (status["code"], status["reason"], status["status"]) == (400, "BadRequest", "Failure")
    expected = [str(p) for p in validate_documents([("", bad)], driver=DRIVER)]
    assert status["message"].splitlines() == expected
    assert len(expected) == 2
    assert expected[0].startswith(
        "ResourceClaim ns/c: spec.devices.config[0].opaque.parameters.sharing.strategy: must be one of:"
    )
    assert "TimeSlicing" in expected[0] and "MPS" in expected[0]
    assert expected[1].startswith("ResourceClaim ns/c: spec.devices.config[1].opaque.parameters.colour:")


def test_a_good_config_is_admitted() -> None:
    assert judge(claim(opaque(GOOD))) == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


def test_other_drivers_configs_and_other_kinds_are_left_alone() -> None:
    assert judge(claim(opaque({"anything": ["goes"]}, driver="gpu.nvidia.com")))["allowed"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"devices": {}}}
    called: list[Mapping[str, Any]] = []

    def advise(obj: Mapping[str, Any]) -> list[str]:
        called.append(obj)
        return ["advice"]

    response = judge(pod, warnings=advise)
    assert response == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}
    assert called == []
    # a kind of ours in another group is not ours
    lookalike = {**claim(opaque(BAD)), "apiVersion": "example.com/v1"}
    assert judge(lookalike)["allowed"]


def test_templates_and_device_classes_are_judged_with_their_paths() -> None:
    response = judge(template(opaque(BAD)))
    assert not response["allowed"]
    assert response["status"]["message"].startswith(
        "ResourceClaimTemplate ns/t: spec.spec.devices.config[0].opaque.parameters.sharing.strategy: "
    )
    response = judge(device_class(opaque(BAD)))
    assert not response["allowed"]
    assert response["status"]["message"].startswith(
        "DeviceClass shared.gpudra.io: spec.config[0].opaque.parameters.sharing.strategy: "
    )
    assert judge(device_class(opaque(GOOD)))["allowed"]


def test_an_object_without_apiversion_and_kind_is_judged_as_the_request_names_it() -> None:
    bare = {k: v for k, v in claim(opaque(BAD)).items() if k not in ("apiVersion", "kind")}
    review_body = admission_review(bare)
    review_body["request"]["kind"] = {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"}
    assert not review(review_body, driver=DRIVER, warnings=no_warnings)["response"]["allowed"]


def test_delete_is_allowed_untouched() -> None:
    assert judge(None, operation="DELETE", old=claim(opaque(BAD)))["allowed"]


def test_an_update_is_denied_only_for_problems_the_old_object_did_not_have() -> None:
    """A claim stored before the webhook (or a stricter gpudra) must stay updatable: its finalizers
    are removed by UPDATEs that leave its (immutable) spec as it was."""
    stored = claim(opaque(BAD))
    finalized = copy.deepcopy(stored)
    finalized["metadata"]["finalizers"] = []
    assert judge(finalized, operation="UPDATE", old=stored)["allowed"]
    worse = device_class(opaque(BAD), opaque({**GPU_CONFIG, "colour": "blue"}))
    response = judge(worse, operation="UPDATE", old=device_class(opaque(BAD)))
    assert not response["allowed"]
    assert response["status"]["message"].splitlines() == [
        "DeviceClass shared.gpudra.io: spec.config[1].opaque.parameters.colour: "
        + validate_documents([("", worse)], driver=DRIVER)[1].message
    ]


def test_warnings_are_passed_through_for_claims_and_templates_within_the_api_servers_limits() -> None:
    seen: list[Mapping[str, Any]] = []

    def advise(obj: Mapping[str, Any]) -> list[str]:
        seen.append(obj)
        return ["spec.devices.requests[0]: asks for 9 GPUs", "two\nlines\x00here", "x" * 300, "  ", "again"]

    response = judge(claim(opaque(GOOD)), warnings=lambda obj: [*advise(obj), "again"])
    assert response["allowed"]
    assert response["warnings"] == [
        "spec.devices.requests[0]: asks for 9 GPUs",
        "two lines here",
        "x" * (MAX_WARNING_CHARS - 1) + "…",
        "again",
    ]
    assert seen == [claim(opaque(GOOD))]
    # denied claims get their warnings too; classes get none
    assert judge(template(opaque(BAD)), warnings=advise)["warnings"][0].startswith("spec.devices")
    assert "warnings" not in judge(device_class(opaque(GOOD)), warnings=advise)
    many = judge(claim(), warnings=lambda obj: [f"{i:03d}" + "w" * 200 for i in range(100)])["warnings"]
    assert sum(map(len, many)) <= MAX_WARNINGS_CHARS
    assert len(many) == MAX_WARNINGS_CHARS // 203


def test_time_slicing_a_mig_device_is_admitted_with_a_warning_naming_the_field() -> None:
    mig_time_slicing = {
        "apiVersion": "resource.gpudra.io/v1beta1",
        "kind": "MigDeviceConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}},
    }
    note = (
        "opaque.parameters.sharing.strategy: TimeSlicing on a MIG device sets nothing: the claim's "
        "containers share the partition; interval Long is not applied (the time-slice is the whole GPU's)"
    )
    response = judge(claim(opaque(GOOD), opaque(mig_time_slicing)), warnings=lambda obj: ["reach"])
    assert response["allowed"]
    assert response["warnings"] == [f"spec.devices.config[1].{note}", "reach"]
    # a class's config is advised too (its warnings from the cluster's reach are for claims only)
    assert judge(device_class(opaque(mig_time_slicing)))["warnings"] == [f"spec.config[0].{note}"]
    assert "warnings" not in judge(claim(opaque(GOOD)))


def test_a_failing_warnings_callback_costs_only_the_warnings(caplog: pytest.LogCaptureFixture) -> None:
    def broken(obj: Mapping[str, Any]) -> list[str]:
        raise RuntimeError("bug")

    assert judge(claim(opaque(GOOD)), warnings=broken) == {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "allowed": True,
    }
    assert "warnings callback failed" in caplog.text


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "must be a JSON object"),
        ({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}, "apiVersion, kind: must be"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, "request: is required"),
        ({**admission_review(claim()), "request": {"uid": ""}}, "request.uid: is required"),
        (
            {**admission_review(claim()), "request": {"uid": "u", "kind": "ResourceClaim"}},
            "request.kind: is required",
        ),
        (
            {
                **admission_review(claim()),
                "request": {**admission_review(claim())["request"], "operation": "X"},
            },
            "request.operation: must be one of CREATE, UPDATE, DELETE, CONNECT",
        ),
        (admission_review(None, old=claim()), "request.object: must be an object for CREATE"),
    ],
)
def test_a_malformed_review_is_an_error_naming_the_field(body: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        review(body, driver=DRIVER, warnings=no_warnings)


# --- the configuration -------------------------------------------------------------------------


def matches(expression: str, resource: str, obj: Mapping[str, Any]) -> bool:
    """A matchCondition, evaluated as the API server does: `object` untyped JSON, `request`."""
    env = celpy.Environment()
    program = env.program(env.compile(expression))
    activation = {
        "object": celpy.adapter.json_to_cel(obj),
        "request": celpy.adapter.json_to_cel(
            {"resource": {"group": "resource.k8s.io", "resource": resource}}
        ),
    }
    return bool(program.evaluate(activation))


def test_the_configuration_sends_configs_to_one_webhook_and_the_rest_to_the_other() -> None:
    bundle = b"-----BEGIN CERTIFICATE-----\n...\n"
    configuration = desired_configuration(OPTIONS, bundle, CLASSES)
    assert configuration["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert configuration["kind"] == "ValidatingWebhookConfiguration"
    assert configuration["metadata"] == {
        "name": "gpudra",
        "annotations": {"gpudra.io/warned-classes": "gpu.gpudra.io,mig.gpudra.io"},
    }
    config_hook, warnings_hook = configuration["webhooks"]
    assert config_hook["name"] == "config.gpu.gpudra.io"
    assert warnings_hook["name"] == "warnings.gpu.gpudra.io"
    for hook in (config_hook, warnings_hook):
        assert hook["clientConfig"] == {
            "caBundle": base64.b64encode(bundle).decode(),
            "service": {"namespace": "gpudra", "name": "gpudra-webhook", "path": "/validate", "port": 8443},
        }
        (rule,) = hook["rules"]
        assert rule["apiGroups"] == ["resource.k8s.io"] and rule["apiVersions"] == ["v1"]
        assert rule["operations"] == ["CREATE", "UPDATE"] and rule["scope"] == "*"
        assert hook["matchPolicy"] == "Equivalent"
        assert hook["sideEffects"] == "None" and hook["admissionReviewVersions"] == ["v1"]
        assert hook["namespaceSelector"] == {} and hook["objectSelector"] == {}
    assert config_hook["rules"][0]["resources"] == [
        "resourceclaims",
        "resourceclaimtemplates",
        "deviceclasses",
    ]
    assert warnings_hook["rules"][0]["resources"] == ["resourceclaims", "resourceclaimtemplates"]
    assert (config_hook["failurePolicy"], config_hook["timeoutSeconds"]) == ("Fail", 10)
    assert (warnings_hook["failurePolicy"], warnings_hook["timeoutSeconds"]) == ("Ignore", 1)
    assert [c["name"] for c in warnings_hook["matchConditions"]] == ["no-gpudra-config", "gpudra-class"]
    # No class of the driver, no warnings webhook: nothing for other drivers' claims to wait on.
    (alone,) = desired_configuration(OPTIONS, bundle)["webhooks"]
    assert alone == config_hook

    ignore = desired_configuration(dataclasses.replace(OPTIONS, failure_policy="Ignore"), bundle, CLASSES)
    assert [hook["failurePolicy"] for hook in ignore["webhooks"]] == ["Ignore", "Ignore"]
    outside = desired_configuration(
        dataclasses.replace(OPTIONS, webhook_url="https://10.0.0.5:8443/"), bundle
    )
    assert outside["webhooks"][0]["clientConfig"] == {
        "caBundle": base64.b64encode(bundle).decode(),
        "url": "https://10.0.0.5:8443/validate",
    }


@pytest.mark.parametrize(
    ("resource", "obj", "carries_config"),
    [
        ("resourceclaims", claim(opaque(GOOD)), True),
        ("resourceclaims", claim(opaque(GOOD, driver="gpu.nvidia.com"), opaque(BAD)), True),
        ("resourceclaims", claim(opaque(GOOD, driver="gpu.nvidia.com")), False),
        ("resourceclaims", claim(), False),
        ("resourceclaims", {"spec": {"devices": {"requests": []}}}, False),
        ("resourceclaims", {"spec": {}}, False),
        ("resourceclaims", claim({"requests": ["gpu"]}), False),  # an entry without opaque
        ("resourceclaimtemplates", template(opaque(BAD)), True),
        ("resourceclaimtemplates", template(), False),
        ("resourceclaimtemplates", {"spec": {}}, False),
        ("deviceclasses", device_class(opaque(GOOD)), True),
        ("deviceclasses", device_class(), False),
        ("deviceclasses", {"spec": {"selectors": []}}, False),
    ],
)
def test_the_match_conditions_split_objects_by_their_config_without_errors(
    resource: str, obj: dict[str, Any], carries_config: bool
) -> None:
    config_hook, warnings_hook = desired_configuration(OPTIONS, b"", CLASSES)["webhooks"]
    assert matches(config_hook["matchConditions"][0]["expression"], resource, obj) is carries_config
    assert matches(warnings_hook["matchConditions"][0]["expression"], resource, obj) is not carries_config


def _asks(*classes: str, first_available: bool = False) -> dict[str, Any]:
    requests = [
        {"name": f"r{i}", "firstAvailable": [{"name": "a", "deviceClassName": c}]}
        if first_available
        else {"name": f"r{i}", "exactly": {"deviceClassName": c}}
        for i, c in enumerate(classes)
    ]
    return {"spec": {"devices": {"requests": requests}}}


@pytest.mark.parametrize(
    ("resource", "obj", "warned"),
    [
        ("resourceclaims", _asks("gpu.gpudra.io"), True),
        ("resourceclaims", _asks("gpu.nvidia.com", "mig.gpudra.io"), True),
        ("resourceclaims", _asks("gpu.gpudra.io", first_available=True), True),
        ("resourceclaims", _asks("gpu.nvidia.com"), False),  # another driver's claim: never waits on gpudra
        ("resourceclaims", _asks("gpu.nvidia.com", first_available=True), False),
        ("resourceclaims", {"spec": {"devices": {"requests": [{"name": "x"}]}}}, False),
        ("resourceclaims", {"spec": {}}, False),
        ("resourceclaimtemplates", {"spec": {"spec": _asks("gpu.gpudra.io")["spec"]}}, True),
        ("resourceclaimtemplates", {"spec": {"spec": _asks("example.com")["spec"]}}, False),
        ("resourceclaimtemplates", {"spec": {}}, False),
    ],
)
def test_the_warnings_webhook_sees_only_claims_asking_the_drivers_classes(
    resource: str, obj: dict[str, Any], warned: bool
) -> None:
    _, warnings_hook = desired_configuration(OPTIONS, b"", CLASSES)["webhooks"]
    expression = warnings_hook["matchConditions"][1]["expression"]
    assert matches(expression, resource, obj) is warned


def test_a_class_name_cannot_break_out_of_the_warnings_condition() -> None:
    hostile = 'x" ] || true || ["'
    _, warnings_hook = desired_configuration(OPTIONS, b"", [hostile])["webhooks"]
    expression = warnings_hook["matchConditions"][1]["expression"]
    assert not matches(expression, "resourceclaims", _asks("gpu.gpudra.io"))
    assert matches(expression, "resourceclaims", _asks(hostile))


def test_the_driver_name_cannot_break_out_of_its_cel_string() -> None:
    hostile = 'x" || true || "'
    condition = desired_configuration(dataclasses.replace(OPTIONS, driver=hostile), b"")["webhooks"][0]
    expression = condition["matchConditions"][0]["expression"]
    assert not matches(expression, "resourceclaims", claim(opaque(GOOD)))
    assert matches(expression, "resourceclaims", claim(opaque(GOOD, driver=hostile)))


# --- the server ---------------------------------------------------------------------------------


def post(
    connection: http.client.HTTPSConnection, body: bytes, path: str = "/validate"
) -> tuple[int, bytes, str]:
    connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, response.read(), response.getheader("Content-Type", "")


def reviews(metrics: ControllerMetrics) -> dict[tuple[str, str], float]:
    """gpudra_admission_reviews_total, by (kind, result)."""
    (family,) = [m for m in metrics.registry.collect() if m.name == "gpudra_admission_reviews"]
    return {
        (s.labels["kind"], s.labels["result"]): s.value for s in family.samples if s.name.endswith("_total")
    }


def counted(metrics: ControllerMetrics) -> dict[tuple[str, str], float]:
    """The reviews counted so far (the judged kinds' series start at 0)."""
    return {labels: value for labels, value in reviews(metrics).items() if value}


def test_the_judged_kinds_review_series_start_at_zero(metrics: ControllerMetrics) -> None:
    metrics.admission_reviews(JUDGED_KINDS)
    assert reviews(metrics) == {
        (kind, result): 0 for kind in JUDGED_KINDS for result in ("allowed", "denied", "error")
    }


@pytest.fixture
def metrics() -> ControllerMetrics:
    return ControllerMetrics()


@pytest.fixture
def server(metrics: ControllerMetrics) -> Any:
    webhook = WebhookServer(
        "127.0.0.1",
        0,
        DRIVER,
        warnings=lambda obj: ["mind the gap"],
        count_review=metrics.admission_reviews(JUDGED_KINDS),
    )
    assert webhook.problem() == "the webhook server is not listening"
    webhook.start()
    yield webhook
    webhook.stop(5)


def test_the_server_answers_nothing_before_it_has_a_certificate(server: WebhookServer) -> None:
    assert server.problem() == "no serving certificate yet"
    material = material_for()
    connection = http.client.HTTPSConnection(
        "127.0.0.1", server.port, context=client_context(material), timeout=5
    )
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        post(connection, b"{}")
    connection.close()
    server.use(material)
    assert server.problem() is None


def test_the_server_reviews_over_https(server: WebhookServer, metrics: ControllerMetrics) -> None:
    material = material_for()
    server.use(material)
    connection = http.client.HTTPSConnection(
        "127.0.0.1", server.port, context=client_context(material), timeout=5
    )
    try:
        status, body, content_type = post(
            connection, json.dumps(admission_review(claim(opaque(BAD)))).encode()
        )
        assert (status, content_type) == (200, "application/json")
        response = json.loads(body)["response"]
        assert not response["allowed"] and response["warnings"] == ["mind the gap"]
        # the same connection is kept for the next review
        status, body, _ = post(connection, json.dumps(admission_review(claim(opaque(GOOD)))).encode())
        assert status == 200 and json.loads(body)["response"]["allowed"]
        status, body, _ = post(connection, json.dumps({"kind": "AdmissionReview"}).encode())
        assert status == 400 and body.startswith(b"malformed AdmissionReview: apiVersion, kind: must be")
        status, body, _ = post(connection, b"{not json")
        assert status == 400 and body.startswith(b"the body is not JSON")
        status, body, _ = post(connection, b"[" * 100_000 + b"]" * 100_000)
        assert (status, body) == (400, b"the review nests too deeply to decode (more than 100 levels)")
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}
        assert post(connection, json.dumps(admission_review(pod)).encode())[0] == 200
        assert post(connection, b"{}", path="/other")[0] == 404
        assert post(connection, json.dumps(admission_review(pod)).encode())[0] == 200  # a new connection
    finally:
        connection.close()
    assert counted(metrics) == {
        ("ResourceClaim", "denied"): 1,
        ("ResourceClaim", "allowed"): 1,
        ("other", "allowed"): 2,  # kinds that are not ours make no series of their own
        ("unknown", "error"): 3,
    }


def test_a_bug_in_the_review_is_a_500_not_a_dead_server(
    server: WebhookServer, metrics: ControllerMetrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise KeyError("bug")

    monkeypatch.setattr("gpudra.controller.webhook.review", broken)
    status, body, _ = server.answer(json.dumps(admission_review(claim())).encode())
    assert (status, body) == (500, b"internal error; see the controller's log")
    assert counted(metrics) == {("ResourceClaim", "error"): 1}


DEEP = "__DEEP__"


def deep_review(
    obj: Mapping[str, Any], *, operation: str = "CREATE", old: Mapping[str, Any] | None = None
) -> bytes:
    """The review as the API server sends it, "__DEEP__" in it replaced by arrays nested 3000 deep (what
    the API server accepts in opaque parameters; json.dumps cannot write it)."""
    text = json.dumps(admission_review(obj, operation=operation, old=old))
    return text.replace(json.dumps(DEEP), "[" * 3000 + "]" * 3000).encode()


def test_an_object_nested_too_deeply_is_refused_only_when_it_carries_a_gpudra_config(
    metrics: ControllerMetrics,
) -> None:
    skipped: list[tuple[str, str, str]] = []
    webhook = WebhookServer(
        "127.0.0.1",
        0,
        DRIVER,
        warnings=lambda obj: ["mind the gap"],
        count_review=metrics.admission_reviews(JUDGED_KINDS),
        skipped=lambda resource, poisoned: skipped.append((resource, poisoned.ref, poisoned.reason)),
    )

    def answer(body: bytes) -> dict[str, Any]:
        status, text, _ = webhook.answer(body)
        assert status == 200, text
        response = json.loads(text)["response"]
        assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
        return dict(response)

    foreign = claim(opaque({"deep": DEEP}, driver="other.example.com"), name="foreign")
    assert answer(deep_review(foreign)) == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}
    ours = claim(opaque({**GPU_CONFIG, "deep": DEEP}), name="ours")
    refused = answer(deep_review(ours))
    assert not refused["allowed"] and "warnings" not in refused
    assert refused["status"]["code"] == 400 and refused["status"]["message"] == (
        "ResourceClaim ns/ours: the object nests too deeply to decode (more than 100 levels), so its "
        "gpu.gpudra.io config cannot be checked"
    )
    for obj in (
        template(opaque({**GPU_CONFIG, "deep": DEEP})),
        device_class(opaque({**GPU_CONFIG, "deep": DEEP})),
    ):
        assert not answer(deep_review(obj))["allowed"], obj["kind"]
    # stored while no webhook ran: its finalizers can still be removed
    assert answer(deep_review(ours, operation="UPDATE", old=ours))["allowed"]
    # an unreadable old object hides no problem of the new one
    fixed = claim(opaque(BAD), name="ours")
    assert not answer(deep_review(fixed, operation="UPDATE", old=ours))["allowed"]
    assert answer(deep_review(claim(opaque(GOOD), name="ours"), operation="UPDATE", old=ours))["allowed"]
    assert skipped == [
        ("resourceclaims", "ns/foreign", "too-deep"),
        ("resourceclaims", "ns/ours", "too-deep"),
        ("resourceclaimtemplates", "ns/t", "too-deep"),
        ("deviceclasses", "shared.gpudra.io", "too-deep"),
        ("resourceclaims", "ns/ours", "too-deep"),
        ("resourceclaims", "ns/ours", "too-deep"),
        ("resourceclaims", "ns/ours", "too-deep"),
        ("resourceclaims", "ns/ours", "too-deep"),
    ]
    assert counted(metrics) == {
        ("ResourceClaim", "allowed"): 3,
        ("ResourceClaim", "denied"): 2,
        ("ResourceClaimTemplate", "denied"): 1,
        ("DeviceClass", "denied"): 1,
    }


def test_the_server_refuses_a_body_over_its_limit_unread(server: WebhookServer) -> None:
    material = material_for()
    server.use(material)
    connection = http.client.HTTPSConnection(
        "127.0.0.1", server.port, context=client_context(material), timeout=5
    )
    try:
        connection.putrequest("POST", "/validate")
        connection.putheader("Content-Length", str(64 * 1024 * 1024))
        connection.endheaders()
        response = connection.getresponse()
        assert response.status == 413
        assert response.read().startswith(
            f"the review is 67108864 bytes; at most {MAX_BODY_BYTES} are accepted".encode()
        )
    finally:
        connection.close()


def test_the_body_limit_holds_two_objects_of_etcds_size_and_the_envelope() -> None:
    assert MAX_BODY_BYTES == 2 * 1536 * 1024 + 512 * 1024  # 3.5 MiB: twice etcd's default request limit
    obj = claim(opaque(GOOD))
    obj["metadata"]["annotations"] = {"big": "x" * (1536 * 1024 - 4096)}  # as large as etcd stores
    body = json.dumps(admission_review(obj, operation="UPDATE", old=obj)).encode()
    assert len(body) <= MAX_BODY_BYTES


def test_reviews_beyond_the_concurrency_bound_wait_then_get_503_unread(
    server: WebhookServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    material = material_for()
    server.use(material)
    monkeypatch.setattr("gpudra.controller.webhook.REVIEW_WAIT_SECONDS", 0.2)
    body = json.dumps(admission_review(claim(opaque(GOOD)))).encode()

    def connect() -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            "127.0.0.1", server.port, context=client_context(material), timeout=5
        )

    for _ in range(MAX_CONCURRENT_REVIEWS):  # every slot taken, as by slow decodes
        assert server.decoding.acquire(blocking=False)
    connection = connect()
    try:
        status, text, _ = post(connection, body)
        assert (status, text) == (
            503,
            f"busy: {MAX_CONCURRENT_REVIEWS} reviews are being decoded; try again".encode(),
        )
    finally:
        connection.close()
    server.decoding.release()  # one slot frees: the next review is answered
    connection = connect()
    try:
        status, text, _ = post(connection, body)
        assert status == 200 and json.loads(text)["response"]["allowed"]
    finally:
        connection.close()
    for _ in range(MAX_CONCURRENT_REVIEWS - 1):
        server.decoding.release()
    assert all(server.decoding.acquire(blocking=False) for _ in range(MAX_CONCURRENT_REVIEWS))


def test_an_object_dense_review_is_denied_unread_for_its_uid(
    server: WebhookServer, metrics: ControllerMetrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review whose gpudra config is a million empty objects (3 MiB, some 85 MiB once decoded) is
    denied for its UID without being decoded; one without a request UID where the API server writes
    it is a 400."""
    server.use(material := material_for())

    def never(*_: Any, **__: Any) -> Any:
        raise AssertionError("decoded")

    monkeypatch.setattr("gpudra.controller.webhook.bounded_json.decode", never)
    flood = claim(opaque({**GPU_CONFIG, "pad": [{}] * 1_000_000}))
    body = json.dumps(admission_review(flood), separators=(",", ":")).encode()
    assert len(body) <= MAX_BODY_BYTES
    connection = http.client.HTTPSConnection(
        "127.0.0.1", server.port, context=client_context(material), timeout=10
    )
    try:
        status, text, _ = post(connection, body)
        assert status == 200
        response = json.loads(text)["response"]
        assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002" and not response["allowed"]
        assert response["status"]["message"].startswith("the review holds about 2000")
        assert f"at most {MAX_REVIEW_VALUES} are decoded" in response["status"]["message"]
        status, text, _ = post(connection, json.dumps([{}] * 500_000).encode())
        assert status == 400 and text.startswith(b"the review holds about")
    finally:
        connection.close()
    assert counted(metrics) == {("unknown", "denied"): 1, ("unknown", "error"): 1}


def test_a_slow_sender_holds_no_decode_slot_and_is_dropped_at_the_read_deadline(
    server: WebhookServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.use(material := material_for())
    monkeypatch.setattr("gpudra.controller.webhook.BODY_READ_SECONDS", 0.5)
    body = json.dumps(admission_review(claim(opaque(GOOD)))).encode()
    slow = socket.create_connection(("127.0.0.1", server.port))
    tls = client_context(material).wrap_socket(slow, server_hostname="127.0.0.1")
    try:
        tls.sendall(
            b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[:10]
        )
        for _ in range(MAX_CONCURRENT_REVIEWS):  # every decode slot is free meanwhile
            assert server.decoding.acquire(timeout=5)
        for _ in range(MAX_CONCURRENT_REVIEWS):
            server.decoding.release()
        connection = http.client.HTTPSConnection(
            "127.0.0.1", server.port, context=client_context(material), timeout=5
        )
        try:
            status, text, _ = post(connection, body)
            assert status == 200 and json.loads(text)["response"]["allowed"]
        finally:
            connection.close()
        time.sleep(0.6)
        tls.sendall(body[10:20])  # past the deadline: the server has given up on it
        tls.settimeout(5)
        assert tls.recv(1024) == b""  # closed without an answer
    finally:
        tls.close()


def test_client_slots_bound_each_address_and_every_one_together() -> None:
    slots = ClientSlots(total=3, per_client=2)
    assert slots.acquire("a", 0) and slots.acquire("a", 0)
    assert not slots.acquire("a", 0.01)  # its own bound, though one is free in all
    assert slots.acquire("b", 0)
    assert not slots.acquire("c", 0.01)  # every slot taken
    slots.release("a")
    assert slots.acquire("c", 0) and not slots.acquire("a", 0.01)
    for client in ("a", "b", "c"):
        slots.release(client)
    assert slots._held == {}


def test_a_new_certificate_serves_new_connections_on_the_same_socket(server: WebhookServer) -> None:
    first, second = material_for(), material_for()
    server.use(first)
    review_body = json.dumps(admission_review(claim())).encode()
    kept = http.client.HTTPSConnection("127.0.0.1", server.port, context=client_context(first), timeout=5)
    try:
        assert post(kept, review_body)[0] == 200
        server.use(second)
        # a connection made before the swap goes on with the certificate it has
        assert post(kept, review_body)[0] == 200
        fresh = http.client.HTTPSConnection(
            "127.0.0.1", server.port, context=client_context(second), timeout=5
        )
        try:
            assert post(fresh, review_body)[0] == 200
        finally:
            fresh.close()
        stale = http.client.HTTPSConnection(
            "127.0.0.1", server.port, context=client_context(first), timeout=5
        )
        try:
            with pytest.raises(ssl.SSLCertVerificationError):
                post(stale, review_body)
        finally:
            stale.close()
    finally:
        kept.close()


def test_a_certificate_that_cannot_be_loaded_is_refused() -> None:
    good = material_for()
    webhook = WebhookServer("127.0.0.1", 0, DRIVER, warnings=no_warnings)
    with pytest.raises(ConfigError, match=r"tls\.crt, tls\.key: cannot be loaded"):
        webhook.use(Material(good.tls_crt, material_for().tls_key, good.ca_crt, good.ca_key))
    assert webhook.context() is None


# --- the certificate keeper --------------------------------------------------------------------


class FakeAdmission:
    """Secrets and webhook configurations stored as an API server stores them: a resourceVersion per
    write, `Conflict` for a stale replace or a create of an existing name. `writes` lists every write;
    `conflicts` makes the next writes fail as if another replica got in first."""

    def __init__(self) -> None:
        self.secrets: dict[tuple[str, str], Obj] = {}
        self.configurations: dict[str, Obj] = {}
        self.writes: list[str] = []
        self.conflicts = 0
        self.version = 0

    def _store(self, store: dict[Any, Obj], key: Any, obj: Obj, *, create: bool, what: str) -> Obj:
        if self.conflicts:
            self.conflicts -= 1
            raise Conflict(f"{what}: HTTP 409 Conflict")
        if create and key in store:
            raise Conflict(f"{what}: HTTP 409 AlreadyExists")
        if not create and store.get(key, {}).get("metadata", {}).get("resourceVersion") != obj[
            "metadata"
        ].get("resourceVersion"):
            raise Conflict(f"{what}: HTTP 409 Conflict")
        self.version += 1
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(self.version)
        store[key] = stored
        self.writes.append(what)
        return copy.deepcopy(stored)

    def get_secret(self, namespace: str, name: str) -> Obj | None:
        return copy.deepcopy(self.secrets.get((namespace, name)))

    def create_secret(self, namespace: str, secret: Obj) -> Obj:
        key = (namespace, secret["metadata"]["name"])
        return self._store(self.secrets, key, secret, create=True, what="create secret")

    def replace_secret(self, namespace: str, secret: Obj) -> Obj:
        key = (namespace, secret["metadata"]["name"])
        return self._store(self.secrets, key, secret, create=False, what="update secret")

    def get_webhook_configuration(self, name: str) -> Obj | None:
        return copy.deepcopy(self.configurations.get(name))

    def create_webhook_configuration(self, configuration: Obj) -> Obj:
        name = configuration["metadata"]["name"]
        return self._store(self.configurations, name, configuration, create=True, what="create configuration")

    def replace_webhook_configuration(self, configuration: Obj) -> Obj:
        name = configuration["metadata"]["name"]
        return self._store(
            self.configurations, name, configuration, create=False, what="update configuration"
        )

    def material(self) -> Material:
        return certs.from_secret_data(self.secrets[("gpudra", "gpudra-webhook-tls")]["data"])

    def bundle(self) -> bytes:
        hooks = self.configurations["gpudra"]["webhooks"]
        bundles = {hook["clientConfig"]["caBundle"] for hook in hooks}
        assert len(bundles) == 1
        return base64.b64decode(bundles.pop())


def keeper(api: FakeAdmission, *, leader: bool = True) -> tuple[CertificateKeeper, WebhookServer]:
    webhook = WebhookServer("127.0.0.1", 0, DRIVER, warnings=no_warnings)
    return CertificateKeeper(api, OPTIONS, webhook, is_leader=lambda: leader), webhook


def test_the_first_leader_creates_secret_and_configuration_and_serves() -> None:
    api = FakeAdmission()
    first, webhook = keeper(api)
    assert first.step() == PERIOD
    assert api.writes == ["create secret", "create configuration"]
    secret = api.secrets[("gpudra", "gpudra-webhook-tls")]
    assert secret["type"] == "kubernetes.io/tls"
    assert sorted(secret["data"]) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    material = api.material()
    assert certs.names_of(read_certificates(material.tls_crt)[0]) == {"gpudra-webhook.gpudra.svc"}
    assert (
        api.configurations["gpudra"]["webhooks"]
        == desired_configuration(OPTIONS, material.ca_crt)["webhooks"]
    )
    assert webhook.context() is not None
    assert first.step() == PERIOD
    assert api.writes == ["create secret", "create configuration"]  # nothing changed, nothing written


def test_a_restarted_controller_writes_nothing() -> None:
    api = FakeAdmission()
    keeper(api)[0].step()
    written = list(api.writes)
    restarted, webhook = keeper(api)
    assert restarted.step() == PERIOD
    assert api.writes == written
    assert webhook.context() is not None


def test_the_warnings_webhook_follows_the_drivers_classes_and_survives_a_restart_before_they_are_listed() -> (
    None
):
    api = FakeAdmission()
    classes: list[str] | None = ["gpu.gpudra.io"]
    webhook = WebhookServer("127.0.0.1", 0, DRIVER, warnings=no_warnings)
    leader = CertificateKeeper(api, OPTIONS, webhook, is_leader=lambda: True, warned_classes=lambda: classes)
    leader.step()

    def warned() -> list[str]:
        hooks = api.configurations["gpudra"]["webhooks"]
        return [hook["name"] for hook in hooks if hook["name"].startswith("warnings.")]

    assert warned() == ["warnings.gpu.gpudra.io"]
    assert api.configurations["gpudra"]["metadata"]["annotations"] == {
        "gpudra.io/warned-classes": "gpu.gpudra.io"
    }
    classes = None  # a restarted controller that has not listed the classes keeps what is stored
    written = list(api.writes)
    leader.step()
    assert api.writes == written and warned() == ["warnings.gpu.gpudra.io"]
    classes = ["gpu.gpudra.io", "team-a-h100"]  # a class added by the cluster's admins
    leader.step()
    assert api.writes == [*written, "update configuration"]
    assert "team-a-h100" in api.configurations["gpudra"]["webhooks"][1]["matchConditions"][1]["expression"]
    classes = []  # no class names the driver: no warnings webhook
    leader.step()
    assert warned() == []


def test_a_follower_never_writes_but_serves_what_the_secret_holds() -> None:
    api = FakeAdmission()
    follower, webhook = keeper(api, leader=False)
    assert follower.step() == SHORT_PERIOD  # nothing to serve yet: look again soon
    assert api.writes == [] and webhook.context() is None
    keeper(api)[0].step()
    assert follower.step() == PERIOD
    assert webhook.context() is not None
    # a damaged Secret is the leader's to mend; the follower neither writes nor serves it
    api.secrets[("gpudra", "gpudra-webhook-tls")]["data"]["tls.crt"] = ""
    follower2, webhook2 = keeper(api, leader=False)
    assert follower2.step() == SHORT_PERIOD
    assert webhook2.context() is None
    assert api.writes == ["create secret", "create configuration"]


def test_a_conflict_is_retried_on_the_next_step_not_raised() -> None:
    api = FakeAdmission()
    api.conflicts = 1
    leader, webhook = keeper(api)
    assert leader.step() == SHORT_PERIOD
    assert api.writes == [] and webhook.context() is None
    assert leader.step() == PERIOD
    assert api.writes == ["create secret", "create configuration"]


def test_a_changed_configuration_is_put_back_and_the_secret_left_alone() -> None:
    api = FakeAdmission()
    keeper(api)[0].step()
    api.configurations["gpudra"]["webhooks"][0]["failurePolicy"] = "Ignore"
    keeper(api)[0].step()
    assert api.writes[2:] == ["update configuration"]
    assert api.configurations["gpudra"]["webhooks"][0]["failurePolicy"] == "Fail"


def age(api: FakeAdmission, material: Material) -> None:
    """Store `material` as the Secret, and a configuration that trusts its bundle."""
    api.secrets[("gpudra", "gpudra-webhook-tls")]["data"] = certs.to_secret_data(material)
    api.configurations["gpudra"]["webhooks"] = desired_configuration(OPTIONS, material.ca_crt)["webhooks"]


def test_an_aged_serving_certificate_is_renewed_from_the_same_ca() -> None:
    api = FakeAdmission()
    keeper(api)[0].step()
    old = material_for(serving_names(OPTIONS), now=datetime.now(UTC) - timedelta(days=300))
    age(api, old)
    leader, webhook = keeper(api)
    leader.step()
    assert api.writes[2:] == ["update secret"]
    renewed = api.material()
    assert renewed.ca_crt == old.ca_crt and renewed.tls_crt != old.tls_crt
    assert certs.renewal_reason(datetime.now(UTC), renewed, serving_names(OPTIONS)) is None
    assert webhook.context() is not None


def test_a_ca_rollover_never_serves_a_certificate_the_configuration_does_not_trust() -> None:
    api = FakeAdmission()
    keeper(api)[0].step()
    now = datetime.now(UTC)
    names = serving_names(OPTIONS)
    ancient = material_for(names, now=now - timedelta(days=3000))
    # the serving certificate has been renewed on its own schedule
    serving = certs.issue_serving(
        now - timedelta(days=1), certs.Issued(ancient.ca_crt, ancient.ca_key), names
    )
    old = Material(serving.cert, serving.key, ancient.ca_crt, ancient.ca_key)
    age(api, old)
    leader, _ = keeper(api)

    leader.step()  # the new CA joins the bundle, in the Secret and then the configuration
    assert api.writes[2:] == ["update secret", "update configuration"]
    phase_a = api.material()
    assert phase_a.tls_crt == old.tls_crt
    assert len(read_certificates(api.bundle())) == 2
    assert certs.trusts(api.bundle(), phase_a)

    api.configurations["gpudra"]["webhooks"] = desired_configuration(OPTIONS, old.ca_crt)["webhooks"]
    leader.step()  # the configuration lost the new CA (someone restored it): the serving cert waits
    assert api.writes[4:] == ["update configuration"]
    assert api.material() == phase_a

    leader.step()  # the configuration trusts the new CA: now the serving certificate follows
    assert api.writes[5:] == ["update secret"]
    phase_b = api.material()
    assert phase_b.tls_crt != old.tls_crt
    assert certs.trusts(api.bundle(), phase_b)
    assert certs.renewal_reason(now, phase_b, names) is None

    leader.step()
    assert api.writes[6:] == []


class Clock:
    """A wall clock a test steps ahead or back."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.mark.parametrize(
    "step_days",
    [250, 365 * 9, 365 * 11, -30, -250, -365 * 3],
    ids=["+250d", "+9y (CA rollover)", "+11y (CA expired)", "-30d", "-250d", "-3y"],
)
def test_a_stepped_wall_clock_put_right_heals_the_webhook_within_one_step(step_days: int) -> None:
    """The leader's clock steps ahead or back and the keeper renews by it for a while (the API
    server, whose clock is right, may refuse what it writes then); once the clock is put right,
    the next step leaves a chain that verifies at the right time, and serves it."""
    api, clock = FakeAdmission(), Clock()
    right = clock.now
    webhook = WebhookServer("127.0.0.1", 0, DRIVER, warnings=no_warnings)
    leader = CertificateKeeper(api, OPTIONS, webhook, is_leader=lambda: True, clock=clock)
    names = serving_names(OPTIONS)
    leader.step()
    clock.now = right + timedelta(days=step_days)
    for _ in range(3):  # CA rollover takes two steps (the new CA joins, then the serving cert follows)
        leader.step()
    assert certs.renewal_reason(clock.now, api.material(), names) is None

    clock.now = right + timedelta(seconds=5)
    leader.step()
    material = api.material()
    assert certs.chain_problem(clock.now, api.bundle(), material, names) is None
    assert certs.renewal_reason(clock.now, material, names) is None
    assert leader._served == material and webhook.context() is not None
    written = list(api.writes)
    leader.step()
    assert api.writes == written  # healed: nothing more to write


def test_a_serving_certificate_the_configuration_does_not_verify_now_is_replaced_without_waiting() -> None:
    """An expired CA (the leader was down past its end): the stored serving certificate is trusted
    by the configuration's bundle by signature, but not now; the new CA and certificate replace it in
    one step instead of waiting for a trust that can never come."""
    api = FakeAdmission()
    keeper(api)[0].step()
    names = serving_names(OPTIONS)
    expired = material_for(names, now=datetime.now(UTC) - certs.CA_LIFETIME - timedelta(days=1))
    age(api, expired)
    assert certs.trusts(api.bundle(), expired)
    leader, webhook = keeper(api)
    leader.step()
    assert api.writes[2:] == ["update secret", "update configuration"]
    material = api.material()
    assert material.ca_crt != expired.ca_crt
    assert certs.chain_problem(datetime.now(UTC), api.bundle(), material, names) is None
    assert webhook.context() is not None


def test_serving_names_follow_the_service_or_the_url() -> None:
    assert serving_names(OPTIONS) == ["gpudra-webhook.gpudra.svc"]
    assert serving_names(dataclasses.replace(OPTIONS, webhook_url="https://10.0.0.5:8443")) == ["10.0.0.5"]
    with pytest.raises(ConfigError, match="webhook_url: must be an https:// URL with a host"):
        serving_names(dataclasses.replace(OPTIONS, webhook_url="/validate"))


def test_the_keeper_runs_as_a_service() -> None:
    api = FakeAdmission()
    leader, webhook = keeper(api)
    webhook.start()
    leader.start()
    try:
        for _ in range(100):
            if webhook.problem() is None:
                break
            leader.loop.stopping.wait(0.05)
        assert webhook.problem() is None
    finally:
        leader.stop(5)
        webhook.stop(5)
    assert not leader.loop.alive
