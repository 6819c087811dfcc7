"""The `gpudra` command: inventory, validate, migrate, explain, status, kubelet-plugin, mps-host,
controller. The one place that wires objects together.

Every option of kubelet-plugin and controller can also come from an environment variable,
GPUDRA_<OPTION> (e.g. GPUDRA_NODE_NAME), which is how the Helm chart sets them. Each option's value
type (`gpudra.options.types`) checks it, from a flag and from a variable alike, and is the rule the
chart's values.schema.json holds for it (scripts/gen_chart_schema.py).

No traceback reaches a user: bad input of any kind ends in one line and an exit code of EXIT_CODES.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from gpudra import build
from gpudra.options.types import (
    AbsolutePath,
    Bytes,
    CheckedText,
    Choice,
    Count,
    Minor,
    OptionType,
    Pattern,
    Port,
    Seconds,
    Text,
    comma_list,
    one_of,
)
from gpudra.cli.output_format import OUTPUT, OUTPUT_HELP
from gpudra.errors import ConfigError, GpudraError
from gpudra.model.gpu_health import XidClass, parse_xid_classes
from gpudra.model.kube_api import NEWEST_MINOR, OLDEST_MINOR
from gpudra.model.publishing import (
    MAX_SHARES_PER_GPU,
    MIN_SHARES_PER_GPU,
    Publishing,
    ServerFields,
    parse_feature_gates,
)
from gpudra.runtime import logs

# Each command imports what it needs when it runs: `gpudra kubelet-plugin` opens the kubelet's sockets
# before the ~0.3 s of importing NVML, the API client and the models (see gpudra.node.daemon).

DRIVER = "gpu.gpudra.io"

SIM_MACHINES = ("dgx-a100", "dgx-h100", "mixed", "vm-h100", "vm-h200", "no-sharing")

EXIT_CODES = """\
exit codes:
  0    success (validate: every file is valid; migrate: everything was translated; explain: every
       claim fits)
  1    the answer is no: validate found problems; migrate: something had no gpudra equivalent and was
       left as it was (listed on stderr; the output is incomplete); explain: a claim does not fit;
       inventory: a slice would be refused; kubelet-plugin, controller: stopped on an error while running
  2    usage or input error: a bad option or GPUDRA_* variable, a file that cannot be read or parsed,
       a kubeconfig that cannot be used, an API server or controller that cannot be reached or refuses
  3    an unexpected error inside gpudra (a bug: please report it; GPUDRA_DEBUG=1 shows the traceback)
  130  interrupted (Ctrl-C)
  141  the output was closed early (e.g. piped into head): the rest is not written
