"""The `gpudra` command: inventory, validate, kubelet-plugin. The one place that wires objects together.

Every option of kubelet-plugin can also come from an environment variable, GPUDRA_<OPTION> (e.g.
GPUDRA_NODE_NAME), which is how the Helm chart sets them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from gpudra import logs, manifest_files
from gpudra.errors import ConfigError, GpudraError
from gpudra.gpu import nvml
from gpudra.model import devices, placement, slices
from gpudra.model.inventory import Gpu, Inventory
from gpudra.node import daemon as plugin

DRIVER = "gpu.gpudra.io"
NEWEST_MINOR = 36


def _env(option: str, default: str | None = None) -> str | None:
    return os.environ.get("GPUDRA_" + option.upper().replace("-", "_"), default)


def _add(parser: argparse.ArgumentParser, option: str, *, default: str | None, help: str, **kw: Any) -> None:
    env = "GPUDRA_" + option.upper().replace("-", "_")
    parser.add_argument(f"--{option}", default=_env(option, default), help=f"{help} (env {env})", **kw)


def _common(parser: argparse.ArgumentParser) -> None:
    _add(parser, "nvml", default="real", help="NVML to use: real, or sim:dgx-a100|dgx-h100|mixed")
    _add(parser, "driver-name", default=DRIVER, help="DRA driver name")
    _add(
        parser,
        "mig-mode",
        default="partitionable",
        help="partitionable or static",
        choices=["partitionable", "static"],
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpudra", description="Kubernetes DRA driver for NVIDIA GPUs")
    commands = parser.add_subparsers(dest="command", required=True)

    inv = commands.add_parser("inventory", help="show the GPUs and the ResourceSlices gpudra would publish")
    _common(inv)
    _add(inv, "node-name", default=socket.gethostname(), help="node (and pool) name")
    inv.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
    inv.add_argument(
        "--server-minor",
        type=int,
        default=NEWEST_MINOR,
        help=f"Kubernetes 1.x minor to split slices for (default {NEWEST_MINOR})",
    )

    val = commands.add_parser("validate", help="check gpudra configs in ResourceClaims, templates, classes")
    val.add_argument("files", nargs="+", type=Path)
    _add(val, "driver-name", default=DRIVER, help="DRA driver name whose configs are checked")

    plugin = commands.add_parser("kubelet-plugin", help="run the node plugin (DaemonSet)")
    _common(plugin)
    _add(plugin, "node-name", default=None, help="this node's name (required)")
    _add(plugin, "kubeconfig", default=None, help="kubeconfig file (in-cluster config when absent)")
    _add(plugin, "registry-dir", default="/var/lib/kubelet/plugins_registry", help="kubelet plugin registry")
    _add(plugin, "plugin-dir", default=None, help="DRA socket directory (/var/lib/kubelet/plugins/<driver>)")
    _add(plugin, "cdi-root", default="/var/run/cdi", help="where CDI specs are written")
    _add(plugin, "state-dir", default=None, help="checkpoint directory (default: the plugin directory)")
    _add(
        plugin,
        "toolkit-cdi-dirs",
        default="/etc/cdi:/var/run/cdi",
        help="directories searched for the NVIDIA Container Toolkit's CDI spec",
    )
    _add(plugin, "metrics-port", default="0", help="HTTP port for /metrics, /livez and /readyz (0: off)")
    _add(plugin, "metrics-address", default="0.0.0.0", help="address the HTTP port binds (e.g. 127.0.0.1)")
    _add(plugin, "log-format", default="text", help="text or json", choices=["text", "json"])
    _add(plugin, "log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    _add(plugin, "resync-seconds", default="30", help="ResourceSlice resync period")
    _add(
        plugin,
        "health-interval-seconds",
        default="10",
        help="how often GPU health is probed for the kubelet (0: no health service)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "inventory":
            return _inventory(args)
        if args.command == "validate":
            return _validate(args)
        return _kubelet_plugin(args)
    except GpudraError as err:
        print(f"gpudra {args.command}: {err}", file=sys.stderr)
        return 1


# --- inventory -----------------------------------------------------------------------------------


def _inventory(args: argparse.Namespace) -> int:
    with nvml.connect(args.nvml) as session:
        inventory = session.inventory()
    model = devices.build_devices(inventory, mig_mode=args.mig_mode)
    built = slices.build_slices(
        model, driver=args.driver_name, node_name=args.node_name, generation=1, server_minor=args.server_minor
    )
    problems = slices.validate_slices(built, server_minor=args.server_minor)
    if args.output == "table":
        print(_table(inventory, model))
    else:
        listing = {"apiVersion": "v1", "kind": "List", "items": built}
        print(
            json.dumps(listing, indent=2)
            if args.output == "json"
            else yaml.safe_dump(listing, sort_keys=False)
        )
    for problem in problems:
        print(f"invalid slice: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _table(inventory: Inventory, model: devices.DeviceModel) -> str:
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
    )
    # the shared device of each GPU that has one (several claims each get a share of it)
    shared = {devices.gpu_uuid_of(d): d["name"] for d in model.devices if d.get("allowMultipleAllocations")}
    rows = [header] + [
        _gpu_row(gpu, shared.get(gpu.uuid)) for gpu in sorted(inventory.gpus, key=lambda g: g.minor)
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
    ]
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


# --- validate ------------------------------------------------------------------------------------


def _validate(args: argparse.Namespace) -> int:
    problems = manifest_files.validate_files(args.files, driver=args.driver_name)
    for problem in problems:
        print(problem)
    if not problems:
        print(f"{len(args.files)} file(s) valid")
    return 1 if problems else 0


# --- kubelet-plugin ------------------------------------------------------------------------------


def _kubelet_plugin(args: argparse.Namespace) -> int:
    if not args.node_name:
        print("gpudra kubelet-plugin: --node-name (or GPUDRA_NODE_NAME) is required", file=sys.stderr)
        return 2
    plugin_dir = Path(args.plugin_dir or f"/var/lib/kubelet/plugins/{args.driver_name}")
    options = plugin.Options(
        node_name=args.node_name,
        driver=args.driver_name,
        nvml=args.nvml,
        mig_mode=args.mig_mode,
        kubeconfig=args.kubeconfig,
        registry_dir=Path(args.registry_dir),
        plugin_dir=plugin_dir,
        cdi_root=Path(args.cdi_root),
        state_dir=Path(args.state_dir) if args.state_dir else plugin_dir,
        toolkit_cdi_dirs=tuple(Path(p) for p in args.toolkit_cdi_dirs.split(":") if p),
        metrics_port=_int_option(args.metrics_port, "--metrics-port"),
        metrics_address=args.metrics_address,
        resync_seconds=float(args.resync_seconds),
        health_interval_seconds=_seconds_option(args.health_interval_seconds, "--health-interval-seconds"),
    )
    logs.configure(fmt=args.log_format, level=args.log_level.upper())
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    plugin.run(options, stop=stop)
    return 0


def _seconds_option(value: str, option: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ConfigError(f"{value!r} is not a number of seconds >= 0 (0: off)", field=option)
    return seconds


def _int_option(value: str, option: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise GpudraError(f"{option}: {value!r} is not an integer") from None
