"""`gpudra inventory`: the node's GPUs as a table, or the ResourceSlices it would publish.
I/O: NVML (through gpudra.node.gpu_driver) and stdout.
"""

from __future__ import annotations

import json
import sys

import yaml

from gpudra.model import devices, placement, slices
from gpudra.model.inventory import Gpu, Inventory
from gpudra.model.publishing import Publishing, ServerFields, Withheld, fit_to_server
from gpudra.node import gpu_driver


def show(
    *, nvml_name: str, publishing: Publishing, driver: str, node_name: str, fields: ServerFields, output: str
) -> int:
    """Print the node's GPUs (`output` table) or the ResourceSlices it would publish (json, yaml) to an
    API server that keeps `fields`: what the plugin would withhold there is left out and named, with
    the plugin's own rule (`fit_to_server`); the exit code: 1 when a slice would be refused."""
    with gpu_driver.connect(nvml_name) as session:
        inventory = session.inventory()
    model = devices.publish(inventory, publishing)  # the options checked as the plugin checks them
    fitted, withheld = fit_to_server(publishing, fields)
    if fitted != publishing:
        model = devices.publish(inventory, fitted)
    built = slices.build_slices(
        model, driver=driver, node_name=node_name, generation=1, server_minor=fields.minor
    )
    problems = slices.validate_slices(built, server_minor=fields.minor)
    if output in ("table", "wide"):
        print(_table(inventory, model, fitted, withheld_lines(fields, withheld), wide=output == "wide"))
    else:
        listing = {"apiVersion": "v1", "kind": "List", "items": built}
        print(json.dumps(listing, indent=2) if output == "json" else yaml.safe_dump(listing, sort_keys=False))
        for line in withheld_lines(fields, withheld)[1:]:
            print(line, file=sys.stderr)
    for problem in problems:
        print(f"invalid slice: {problem}", file=sys.stderr)
    return 1 if problems else 0


def withheld_lines(fields: ServerFields, withheld: list[Withheld]) -> list[str]:
    """The server published for, then one line per form withheld there: what would serve it, and why."""
    lines = [f"for: {fields.describe()}"]
    lines += [f"withheld {w.form}: {w.needs}: {w.cause}" for w in withheld]
    return lines


def _table(
    inventory: Inventory,
    model: devices.DeviceModel,
    publishing: Publishing,
    release: list[str],
    *,
    wide: bool = False,
) -> str:
    """The GPUs, one row each (`wide`: with their UUIDs), their MIG partitions, what is published."""
    lines = [
        f"driver {inventory.driver_version}, CUDA {inventory.cuda_driver_version}, "
        f"{len(inventory.gpus)} GPUs",
        "",
    ]
    header = (
        "DEVICE",
        "PRODUCT",
        "MEMORY",
        "PCI BUS ID",
        "NUMA",
        "NVLINK",
        "MIG",
        "SHARED",
        "LARGEST PLACEABLE",
        *(("UUID",) if wide else ()),
    )
    # the shared device of each GPU that has one (several claims each get a share of it)
    shared = {devices.gpu_uuid_of(d): d["name"] for d in model.devices if d.get("allowMultipleAllocations")}
    rows = [header] + [
        _gpu_row(gpu, shared.get(gpu.uuid)) + ((gpu.uuid,) if wide else ())
        for gpu in sorted(inventory.gpus, key=lambda g: g.minor)
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    partitions: dict[str, dict[str, list[str]]] = {}
    for device in model.devices:
        attrs = device["attributes"]
        if attrs["type"].get("string") == "mig":
            parent = f"gpu-{attrs['parentMinor'].get('int')}"
            profile, where = devices.partition_of(device)
            partitions.setdefault(parent, {}).setdefault(profile, []).append(str(where.start))
    if partitions:
        lines += ["", "MIG partitions (profile x count @ placement starts):"]
        for parent, profiles in partitions.items():
            # starts in numeric order, not the published (packing) order, so that the table reads like NVML's
            summary = ", ".join(f"{p} x{len(s)} @{','.join(sorted(s, key=int))}" for p, s in profiles.items())
            lines.append(f"  {parent}: {summary}")
    lines += [
        "",
        f"{len(model.devices)} devices ({len(shared)} shared), {len(model.counter_sets)} counter sets",
        f"publishing: {publishing.describe()}",
        *release,
    ]
    published = {devices.gpu_uuid_of(d) for d in model.devices}
    idle = [
        f"gpu-{g.minor}" for g in sorted(inventory.gpus, key=lambda g: g.minor) if g.uuid not in published
    ]
    if idle:
        # switch_idle_mig: partitions on demand were asked for and withheld on this server (fit_to_server)
        instead = (
            "; partitions on demand are withheld on this server (below)"
            if publishing.switch_idle_mig
            else ", or offer partitions on demand with --mig-mode partitionable"
        )
        lines.append(
            f"not published: {', '.join(idle)} (MIG mode on without MIG devices: create them{instead})"
        )
    if model.counter_sets:
        lines.append(
            "counter sets cost every scheduling cycle in the cluster on Kubernetes before 1.37 "
            "(docs/install.md, What to publish)"
        )
    return "\n".join(lines)


def _gpu_row(gpu: Gpu, shared: str | None) -> tuple[str, ...]:
    mig = "enabled" if gpu.mig_enabled else ("capable" if gpu.mig_capable else "-")
    return (
        f"gpu-{gpu.minor}",
        gpu.name,
        f"{gpu.memory_bytes / 1024**3:.0f} GiB",
        gpu.pci_bus_id,
        "-" if gpu.numa_node is None else str(gpu.numa_node),
        gpu.nvlink_domain or "-",
        mig,
        shared or "-",
        _largest_placeable(gpu),
    )


def _largest_placeable(gpu: Gpu) -> str:
    """The largest MIG profile one more GPU instance could have beside those that exist now."""
    if not gpu.mig_profiles:
        return "-"
    largest = placement.largest_placeable(gpu, placement.existing_instances(gpu))
    return "none" if largest is None else largest.name
