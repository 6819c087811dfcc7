"""`gpudra.bounded_json`: what others write is decoded object by object, and one object beyond the
bounds (nested deeper than 100 levels, or larger than 4 MiB of JSON) is left out, named, while the rest
of the document is used. The depth check is compared with a plain recursive count."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudra import bounded_json
from gpudra.bounded_json import EACH, MAX_CHARS, MAX_DEPTH, ONE, Poisoned, Unreadable, decode, nesting_exceeds

DEEP = "[" * 3000 + "]" * 3000  # what the API server accepts in a claim's opaque parameters


def nested(levels: int) -> str:
    """A JSON array `levels` deep, as a tenant would write it (json.dumps cannot go that deep)."""
    return "[" * levels + "]" * levels


def claim(name: str, parameters: str = "{}", *, namespace: str = "team-a", version: str = "7") -> str:
    """A claim's JSON with `parameters` (raw JSON text) as its opaque parameters, metadata first as the
    API server writes it."""
    head = json.dumps({"name": name, "namespace": namespace, "resourceVersion": version})
    config = f'[{{"opaque": {{"parameters": {parameters}}}}}]'
    return f'{{"metadata": {head}, "spec": {{"devices": {{"config": {config}}}}}}}'


def page(*items: str) -> str:
    head = '"kind": "ResourceClaimList", "metadata": {"resourceVersion": "9"}'
    return f'{{{head}, "items": [{", ".join(items)}]}}'


def test_a_page_keeps_every_item_but_the_poisoned_one_which_is_named() -> None:
    decoded = decode(page(claim("a"), claim("deep", DEEP, version="12"), claim("b")), {"items": EACH})
    first, poisoned, last = decoded["items"]
    assert first["metadata"]["name"] == "a" and last["metadata"]["name"] == "b"
    assert isinstance(poisoned, Poisoned) and poisoned.reason == "too-deep"
    assert (poisoned.namespace, poisoned.name, poisoned.resource_version) == ("team-a", "deep", "12")
    assert poisoned.ref == "team-a/deep"
    assert poisoned.problem == "nests too deeply to decode (more than 100 levels)"
    assert decoded["metadata"] == {"resourceVersion": "9"} and decoded["kind"] == "ResourceClaimList"


def test_the_depth_bound_is_exact_whether_or_not_python_could_decode_the_object() -> None:
    # the claim's own levels count: parameters 94 deep sit at level 100 (spec, devices, config, its
    # entry, opaque)
    assert decode(claim("x", nested(MAX_DEPTH - 6)), ONE) == json.loads(claim("x", nested(MAX_DEPTH - 6)))
    over = decode(claim("x", nested(MAX_DEPTH - 5)), ONE)  # Python decodes it; the bound refuses it
    assert isinstance(over, Poisoned) and over.reason == "too-deep" and over.name == "x"
    assert isinstance(decode(claim("x", nested(900)), ONE), Poisoned)
    assert isinstance(decode(claim("x", nested(100_000)), ONE), Poisoned)


def test_an_object_over_the_size_bound_is_left_out_with_its_name() -> None:
    big = json.dumps({"blob": "x" * MAX_CHARS})
    decoded = decode(page(claim("big", big), claim("small")), {"items": EACH})
    poisoned, small = decoded["items"]
    assert isinstance(poisoned, Poisoned) and poisoned.reason == "too-large" and poisoned.name == "big"
    assert poisoned.problem == "is too large to decode (more than 4 MiB of JSON)"
    assert small["metadata"]["name"] == "small"


def test_the_name_is_found_wherever_the_metadata_is_and_however_it_is_escaped() -> None:
    metadata = json.dumps(
        {"namespace": "n\\s", "name": 'q"[{', "resourceVersion": "3", "labels": {"name": "no"}}
    )
    text = f'{{"spec": {{"a": [{{"name": "not this"}}], "deep": {DEEP}}}, "metadata": {metadata}}}'
    poisoned = decode(text, ONE)
    assert isinstance(poisoned, Poisoned)
    assert (poisoned.namespace, poisoned.name, poisoned.resource_version) == ("n\\s", 'q"[{', "3")


def test_other_paths_can_be_kept_with_arrays_by_star() -> None:
    text = claim("x", DEEP).replace('"opaque": {', '"opaque": {"driver": "gpu.gpudra.io", ')
    path = ("spec", "devices", "config", "*", "opaque", "driver")
    poisoned = decode(text, ONE, keep={path})
    assert isinstance(poisoned, Poisoned)
    assert poisoned.strings == {path: ("gpu.gpudra.io",)} and poisoned.name == ""
    assert poisoned.ref == "(unnamed)"


def test_a_watch_event_keeps_its_type_and_version_around_a_poisoned_object() -> None:
    event = decode(f'{{"type": "MODIFIED", "object": {claim("deep", DEEP, version="44")}}}', {"object": ONE})
    assert event["type"] == "MODIFIED" and event["object"].resource_version == "44"


def test_nested_shapes_bound_each_member_and_leave_the_rest_whole() -> None:
    shape = {"request": {"object": ONE, "oldObject": ONE}}
    request = f'{{"uid": "u", "object": {claim("new", DEEP)}, "oldObject": null}}'
    text = f'{{"kind": "AdmissionReview", "request": {request}}}'
    review = decode(text, shape)
    assert review["request"]["uid"] == "u" and review["request"]["oldObject"] is None
    assert isinstance(review["request"]["object"], Poisoned)


@pytest.mark.parametrize(
    "text",
    [
        DEEP,  # not an object where the shape wants one
        f'{{"kind": "List", "metadata": {DEEP}, "items": []}}',  # the document's own part
        f'{{"items": {{"deep": {DEEP}}}}}',  # not an array where the shape wants one
    ],
)
def test_a_document_whose_own_parts_break_a_bound_is_unreadable(text: str) -> None:
    with pytest.raises(Unreadable, match="nests too deeply to decode"):
        decode(text, {"items": EACH})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"items": [1, 2', "expected ','"),
        ('{"items": [1, }', "Expecting value"),
        ('{"items": [] } x', "extra data"),
        ('{"items" [1]}', "expected ':'"),
        ("{1: 2}", "expected a member name"),
        ('{"items": [' + "[" * 100_000, "ends inside"),  # past any recursion limit (celpy sets 2500)
    ],
)
def test_malformed_json_is_a_value_error(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode(text, {"items": EACH})


def test_a_document_decodes_as_json_loads_does_when_nothing_is_poisoned() -> None:
    document = {"kind": "L", "items": [{"a": [1, 2.5, None, True]}, [], "s", {"b": {"c": '[{\\"}'}}], "z": {}}
    for text in (
        json.dumps(document),
        json.dumps(document, indent=2),
        json.dumps(document, separators=(",", ":")),
    ):
        assert decode(text, {"items": EACH}) == document
        assert decode(text, ONE) == document
    assert decode(' {"items": []} ', {"items": EACH}) == {"items": []}
    assert decode('{"items": null}', {"items": EACH}) == {"items": None}


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab\n\u00e9'),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(alphabet='[]{}"\\k'), children, max_size=3)
    ),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(json_values, st.integers(min_value=0, max_value=12))
def test_the_depth_check_agrees_with_a_recursive_count(value: Any, limit: int) -> None:
    for text in (json.dumps(value), json.dumps(value, indent=1, ensure_ascii=False)):
        assert nesting_exceeds(text, limit) == (depth(value) > limit)


def test_the_module_states_its_bounds() -> None:
    assert (bounded_json.MAX_DEPTH, bounded_json.MAX_CHARS) == (100, 4 * 1024 * 1024)