"""
EXIT_USAGE = 2
EXIT_BUG = 3
EXIT_INTERRUPTED = 130
EXIT_PIPE_CLOSED = 141

# A DNS subdomain, as Kubernetes names drivers (the length is checked apart, below).
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_DRIVER_NAME = Pattern(
    _DNS_SUBDOMAIN, "a DNS subdomain: lower-case letters, digits, '-' and '.', at most 63", max_length=63
)
# --instance-id goes into socket file names: no '/', no leading dot (the kubelet skips dot files).
_INSTANCE_ID = Pattern(
    r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}",
    "an instance ID: 1 to 63 letters, digits, '-', '_' and '.', starting with a letter or digit",
    empty="<driver>-reg.sock and dra.sock",
)
_XIDS = CheckedText(
    lambda text: parse_xid_classes(text, field="--health-xids"),
    comma_list(rf"(default|[0-9]{{1,10}})\s*=\s*({one_of([c.value for c in XidClass])})"),
)
_GATES = CheckedText(parse_feature_gates, comma_list(r"[A-Za-z0-9]+\s*=\s*([Tt]rue|[Ff]alse|TRUE|FALSE)"))
LOG_LEVELS = Choice(("DEBUG", "INFO", "WARNING", "ERROR"), case_insensitive=True)
# Kubernetes' own syntax for MIG profile names, e.g. 1g.10gb, 1g.10gb+me, 7g.80gb.
_MIG_PROFILES = Pattern(
    comma_list(r"[0-9]+c?\.?[0-9]*g\.[0-9]+gb(\+[a-z]+)*"),
    "comma-separated MIG profile names (e.g. 1g.10gb,3g.40gb)",
)


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line: the command, the option, what is allowed."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _env(option: str, default: str | None = None) -> str | None:
    return os.environ.get("GPUDRA_" + option.upper().replace("-", "_"), default)


def _add(
    parser: argparse.ArgumentParser,
    option: str,
    *,
    default: str | None,
    help: str,
    type: OptionType[Any] | None = None,
) -> None:
    """--`option`, also settable as GPUDRA_<OPTION>; `type` checks either (any text when None)."""
    env = "GPUDRA_" + option.upper().replace("-", "_")
    kind = type or Text()
    parser.add_argument(
        f"--{option}",
        default=_env(option, default),
        help=f"{help} (env {env})",
        type=kind,
        metavar=kind.metavar,
    )


def _common(parser: argparse.ArgumentParser) -> None:
    # The simulated machines are listed by hand: importing gpudra.sim here would slow every command's
    # start (tests/unit/gpu/test_sim_library.py checks the list against gpudra.sim.PROFILES).
    nvml = Choice(("real", *(f"sim:{m}" for m in SIM_MACHINES)), label="NVML")
    _add(
        parser, "nvml", default="real", help=f"NVML to use: real, or sim:{'|'.join(SIM_MACHINES)}", type=nvml
    )
    _add(parser, "driver-name", default=DRIVER, help="DRA driver name", type=_DRIVER_NAME)
    # What a node publishes is what every scheduling cycle in the cluster pays for: the defaults are
    # the layout that costs the scheduler no more than whole GPUs (docs/install.md, "What to publish").
    _add(
        parser,
        "mig-mode",
        default="static",
        help="static: whole GPUs with MIG off and the MIG devices that exist; partitionable: every MIG "
        "profile x placement offered, created on demand (counter sets: Kubernetes 1.37+ for a fast "
        "scheduler, see docs/install.md)",
        type=Choice(("partitionable", "static")),
    )
    _add(
        parser,
        "mig-profiles",
        default="",
        help="with --mig-mode partitionable: the MIG profiles offered, comma-separated (e.g. "
        "1g.10gb,3g.40gb); empty: every profile the GPUs have",
        type=_MIG_PROFILES,
    )
    _add(
        parser,
        "mig-share-profiles",
        default="",
        help="with --mig-mode partitionable: offered MIG profiles whose partitions are also published as "
        "shareable, comma-separated (e.g. 1g.10gb): several claims each get a share (memory, compute, "
        "and a count with --shares-per-gpu) of one partition, limited by MPS inside it; each adds one "
        "device per placement for the scheduler to look at on every node",
        type=_MIG_PROFILES,
    )
    _add(
        parser,
        "partition-attributes",
        default="full",
        help="the attributes of MIG partitions: full, everything their GPU carries too (product, versions, "
        "PCIe root, NUMA node); minimal, only type, profile, parent, placement and product, which costs the "
        "scheduler a third less CPU per pod with many partitions (selectors by the others then match no "
        "partition)",
        type=Choice(("full", "minimal")),
    )
    _add(
        parser,
        "shares",
        default="off",
        help="on: publish each whole GPU also as a shared device (MPS/time-slicing shares by memory and "
        "compute; consumable capacity and counter sets: Kubernetes 1.37+ for a fast scheduler)",
        type=Choice(("off", "on")),
    )
    _add(
        parser,
        "shares-per-gpu",
        default="0",
        help=f"with --shares on (or --mig-share-profiles): shares by count, as the device plugin's "
        f"replicas: each GPU's (or partition's) shared device offers this many (at most one per GiB "
        f"of memory), every share takes at least one, and one that names no memory gets the memory / "
        f"N; {MIN_SHARES_PER_GPU} to {MAX_SHARES_PER_GPU}, 0: shares by memory and compute only",
        type=Count(MIN_SHARES_PER_GPU, MAX_SHARES_PER_GPU, zero_means="off"),
    )


def _command(commands: Any, name: str, help: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        name, help=help, epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gpudra",
        description="Kubernetes DRA driver for NVIDIA GPUs",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=build.describe())
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    inv = _command(commands, "inventory", "show the GPUs and the ResourceSlices gpudra would publish")
    _common(inv)
    _add(inv, "node-name", default=socket.gethostname(), help="node (and pool) name")
    inv.add_argument(
        "-o", "--output", type=OUTPUT, default="table", help=f"{OUTPUT_HELP}; json, yaml: the slices"
    )
    inv.add_argument(
        "--server-minor",
        type=Minor(OLDEST_MINOR),
        default=NEWEST_MINOR,
        help=f"Kubernetes 1.x minor to publish for: what its API server keeps, how slices are split "
        f"(default {NEWEST_MINOR})",
    )
    _feature_gates(inv, "the API server's")

    val = _command(commands, "validate", "check gpudra configs in ResourceClaims, templates, classes")
    val.add_argument(
        "files",
        nargs="+",
        type=Path,
        metavar="PATH",
        help="a YAML or JSON file; a directory: its *.yaml, *.yml and *.json files (not subdirectories); "
        "- : standard input",
    )
    _add(
        val,
        "driver-name",
        default=DRIVER,
        help="DRA driver name whose configs are checked",
        type=_DRIVER_NAME,
    )
    val.add_argument(
        "-o", "--output", type=OUTPUT, default="table", help=f"{OUTPUT_HELP}; json, yaml: a List of problems"
    )

    _migrate_parser(
        _command(commands, "migrate", "rewrite NVIDIA DRA driver and device-plugin manifests for gpudra")
    )

    why = _command(commands, "explain", "why a claim fits a node or not, by the scheduler's rules")
    why.add_argument(
        "target",
        help="a file of claims, templates, pods or workloads; or, in the cluster, claim/NAME, pod/NAME, "
        "deployment/NAME, statefulset/NAME, replicaset/NAME, daemonset/NAME, job/NAME or cronjob/NAME "
        "(a workload: a new pod of its template)",
    )
    why.add_argument(
        "-n",
        "--namespace",
        default=None,
        help="namespace of KIND/NAME and of objects in the file that name none (default: the "
        "kubeconfig context's, else default)",
    )
    why.add_argument("--kubeconfig", default=None, help="kubeconfig (default $KUBECONFIG, ~/.kube/config)")
    why.add_argument("--context", default=None, help="the kubeconfig context to use (default: its current)")
    why.add_argument(
        "--slices",
        action="append",
        type=Path,
        default=[],
        help="offline: ResourceSlices (gpudra inventory -o yaml) and allocated ResourceClaims, "
        "instead of the cluster's; repeatable",
    )
    why.add_argument("--classes", type=Path, default=None, help="DeviceClasses (offline default: gpudra's)")
    why.add_argument(
        "-o", "--output", type=OUTPUT, default="table", help=f"{OUTPUT_HELP}; wide: every device"
    )
    why.add_argument("-v", "--verbose", action="store_true", help="the same as -o wide")
    why.add_argument(
        "--server-minor",
        type=Minor(OLDEST_MINOR),
        default=None,
        help="the cluster's Kubernetes 1.x minor, for what its API server keeps (offline default "
        f"{NEWEST_MINOR}; online the server's, its fields found by a dry-run probe slice)",
    )
    _feature_gates(why, "the cluster's")
    why.add_argument(
        "--driver-name", default=DRIVER, type=_DRIVER_NAME, help="DRA driver name whose forms are judged"
    )

    status = _command(
        commands, "status", "the cluster's GPUs: allocated, shared, free, idle; MIG room; claims waiting"
    )
    status.add_argument("-o", "--output", type=OUTPUT, default="table", help=OUTPUT_HELP)
    status.add_argument("--kubeconfig", default=None, help="kubeconfig (default $KUBECONFIG, ~/.kube/config)")
    status.add_argument(
        "--context", default=None, help="the kubeconfig context to use (default: its current)"
    )
    status.add_argument("--driver-name", default=DRIVER, type=_DRIVER_NAME, help="DRA driver name")
    status.add_argument(
        "--idle-after-seconds",
        default="1800",
        type=Seconds(),
        help="report an allocated GPU idle after this long without activity (as the controller's option)",
    )
    status.add_argument(
        "--controller-url",
        default=None,
        type=Pattern(r"https://\S+", "an https:// URL (e.g. https://127.0.0.1:9443)"),
        help="read the view the controller serves at this URL's /status, its webhook port "
        "(e.g. https://127.0.0.1:9443 through kubectl port-forward)",
    )
    status.add_argument(
        "--token",
        default=None,
        help="with --controller-url: the bearer token to send (default: the kubeconfig's)",
    )
    status.add_argument(
        "--certificate-authority",
        default=None,
        help="with --controller-url: the CA file that signed the controller's certificate (the "
        "webhook Secret's ca.crt); default: the kubeconfig's when the URL is its server, else the system's",
    )
    status.add_argument(
        "--tls-server-name",
        default=None,
        help="with --controller-url: the name the controller's certificate must carry, when the URL's "
        "host is not it (e.g. gpudra-controller.gpudra.svc through a port-forward)",
    )
    status.add_argument(
        "--web",
        action="store_true",
        help="serve the GPU map page (read-only, auto-refreshing) from your kubeconfig's view at --listen",
    )
    status.add_argument(
        "--listen", default="127.0.0.1:8090", help="with --web: HOST:PORT to serve the page on (0: any port)"
    )
    status.add_argument(
        "-n",
        "--namespace",
        default=None,
        help="with --web: the namespace whose claims the page shows when your kubeconfig may not list "
        "them in every namespace (default: the kubeconfig context's)",
    )

    plugin = _command(commands, "kubelet-plugin", "run the node plugin (DaemonSet)")
    _common(plugin)
    _add(plugin, "node-name", default=None, help="this node's name (required)")
    _add(plugin, "kubeconfig", default=None, help="kubeconfig file (in-cluster config when absent)")
    _add(
        plugin,
        "registry-dir",
        default="/var/lib/kubelet/plugins_registry",
        help="kubelet plugin registry",
        type=AbsolutePath(),
    )
    _add(
        plugin,
        "plugin-dir",
        default=None,
        help="DRA socket directory (/var/lib/kubelet/plugins/<driver>)",
        type=AbsolutePath(),
    )
    _add(
        plugin,
        "instance-id",
        default=None,
        help="this instance's own socket names, <driver>-<id>-reg.sock and dra-<id>.sock (the chart passes "
        "the pod's UID), so that both pods of a rolling update stay registered with the kubelet (1.33+); "
        "1 to 63 letters, digits, '-', '_' and '.', starting with a letter or digit; unset: "
        "<driver>-reg.sock and dra.sock",
        type=_INSTANCE_ID,
    )
    _add(plugin, "cdi-root", default="/var/run/cdi", help="where CDI specs are written", type=AbsolutePath())
    _add(
        plugin,
        "state-dir",
        default=None,
        help="checkpoint directory (default: the plugin directory)",
        type=AbsolutePath(),
    )
    _add(
        plugin,
        "toolkit-cdi-dirs",
        default="/etc/cdi:/var/run/cdi",
        help="directories searched for the NVIDIA Container Toolkit's CDI spec, ':'-separated absolute paths",
        type=Pattern(
            r"/[^:]*(:/[^:]*)*",
            "':'-separated absolute paths (e.g. /etc/cdi:/var/run/cdi)",
            empty="no toolkit spec is looked for",
        ),
    )
    _add(
        plugin,
        "metrics-port",
        default="0",
        help="HTTP port for /metrics, /livez and /readyz (0: off)",
        type=Port(),
    )
    _add(plugin, "metrics-address", default="0.0.0.0", help="address the HTTP port binds (e.g. 127.0.0.1)")
    _logging(plugin)
    _add(
        plugin,
        "resync-seconds",
        default="30",
        help="ResourceSlice resync period",
        type=Seconds(exclusive=True),
    )
    _add(
        plugin,
        "health-interval-seconds",
        default="10",
        help="how often GPU health is probed for the kubelet (0: no health service)",
        type=Seconds(zero_means="no health service"),
    )
    _add(
        plugin,
        "health-xids",
        default="",
        help="XID classes over the defaults (docs/health.md): comma-separated <xid>=<class> or "
        "default=<class> (XIDs not named); classes: ignore (an application error: counted only), "
        "recoverable (tainted until quiet for --health-recovery-seconds), reset (tainted until a GPU "
        "reset is seen, the node reboots or the Node is annotated gpudra.io/clear-health=<GPU UUID>), "
        "reboot (tainted until the node reboots or the Node is annotated); e.g. "
        "'31=reset,default=ignore'",
        type=_XIDS,
    )
    _add(
        plugin,
        "health-recovery-seconds",
        default="600",
        help="how long a GPU with a recoverable fault must stay without faults before its taint is lifted",
        type=Seconds(),
    )
    _add(
        plugin,
        "health-reset-effect",
        default="NoSchedule",
        type=Choice(("NoSchedule", "NoExecute")),
        help="the taint effect of faults that need a GPU reset or a node reboot: NoSchedule keeps new "
        "claims off the GPU, NoExecute also evicts the pods using it",
    )
    _add(
        plugin,
        "usage-interval-seconds",
        default="30",
        help="how often claims' GPU use is sampled (0: off)",
        type=Seconds(zero_means="off"),
    )
    _add(
        plugin,
        "mps-check-interval-seconds",
        default="5",
        help="how often the MPS control daemons of prepared claims are checked; one that stopped (e.g. "
        "with the plugin pod a rolling update replaced) is started again with its claim's limits (0: only "
        "at plugin start)",
        type=Seconds(zero_means="only at plugin start"),
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
        type=AbsolutePath(),
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
        type=AbsolutePath(),
    )
    _add(
        plugin,
        "mps-host-socket",
        default="",
        help="the socket of `gpudra mps-host` on this node, which then runs the claims' MPS control daemons "
        "outside the plugin, so that they outlive its restarts and upgrades (the chart's default); empty: "
        "the plugin runs them itself, and they end with its container",
        type=Pattern(r"/.*", "an absolute path", empty="the plugin runs the MPS daemons itself"),
    )
    _mps_host_parser(_command(commands, "mps-host", "run the claims' MPS daemons for the plugin (DaemonSet)"))
    _controller_parser(_command(commands, "controller", "run the cluster controller (Deployment)"))
    return parser


def _migrate_parser(migrate: argparse.ArgumentParser) -> None:
    migrate.add_argument(
        "files",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="a YAML or JSON file of manifests (several documents, Lists, Helm's output); - : standard input",
    )
    migrate.add_argument(
        "--device-plugin-config",
        type=Path,
        default=None,
        metavar="FILE",
        help="the NVIDIA device plugin's config (version: v1; or its chart's ConfigMap): sharing replicas, "
        "renamed resources, flags.migStrategy",
    )
    migrate.add_argument(
        "--mig-strategy",
        type=Choice(("none", "single", "mixed")),
        default=None,
        help="the device plugin's MIG strategy, over the config's flags.migStrategy (default: the config's, "
        "else none)",
    )
    migrate.add_argument(
        "--gpu-memory",
        type=Bytes(minimum="1Gi"),
        default=None,
        help="the memory of the GPUs that time-slicing or MPS replicas divide (e.g. 81559Mi for an H100 "
        "80GB, as gpudra inventory shows it): a replica becomes a share of memory / replicas, in whole Gi",
    )
    migrate.add_argument(
        "--shares-by-count",
        action="store_true",
        help="a time-slicing or MPS replica becomes one share by count (capacity shares: 1) instead of a "
        "share of memory: the nodes then need the chart's kubeletPlugin.options.sharesPerGpu set to the "
        "replicas, which gives each share 1/replicas of the GPU's memory",
    )
    migrate.add_argument("--driver-name", default=DRIVER, type=_DRIVER_NAME, help="gpudra's DRA driver name")


def _mps_host_parser(host: argparse.ArgumentParser) -> None:
    nvml = Choice(("real", *(f"sim:{m}" for m in SIM_MACHINES)), label="NVML")
    _add(host, "nvml", default="real", help=f"NVML to use: real, or sim:{'|'.join(SIM_MACHINES)}", type=nvml)
    _add(host, "driver-name", default=DRIVER, help="DRA driver name", type=_DRIVER_NAME)
    _add(
        host,
        "state-dir",
        default=None,
        help="the kubelet plugin's --state-dir, whose mps/ holds the daemons' directories (default: "
        "/var/lib/kubelet/plugins/<driver>)",
        type=AbsolutePath(),
    )
    _add(
        host,
        "mps-host-socket",
        default=None,
        help="the socket the plugin's --mps-host-socket names (default: <state-dir>/mps-host/mps-host.sock); "
        "its directory must be mounted by the plugin and mps-host only",
        type=AbsolutePath(),
    )
    _add(
        host,
        "driver-root",
        default="/",
        help="the kubelet plugin's --driver-root: nvidia-cuda-mps-control runs chrooted into it",
        type=AbsolutePath(),
    )
    _logging(host)


def _controller_parser(ctl: argparse.ArgumentParser) -> None:
    _add(ctl, "driver-name", default=DRIVER, help="DRA driver name", type=_DRIVER_NAME)
    _add(ctl, "kubeconfig", default=None, help="kubeconfig file (in-cluster config when absent)")
    _add(
        ctl,
        "namespace",
        default=os.environ.get("POD_NAMESPACE", "gpudra"),
        help="the controller's namespace: its Lease and the webhook's Secret live there",
    )
    _add(ctl, "identity", default=None, help="this replica's name in the Lease (default: host name + random)")
    _add(
        ctl,
        "webhook-port",
        default="9443",
        help="HTTPS port of the admission webhook, and of /status and the GPU map for a bearer token "
        "(0: none of them)",
        type=Port(),
    )
    _add(ctl, "webhook-address", default="0.0.0.0", help="address the webhook binds")
    _add(ctl, "webhook-service", default="gpudra-controller", help="the Service the API server calls")
    _add(
        ctl,
        "webhook-url",
        default=None,
        help="https://HOST:PORT the API server calls (+ /validate) instead of the Service (a controller "
        "outside the cluster)",
        type=Pattern(
            r"https://[^/\s]+", "https://HOST:PORT (no path: /validate is added)", empty="the Service"
        ),
    )
    _add(ctl, "webhook-configuration", default="gpudra", help="ValidatingWebhookConfiguration name")
    _add(ctl, "webhook-secret", default="gpudra-webhook-tls", help="Secret with the webhook's CA and cert")
    _add(
        ctl,
        "failure-policy",
        default="Fail",
        type=Choice(("Fail", "Ignore")),
        help="when the webhook cannot be reached: Fail refuses claims with gpudra configs, Ignore admits "
        "them unchecked (a bad config then fails at prepare)",
    )
    _add(
        ctl,
        "metrics-port",
        default="8080",
        help="HTTP port for /metrics, /livez, /readyz (0: off)",
        type=Port(),
    )
    _add(ctl, "metrics-address", default="0.0.0.0", help="address the HTTP port binds")
    _add(
        ctl,
        "gpu-map",
        default="true",
        help="serve the read-only GPU map page at / on the HTTP port (docs/gpu-map.md: who can reach it)",
        type=Choice(("true", "false")),
    )
    _add(
        ctl,
        "idle-after-seconds",
        default="1800",
        help="report an allocated GPU idle after this long",
        type=Seconds(),
    )
    _add(ctl, "lease-name", default="gpudra-controller", help="the leader election Lease")
    _add(
        ctl,
        "lease-seconds",
        default="15",
        help="how long a leader holds the Lease without renewing (at least 3)",
        type=Seconds(minimum=3),
    )
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
        type=_GATES,
        help=f"{whose} feature gates that differ from the release's defaults, as the components take them "
        "(DRAPartitionableDevices=true,DRAConsumableCapacity=true,DRADeviceTaints=true)",
    )


def _logging(daemon: argparse.ArgumentParser) -> None:
    _add(daemon, "log-format", default="text", help="text or json", type=Choice(("text", "json")))
    _add(daemon, "log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR", type=LOG_LEVELS)


def _run_daemon(args: argparse.Namespace, run: Callable[[threading.Event], None]) -> int:
    """Logging as the options say, then `run(stop)` until SIGTERM or SIGINT sets `stop`."""
    logs.configure(fmt=args.log_format, level=args.log_level)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    run(stop)
    return 0


DAEMONS = ("kubelet-plugin", "controller", "mps-host")
_DEBUG = "GPUDRA_DEBUG=1 shows the traceback"


def main(argv: Sequence[str] | None = None) -> int:
    """The command's exit code (EXIT_CODES). Its errors are one line on stderr, the daemons' too: a
    daemon that cannot start (a kubeconfig it cannot use, a directory it cannot create, a port in use)
    says so in the one line its pod's status shows, exit 2. An unexpected error is exit 3, its
    traceback shown with GPUDRA_DEBUG=1, and in a daemon's log at --log-level DEBUG."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as done:  # --help, or a usage error argparse printed (_Parser.error)
        return done.code if isinstance(done.code, int) else EXIT_USAGE
    try:
        return _dispatch(args)
    except ConfigError as err:
        return _fail(args.command, str(err), EXIT_USAGE)
    except GpudraError as err:
        return _fail(args.command, str(err), 1 if args.command in DAEMONS else EXIT_USAGE)
    except BrokenPipeError:
        # The reader is gone (`| head`): what is left unwritten goes nowhere, including at exit's flush.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE_CLOSED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except OSError as err:
        where = f"{err.filename}: " if err.filename else ""
        return _fail(args.command, f"{where}{err.strerror or err}", EXIT_USAGE)
    except Exception as err:
        if os.environ.get("GPUDRA_DEBUG"):
            raise
        if args.command in DAEMONS:
            logging.getLogger("gpudra").debug("unexpected error", exc_info=True)
        what = f"{type(err).__name__}: {err}".splitlines()[0]
        return _fail(args.command, f"unexpected error (a bug: please report it; {_DEBUG}): {what}", EXIT_BUG)


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "inventory":
        return _inventory(args)
    if args.command == "validate":
        return _validate(args)
    if args.command == "migrate":
        return _migrate(args)
    if args.command == "explain":
        return _explain(args)
    if args.command == "status":
        return _status(args)
    if args.command == "controller":
        return _controller(args)
    if args.command == "mps-host":
        return _mps_host(args)
    return _kubelet_plugin(args)


