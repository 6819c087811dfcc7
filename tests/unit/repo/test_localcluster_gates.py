"""The local cluster's feature gates from GPUDRA_FEATURE_GATES (make compat): parsed, or one clear error."""

from __future__ import annotations

import pytest

from gpudra.errors import ClusterError
from tests.localcluster.cluster import feature_gates_from_env


def test_gates_are_read_as_the_components_flag_has_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUDRA_FEATURE_GATES", "DRAPartitionableDevices=true, DRADeviceTaints=FALSE,")
    assert feature_gates_from_env() == {"DRAPartitionableDevices": True, "DRADeviceTaints": False}
    monkeypatch.delenv("GPUDRA_FEATURE_GATES")
    assert feature_gates_from_env() == {}


@pytest.mark.parametrize("value", ["DRAPartitionableDevices", "DRAPartitionableDevices=yes", "=true"])
def test_a_malformed_gate_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("GPUDRA_FEATURE_GATES", value)
    with pytest.raises(ClusterError, match=r"GPUDRA_FEATURE_GATES: .* is not Gate=true or Gate=false"):
        feature_gates_from_env()
