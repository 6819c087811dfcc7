"""The simulated machine's PCI entries in a fake sysfs tree. I/O: writes under the given root.

Laid out like Linux: the device directory sits under its root complex and a bridge
(`devices/pci0000:15/0000:15:01.0/0000:18:00.0/numa_node`) and `bus/pci/devices/<bdf>` is a relative
symlink to it, so the code that reads the real /sys reads this tree unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpudra.sim import machines
from gpudra.sim.scratch import scratch


def write(machine: machines.Machine, root: Path) -> None:
    links = root / "bus" / "pci" / "devices"
    links.mkdir(parents=True, exist_ok=True)
    for slot in machine.gpus:
        root_bus = slot.pcie_root.removeprefix("pci").split(":")[1]
        device = root / "devices" / slot.pcie_root / f"0000:{root_bus}:01.0" / slot.bdf
        device.mkdir(parents=True, exist_ok=True)
        # Replaced by rename: see gpudra.sim.scratch.
        numa = scratch(device / "numa_node")
        numa.write_text(f"{slot.numa_node}\n")
        os.replace(numa, device / "numa_node")
        link = scratch(links / slot.bdf)
        link.unlink(missing_ok=True)
        link.symlink_to(os.path.relpath(device, links))
        os.replace(link, links / slot.bdf)
