"""Runs `gpudra kubelet-plugin` as a real process next to a local cluster's kubelet, on a simulated
machine, and reads back what it left on the node (CDI specs, checkpoint, simulated GPU settings).
I/O: a child process and the node's files. Used by the demo and the integration tests."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpudra.errors import ClusterError
from tests.localcluster.cluster import LocalCluster, NodePaths
from tests.localcluster.processes import scrape, terminate

DRIVER = "gpu.gpudra.io"

# What each simulated machine's node group offers besides whole GPUs, as a platform team would set it
# per group (docs/install.md, "What to publish"): the DGX H100s and A100s MIG partitions on demand and
# shares, the L4/T4 box shares. A machine not named here publishes gpudra's defaults: whole GPUs and
# existing MIG devices, no counter sets.
NODE_GROUPS: dict[str, dict[str, str]] = {
    "dgx-h100": {"mig-mode": "partitionable", "shares": "on"},
    "dgx-a100": {"mig-mode": "partitionable", "shares": "on"},
    "mixed": {"shares": "on"},
}


def publishing_flags(profile: str) -> list[str]:
    """The kubelet-plugin options of `profile`'s node group."""
    return [f"--{option}={value}" for option, value in NODE_GROUPS.get(profile, {}).items()]


def publishing_values(profile: str) -> list[str]:
    """The same as the chart's --set arguments (kubeletPlugin.options are the CLI options, camelCase)."""
    camel = {"mig-mode": "migMode", "shares": "shares", "mig-profiles": "migProfiles"}
    found = []
    for option, value in NODE_GROUPS.get(profile, {}).items():
        found += ["--set-string", f"kubeletPlugin.options.{camel[option]}={value}"]
    return found


class NodeFiles:
    """What gpudra's plugin left on a node: CDI specs, its checkpoint, the simulated GPUs' settings.

    The same reads serve a plugin run as a process here and one run in a container (the chart's
    DaemonSet), whose hostPath directories are these files on the node."""

    def __init__(self, *, cdi_root: Path, checkpoint: Path, sim_state: Path) -> None:
        self.cdi_root = cdi_root
        self.checkpoint = checkpoint
        self.sim_state = sim_state

    def cdi_specs(self) -> dict[str, dict[str, Any]]:
        """Claim UID -> this driver's CDI spec on the node (a spec deleted while it is read is gone)."""
        prefix = f"{DRIVER}-claim_"
        specs = {}
        for path in self.cdi_root.glob(f"{prefix}*.json"):
            try:
                specs[path.name[len(prefix) : -len(".json")]] = json.loads(path.read_text())
            except FileNotFoundError:
                continue
        return specs

    def checkpoint_claims(self) -> dict[str, Any]:
        if not self.checkpoint.exists():
            return {}
        return dict(json.loads(self.checkpoint.read_text())["data"]["claims"])

    def mig_devices(self) -> list[str]:
        """The MIG UUIDs on the simulated card, every GPU."""
        state = json.loads(self.sim_state.read_text())
        return [
            ci["uuid"]
            for gpu in state["gpus"]
            for gi in gpu.get("gpu_instances", [])
            for ci in gi.get("compute_instances", [])
        ]

    def mps_daemons(self) -> list[dict[str, Any]]:
        """The simulated card's MPS control daemons that answer on their control socket (a daemon's pid
        in the state file is in its plugin's PID namespace, which a container's is not the node's)."""
        state = json.loads(self.sim_state.read_text())
        return [d for d in state.get("mps_daemons", []) if _answers(Path(d["pipe_directory"]) / "control")]

    def timeslices(self) -> dict[str, int]:
        """GPU UUID -> the simulated GPU's current time-slice setting."""
        state = json.loads(self.sim_state.read_text())
        return {gpu["uuid"]: int(gpu.get("timeslice", 0)) for gpu in state["gpus"]}


