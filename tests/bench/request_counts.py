"""What the API server counted, from its own `apiserver_request_total`: the idle figures. Pure.

The counter has no label for the client, so requests are attributed by resource: while a plugin idles
alone, every request on resource.k8s.io objects, nodes and events is that plugin's (the harness makes
none then); the API server's own traffic (leases, flow-control objects, namespaces) is on other
resources and left out.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>.*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION", "APPLY"})
PLUGIN_GROUPS = frozenset({"resource.k8s.io"})
PLUGIN_CORE_RESOURCES = frozenset({"nodes", "events"})


@dataclass(frozen=True, order=True)
class RequestKind:
    verb: str
    group: str  # "" for the core group
    resource: str
    subresource: str

    def __str__(self) -> str:
        path = f"{self.group}/{self.resource}" if self.group else self.resource
        return f"{self.verb} {path}" + (f"/{self.subresource}" if self.subresource else "")


def parse(metrics: str) -> Counter[RequestKind]:
    """Requests served so far by kind, summed over response codes and the other labels."""
    totals: Counter[RequestKind] = Counter()
    for line in metrics.splitlines():
        sample = _SAMPLE.match(line)
        if sample is None:
            continue
        labels = dict(_LABEL.findall(sample["labels"]))
        kind = RequestKind(
            verb=labels.get("verb", ""),
            group=labels.get("group", ""),
            resource=labels.get("resource", ""),
            subresource=labels.get("subresource", ""),
        )
        totals[kind] += int(float(sample["value"]))
    return totals


def plugin_kind(kind: RequestKind) -> bool:
    """Whether a request of this kind can come from a DRA kubelet plugin."""
    if kind.group in PLUGIN_GROUPS:
        return True
    return kind.group in ("", "events.k8s.io") and kind.resource in PLUGIN_CORE_RESOURCES


@dataclass(frozen=True)
class Requests:
    """A plugin's requests over a window."""

    by_kind: dict[RequestKind, int]

    @classmethod
    def between(cls, before: Counter[RequestKind], after: Counter[RequestKind]) -> Requests:
        delta = after - before  # Counter subtraction keeps only kinds that grew
        return cls({kind: n for kind, n in sorted(delta.items()) if plugin_kind(kind)})

    @property
    def lists(self) -> int:
        return sum(n for kind, n in self.by_kind.items() if kind.verb == "LIST")

    @property
    def writes(self) -> int:
        return sum(n for kind, n in self.by_kind.items() if kind.verb in WRITE_VERBS)

    def writes_to(self, resource: str) -> int:
        return sum(
            n for kind, n in self.by_kind.items() if kind.verb in WRITE_VERBS and kind.resource == resource
        )

    def describe(self) -> str:
        """Like '3 LIST resource.k8s.io/resourceslices, 1 WATCH nodes', or 'none'."""
        return ", ".join(f"{n} {kind}" for kind, n in self.by_kind.items()) or "none"
