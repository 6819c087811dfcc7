"""PluginMetrics series and the two log formats."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpudra.model.devices import DeviceTaint
from gpudra.node.metrics import PluginMetrics
from gpudra.runtime import logs
from gpudra.runtime.logs import JsonFormatter, TextFormatter

UID = "5f7c2a9e-8b1d-4e3f-a6c0-2d9b8e7f1a34"


def sample(metrics: PluginMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_every_series_exists_up_front() -> None:
    metrics = PluginMetrics()
    for op in ("create", "update", "delete"):
        assert sample(metrics, "gpudra_resourceslice_writes_total", operation=op) == 0
    assert sample(metrics, "gpudra_prepared_claims") == 0
    assert sample(metrics, "gpudra_prepared_devices") == 0


@pytest.mark.parametrize(
    ("operation", "histogram"),
    [("prepare", "gpudra_prepare_seconds"), ("unprepare", "gpudra_unprepare_seconds")],
    ids=["prepare", "unprepare"],
)
def test_observe_counts_durations_and_errors(operation: str, histogram: str) -> None:
    metrics = PluginMetrics()
    observe = metrics.observe_prepare if operation == "prepare" else metrics.observe_unprepare
    observe("ok", 0.02)
    observe("ok", 3.0)
    observe("config", 0.001)
    observe("ClaimError", 0.2)
    observe("config", 0.001)

    assert sample(metrics, f"{histogram}_count", outcome="ok") == 2
    assert sample(metrics, f"{histogram}_sum", outcome="ok") == pytest.approx(3.02)
    assert sample(metrics, f"{histogram}_bucket", outcome="ok", le="0.025") == 1
    assert sample(metrics, f"{histogram}_bucket", outcome="ok", le="5.0") == 2
    assert sample(metrics, f"{histogram}_count", outcome="config") == 2
    errors = "gpudra_claim_errors_total"
    assert sample(metrics, errors, operation=operation, reason="config") == 2
    assert sample(metrics, errors, operation=operation, reason="ClaimError") == 1
    assert sample(metrics, errors, operation=operation, reason="ok") is None
    other = "unprepare" if operation == "prepare" else "prepare"
    assert sample(metrics, errors, operation=other, reason="config") is None


def test_track_prepared_reads_the_counts_at_scrape_time() -> None:
    metrics = PluginMetrics()
    counts = [(0, 0)]
    metrics.track_prepared(lambda: counts[-1])
    assert (sample(metrics, "gpudra_prepared_claims"), sample(metrics, "gpudra_prepared_devices")) == (0, 0)
    counts.append((3, 5))
    assert (sample(metrics, "gpudra_prepared_claims"), sample(metrics, "gpudra_prepared_devices")) == (3, 5)
    counts.append((1, 1))
    assert (sample(metrics, "gpudra_prepared_claims"), sample(metrics, "gpudra_prepared_devices")) == (1, 1)


def test_slice_writes_count_per_operation() -> None:
    metrics = PluginMetrics()
    metrics.slice_writes.labels("update").inc()
    metrics.slice_writes.labels("update").inc()
    assert sample(metrics, "gpudra_resourceslice_writes_total", operation="update") == 2
    assert sample(metrics, "gpudra_resourceslice_writes_total", operation="create") == 0


def test_readiness_checks_are_run_at_scrape_time_and_a_raising_probe_fails() -> None:
    metrics = PluginMetrics()
    why: list[str | None] = [None]

    def broken() -> str | None:
        raise OSError("no such directory")

    metrics.track_readiness("kubelet-plugin", {"checkpoint": lambda: why[-1], "cdi-root": broken})
    ready = "gpudra_ready"
    assert sample(metrics, ready, daemon="kubelet-plugin", check="checkpoint") == 1
    assert sample(metrics, ready, daemon="kubelet-plugin", check="cdi-root") == 0
    why.append("the checkpoint is damaged")
    assert sample(metrics, ready, daemon="kubelet-plugin", check="checkpoint") == 0


def test_tainted_devices_are_counted_by_effect_from_zero() -> None:
    metrics = PluginMetrics()
    taints: dict[str, DeviceTaint] = {}
    metrics.track_tainted_devices(lambda: taints)
    assert sample(metrics, "gpudra_tainted_devices", effect="NoSchedule") == 0
    assert sample(metrics, "gpudra_tainted_devices", effect="NoExecute") == 0
    taints["gpu-0"] = {"key": "gpu.gpudra.io/xid", "value": "reset", "effect": "NoExecute"}
    taints["gpu-1"] = {"key": "gpu.gpudra.io/unhealthy", "value": "lost", "effect": "NoSchedule"}
    taints["gpu-1-mig-1g10gb-0"] = {"key": "gpu.gpudra.io/unhealthy", "effect": "NoSchedule"}
    assert sample(metrics, "gpudra_tainted_devices", effect="NoSchedule") == 2
    assert sample(metrics, "gpudra_tainted_devices", effect="NoExecute") == 1


def test_two_instances_do_not_share_a_registry() -> None:
    first, second = PluginMetrics(), PluginMetrics()
    first.observe_prepare("ok", 1)
    assert sample(second, "gpudra_prepare_seconds_count", outcome="ok") is None


# --- logs --------------------------------------------------------------------------------------


def record(message: str = "prepare failed", **extra: object) -> logging.LogRecord:
    logger = logging.getLogger("gpudra.test")
    return logger.makeRecord(logger.name, logging.WARNING, __file__, 1, message, (), None, extra=extra)


def test_json_lines_are_json_with_the_extra_fields() -> None:
    line = JsonFormatter().format(record(claim=UID, error="boom", moved_to=Path("/var/x")))
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed == {
        "ts": parsed["ts"],
        "level": "warning",
        "logger": "gpudra.test",
        "msg": "prepare failed",
        "claim": UID,
        "error": "boom",
        "moved_to": "/var/x",
    }
    assert len(parsed["ts"]) == len("2026-01-01T00:00:00")


def test_json_lines_carry_the_exception() -> None:
    try:
        raise ValueError("bad value")
    except ValueError:
        failure = record(claim=UID)
        failure.exc_info = sys.exc_info()
    parsed = json.loads(JsonFormatter().format(failure))
    assert parsed["claim"] == UID
    assert "ValueError: bad value" in parsed["exception"]


def test_text_lines_carry_key_value_pairs() -> None:
    line = TextFormatter().format(record("settling", claim=UID, state="PrepareStarted"))
    assert line.endswith(f" W gpudra.test: settling claim={UID} state=PrepareStarted")


def test_text_lines_without_extra_fields() -> None:
    line = TextFormatter().format(record("serving"))
    assert line.endswith(" W gpudra.test: serving")


def test_message_arguments_are_applied() -> None:
    logger = logging.getLogger("gpudra.test")
    formatted = logger.makeRecord(
        logger.name, logging.INFO, __file__, 1, "settling %s", ("PrepareStarted",), None
    )
    assert json.loads(JsonFormatter().format(formatted))["msg"] == "settling PrepareStarted"
    assert TextFormatter().format(formatted).endswith(" I gpudra.test: settling PrepareStarted")


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield root
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_configure_writes_one_line_per_record_to_stderr(
    root_logger: logging.Logger, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    logs.configure(fmt=fmt, level="INFO")
    logging.getLogger("gpudra.node.daemon").info("discovered GPUs", extra={"gpus": 8})
    logging.getLogger("gpudra.node.daemon").debug("not shown")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    if fmt == "json":
        assert json.loads(lines[0])["gpus"] == 8
    else:
        assert lines[0].endswith("gpudra.node.daemon: discovered GPUs gpus=8")