def _fail(command: str, message: str, code: int) -> int:
    print(f"gpudra {command}: {message}", file=sys.stderr)
    return code


# --- inventory ---------------------------------------------------------------------------------


def _inventory(args: argparse.Namespace) -> int:
    from gpudra.cli import inventory  # noqa: PLC0415 (see the imports above)

    return inventory.show(
        nvml_name=args.nvml,
        publishing=_publishing_option(args),
        driver=args.driver_name,
        node_name=args.node_name,
        fields=ServerFields.of_release(args.server_minor, parse_feature_gates(args.feature_gates)),
        output=args.output,
    )


# --- validate ------------------------------------------------------------------------------------


def _validate(args: argparse.Namespace) -> int:
    from gpudra.cli import validate  # noqa: PLC0415 (see the imports above)

    return validate.run(args.files, driver=args.driver_name, output=args.output)


# --- migrate -------------------------------------------------------------------------------------


def _migrate(args: argparse.Namespace) -> int:
    from gpudra.cli import migrate  # noqa: PLC0415 (see the imports above)

    return migrate.run(
        args.files,
        driver=args.driver_name,
        device_plugin=args.device_plugin_config,
        mig_strategy=args.mig_strategy,
        gpu_memory=args.gpu_memory,
        by_count=args.shares_by_count,
    )


