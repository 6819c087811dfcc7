"""ClaimReader: every prepare reads its claim from the API server, once."""

from __future__ import annotations

import pytest

from gpudra.errors import ClaimError, ClusterError
from gpudra.kube.claims import ClaimReader
from gpudra.kube.client import NotFound
from gpudra.model.claim import read_claim
from tests.unit.claims import whole_gpus
from tests.unit.harness.kube import FakeClaimKube

HERE = whole_gpus("u-here", "gpu-0", name="here")


def test_every_read_goes_to_the_api_server_and_is_counted() -> None:
    kube = FakeClaimKube({("default", "here"): HERE})
    reader = ClaimReader(kube)
    for _ in range(3):
        assert reader.get(namespace="default", name="here", uid="u-here") == read_claim(HERE)
    assert kube.gets == [("default", "here")] * 3
    assert reader.gets == 3


def test_a_missing_claim_is_a_claim_error() -> None:
    reader = ClaimReader(FakeClaimKube({}))
    with pytest.raises(ClaimError, match="ResourceClaim default/gone not found") as raised:
        reader.get(namespace="default", name="gone", uid="u")
    assert isinstance(raised.value.__cause__, NotFound)


def test_other_api_errors_pass_through() -> None:
    reader = ClaimReader(FakeClaimKube({}, ClusterError("reading ResourceClaim default/here: HTTP 503")))
    with pytest.raises(ClusterError, match="HTTP 503"):
        reader.get(namespace="default", name="here", uid="u-here")
