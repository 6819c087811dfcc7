"""README's demo command works and leaves nothing behind, and the GPU map screenshot in docs/ shows its
state: headless Chromium loads the controller's GPU map page while the demo's pods run and its summary
must equal docs/gpu-map.state.json, which `make gpu-map-screenshot` writes with docs/gpu-map.png."""

from __future__ import annotations

from pathlib import Path

from .demo_command import run_demo
from .procs import cluster_processes

GPU_MAP_STATE = Path(__file__).resolve().parents[2] / "docs" / "gpu-map.state.json"


def test_demo_runs_end_to_end_and_cleans_up() -> None:
    out = run_demo("--gpu-map-check", str(GPU_MAP_STATE), timeout=600)
    assert "the GPU map shows what" in out, out
    assert cluster_processes("/tmp/gpudra-demo-") == []