# --- explain -------------------------------------------------------------------------------------


def _explain(args: argparse.Namespace) -> int:
    from gpudra.cli import explain  # noqa: PLC0415 (see the imports above)

    return explain.run(args)


# --- status --------------------------------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    from gpudra.cli import status  # noqa: PLC0415 (see the imports above)

    if args.web:
        return _status_web(args)
    view = status.fetch(
        kubeconfig=args.kubeconfig,
        driver=args.driver_name,
        idle_after_seconds=args.idle_after_seconds,
        controller_url=args.controller_url,
        context=args.context,
        token=args.token,
        certificate_authority=args.certificate_authority,
        tls_server_name=args.tls_server_name,
    )
    sys.stdout.write(status.show(view, output=args.output))
    return 0


def _status_web(args: argparse.Namespace) -> int:
    from gpudra.cli import status_web  # noqa: PLC0415 (see the imports above)

    if args.controller_url:
        raise ConfigError(
            "--web reads the cluster with your kubeconfig; the controller serves the same page at its "
            "URL's /",
            field="--controller-url",
        )
    return status_web.serve(
        kubeconfig=args.kubeconfig,
        driver=args.driver_name,
        idle_after_seconds=args.idle_after_seconds,
        listen=args.listen,
        context=args.context,
        namespace=args.namespace,
    )


