"""`gpudra explain`'s text output: the verdict, then each node. Pure.

Nodes that read the same (a thousand identical DGX nodes, every one full) are shown once, with the
names of the others, so that the answer stays readable on a large cluster.
"""

from __future__ import annotations

from gpudra.scheduling.explain import AllocatedDevice, Explanation, NodeReport, RequestReport, shorten

_EXAMPLES = 3
_NODE = "\x00"  # where the node's name goes in a block


def render_text(explanation: Explanation, *, verbose: bool = False) -> str:
    """The verdict line first, then what the cluster's feature gates or release keep from fitting,
    errors, the nodes the pod cannot go to by reason, and notes, then the nodes. `verbose` lists every
    device and every excluded node."""
    lines = [explanation.verdict]
    lines += [f"needs: {n}" for n in explanation.needs if n not in explanation.verdict]
    lines += [f"error: {e}" for e in explanation.errors if e not in explanation.verdict]
    lines += [
        f"excluded by {e.check}: {len(e.nodes)} node{'' if len(e.nodes) == 1 else 's'} "
        f"({', '.join(e.nodes if verbose else _first(e.nodes))})"
        for e in explanation.excluded
    ]
    lines += [f"note: {n}" for n in [*explanation.release, *explanation.notes]]
    groups: dict[str, list[str]] = {}
    for report in explanation.nodes:
        groups.setdefault(_node_text(report, verbose=verbose), []).append(report.node)
    for text, nodes in groups.items():
        heading = nodes[0]
        if len(nodes) > 1:
            heading += (
                f" (and {len(nodes) - 1} more nodes that read the same: {', '.join(_first(nodes[1:]))})"
            )
        lines += ["", text.replace(_NODE, heading, 1)]
    return "\n".join(lines) + "\n"


def _node_text(report: NodeReport, *, verbose: bool) -> str:
    if report.fits:
        lines = [f"{_NODE}: fits: " + ", ".join(f"{d.device} ({_purpose(d)})" for d in report.devices)]
    else:
        lines = [f"{_NODE}: cannot fit: {report.reason}"]
    lines += [f"  {note}" for note in report.notes]
    several = len({r.claim for r in report.requests}) > 1
    for request in report.requests:
        lines += _request_lines(request, fits=report.fits, verbose=verbose, several_claims=several)
    return "\n".join(lines)


def _request_lines(request: RequestReport, *, fits: bool, verbose: bool, several_claims: bool) -> list[str]:
    owner = f" of {request.claim}" if several_claims else ""
    lines = [
        f"  request {request.request}{owner}: {request.wants} of class {request.device_class}; "
        f"{len(request.matching)} of {request.devices} devices match, {len(request.usable)} can be allocated"
    ]
    # the request's own selectors first: the class's turn away devices of other kinds, as they should
    for rejection in sorted(request.rejected, key=lambda r: r.selector.startswith("class")):
        examples = f"(e.g. {', '.join(rejection.examples)})"
        if rejection.selector.startswith("class"):
            lines.append(f"    {rejection.devices} not of the class ({rejection.selector}) {examples}")
        else:
            expression = shorten(rejection.expression)
            lines.append(f"    {rejection.devices} rejected by {rejection.selector}: {expression} {examples}")
    shown = request.unusable if verbose else request.unusable[: 2 * _EXAMPLES]
    lines += [f"    {u.device}: {u.reason}" for u in shown]
    if len(request.unusable) > len(shown):
        lines.append(
            f"    ... and {len(request.unusable) - len(shown)} more that cannot be allocated (-v lists all)"
        )
    lines += [f"    error: {e}" for e in request.errors]
    if request.usable and (verbose or not fits):
        usable = request.usable if verbose else _first(request.usable)
        lines.append(f"    can be allocated: {', '.join(usable)}")
    return lines


def _purpose(device: AllocatedDevice) -> str:
    parts = [f"request {device.request}"]
    if device.admin_access:
        parts.append("admin access")
    if device.consumed_capacity:
        parts.append(", ".join(f"{name} {amount}" for name, amount in device.consumed_capacity.items()))
    return "; ".join(parts)


def _first(names: list[str]) -> list[str]:
    if len(names) <= _EXAMPLES:
        return names
    return [*names[:_EXAMPLES], f"+{len(names) - _EXAMPLES} more"]
