"""`python -m tests.bench.gpu_map` (`make bench-gpu-map`): the GPU map page's load time at 1,000 simulated
DGX H100 nodes' slices. Prints a table; asserts nothing.

Each node publishes what gpudra's device model makes of the simulator's DGX H100 (tests/scale/layouts.py:
whole GPUs only, and every MIG profile x placement plus shares), and holds a whole GPU, two MIG
partitions and two shares; PENDING claims wait. Measured, as the controller serves the page:

- survey: the walk of every slice and claim (`gpu_map.survey`), once per change of the cluster;
- JSON: one page drawn and serialised (`gpu_map.draw`);
- explain: the reason of one pending claim (`gpu_map.reason`, which the page asks for after drawing);
- browser: headless Chromium navigating to `/` over loopback until the page drew its JSON (the page's
  own performance.now(), read over the DevTools protocol): the HTML, the JSON request with the server's
  drawing, and the DOM; the pending claims' reasons are taken as known, so the page asks for none
  (one explanation is timed on its own).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import yaml

from gpudra.controller.gpu_map_page import GpuMapPage
from gpudra.model.claim import read_claim
from gpudra.node import gpu_driver
from gpudra.scheduling.gpu_map import MapQuery, Survey, draw, reason, survey
from tests.bench.table import markdown
from tests.localcluster import browser
from tests.localcluster.binaries import repo_root
from tests.scale import layouts

NODES = 1000
PENDING = 20
DRIVER = layouts.DRIVER


def _claim(name: str, results: list[dict[str, Any]], *, classes: tuple[str, ...] = ()) -> dict[str, Any]:
    status: dict[str, Any] = {"allocation": {"devices": {"results": results}}} if results else {}
    return {
        "metadata": {"namespace": f"team-{int(name.split('-')[1]) % 40}", "name": name},
        "spec": {
            "devices": {
                "requests": [
                    {"name": f"r{i}", "exactly": {"deviceClassName": c}} for i, c in enumerate(classes)
                ]
            }
        },
        "status": status,
    }


def _claims(nodes: list[str], devices: set[str]) -> list[dict[str, Any]]:
    """Per node: gpu-0 whole, 3g.40gb and 1g.10gb on gpu-1, two shares of gpu-2 (those the layout has)."""
    found = []
    for index, node in enumerate(nodes):
        holds = [
            ("gpu-0", None),
            ("gpu-1-mig-3g40gb-0", None),
            ("gpu-1-mig-1g10gb-4", None),
            ("gpu-2-shared", "a"),
            ("gpu-2-shared", "b"),
        ]
        for n, (device, share) in enumerate(holds):
            if device not in devices:
                continue
            result: dict[str, Any] = {"request": "r0", "driver": DRIVER, "pool": node, "device": device}
            if share:
                result |= {
                    "shareID": f"{index}-{share}",
                    "consumedCapacity": {"memory": "20Gi", "compute": "25"},
                }
            found.append(_claim(f"c-{index * 10 + n}", [result]))
    found += [_claim(f"p-{i}", [], classes=("gpu.gpudra.io",)) for i in range(PENDING)]
    return found


def _timed(step: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = step()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access log in the table's output."""


def _browser_ms(url: str, repeat: int) -> float:
    return statistics.median(browser.drawn_ms(url) for _ in range(repeat))


def _layout(name: str, dgx: Any, nodes: list[str], classes: list[Any], *, repeat: int) -> list[list[str]]:
    shape = layouts.shape(dgx, layouts.LAYOUTS[name], server_minor=36)
    slices = [s for node in nodes for s in shape.slices_for(node)]
    devices = {str(d["name"]) for d in shape.model.devices}
    claims = [read_claim(c) for c in _claims(nodes, devices)]
    build = functools.partial(
        survey,
        driver=DRIVER,
        slices=slices,
        claims=claims,
        classes=classes,
        now=datetime.now(UTC),
        idle_after_seconds=1800,
    )
    survey_s, found = _timed(build, repeat)
    explain_s, _ = _timed(functools.partial(reason, found, "team-0/p-0"), 1)
    # The browser's load is timed up to the drawing: the reasons it would ask for next are known.
    found.reasons.update({f"{p.namespace}/{p.name}": "known" for p in found.view.pending})
    rows = []
    for size in (50, 200):
        page_s, body = _timed(functools.partial(_page_json, found, size), repeat)
        server = make_server(
            "127.0.0.1", 0, GpuMapPage(functools.partial(_same, found)).app, handler_class=_Quiet
        )
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            loaded = _browser_ms(f"http://127.0.0.1:{server.server_port}/?size={size}", repeat)
        finally:
            server.shutdown()
            server.server_close()
        gpus = sum(len(n["gpus"]) for n in json.loads(body)["nodes"])
        rows.append(
            [
                name,
                f"{len(slices):,}",
                str(size),
                str(gpus),
                f"{survey_s:.2f}",
                f"{page_s * 1000:.0f}",
                f"{len(body) / 1024:.0f}",
                f"{loaded:.0f}",
                f"{explain_s:.2f}",
            ]
        )
    return rows


def _page_json(found: Survey, size: int) -> str:
    return draw(found, MapQuery(size=size)).model_dump_json(by_alias=True)


def _same(found: Survey) -> Survey:
    return found


def run(nodes: int, repeat: int) -> str:
    with gpu_driver.connect("sim:dgx-h100") as session:
        dgx = session.inventory()
    classes = list(
        yaml.safe_load_all((repo_root() / "deploy" / "manifests" / "deviceclasses.yaml").read_text())
    )
    names = [f"dgx-{i:04d}" for i in range(nodes)]
    rows = []
    for layout_name in ("whole-gpus", "everything"):
        rows += _layout(layout_name, dgx, names, classes, repeat=repeat)
    header = [
        "layout",
        "slices",
        "nodes/page",
        "GPUs/page",
        "survey s",
        "page JSON ms",
        "JSON KiB",
        "browser ms",
        "explain 1 pending s",
    ]
    return (
        f"GPU map at {nodes:,} simulated DGX H100 nodes ({nodes * 8:,} GPUs), median of {repeat}\n\n"
        + markdown(header, rows)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.gpu_map", description=__doc__)
    parser.add_argument("--nodes", type=int, default=NODES)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    print(run(args.nodes, args.repeat))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
