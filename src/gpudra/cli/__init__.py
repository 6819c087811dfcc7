"""The `gpudra` command: inventory, validate, explain, status, kubelet-plugin, controller. The one place
that wires objects together.

Every option of kubelet-plugin and controller can also come from an environment variable,
GPUDRA_<OPTION> (e.g. GPUDRA_NODE_NAME), which is how the Helm chart sets them.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import secrets
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpudra import build, logs
from gpudra.errors import ConfigError, GpudraError
from gpudra.model.kube_api import NEWEST_MINOR, OLDEST_MINOR
from gpudra.model.publishing import Publishing, ServerFields, parse_feature_gates

# Each command imports what it needs when it runs: `gpudra kubelet-plugin` opens the kubelet's sockets
# before the ~0.3 s of importing NVML, the API client and the models (see gpudra.node.daemon).

DRIVER = "gpu.gpudra.io"
# --instance-id goes into socket file names: no '/', no leading dot (the kubelet skips dot files).
_INSTANCE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_INSTANCE_ID_RULE = "1 to 63 letters, digits, '-', '_' and '.', starting with a letter or digit"


SIM_MACHINES = ("dgx-a100", "dgx-h100", "mixed", "vm-h100", "vm-h200", "no-sharing")


def _env(option: str, default: str | None = None) -> str | None:
    return os.environ.get("GPUDRA_" + option.upper().replace("-", "_"), default)


def _add(parser: argparse.ArgumentParser, option: str, *, default: str | None, help: str, **kw: Any) -> None:
    env = "GPUDRA_" + option.upper().replace("-", "_")
    parser.add_argument(f"--{option}", default=_env(option, default), help=f"{help} (env {env})", **kw)


def _common(parser: argparse.ArgumentParser) -> None:
    # The simulated machines are listed by hand: importing gpudra.sim here would slow every command's
    # start (tests/unit/test_sim_library.py checks the list against gpudra.sim.PROFILES).
    _add(parser, "nvml", default="real", help=f"NVML to use: real, or sim:{'|'.join(SIM_MACHINES)}")
    _add(parser, "driver-name", default=DRIVER, help="DRA driver name")
    # What a node publishes is what every scheduling cycle in the cluster pays for: the defaults are
    # the layout that costs the scheduler no more than whole GPUs (docs/install.md, "What to publish").
    _add(
        parser,
        "mig-mode",
        default="static",
        help="static: whole GPUs with MIG off and the MIG devices that exist; partitionable: every MIG "
        "profile x placement offered, created on demand (counter sets: Kubernetes 1.37+ for a fast "
        "scheduler, see docs/install.md)",
        choices=["partitionable", "static"],
    )
    _add(
        parser,
        "mig-profiles",
        default="",
        help="with --mig-mode partitionable: the MIG profiles offered, comma-separated (e.g. "
        "1g.10gb,3g.40gb); empty: every profile the GPUs have",
    )
    _add(
        parser,
        "shares",
        default="off",
        help="on: publish each whole GPU also as a shared device (MPS/time-slicing shares by memory and "
        "compute; consumable capacity and counter sets: Kubernetes 1.37+ for a fast scheduler)",
        choices=["off", "on"],
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpudra", description="Kubernetes DRA driver for NVIDIA GPUs")
    parser.add_argument("--version", action="version", version=build.describe())
    commands = parser.add_subparsers(dest="command", required=True)

    inv = commands.add_parser("inventory", help="show the GPUs and the ResourceSlices gpudra would publish")
    _common(inv)
    _add(inv, "node-name", default=socket.gethostname(), help="node (and pool) name")
    inv.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
    inv.add_argument(
        "--server-minor",
        type=int,
        default=NEWEST_MINOR,
        help=f"Kubernetes 1.x minor to publish for: what its API server keeps, how slices are split "
        f"(default {NEWEST_MINOR})",
    )
    _feature_gates(inv, "the API server's")

    val = commands.add_parser("validate", help="check gpudra configs in ResourceClaims, templates, classes")
    val.add_argument(
        "files",
        nargs="+",
        type=Path,
        metavar="PATH",
        help="a YAML or JSON file, or a directory: its *.yaml, *.yml and *.json files (not subdirectories)",
    )
    _add(val, "driver-name", default=DRIVER, help="DRA driver name whose configs are checked")

    why = commands.add_parser("explain", help="why a claim fits a node or not, by the scheduler's rules")
    why.add_argument("target", help="a file of claims, templates or pods; or claim/NAME or pod/NAME")
    why.add_argument("-n", "--namespace", default=None, help="namespace of claim/NAME, pod/NAME (default)")
    why.add_argument("--kubeconfig", default=None, help="kubeconfig (default $KUBECONFIG, ~/.kube/config)")
    why.add_argument(
        "--slices",
        action="append",
        type=Path,
        default=[],
        help="offline: ResourceSlices (gpudra inventory -o yaml) and allocated ResourceClaims, "
        "instead of the cluster's; repeatable",
    )
    why.add_argument("--classes", type=Path, default=None, help="DeviceClasses (offline default: gpudra's)")
    why.add_argument("-o", "--output", choices=["text", "json"], default="text")
    why.add_argument("-v", "--verbose", action="store_true", help="list every device in the text output")
    why.add_argument(
        "--server-minor",
        type=int,
        default=None,
        help="the cluster's Kubernetes 1.x minor, for what its API server keeps (offline default "
        f"{NEWEST_MINOR}; online the server's, its fields found by a dry-run probe slice)",
    )
    _feature_gates(why, "the cluster's")
    why.add_argument("--driver-name", default=DRIVER, help="DRA driver name whose forms are judged")

    status = commands.add_parser(
        "status", help="the cluster's GPUs: allocated, shared, free, idle; MIG room; claims waiting"
    )
    status.add_argument("-o", "--output", choices=["table", "wide", "json"], default="table")
    status.add_argument("--kubeconfig", default=None, help="kubeconfig (default $KUBECONFIG, ~/.kube/config)")
    status.add_argument("--driver-name", default=DRIVER, help="DRA driver name")
    status.add_argument(
        "--idle-after-seconds",
        default="1800",
        help="report an allocated GPU idle after this long without activity (as the controller's option)",
    )
    status.add_argument(
        "--controller-url",
        default=None,
        help="read the view the controller serves at this URL (e.g. http://127.0.0.1:8080)",
    )

    plugin = commands.add_parser("kubelet-plugin", help="run the node plugin (DaemonSet)")
    _common(plugin)
    _add(plugin, "node-name", default=None, help="this node's name (required)")
    _add(plugin, "kubeconfig", default=None, help="kubeconfig file (in-cluster config when absent)")
    _add(plugin, "registry-dir", default="/var/lib/kubelet/plugins_registry", help="kubelet plugin registry")
    _add(plugin, "plugin-dir", default=None, help="DRA socket directory (/var/lib/kubelet/plugins/<driver>)")
    _add(
        plugin,
        "instance-id",
        default=None,
        help="this instance's own socket names, <driver>-<id>-reg.sock and dra-<id>.sock (the chart passes "
        "the pod's UID), so that both pods of a rolling update stay registered with the kubelet (1.33+); "
        f"{_INSTANCE_ID_RULE}; unset: <driver>-reg.sock and dra.sock",
    )
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
    _logging(plugin)
    _add(plugin, "resync-seconds", default="30", help="ResourceSlice resync period")
    _add(
        plugin,
        "health-interval-seconds",
        default="10",
        help="how often GPU health is probed for the kubelet (0: no health service)",
    )
    _add(
        plugin,
        "health-xids",
        default="",
        help="XID classes over the defaults (docs/health.md): comma-separated <xid>=<class> or "
        "default=<class> (XIDs not named); classes: ignore (an application error: counted only), "
        "recoverable (tainted until quiet for --health-recovery-seconds), reset (tainted until a GPU "
        "reset is seen or the Node is annotated gpudra.io/clear-health=<GPU UUID>); e.g. "
        "'31=reset,default=ignore'",
    )
    _add(
        plugin,
        "health-recovery-seconds",
        default="600",
        help="how long a GPU with a recoverable fault must stay without faults before its taint is lifted",
    )
    _add(
        plugin,
        "health-reset-effect",
        default="NoSchedule",
        choices=["NoSchedule", "NoExecute"],
        help="the taint effect of faults that need a GPU reset: NoSchedule keeps new claims off the GPU, "
        "NoExecute also evicts the pods using it",
    )
    _add(plugin, "usage-interval-seconds", default="30", help="how often claims' GPU use is sampled (0: off)")
    _add(
        plugin,
        "mps-check-interval-seconds",
        default="5",
        help="how often the MPS control daemons of prepared claims are checked; one that stopped (e.g. "
        "with the plugin pod a rolling update replaced) is started again with its claim's limits (0: only "
        "at plugin start)",
    )
    _add(
        plugin,
        "driver-root",
        default="/",
        help="where the NVIDIA driver's files (libnvidia-ml.so.1, nvidia-smi, nvidia-cuda-mps-control) are: "
        "/ for this machine's driver, else the host's driver root mounted here (the host's / or the GPU "
        "Operator's /run/nvidia/driver); the tools then run chrooted into it, and MPS needs --state-dir "
        "at the same path inside it (true for the host's / with the state directory mounted at its host "
        "path); ignored with --nvml sim:...",
    )
    _add(
        plugin,
        "dev-root",
        default="/",
        help="the host directory whose dev/ holds the NVIDIA device nodes, as NVIDIA's DRA driver and "
        "nvidia-ctk --dev-root mean it: / for the host's /dev, where claim specs name each node by its "
        "path alone; otherwise a spec's GPU and control nodes get hostPath <dev-root>/dev/<name> "
        "(container path /dev/<name>) for the runtime to find them by (GPU Operator: /run/nvidia/driver "
        "if that driver root has a dev/ directory, which NVIDIA's DRA driver then uses). With --nvml "
        "sim:..., a dev root other than / is where the plugin creates the simulated machine's stand-in "
        "nodes at start (needs CAP_MKNOD): mount that host directory at the same path in its container",
    )
    _controller_parser(commands.add_parser("controller", help="run the cluster controller (Deployment)"))
    return parser


def _controller_parser(ctl: argparse.ArgumentParser) -> None:
    _add(ctl, "driver-name", default=DRIVER, help="DRA driver name")
    _add(ctl, "kubeconfig", default=None, help="kubeconfig file (in-cluster config when absent)")
    _add(
        ctl,
        "namespace",
        default=os.environ.get("POD_NAMESPACE", "gpudra"),
        help="the controller's namespace: its Lease and the webhook's Secret live there",
    )
    _add(ctl, "identity", default=None, help="this replica's name in the Lease (default: host name + random)")
    _add(ctl, "webhook-port", default="9443", help="HTTPS port of the admission webhook (0: no webhook)")
    _add(ctl, "webhook-address", default="0.0.0.0", help="address the webhook binds")
    _add(ctl, "webhook-service", default="gpudra-controller", help="the Service the API server calls")
    _add(
        ctl,
        "webhook-url",
        default=None,
        help="https://HOST:PORT the API server calls (+ /validate) instead of the Service (a controller "
        "outside the cluster)",
    )
    _add(ctl, "webhook-configuration", default="gpudra", help="ValidatingWebhookConfiguration name")
    _add(ctl, "webhook-secret", default="gpudra-webhook-tls", help="Secret with the webhook's CA and cert")
    _add(
        ctl,
        "failure-policy",
        default="Fail",
        choices=["Fail", "Ignore"],
        help="when the webhook cannot be reached: Fail refuses claims with gpudra configs, Ignore admits "
        "them unchecked (a bad config then fails at prepare)",
    )
    _add(
        ctl, "metrics-port", default="8080", help="HTTP port for /metrics, /status, /livez, /readyz (0: off)"
    )
    _add(ctl, "metrics-address", default="0.0.0.0", help="address the HTTP port binds")
    _add(ctl, "idle-after-seconds", default="1800", help="report an allocated GPU idle after this long")
    _add(ctl, "lease-name", default="gpudra-controller", help="the leader election Lease")
    _add(ctl, "lease-seconds", default="15", help="how long a leader holds the Lease without renewing")
    _add(
        ctl,
        "owner-cluster-role",
        default=None,
        help="ClusterRole that owns the Secret, webhook configuration and Lease this controller creates, "
        "so deleting it removes them (the chart sets its own)",
    )
    _logging(ctl)


def _feature_gates(parser: argparse.ArgumentParser, whose: str) -> None:
    parser.add_argument(
        "--feature-gates",
        default="",
        help=f"{whose} feature gates that differ from the release's defaults, as the components take them "
        "(DRAPartitionableDevices=true,DRAConsumableCapacity=true,DRADeviceTaints=true)",
    )


def _logging(daemon: argparse.ArgumentParser) -> None:
    _add(daemon, "log-format", default="text", help="text or json", choices=["text", "json"])
    _add(daemon, "log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")


def _run_daemon(args: argparse.Namespace, run: Callable[[threading.Event], None]) -> int:
    """Logging as the options say, then `run(stop)` until SIGTERM or SIGINT sets `stop`."""
    logs.configure(fmt=args.log_format, level=args.log_level.upper())
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    run(stop)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "inventory":
            return _inventory(args)
        if args.command == "validate":
            return _validate(args)
        if args.command == "explain":
            return _explain(args)
        if args.command == "status":
            return _status(args)
        if args.command == "controller":
            return _controller(args)
        return _kubelet_plugin(args)
    except GpudraError as err:
        print(f"gpudra {args.command}: {err}", file=sys.stderr)
        return 1


# --- inventory ---------------------------------------------------------------------------------


def _inventory(args: argparse.Namespace) -> int:
    from gpudra.cli import inventory  # noqa: PLC0415 (see the imports above)

    return inventory.show(
        nvml_name=args.nvml,
        publishing=_publishing_option(args),
        driver=args.driver_name,
        node_name=args.node_name,
        fields=_server_fields(args.server_minor, args.feature_gates),
        output=args.output,
    )


def _server_fields(minor: int, gates: str) -> ServerFields:
    """What an API server of 1.`minor` with `gates` (--feature-gates) keeps."""
    if minor < OLDEST_MINOR:
        raise ConfigError(
            f"1.{minor} is older than 1.{OLDEST_MINOR}, the oldest gpudra supports", field="--server-minor"
        )
    return ServerFields.of_release(minor, parse_feature_gates(gates))


# --- validate ------------------------------------------------------------------------------------


def _validate(args: argparse.Namespace) -> int:
    from gpudra.cli import validate  # noqa: PLC0415 (see the imports above)

    return validate.run(args.files, driver=args.driver_name)


# --- explain -------------------------------------------------------------------------------------


def _explain(args: argparse.Namespace) -> int:
    from gpudra.cli import explain  # noqa: PLC0415 (see the imports above)

    return explain.run(args)


# --- status --------------------------------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    from gpudra.cli import status  # noqa: PLC0415 (see the imports above)

    view = status.fetch(
        kubeconfig=args.kubeconfig,
        driver=args.driver_name,
        idle_after_seconds=_seconds_option(args.idle_after_seconds, "--idle-after-seconds"),
        controller_url=args.controller_url,
    )
    sys.stdout.write(status.show(view, output=args.output))
    return 0


# --- controller ----------------------------------------------------------------------------------


def _controller(args: argparse.Namespace) -> int:
    from gpudra.controller import wiring  # noqa: PLC0415 (see the imports above)
    from gpudra.controller.options import Options as ControllerOptions  # noqa: PLC0415

    seconds = {
        option: _seconds_option(getattr(args, option.replace("-", "_")), f"--{option}")
        for option in ("idle-after-seconds", "lease-seconds")
    }
    if seconds["lease-seconds"] < 3:
        raise ConfigError("must be at least 3 (seconds)", field="--lease-seconds")
    options = ControllerOptions(
        driver=args.driver_name,
        kubeconfig=args.kubeconfig,
        namespace=args.namespace,
        identity=args.identity or f"{socket.gethostname()}_{secrets.token_hex(4)}",
        webhook_port=_int_option(args.webhook_port, "--webhook-port"),
        webhook_address=args.webhook_address,
        webhook_service=args.webhook_service,
        webhook_url=args.webhook_url or None,
        webhook_configuration=args.webhook_configuration,
        webhook_secret=args.webhook_secret,
        failure_policy=args.failure_policy,
        metrics_port=_int_option(args.metrics_port, "--metrics-port"),
        metrics_address=args.metrics_address,
        idle_after_seconds=seconds["idle-after-seconds"],
        lease_name=args.lease_name,
        lease_seconds=seconds["lease-seconds"],
        owner_cluster_role=args.owner_cluster_role or None,
    )
    return _run_daemon(args, lambda stop: wiring.run(options, stop=stop))


# --- kubelet-plugin ------------------------------------------------------------------------------


def _kubelet_plugin(args: argparse.Namespace) -> int:
    if not args.node_name:
        print("gpudra kubelet-plugin: --node-name (or GPUDRA_NODE_NAME) is required", file=sys.stderr)
        return 2
    from gpudra.model.gpu_health import parse_xid_classes  # noqa: PLC0415 (see the imports above)
    from gpudra.node import daemon  # noqa: PLC0415
    from gpudra.node.options import Options  # noqa: PLC0415

    plugin_dir = Path(args.plugin_dir or f"/var/lib/kubelet/plugins/{args.driver_name}")
    options = Options(
        node_name=args.node_name,
        driver=args.driver_name,
        nvml=args.nvml,
        publishing=_publishing_option(args),
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
        usage_interval_seconds=_seconds_option(args.usage_interval_seconds, "--usage-interval-seconds"),
        mps_check_interval_seconds=_seconds_option(
            args.mps_check_interval_seconds, "--mps-check-interval-seconds"
        ),
        driver_root=_absolute_path_option(args.driver_root, "--driver-root"),
        dev_root=_absolute_path_option(args.dev_root, "--dev-root"),
        instance_id=_instance_id_option(args.instance_id),
        health_xids=parse_xid_classes(args.health_xids, field="--health-xids"),
        health_recovery_seconds=_seconds_option(args.health_recovery_seconds, "--health-recovery-seconds"),
        health_reset_effect=args.health_reset_effect,
    )
    return _run_daemon(args, lambda stop: daemon.run(options, stop=stop))


def _publishing_option(args: argparse.Namespace) -> Publishing:
    profiles = frozenset(p.strip() for p in args.mig_profiles.split(",") if p.strip())
    if profiles and args.mig_mode != "partitionable":
        raise ConfigError(
            "names MIG profiles to offer on demand, which needs --mig-mode partitionable",
            field="--mig-profiles",
        )
    return Publishing(mig_mode=args.mig_mode, shares=args.shares == "on", mig_profiles=profiles or None)


def _instance_id_option(value: str | None) -> str | None:
    """None when unset or empty; else the ID, which becomes part of two file names."""
    if not value:
        return None
    if not _INSTANCE_ID.fullmatch(value):
        raise ConfigError(f"{value!r} is not an instance ID: {_INSTANCE_ID_RULE}", field="--instance-id")
    return value


def _seconds_option(value: str, option: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ConfigError(f"{value!r} is not a number of seconds >= 0 (0: off)", field=option)
    return seconds


def _absolute_path_option(value: str, option: str) -> Path:
    if not value.startswith("/"):
        raise ConfigError(f"{value!r} is not an absolute path", field=option)
    return Path(value)


def _int_option(value: str, option: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise GpudraError(f"{option}: {value!r} is not an integer") from None
