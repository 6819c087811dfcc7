"""Whether a claim's requests can match any device the driver publishes anywhere: the admission warning for
a request no node could ever satisfy (a product no node has, a typo in an attribute name). Pure.

Only requests for this driver's DeviceClasses are looked at, against the driver's devices on every
node, by the class's and the request's CEL selectors (the scheduler's rules, `gpudra.scheduling.allocator`);
availability is not: a device held by another claim still counts, since it may be freed. A request with
`firstAvailable` is reported only when none of its subrequests matches. A selector that fails on a
device counts as no match. These are warnings, not rejections: a node with the right GPUs may join
later.

A request whose class selects a form of the GPUs that no node can publish on this cluster (shares, MIG
partitions on demand: `gpudra.scheduling.forms`, the kubelet plugin's own rule) gets a second warning
saying which feature gate or release would serve it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpudra.model.claim import ClaimSpec, Request
from gpudra.model.publishing import Withheld
from gpudra.scheduling.allocator import Matcher
from gpudra.scheduling.cel import CelError
from gpudra.scheduling.claims import claim_from_spec
from gpudra.scheduling.forms import needs
from gpudra.scheduling.pools import SliceDevice


class Reach:
    """The devices and classes requests are held against; build once per change of either."""

    def __init__(
        self,
        devices: Sequence[SliceDevice],
        classes: Mapping[str, Sequence[str]],
        driver_classes: set[str],
        *,
        withheld: Sequence[Withheld] = (),
        driver: str = "",
    ) -> None:
        """`withheld`: what `driver`'s nodes cannot publish on this cluster (`forms.withheld_on`)."""
        self.devices = devices
        self.classes = classes
        self.driver_classes = driver_classes
        self.matcher = Matcher(classes)
        self.withheld = withheld
        self.driver = driver

    def warnings(self, spec: ClaimSpec | None) -> list[str]:
        """One line per request of a ResourceClaim's or ResourceClaimTemplate's spec
        (`gpudra.model.claim.read_spec_of`; None for other objects) that no device matches."""
        if spec is None or spec.problems:
            return []  # a malformed spec: the API server's validation answers that
        found = []
        for alternatives in spec.requests:
            ours = [r for r in alternatives if r.device_class in self.driver_classes]
            if len(ours) != len(alternatives) or any(self._matches(r) for r in ours):
                continue  # another driver's class among them: not ours to judge
            first = alternatives[0]
            where = first.field.rsplit(".firstAvailable", 1)[0].removesuffix(".exactly")
            classes = ", ".join(sorted({r.device_class for r in alternatives}))
            found.append(
                f"{where} ({first.base}): no GPU published by any node matches class {classes}"
                + (" and the request's selectors" if any(r.selectors for r in alternatives) else "")
                + f"; {len(self.devices)} devices checked"
            )
            if self.withheld and self.driver:
                gated = needs(
                    [claim_from_spec("claim", spec)], self.classes, self.withheld, driver=self.driver
                )
                lines = {f"{where} ({first.base}): {n.withheld.needs}" for n in gated if n.request in ours}
                found += sorted(lines)
        return found

    def _matches(self, request: Request) -> bool:
        try:
            matcher = self.matcher.for_request(request)
        except (CelError, KeyError):
            return True  # a selector that does not compile is the API server's to reject
        return any(matcher.check(device) is None for device in self.devices)
