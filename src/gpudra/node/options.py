"""The node's daemons' options, each declared once (gpudra.options.declared): `gpudra kubelet-plugin`'s
and `gpudra mps-host`'s flags, GPUDRA_* variables and chart values are made from these fields. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudra.model.gpu_health import Classification, XidClass, parse_xid_classes
from gpudra.model.publishing import Publishing
from gpudra.options.declared import group, option
from gpudra.options.shared import LogFormat, driver_option, log_format_option, log_level_option
from gpudra.options.types import (
    AbsolutePath,
    Choice,
    Parsed,
    PathList,
    Pattern,
    Port,
    Seconds,
    comma_list,
    one_of,
)

# The simulated machines are listed by hand: importing gpudra.sim here would slow every command's
# start (tests/unit/gpu/test_sim_library.py checks the list against gpudra.sim.PROFILES).
SIM_MACHINES = ("dgx-a100", "dgx-h100", "mixed", "vm-h100", "vm-h200", "no-sharing")
NVML = Choice(("real", *(f"sim:{m}" for m in SIM_MACHINES)), label="NVML")


def nvml_option() -> Any:
    return option(f"NVML to use: real, or sim:{'|'.join(SIM_MACHINES)}", type=NVML, default="real")


def _plugin_dir(options: Mapping[str, Any]) -> str:
    return f"/var/lib/kubelet/plugins/{options['driver']}"


# --instance-id goes into socket file names: no '/', no leading dot (the kubelet skips dot files).
_INSTANCE_ID = Pattern(
    r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}",
    "an instance ID: 1 to 63 letters, digits, '-', '_' and '.', starting with a letter or digit",
    empty="<driver>-reg.sock and dra.sock",
)
_XIDS = Parsed(
    lambda text: parse_xid_classes(text, field="--health-xids"),
    comma_list(rf"(default|[0-9]{{1,10}})\s*=\s*({one_of([c.value for c in XidClass])})"),
)


@dataclass(frozen=True, kw_only=True)
class PluginOptions:
    """`gpudra kubelet-plugin`'s options."""

    nvml: str = nvml_option()
    driver: str = driver_option()
    # What the node offers besides whole GPUs.
    publishing: Publishing = group(Publishing)
    node_name: str = option("this node's name", required=True, chart="the pod's spec.nodeName")
    kubeconfig: str | None = option(
        "kubeconfig file (in-cluster config when absent)", chart="in-cluster config"
    )
    registry_dir: Path = option(
        "kubelet plugin registry",
        type=AbsolutePath(),
        default="/var/lib/kubelet/plugins_registry",
        chart="kubeletPlugin.kubeletDir",
    )
    plugin_dir: Path = option(
        "DRA socket directory (/var/lib/kubelet/plugins/<driver>)",
        type=AbsolutePath(),
        default=_plugin_dir,
        chart="kubeletPlugin.kubeletDir",
    )
    # Names this instance's kubelet sockets (the pod's UID), so that two pods of a rolling update both
    # stay registered (gpudra.node.kubelet_grpc); None: the names every instance shares.
    instance_id: str | None = option(
        "this instance's own socket names, <driver>-<id>-reg.sock and dra-<id>.sock (the chart passes "
        "the pod's UID), so that both pods of a rolling update stay registered with the kubelet (1.33+); "
        "1 to 63 letters, digits, '-', '_' and '.', starting with a letter or digit; unset: "
        "<driver>-reg.sock and dra.sock",
        type=_INSTANCE_ID,
        chart="the pod's metadata.uid (its own sockets, for a rolling update with maxSurge)",
    )
    cdi_root: Path = option(
        "where CDI specs are written",
        type=AbsolutePath(),
        default="/var/run/cdi",
        chart="kubeletPlugin.cdiDir",
    )
    state_dir: Path = option(
        "checkpoint directory (default: the plugin directory)",
        type=AbsolutePath(),
        default=lambda options: str(options["plugin_dir"]),
        chart="the plugin directory, a hostPath",
    )
    toolkit_cdi_dirs: tuple[Path, ...] = option(
        "directories searched for the NVIDIA Container Toolkit's CDI spec, ':'-separated absolute paths",
        type=PathList(empty="no toolkit spec is looked for"),
        default="/etc/cdi:/var/run/cdi",
    )
    metrics_port: int = option(
        "HTTP port for /metrics, /livez and /readyz (0: off)",
        type=Port(),
        default="0",
        chart="kubeletPlugin.port (the probes use it)",
    )
    metrics_address: str = option(
        "address the HTTP port binds (e.g. 127.0.0.1)", default="0.0.0.0", chart="all of the pod's addresses"
    )
    log_format: LogFormat = log_format_option()
    log_level: str = log_level_option()
    resync_seconds: float = option("ResourceSlice resync period", type=Seconds(exclusive=True), default="30")
    # 0: no health service
    health_interval_seconds: float = option(
        "how often GPU health is probed for the kubelet (0: no health service)",
        type=Seconds(zero_means="no health service"),
        default="10",
    )
    # Which XIDs are application errors, recoverable, or need a reset (gpudra.model.gpu_health).
    health_xids: Classification = option(
        "XID classes over the defaults (docs/health.md): comma-separated <xid>=<class> or "
        "default=<class> (XIDs not named); classes: ignore (an application error: counted only), "
        "recoverable (tainted until quiet for --health-recovery-seconds), reset (tainted until a GPU "
        "reset is seen, the node reboots or the Node is annotated gpudra.io/clear-health=<GPU UUID>), "
        "reboot (tainted until the node reboots or the Node is annotated); e.g. "
        "'31=reset,default=ignore'",
        type=_XIDS,
        default="",
    )
    # A recoverable fault's taint is lifted after this long quiet.
    health_recovery_seconds: float = option(
        "how long a GPU with a recoverable fault must stay without faults before its taint is lifted",
        type=Seconds(),
        default="600",
    )
    # The taint effect of faults that need a reset.
    health_reset_effect: str = option(
        "the taint effect of faults that need a GPU reset or a node reboot: NoSchedule keeps new "
        "claims off the GPU, NoExecute also evicts the pods using it",
        type=Choice(("NoSchedule", "NoExecute")),
        default="NoSchedule",
    )
    # 0: no claim usage sampling
    usage_interval_seconds: float = option(
        "how often claims' GPU use is sampled (0: off)", type=Seconds(zero_means="off"), default="30"
    )
    # 0: stopped MPS daemons are started again only at plugin start
    mps_check_interval_seconds: float = option(
        "how often the MPS control daemons of prepared claims are checked; one that stopped (e.g. "
        "with the plugin pod a rolling update replaced) is started again with its claim's limits (0: only "
        "at plugin start)",
        type=Seconds(zero_means="only at plugin start"),
        default="5",
    )
    # Where the NVIDIA driver's files are (gpudra.gpu.driver_root).
    driver_root: Path = option(
        "where the NVIDIA driver's files (libnvidia-ml.so.1, nvidia-smi, nvidia-cuda-mps-control) are: "
        "/ for this machine's driver, else the host's driver root mounted here (the host's / or the GPU "
        "Operator's /run/nvidia/driver); the tools then run chrooted into it, and MPS needs --state-dir "
        "at the same path inside it (true for the host's / with the state directory mounted at its host "
        "path); ignored with --nvml sim:...",
        type=AbsolutePath(),
        default="/",
        chart="kubeletPlugin.driverRoot, mounted at /driver-root",
    )
    # The host directory whose dev/ holds the NVIDIA device nodes, named as hostPath in claim specs
    # (gpudra.node.cdi) unless it is /; with the simulator, also where its stand-in nodes are made.
    dev_root: Path = option(
        "the host directory whose dev/ holds the NVIDIA device nodes, as NVIDIA's DRA driver and "
        "nvidia-ctk --dev-root mean it: / for the host's /dev, where claim specs name each node by its "
        "path alone; otherwise a spec's GPU and control nodes get hostPath <dev-root>/dev/<name> "
        "(container path /dev/<name>) for the runtime to find them by (GPU Operator: /run/nvidia/driver "
        "if that driver root has a dev/ directory, which NVIDIA's DRA driver then uses). With --nvml "
        "sim:..., a dev root other than / is where the plugin creates the simulated machine's stand-in "
        "nodes at start (needs CAP_MKNOD): mount that host directory at the same path in its container",
        type=AbsolutePath(),
        default="/",
    )
    # `gpudra mps-host`'s socket: the claims' MPS daemons run there (gpudra.node.mps_host); None: here.
    mps_host_socket: Path | None = option(
        "the socket of `gpudra mps-host` on this node, which then runs the claims' MPS control daemons "
        "outside the plugin, so that they outlive its restarts and upgrades (the chart's default); empty: "
        "the plugin runs them itself, and they end with its container",
        type=AbsolutePath(empty="the plugin runs the MPS daemons itself"),
        default="",
        chart="mpsHost.enabled (the mps-host DaemonSet's socket in the plugin directory)",
    )


@dataclass(frozen=True, kw_only=True)
class MpsHostOptions:
    """`gpudra mps-host`'s options."""

    nvml: str = nvml_option()
    driver: str = driver_option()
    state_dir: Path = option(
        "the kubelet plugin's --state-dir, whose mps/ holds the daemons' directories (default: "
        "/var/lib/kubelet/plugins/<driver>)",
        type=AbsolutePath(),
        default=_plugin_dir,
    )
    mps_host_socket: Path = option(
        "the socket the plugin's --mps-host-socket names (default: <state-dir>/mps-host/mps-host.sock); "
        "its directory must be mounted by the plugin and mps-host only",
        type=AbsolutePath(),
        default=lambda options: f"{options['state_dir']}/mps-host/mps-host.sock",
    )
    driver_root: Path = option(
        "the kubelet plugin's --driver-root: nvidia-cuda-mps-control runs chrooted into it",
        type=AbsolutePath(),
        default="/",
    )
    log_format: LogFormat = log_format_option()
    log_level: str = log_level_option()
