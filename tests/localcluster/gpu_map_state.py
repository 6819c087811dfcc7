"""What the GPU map page drew, summarised so that two runs of the demo compare equal: the sidecar
docs/gpu-map.state.json that `make gpu-map-screenshot` writes beside docs/gpu-map.png from the same page
load, and that the demo's check (`--gpu-map-check`, run by tests/integration/test_demo.py) compares with
the page it loads, so the screenshot in the docs cannot silently stop matching the demo.

Only what every run of the demo draws the same is kept:

- per node, its GPUs (how many, of which product and memory): the slices each simulated machine
  publishes;
- per claim, what it holds: whole GPUs, MIG partitions (profile and slots taken) and shares (memory and
  SMs), and whether it is marked idle; the MIG slots taken in all, the GPUs marked unhealthy;
- the pending claims with their classes and explain's verdict (the words before its first colon);
- the page's one-line summary (counts) and its notes.

Left out: which GPU or node a claim landed on and where on the GPU a partition starts (the scheduler
picks among equal nodes and devices at random), UUIDs, times and ages, and the random five characters
of a claim made from a template (`names` maps each such claim to its generateName followed by `*`).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.localcluster.browser import Element

REGENERATE = "make gpu-map-screenshot"


def summary(dom: Element, names: Mapping[str, str]) -> dict[str, Any]:
    """The deterministic part of the drawn page; `names`: claim "namespace/name" -> its stable name."""
    pattern = re.compile("|".join(re.escape(n) for n in sorted(names, key=len, reverse=True)) or "(?!)")

    def stable(text: str) -> str:
        return pattern.sub(lambda m: names[m.group(0)], text)

    error = dom.by_id("error")
    nodes: dict[str, Any] = {}
    holds: dict[str, list[str]] = {}
    slots_taken = 0
    idle: list[str] = []
    unhealthy = 0
    for section in dom.find_all(lambda e: e.tag == "section" and "data-node" in e.attrs):
        cards = section.by_class("gpu")
        nodes[section.attrs["data-node"]] = {
            "gpus": len(cards),
            "products": dict(sorted(Counter(_text(c.by_class("product")[0]) for c in cards).items())),
        }
        for card in cards:
            unhealthy += "data-unhealthy" in card.attrs
            held = _holders(card)
            if card.attrs.get("data-idle") == "true":
                idle.extend(stable(h) for h in held)
            partitions = []
            for item in card.find_all(lambda e: e.tag == "li"):
                if "data-holder" in item.attrs:
                    holds.setdefault(stable(item.attrs["data-holder"]), []).append("whole GPU")
                elif "data-share" in item.attrs:
                    claim = item.attrs["data-share"]
                    sized = _text(item).removeprefix(f"share: {claim} ")
                    holds.setdefault(stable(claim), []).append(f"share {sized}")
                elif "data-partition" in item.attrs:
                    # "3g.40gb @4: ns/claim": where it starts is the scheduler's pick, not its size
                    placed, _, claims = _text(item).partition(": ")
                    profile, _, at = placed.partition(" @")
                    partitions.append((int(at), profile, [c.strip() for c in claims.split(",")]))
            slots = {int(s.attrs["data-slot"]): s.attrs.get("data-claim") for s in card.by_class("slot")}
            ends = [start for start, _, _ in partitions[1:]] + [len(slots)]
            for (start, profile, claims), end in zip(partitions, ends, strict=False):
                taken = sum(slots.get(i) == ",".join(claims) for i in range(start, end))
                slots_taken += taken
                for claim in claims:
                    holds.setdefault(stable(claim), []).append(
                        f"MIG {profile} ({taken} slot{'' if taken == 1 else 's'})"
                    )
    pending = [
        {
            "claim": stable(row.attrs["data-claim"]),
            "classes": _text(row.find_all(lambda e: e.tag == "td")[3]),
            "verdict": stable(_text(row.by_class("reason")[0]).split(":")[0]),
        }
        for row in dom.find_all(lambda e: e.tag == "tr" and "pending" in e.attrs.get("class", "").split())
    ]
    return {
        "error": None if "hidden" in error.attrs else _text(error),
        "summary": _text(dom.by_id("summary")),
        "notes": [stable(_text(li)) for li in dom.by_id("notes").find_all(lambda e: e.tag == "li")],
        "nodes": dict(sorted(nodes.items())),
        "claims": {claim: sorted(found) for claim, found in sorted(holds.items())},
        "migSlotsTaken": slots_taken,
        "idle": sorted(idle),
        "unhealthyGpus": unhealthy,
        "pending": sorted(pending, key=lambda p: p["claim"]),
    }


def write(path: Path, state: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(state, indent=2, ensure_ascii=False) + "\n")


def mismatch(path: Path, state: Mapping[str, Any]) -> str | None:
    """None when `path` holds `state`; else one paragraph naming what differs and how to refresh it."""
    try:
        committed = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        return f"no GPU map state to compare with at {path} ({err}): run `{REGENERATE}` and commit it"
    if committed == state:
        return None
    differ = [
        f"{key}: docs say {json.dumps(committed.get(key))[:300]}, "
        f"the page drew {json.dumps(state.get(key))[:300]}"
        for key in sorted(set(committed) | set(state))
        if committed.get(key) != state.get(key)
    ]
    return (
        f"the GPU map screenshot in docs/ does not match the demo's state ({path} differs from the page "
        f"the demo's cluster serves): run `{REGENERATE}` and commit docs/gpu-map.png and {path.name}\n  "
        + "\n  ".join(differ)
    )


def stable_names(claims: list[dict[str, Any]]) -> dict[str, str]:
    """Claim "namespace/name" -> "namespace/generateName*" for the claims made from a template (their
    name ends in five random characters)."""
    found = {}
    for claim in claims:
        meta = claim.get("metadata") or {}
        if meta.get("generateName"):
            found[f"{meta['namespace']}/{meta['name']}"] = f"{meta['namespace']}/{meta['generateName']}*"
    return found


def _holders(card: Element) -> list[str]:
    return [
        e.attrs.get("data-holder") or e.attrs.get("data-share") or ""
        for e in card.find_all(lambda e: "data-holder" in e.attrs or "data-share" in e.attrs)
        if e.tag == "li"
    ] + [
        claim
        for e in card.find_all(lambda e: e.tag == "li" and "data-partition" in e.attrs)
        for claim in _text(e).partition(": ")[2].split(",")
    ]


def _text(element: Element) -> str:
    return " ".join(element.text.split())