# --- controller ----------------------------------------------------------------------------------


def _controller(args: argparse.Namespace) -> int:
    from gpudra.controller import wiring  # noqa: PLC0415 (see the imports above)
    from gpudra.controller.options import ControllerOptions  # noqa: PLC0415

    options = ControllerOptions(
        driver=args.driver_name,
        kubeconfig=args.kubeconfig,
        namespace=args.namespace,
        identity=args.identity or f"{socket.gethostname()}_{secrets.token_hex(4)}",
        webhook_port=args.webhook_port,
        webhook_address=args.webhook_address,
        webhook_service=args.webhook_service,
        webhook_url=args.webhook_url or None,
        webhook_configuration=args.webhook_configuration,
        webhook_secret=args.webhook_secret,
        failure_policy=args.failure_policy,
        metrics_port=args.metrics_port,
        metrics_address=args.metrics_address,
        gpu_map=args.gpu_map == "true",
        idle_after_seconds=args.idle_after_seconds,
        lease_name=args.lease_name,
        lease_seconds=args.lease_seconds,
        owner_cluster_role=args.owner_cluster_role or None,
    )
    return _run_daemon(args, lambda stop: wiring.run(options, stop=stop))


# --- kubelet-plugin ------------------------------------------------------------------------------


def _kubelet_plugin(args: argparse.Namespace) -> int:
    if not args.node_name:
        raise ConfigError("is required (or GPUDRA_NODE_NAME): this node's name", field="--node-name")
    from gpudra.node import daemon  # noqa: PLC0415 (see the imports above)
    from gpudra.node.options import PluginOptions  # noqa: PLC0415

    plugin_dir = args.plugin_dir or Path(f"/var/lib/kubelet/plugins/{args.driver_name}")
    options = PluginOptions(
        node_name=args.node_name,
        driver=args.driver_name,
        nvml=args.nvml,
        publishing=_publishing_option(args),
        kubeconfig=args.kubeconfig,
        registry_dir=args.registry_dir,
        plugin_dir=plugin_dir,
        cdi_root=args.cdi_root,
        state_dir=args.state_dir or plugin_dir,
        toolkit_cdi_dirs=tuple(Path(p) for p in args.toolkit_cdi_dirs.split(":") if p),
        metrics_port=args.metrics_port,
        metrics_address=args.metrics_address,
        resync_seconds=args.resync_seconds,
        health_interval_seconds=args.health_interval_seconds,
        usage_interval_seconds=args.usage_interval_seconds,
        mps_check_interval_seconds=args.mps_check_interval_seconds,
        driver_root=args.driver_root,
        dev_root=args.dev_root,
        instance_id=args.instance_id or None,
        health_xids=parse_xid_classes(args.health_xids, field="--health-xids"),
        health_recovery_seconds=args.health_recovery_seconds,
        health_reset_effect=args.health_reset_effect,
        mps_host_socket=Path(args.mps_host_socket) if args.mps_host_socket else None,
    )
    return _run_daemon(args, lambda stop: daemon.run(options, stop=stop))


