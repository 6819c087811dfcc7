"""gpudra's API client against the real API server: a refusal carries the API server's own words (its
Status message: which field, and why) on one bounded line, so a log or an event says what to fix."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from gpudra.errors import ClusterError
from gpudra.kube.client import MAX_STATUS_MESSAGE, Kube, NotFound
from tests.localcluster.node_plugin import DRIVER


def _slice(name: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": DRIVER,
            "nodeName": "node-mixed",
            "pool": {"name": "node-mixed", "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def test_a_refused_write_says_which_field_in_the_api_servers_words(api: client.ApiClient) -> None:
    kube = Kube(api)
    with pytest.raises(ClusterError) as refused:
        kube.create_slice(_slice("errors-one", [{"name": "Not_A_DNS_Label"}]), dry_run=True)
    message = str(refused.value)
    assert message.startswith("creating ResourceSlice errors-one (dry run): HTTP 422"), message
    assert "spec.devices[0].name" in message and "Not_A_DNS_Label" in message, message


def test_a_long_refusal_is_one_line_of_bounded_length(api: client.ApiClient) -> None:
    """Every device of a slice refused: the API server lists each, gpudra keeps one line of its words."""
    kube = Kube(api)
    devices = [{"name": f"Bad_{i}\nline"} for i in range(40)]
    with pytest.raises(ClusterError) as refused:
        kube.create_slice(_slice("errors-many", devices), dry_run=True)
    message = str(refused.value)
    prefix = "creating ResourceSlice errors-many (dry run): HTTP 422 Unprocessable Entity: "
    assert message.startswith(prefix), message
    words = message[len(prefix) :]
    assert len(words) == MAX_STATUS_MESSAGE and words.endswith("…"), words
    assert "spec.devices[0].name" in words and words.isprintable(), words


def test_a_missing_object_is_not_found_with_its_name(api: client.ApiClient) -> None:
    with pytest.raises(NotFound) as missing:
        Kube(api).get_claim("default", "no-such-claim")
    assert 'resourceclaims.resource.k8s.io "no-such-claim" not found' in str(missing.value), missing.value
