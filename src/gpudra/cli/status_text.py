"""`gpudra status` as text: the cluster view as tables readable at a glance. Pure.

`table` shows GPUs per node and product with a total, the unhealthy GPUs and partitions, the MIG GPUs
that have partitions allocated (with the largest partition still placeable), idle allocated devices and
pending claims; `wide` lists every MIG-capable GPU, busy or not.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpudra.scheduling.cluster_view import ClusterView

_GIB = 1024**3


def render(view: ClusterView, *, wide: bool = False) -> str:
    sections = [_gpus(view), _unhealthy(view), _mig(view, wide=wide), _idle(view), _pending(view)]
    return "\n\n".join(s for s in sections if s) + "\n"


def _gpus(view: ClusterView) -> str:
    if not view.nodes:
        return f"no GPUs published by {view.driver}"
    header = ("NODE", "PRODUCT", "GPUS", "ALLOCATED", "SHARED", "FREE", "IDLE")
    rows: list[tuple[str, ...]] = [
        (r.node, r.product, str(r.gpus), str(r.allocated), str(r.shared), str(r.free), str(r.idle))
        for r in view.nodes
    ]
    total = [sum(getattr(r, f) for r in view.nodes) for f in ("gpus", "allocated", "shared", "free", "idle")]
    rows.append(("TOTAL", "", *(str(t) for t in total)))
    return _table(header, rows)


def _unhealthy(view: ClusterView) -> str:
    if not view.unhealthy:
        return ""
    header = ("NODE", "DEVICE", "PRODUCT", "REASON", "EFFECT", "SLICES", "GPU")
    rows = [
        (d.node, d.device, d.product, d.reason, d.effect, _SLICES[d.slices], d.uuid) for d in view.unhealthy
    ]
    words = [f"  {d.node}/{d.device}: {d.message}" for d in view.unhealthy if d.message]
    title = "Unhealthy GPUs (tainted gpudra.io/unhealthy, or left out of the slices where the release drops"
    title += " device taints; docs/health.md):\n"
    return title + _table(header, rows) + ("\n" + "\n".join(words) if words else "")


# How the SLICES column says what the node's slices show of an unhealthy device.
_SLICES = {
    "tainted": "tainted",
    "left-out": "left out (no device taints on this release)",
    "untainted": "UNTAINTED (the server dropped the taint)",
}


def _mig(view: ClusterView, *, wide: bool) -> str:
    shown = [m for m in view.mig if wide or m.partitions_allocated]
    if not shown:
        return ""
    header = ("NODE", "GPU", "PRODUCT", "PARTITIONS", "LARGEST PLACEABLE")
    rows = [
        (
            m.node,
            m.gpu or m.uuid,
            m.product,
            str(m.partitions_allocated),
            f"{m.largest_placeable} ({_gib(m.largest_placeable_memory)})" if m.largest_placeable else "none",
        )
        for m in shown
    ]
    title = "MIG GPUs" + ("" if wide else " with partitions allocated") + ":"
    return title + "\n" + _table(header, rows)


def _idle(view: ClusterView) -> str:
    if not view.idle:
        return ""
    header = ("NAMESPACE", "CLAIM", "PODS", "NODE", "DEVICE", "IDLE FOR")
    rows = [
        (d.namespace, d.claim, ",".join(d.pods) or "-", d.node, d.device, _duration(d.idle_seconds))
        for d in view.idle
    ]
    return f"Allocated but idle for {_duration(view.idle_after_seconds)} or more:\n" + _table(header, rows)


def _pending(view: ClusterView) -> str:
    if not view.pending:
        return ""
    header = ("NAMESPACE", "CLAIM", "CLASSES", "AGE")
    rows = [(p.namespace, p.name, ",".join(p.device_classes), _duration(p.age_seconds)) for p in view.pending]
    return "Claims waiting for GPUs (gpudra explain claim/NAME -n NAMESPACE says why):\n" + _table(
        header, rows
    )


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )


def _gib(amount: int) -> str:
    return f"{amount / _GIB:.0f} GiB" if amount >= _GIB else f"{amount // 1024**2} MiB"


def _duration(seconds: float) -> str:
    """Like kubectl's ages: 45s, 12m, 3h5m, 2d4h."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60}m" if s % 3600 // 60 else f"{s // 3600}h"
    return f"{s // 86400}d{s % 86400 // 3600}h" if s % 86400 // 3600 else f"{s // 86400}d"
