"""The GPU map page's summary for docs/gpu-map.state.json (tests/localcluster/gpu_map_state.py): what the
scheduler picks at random (which GPU, which placement) and the random suffix of a template's claim
leave it unchanged; what the demo's state is (what each claim holds, the pending claims) changes it."""

from __future__ import annotations

from pathlib import Path

from tests.localcluster.browser import parse
from tests.localcluster.gpu_map_state import mismatch, stable_names, summary, write

NS = "gpudra-examples"


def page(mig_on: str, mig_at: int, suffix: str, *, idle: bool = False, reason: str = "cannot fit: no") -> str:
    """The page as its script draws it: node-h100 with two H100s, a 3g.40gb partition of a template's
    claim on `mig_on` at `mig_at`, a whole GPU held by another claim on the other; one pending claim."""
    mig = f"{NS}/mig-1g-mig-{suffix}"
    whole = f"{NS}/single-gpu-gpu-{suffix}"
    slots = "".join(
        f'<span class="slot" data-slot="{i}"'
        + (f' data-claim="{mig}"' if mig_at <= i < mig_at + 4 else "")
        + "></span>"
        for i in range(8)
    )
    cards = {
        mig_on: f'<div class="gpu" data-gpu="{mig_on}" data-uuid="GPU-{mig_on}" data-state="mig" '
        'data-idle="false"><div class="product">NVIDIA H100 80GB HBM3 · 80 GiB</div>'
        f'<div class="slots" data-slots="8">{slots}</div><div class="who"><ul>'
        f'<li data-partition="{mig_on}-mig-3g.40gb-{mig_at}">3g.40gb @{mig_at}: {mig}</li>'
        '<li class="room">room for 3g.40gb</li></ul></div></div>',
    }
    other = "gpu-1" if mig_on == "gpu-0" else "gpu-0"
    cards[other] = (
        f'<div class="gpu" data-gpu="{other}" data-uuid="GPU-{other}" data-state="whole" '
        f'data-idle="{str(idle).lower()}"><div class="product">NVIDIA H100 80GB HBM3 · 80 GiB</div>'
        f'<div class="bar"></div><div class="who"><ul><li data-holder="{whole}">whole: {whole}</li>'
        "</ul></div></div>"
    )
    return (
        '<html><body><p id="error" hidden=""></p>'
        '<span id="summary">1 of 1 nodes · 2 GPUs shown · 1 pending</span>'
        '<span id="age">as of 12:00:00</span><ul id="notes"></ul>'
        '<section class="node" data-node="node-h100"><h2>node-h100 (2 GPUs)</h2><div class="gpus">'
        + cards["gpu-0"]
        + cards["gpu-1"]
        + "</div></section><table><tbody>"
        f'<tr class="pending" data-claim="{NS}/gated-gpu-{suffix}"><td>{NS}</td><td>gated-gpu-{suffix}</td>'
        f'<td>{3 if idle else 9}s</td><td>gpu.gpudra.io</td><td class="reason">{reason} device</td></tr>'
        "</tbody></table></body></html>"
    )


def names(suffix: str) -> dict[str, str]:
    claims = [
        {"metadata": {"namespace": NS, "name": f"{pod}-{suffix}", "generateName": f"{pod}-"}}
        for pod in ("mig-1g-mig", "single-gpu-gpu", "gated-gpu")
    ]
    return stable_names([*claims, {"metadata": {"namespace": NS, "name": "named"}}])


def test_the_summary_leaves_out_the_schedulers_picks_and_the_random_names() -> None:
    first = summary(parse(page("gpu-0", 0, "x7k2q")), names("x7k2q"))
    assert first == summary(parse(page("gpu-1", 4, "b9zt5")), names("b9zt5"))
    assert first["nodes"] == {"node-h100": {"gpus": 2, "products": {"NVIDIA H100 80GB HBM3 · 80 GiB": 2}}}
    assert first["claims"] == {
        f"{NS}/mig-1g-mig-*": ["MIG 3g.40gb (4 slots)"],
        f"{NS}/single-gpu-gpu-*": ["whole GPU"],
    }
    assert first["migSlotsTaken"] == 4 and first["idle"] == [] and first["unhealthyGpus"] == 0
    assert first["pending"] == [
        {"claim": f"{NS}/gated-gpu-*", "classes": "gpu.gpudra.io", "verdict": "cannot fit"}
    ]
    assert first["error"] is None and first["notes"] == []


def test_a_different_state_is_a_mismatch_that_says_how_to_refresh_the_docs(tmp_path: Path) -> None:
    path = tmp_path / "gpu-map.state.json"
    write(path, summary(parse(page("gpu-0", 0, "x7k2q")), names("x7k2q")))
    assert mismatch(path, summary(parse(page("gpu-1", 4, "b9zt5")), names("b9zt5"))) is None
    idle = summary(parse(page("gpu-0", 0, "x7k2q", idle=True)), names("x7k2q"))
    found = mismatch(path, idle)
    assert found is not None and "run `make gpu-map-screenshot`" in found
    assert f'idle: docs say [], the page drew ["{NS}/single-gpu-gpu-*"]' in found
    fits = summary(parse(page("gpu-0", 0, "x7k2q", reason="fits on node-h100")), names("x7k2q"))
    assert "pending:" in (mismatch(path, fits) or "")
    assert "make gpu-map-screenshot" in (mismatch(tmp_path / "none.json", fits) or "")
