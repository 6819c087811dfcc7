"""The cluster's objects read into typed records (gpudra.model.cluster_objects), and the tolerant
readers under them (gpudra.model.tolerant): well-formed objects read whole, ill-typed ones read as
absent, and nothing raises."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudra.model import tolerant
from gpudra.model.claim import FieldProblem, Toleration
from gpudra.model.cluster_objects import (
    Container,
    DeviceClass,
    Node,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Pod,
    PodClaim,
    PodSpec,
    ResourceClaimTemplate,
    Taint,
)

NODE = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {"name": "gpu-1", "labels": {"gpu": "h100", "gpus": 8}},
    "spec": {
        "unschedulable": True,
        "taints": [
            {"key": "gpu", "value": "yes", "effect": "NoSchedule"},
            {"key": "bare", "effect": "NoExecute"},
        ],
    },
    "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": 110}},
}

POD_SPEC = {
    "nodeName": "gpu-1",
    "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "nodeSelector": {"gpu": "h100"},
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["4"]}],
                        "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}],
                    }
                ]
            }
        },
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{}]},
    },
    "topologySpreadConstraints": [{"maxSkew": 1}],
    "containers": [{"name": "app", "resources": {"requests": {"cpu": "2"}, "limits": {"memory": "8Gi"}}}],
    "initContainers": [{"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": 1}}}],
    "overhead": {"memory": "100Mi"},
    "resourceClaims": [
        {"name": "gpu", "resourceClaimTemplateName": "one-gpu"},
        {"name": "shared", "resourceClaimName": "team-gpu"},
    ],
}

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"namespace": "team-a", "name": "train"},
    "spec": POD_SPEC,
    "status": {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}],
        "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "train-gpu-x7k2"}, {"name": "shared"}],
    },
}

DEVICE_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "gpu.gpudra.io"},
    "spec": {
        "selectors": [{"cel": {"expression": 'device.driver == "gpu.gpudra.io"'}}, {"cel": {}}],
        "config": [{"opaque": {"driver": "gpu.gpudra.io", "parameters": {}}}],
    },
}

TEMPLATE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaimTemplate",
    "metadata": {"namespace": "team-a", "name": "one-gpu"},
    "spec": {
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpudra.io"}}]}}
    },
}


# --- well-formed objects --------------------------------------------------------------------------


def test_a_node_is_read_whole() -> None:
    assert Node.from_raw(NODE) == Node(
        name="gpu-1",
        labels={"gpu": "h100", "gpus": "8"},  # a number, as YAML reads it, compared as its text
        taints=(Taint("gpu", "yes", "NoSchedule"), Taint("bare", "", "NoExecute")),
        unschedulable=True,
        allocatable={"cpu": "64", "memory": "512Gi", "pods": "110"},
    )


def test_a_pod_is_read_whole() -> None:
    pod = Pod.from_raw(POD)
    assert (pod.namespace, pod.name, pod.phase, pod.scheduled) == ("team-a", "train", "Running", True)
    assert pod.claim_statuses == {"gpu": "train-gpu-x7k2"}  # an entry naming no claim made is none
    assert pod.problems == ()
    assert pod.spec == PodSpec.from_raw(POD_SPEC)
    assert pod.spec == PodSpec(
        node_name="gpu-1",
        tolerations=(Toleration(key="gpu", operator="Exists", effect="NoSchedule"),),
        node_selector={"gpu": "h100"},
        required_node_affinity=(
            NodeSelectorTerm(
                match_expressions=(NodeSelectorRequirement("gpus", "Gt", ("4",)),),
                match_fields=(NodeSelectorRequirement("metadata.name", "In", ("gpu-1",)),),
            ),
        ),
        pod_affinity=False,
        pod_anti_affinity=True,
        topology_spread=True,
        containers=(Container(requests={"cpu": "2"}, limits={"memory": "8Gi"}),),
        init_containers=(Container(requests={"cpu": "1"}, restart_policy="Always"),),
        overhead={"memory": "100Mi"},
        resource_claims=(
            PodClaim(0, name="gpu", template_name="one-gpu"),
            PodClaim(1, name="shared", resource_claim_name="team-gpu"),
        ),
    )


def test_required_node_affinity_is_none_only_when_not_given() -> None:
    assert PodSpec.from_raw({}).required_node_affinity is None
    empty = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"x": 1}}}}
    assert PodSpec.from_raw(empty).required_node_affinity == ()  # given, with no term: matches no node


def test_a_device_class_keeps_one_expression_per_selector() -> None:
    assert DeviceClass.from_raw(DEVICE_CLASS) == DeviceClass(
        name="gpu.gpudra.io", selectors=('device.driver == "gpu.gpudra.io"', "")
    )


def test_a_template_holds_its_claim_spec() -> None:
    template = ResourceClaimTemplate.from_raw(TEMPLATE)
    assert (template.namespace, template.name) == ("team-a", "one-gpu")
    assert template.spec.path == "spec.spec"
    assert template.spec.problems == ()
    [(request,)] = template.spec.requests
    assert (request.name, request.device_class, request.field) == (
        "gpu",
        "gpu.gpudra.io",
        "spec.spec.devices.requests[0].exactly",
    )


# --- ill-typed objects ----------------------------------------------------------------------------

RECORDS = (Node, Pod, PodSpec, DeviceClass, ResourceClaimTemplate, Taint, Container, NodeSelectorTerm)


@pytest.mark.parametrize(
    "raw", [None, 7, "Node", [NODE], True, {}, {"metadata": None, "spec": [], "status": "x"}]
)
@pytest.mark.parametrize("record", RECORDS)
def test_what_is_not_an_object_reads_as_an_empty_one(record: Any, raw: object) -> None:
    found = record.from_raw(raw)
    if record is Pod:
        found = Pod(spec=found.spec)  # the pod's problems are the next test's
    if record is ResourceClaimTemplate:
        assert found.spec.requests == () and found.name == ""
    else:
        assert found == record()


def test_fields_of_the_wrong_type_read_as_absent() -> None:
    node = Node.from_raw(
        {
            "metadata": {"name": 5, "labels": ["gpu"]},
            "spec": {"unschedulable": "true", "taints": {"key": "gpu"}},
            "status": {"allocatable": {"cpu": {"value": 4}, "memory": None, "pods": "110"}},
        }
    )
    assert node == Node(allocatable={"pods": "110"})
    spec = PodSpec.from_raw(
        {
            "nodeName": ["gpu-1"],
            "tolerations": ["gpu", {"key": 1, "operator": "Exists"}],
            "nodeSelector": {"gpu": {"is": "h100"}, "zone": "a"},
            "affinity": {"nodeAffinity": "required", "podAffinity": ["x"]},
            "containers": [None, {"resources": {"requests": ["cpu"], "limits": {"cpu": True}}}],
            "overhead": "100Mi",
            "topologySpreadConstraints": {"maxSkew": 1},
        }
    )
    assert spec == PodSpec(
        tolerations=(Toleration(operator="Exists"),),
        node_selector={"zone": "a"},
        containers=(Container(limits={"cpu": "True"}),),  # left to the quantity parser to refuse
    )
    term = NodeSelectorTerm.from_raw(
        {"matchExpressions": [{"key": "a", "values": [None, "1", {"x": 2}, 3]}, 4]}
    )
    assert term == NodeSelectorTerm(match_expressions=(NodeSelectorRequirement("a", "", ("1", "3")),))
    assert DeviceClass.from_raw(
        {"metadata": {"name": 1}, "spec": {"selectors": ["x", {"cel": {"expression": 2}}]}}
    ) == (DeviceClass(selectors=("", "")))


def test_a_pod_notes_what_explain_cannot_read_of_its_claims() -> None:
    pod = Pod.from_raw(
        {
            "metadata": ["train"],
            "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": 3}, "gpu"]},
            "spec": {
                "nodeName": "gpu-1",
                "resourceClaims": [None, "gpu", {"name": "b", "resourceClaimName": "c"}],
            },
        }
    )
    assert pod.problems == (
        FieldProblem("metadata", "is list, not an object"),
        FieldProblem("status.resourceClaimStatuses[1]", "is str, not an object"),
        FieldProblem("spec.resourceClaims[1]", "is str, not an object"),
    )
    assert pod.claim_statuses == {}
    assert pod.spec.node_name == "gpu-1"  # the rest is read as it is
    # null stands for absent; an entry keeps its index
    assert pod.spec.resource_claims == (PodClaim(0), PodClaim(2, name="b", resource_claim_name="c"))
    assert Pod.from_raw({"spec": "x", "status": 1}).problems == (
        FieldProblem("status", "is int, not an object"),
        FieldProblem("spec", "is str, not an object"),
    )
    assert Pod.from_raw({"spec": {"resourceClaims": {"name": "gpu"}}}).problems == (
        FieldProblem("spec.resourceClaims", "is dict, not a list"),
    )


def test_the_tolerant_readers() -> None:
    assert tolerant.mapping([("a", 1)]) == {} and tolerant.mapping({"a": 1}) == {"a": 1}
    assert tolerant.items({"a": 1}) == [] and tolerant.items([1, None]) == [1, None]
    assert tolerant.objects([{"a": 1}, "b", None]) == [{"a": 1}]
    assert (tolerant.text(1), tolerant.text("a"), tolerant.text_or_none(None), tolerant.text_or_none("")) == (
        "",
        "a",
        None,
        "",
    )
    assert [tolerant.scalar(v) for v in ("8", 8, 1.5, True, None, [8], {"a": 8})] == [
        "8",
        "8",
        "1.5",
        "True",
        None,
        None,
        None,
    ]
    assert (tolerant.flag(True), tolerant.flag("true"), tolerant.flag(1)) == (True, False, False)
    with pytest.raises(TypeError):
        tolerant.EMPTY["a"] = 1


# --- any JSON -------------------------------------------------------------------------------------

# Keys the readers look for, so that generated objects reach past the top level.
_READ_KEYS = (
    "metadata spec status name namespace labels taints key value effect unschedulable "
    "allocatable nodeName tolerations operator nodeSelector affinity nodeAffinity "
    "requiredDuringSchedulingIgnoredDuringExecution nodeSelectorTerms matchExpressions "
    "matchFields values podAffinity podAntiAffinity topologySpreadConstraints containers "
    "initContainers resources requests limits restartPolicy overhead resourceClaims "
    "resourceClaimName resourceClaimTemplateName phase conditions type resourceClaimStatuses "
    "selectors cel expression devices exactly firstAvailable deviceClassName count "
    "constraints matchAttribute "
)
_KEYS = st.sampled_from(_READ_KEYS.split()) | st.text(max_size=4)
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64)
    | st.floats(allow_nan=True)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_KEYS, children, max_size=6),
    max_leaves=40,
)


# An object's top level, each part anything.
_OBJECTS = _JSON | st.fixed_dictionaries({}, optional={"metadata": _JSON, "spec": _JSON, "status": _JSON})


@settings(max_examples=400, deadline=None)
@given(_OBJECTS)
def test_from_raw_never_raises_on_any_json(raw: object) -> None:
    for record in (*RECORDS, NodeSelectorRequirement):
        record.from_raw(raw)