def _answers(control: Path) -> bool:
    """Whether an MPS control daemon answers `get_server_list` at this socket (its own protocol: one
    command, then end of input; the reply ends when the daemon closes)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(5)
        try:
            conn.connect(str(control))
            conn.sendall(b"get_server_list\n")
            conn.shutdown(socket.SHUT_WR)
            while conn.recv(4096):
                pass
        except OSError:
            return False
    return True


class MpsHostProcess:
    """`gpudra mps-host` of one node, as a process (in a cluster with containers it is a DaemonSet's pod):
    the node's plugin processes run their claims' MPS daemons there. Started with the node's first
    plugin, stopped with its last (`PluginProcess.stop`), so a plugin restart or crash leaves it running."""

    def __init__(self, node: NodePaths, profile: str, state_dir: Path, sim_state: Path) -> None:
        self.node = node
        self.profile = profile
        self.state_dir = state_dir
        self.sim_state = sim_state
        self.socket = state_dir / "mps-host" / "mps-host.sock"
        self.log = node.root / "gpudra-mps-host.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.users: set[int] = set()  # the PluginProcess objects (by id) started and not stopped

    def ensure(self) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        env = {**os.environ, "GPUDRA_SIM_STATE": str(self.sim_state)}
        env.pop("GPUDRA_CRASH_AT", None)  # the plugin's crash points, never mps-host's
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpudra",
                    "mps-host",
                    f"--nvml=sim:{self.profile}",
                    f"--state-dir={self.state_dir}",
                    f"--mps-host-socket={self.socket}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while not self.socket.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])
                raise ClusterError(f"gpudra mps-host on {self.node.name} did not listen:\n{tail}")
            time.sleep(0.05)

    def stop(self) -> None:
        terminate(self.process)
        self.process = None


_MPS_HOSTS: dict[Path, MpsHostProcess] = {}  # by state directory: the plugins of a node share one


class PluginProcess(NodeFiles):
    """One node's gpudra plugin on a simulated machine; restartable, with its log kept across runs."""

    def __init__(
        self,
        cluster: LocalCluster,
        node: NodePaths,
        profile: str,
        *,
        instance_id: str | None = None,
        group: dict[str, str] | None = None,
    ) -> None:
        """`instance_id`: the plugin's --instance-id (sockets of its own, as a pod of a rolling update);
        such an instance logs to a file of its own too. `group`: the publishing options of the node's
        group instead of `profile`'s in NODE_GROUPS."""
        self.cluster = cluster
        self.node = node
        self.profile = profile
        self.instance_id = instance_id
        self.group = NODE_GROUPS.get(profile, {}) if group is None else group
        self.state_dir = node.root / "gpudra"
        super().__init__(
            cdi_root=node.cdi_root,
            checkpoint=self.state_dir / "checkpoint.json",
            sim_state=node.root / "sim" / f"{profile}.json",
        )
        self.log = node.root / (f"gpudra-plugin-{instance_id}.log" if instance_id else "gpudra-plugin.log")
        self.process: subprocess.Popen[bytes] | None = None
        self.metrics_port = 0
        self.mps_host = _MPS_HOSTS.setdefault(
            self.state_dir, MpsHostProcess(node, profile, self.state_dir, self.sim_state)
        )

    def start(
        self,
        *,
        crash_at: str | None = None,
        metrics_port: int = 0,
        resync_seconds: float = 5,
        usage_interval: float = 0,
        mps_check_interval: float | None = None,
        kubeconfig: Path | None = None,
    ) -> None:
        """Start the plugin and wait until it serves claims. `usage_interval` (seconds) turns claim usage
        reporting on; it is off by default, so that tests counting API requests see none of its own.
        `mps_check_interval` (seconds) replaces the default --mps-check-interval-seconds.
        `kubeconfig` replaces the cluster's admin credentials (e.g. the chart's service account)."""
        env = {**os.environ, "GPUDRA_SIM_STATE": str(self.sim_state)}
        env.pop("GPUDRA_CRASH_AT", None)
        if crash_at:
            env["GPUDRA_CRASH_AT"] = crash_at
        seen, serving = self.registrations(), self._log_count("serving claims")
        self.metrics_port = metrics_port
        self.mps_host.ensure()
        self.mps_host.users.add(id(self))
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpudra",
                    "kubelet-plugin",
                    f"--node-name={self.node.name}",
                    f"--kubeconfig={kubeconfig or self.cluster.kubeconfig}",
                    f"--nvml=sim:{self.profile}",
                    *(f"--{option}={value}" for option, value in self.group.items()),
                    f"--registry-dir={self.node.registry_dir}",
                    f"--plugin-dir={self.node.plugins_dir / DRIVER}",
                    f"--cdi-root={self.node.cdi_root}",
                    f"--state-dir={self.state_dir}",
                    f"--mps-host-socket={self.mps_host.socket}",
                    "--toolkit-cdi-dirs=",
                    f"--resync-seconds={resync_seconds}",
                    f"--usage-interval-seconds={usage_interval}",
                    *(
                        [f"--mps-check-interval-seconds={mps_check_interval}"]
                        if mps_check_interval is not None
                        else []
                    ),
                    f"--metrics-port={metrics_port}",
                    "--metrics-address=127.0.0.1",
                    *([f"--instance-id={self.instance_id}"] if self.instance_id else []),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        # Registered (the sockets open first), then serving: the checkpoint settled, the endpoint up.
        self._wait(
            lambda: (
                (self.registrations() > seen and self._log_count("serving claims") > serving)
                or self._exited()
            ),
            "registered and serving claims",
            60,
        )
        if self.process.poll() is not None:
            raise ClusterError(f"gpudra plugin on {self.node.name} exited:\n{self.tail()}")

    def _exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def registrations(self) -> int:
        return self._log_count("registered with the kubelet")

    def _log_count(self, text: str) -> int:
        if not self.log.exists():
            return 0
        return self.log.read_text(errors="replace").count(text)

    def wait_killed(self, timeout: float = 60) -> int:
        """Wait for a crash-injected plugin to die; returns its exit status (negative: the signal)."""
        assert self.process is not None
        self._wait(self._exited, "crashed", timeout)
        return int(self.process.returncode)

    def _wait(self, done: Callable[[], bool], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"gpudra plugin on {self.node.name} not {what} in {timeout:.0f}s:\n{self.tail()}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        terminate(self.process)
        self.process = None
        self.mps_host.users.discard(id(self))
        if not self.mps_host.users:  # the node's last plugin: its daemons were unprepared or are adopted
            self.mps_host.stop()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def metrics(self) -> dict[str, float]:
        """The plugin's Prometheus samples, `name{labels}` -> value (started with a metrics_port)."""
        return scrape(f"http://127.0.0.1:{self.metrics_port}/metrics", f"the plugin on {self.node.name}")