# --- mps-host ------------------------------------------------------------------------------------


def _mps_host(args: argparse.Namespace) -> int:
    from gpudra.node import mps_host  # noqa: PLC0415 (see the imports above)

    state_dir: Path = args.state_dir or Path(f"/var/lib/kubelet/plugins/{args.driver_name}")
    socket_path: Path = args.mps_host_socket or state_dir / "mps-host" / "mps-host.sock"
    return _run_daemon(
        args,
        lambda stop: mps_host.run(
            nvml=args.nvml,
            state_dir=state_dir,
            socket_path=socket_path,
            driver_root=args.driver_root,
            stop=stop,
        ),
    )


def _publishing_option(args: argparse.Namespace) -> Publishing:
    profiles = frozenset(p.strip() for p in args.mig_profiles.split(",") if p.strip())
    shareable = frozenset(p.strip() for p in args.mig_share_profiles.split(",") if p.strip())
    if profiles and args.mig_mode != "partitionable":
        raise ConfigError(MIG_PROFILES_NEED_PARTITIONABLE, field="--mig-profiles")
    if shareable and args.mig_mode != "partitionable":
        raise ConfigError(MIG_SHARE_PROFILES_NEED_PARTITIONABLE, field="--mig-share-profiles")
    if shareable and profiles and not shareable <= profiles:
        raise ConfigError(
            f"{', '.join(sorted(shareable - profiles))} is not among the offered --mig-profiles; allowed: "
            f"{', '.join(sorted(profiles))}",
            field="--mig-share-profiles",
        )
    if args.shares_per_gpu and args.shares != "on" and not shareable:
        raise ConfigError(SHARES_PER_GPU_NEED_SHARES, field="--shares-per-gpu")
    return Publishing(
        mig_mode=args.mig_mode,
        shares=args.shares == "on",
        shares_per_gpu=args.shares_per_gpu,
        mig_profiles=profiles or None,
        partition_attributes=args.partition_attributes,
        mig_share_profiles=shareable,
    )


SHARES_PER_GPU_NEED_SHARES = (
    "sets a count of shares per GPU, which needs --shares on (or --mig-share-profiles)"
)
MIG_SHARE_PROFILES_NEED_PARTITIONABLE = (
    "names MIG profiles to offer as shareable partitions, which needs --mig-mode partitionable"
)
MIG_PROFILES_NEED_PARTITIONABLE = (
    "names MIG profiles to offer on demand, which needs --mig-mode partitionable"
)
