"""The plugin's HTTP endpoint: metrics, liveness and readiness probes, served on a real socket."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, generate_latest

from gpudra.node.metrics import PluginMetrics
from gpudra.runtime.http_endpoint import Check, HttpEndpoint, report, writable_directory


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode()


def _broken() -> str | None:
    raise RuntimeError("boom")


def test_report_names_every_check_and_fails_if_any_fails() -> None:
    ok, body = report([Check("a", lambda: None), Check("b", lambda: "not yet"), Check("c", _broken)])
    assert not ok
    assert body.splitlines() == [
        "[+]a ok",
        "[-]b failed: not yet",
        "[-]c failed: probe raised RuntimeError: boom",
        "failed",
    ]
    assert report([Check("a", lambda: None)]) == (True, "[+]a ok\nok\n")
    assert report([]) == (True, "ok\n")


def test_the_endpoint_serves_metrics_and_both_probes() -> None:
    registry = CollectorRegistry()
    Counter("gpudra_test_things", "Things.", registry=registry).inc(3)
    problem: list[str | None] = ["the kubelet has not registered the plugin yet"]
    endpoint = HttpEndpoint(
        registry,
        address="127.0.0.1",
        port=0,
        liveness=[Check("loop-x", lambda: None)],
        readiness=[Check("kubelet-registration", lambda: problem[0])],
    )
    endpoint.start()
    try:
        status, body = _get(endpoint.port, "/metrics")
        assert status == 200 and "gpudra_test_things_total 3.0" in body
        assert _get(endpoint.port, "/livez") == (200, "[+]loop-x ok\nok\n")
        assert _get(endpoint.port, "/healthz")[0] == 200
        status, body = _get(endpoint.port, "/readyz")
        assert status == 503
        assert "[-]kubelet-registration failed: the kubelet has not registered the plugin yet" in body
        problem[0] = None
        assert _get(endpoint.port, "/readyz") == (200, "[+]kubelet-registration ok\nok\n")
    finally:
        endpoint.stop(5)


def test_the_endpoint_binds_only_the_address_it_is_given() -> None:
    endpoint = HttpEndpoint(CollectorRegistry(), address="127.0.0.1", port=0)
    endpoint.start()
    try:
        listening = Path("/proc/net/tcp").read_text().splitlines()[1:]
        port_hex = f"{endpoint.port:04X}"
        local = [line.split()[1] for line in listening if line.split()[1].endswith(f":{port_hex}")]
        assert local == [f"0100007F:{port_hex}"]  # 127.0.0.1, not 0.0.0.0
    finally:
        endpoint.stop(5)


def test_writable_directory_fails_where_no_file_can_be_written(tmp_path: Path) -> None:
    """(A read-only mount is tried on the real node: tests/integration/test_plugin_faults.py.)"""
    assert writable_directory(tmp_path)() is None
    assert list(tmp_path.iterdir()) == []  # the probe cleans up after itself
    missing = writable_directory(tmp_path / "absent")()
    assert missing is not None and "No such file or directory" in missing
    (tmp_path / "file").write_text("")
    not_a_directory = writable_directory(tmp_path / "file")()
    assert not_a_directory is not None and "Not a directory" in not_a_directory


def test_api_requests_are_exported_by_verb_and_resource() -> None:
    counts = {("get", "resourceclaims"): 2, ("list", "resourceslices"): 5}
    metrics = PluginMetrics()
    metrics.track_api_requests(lambda: counts)
    text = generate_latest(metrics.registry).decode()
    assert 'gpudra_api_requests_total{resource="resourceclaims",verb="get"} 2.0' in text
    assert 'gpudra_api_requests_total{resource="resourceslices",verb="list"} 5.0' in text
