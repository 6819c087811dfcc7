"""A real Kubernetes control plane and kubelet(s) as plain processes on this machine. I/O: processes, files.

Order: etcd, kube-apiserver (token auth, RBAC, self-signed serving certificate), kube-scheduler,
kube-controller-manager (resourceclaim controller on, node lifecycle off), then per node a container
runtime and the real kubelet. The runtime is a fake CRI by default (no container ever starts: the fast
suite), or with `runtime="containerd"` a real containerd, runc and CNI bridge per node plus kube-proxy
(`tests/localcluster/containerd.py`), where pods run for real. Every path a node uses (kubelet root
with plugins_registry and plugins, CDI root, pod logs) lives under the cluster's own directory, never
/var/lib/kubelet.

`state.json` in the cluster directory records the process groups, so `stop_cluster(directory)`
can tear down a cluster started by another process (`make cluster-down`). Stopping also unmounts what
the kubelets mounted under the cluster directory (`unmount_under`), which outlives their processes.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
import socket
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpudra.errors import ClusterError
from tests.localcluster import binaries
from tests.localcluster import containerd as ctrd
from tests.localcluster.processes import (
    Component,
    group_alive,
    http_get,
    http_ok,
    spawn,
    stop_groups,
    wait_until,
)

TOKEN = "gpudra-admin-token"  # a throwaway cluster on loopback; the token is not a secret


@dataclass(frozen=True)
class NodePaths:
    """Where one node's kubelet and the DRA plugins on it keep their files."""

    name: str
    root: Path

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def registry_dir(self) -> Path:
        return self.kubelet_root / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return self.kubelet_root / "plugins"

    @property
    def cdi_root(self) -> Path:
        return self.root / "cdi"

    @property
    def driver_root(self) -> Path:
        """With containerd: an empty stand-in for the NVIDIA driver root, a shared mount (see
        containerd.share_mount) that the chart's HostToContainer mount accepts."""
        return self.root / "driver-root"

    @property
    def cri_socket(self) -> Path:
        return self.root / "cri.sock"

    @property
    def cri_record(self) -> Path:
        """One JSON line per container the kubelet created, with the CDI device IDs it passed."""
        return self.root / "cri-record.jsonl"


@dataclass
class ClusterState:
    """What `state.json` holds."""

    directory: str
    server: str
    kubeconfig: str
    nodes: list[str]
    pgids: dict[str, int] = field(default_factory=dict)
    runtime: str = "fakecri"
    # containerd only: each node's containerd socket and bridge, and kube-proxy (for --cleanup).
    containerd_sockets: list[str] = field(default_factory=list)
    bridges: list[str] = field(default_factory=list)
    kube_proxy: str = ""


def feature_gates_from_env() -> dict[str, bool]:
    """GPUDRA_FEATURE_GATES, as `Gate=true,Other=false` (the components' own flag syntax)."""
    gates = {}
    for item in os.environ.get("GPUDRA_FEATURE_GATES", "").split(","):
        if not item.strip():
            continue
        name, _, value = item.partition("=")
        if value.strip().lower() not in ("true", "false") or not name.strip():
            raise ClusterError(f"GPUDRA_FEATURE_GATES: {item!r} is not Gate=true or Gate=false")
        gates[name.strip()] = value.strip().lower() == "true"
    return gates


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalCluster:
    """Starts and stops the local cluster. Use as a context manager or call start()/stop()."""

    def __init__(
        self,
        directory: Path,
        *,
        nodes: tuple[str, ...] = ("node-1",),
        runtime: str = "fakecri",
        images: tuple[Path, ...] = (),
        registries: tuple[str, ...] = (),
    ) -> None:
        """`runtime`: "fakecri" or "containerd"; `images`: archives imported into every node's
        containerd; `registries`: host:port of plain-HTTP registries the nodes pull from (with
        containerd only)."""
        if runtime not in ("fakecri", "containerd"):
            raise ClusterError(f"runtime: must be fakecri or containerd, got {runtime!r}")
        self.directory = directory.resolve()
        self.node_names = nodes
        self.nodes = {name: NodePaths(name, self.directory / "nodes" / name) for name in nodes}
        self.kubeconfig = self.directory / "admin.kubeconfig"
        self.components: list[Component] = []
        self._ports: dict[str, int] = {}
        self.server = ""
        self.bin = Path()
        self.runtime = runtime
        self.images = images
        self.registries = registries
        self.runtimes: dict[str, ctrd.NodeRuntime] = {}
        self.runtime_bin = Path()
        self._runtime_lock: int | None = None
        self._address = "127.0.0.1"
        # The release comes from K8S (deploy/local/build.sh); the gates and API groups of a run from
        # these, passed to every component that takes them (make compat).
        self.feature_gates = feature_gates_from_env()
        self.runtime_config = os.environ.get("GPUDRA_RUNTIME_CONFIG", "")

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- lifecycle -----------------------------------------------------------------------------

    @property
    def containerd(self) -> bool:
        return self.runtime == "containerd"

    def start(self) -> None:
        self.bin = binaries.ensure_binaries()
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "logs").mkdir(exist_ok=True)
        for name in ("etcd-client", "etcd-peer", "apiserver", "scheduler", "controller-manager"):
            self._ports[name] = free_port()
        try:
            if self.containerd:
                self._runtime_lock = ctrd.lock_runtime(self.directory)
                self.runtime_bin, pause = ctrd.ensure_runtime()
                self.images = (pause, *self.images)
                # Pods reach the API server through the `kubernetes` Service, whose endpoint cannot be
                # a loopback address.
                self._address = ctrd.host_address()
                for index, node in enumerate(self.nodes.values()):
                    self.runtimes[node.name] = ctrd.NodeRuntime(
                        node.root, index=index, cdi_root=node.cdi_root, cluster_dir=self.directory
                    )
            self.server = f"https://{self._address}:{self._ports['apiserver']}"
            self._write_credentials()
            self._start_etcd()
            self.start_apiserver()
            self._start_scheduler()
            self._start_controller_manager()
            for node in self.nodes.values():
                self._start_node(node)
            if self.containerd:
                self._start_kube_proxy()
            for node in self.nodes.values():
                self._wait_node_ready(node)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every component, nodes first, and wait until no process of the cluster is left.

        With containerd: the kubelets first (so that nothing restarts a container), then every
        container through its shim, then the rest; then mounts, bridges and kube-proxy's chains."""
        if self.containerd:
            stop_groups([c.process.pid for c in self.components if c.name.startswith("kubelet-")])
            for runtime in self.runtimes.values():
                ctrd.kill_containers(runtime.socket)
        stop_groups([c.process.pid for c in self.components])
        for component in self.components:
            component.process.wait()
        self.components.clear()
        unmount_under(self.directory)
        if self.containerd:
            _cleanup_network([r.bridge for r in self.runtimes.values()], self.bin / "kube-proxy")
            for runtime in self.runtimes.values():
                # Images and snapshots (about 700 MB a node) are imported or pulled again at the next
                # start; the logs stay beside them for whoever reads a failed run.
                shutil.rmtree(runtime.root / "root", ignore_errors=True)
            if self._runtime_lock is not None:
                os.close(self._runtime_lock)
                self._runtime_lock = None
        state = self.directory / "state.json"
        if state.exists():
            state.unlink()

    # --- components ----------------------------------------------------------------------------

    def _component(self, name: str, argv: list[str]) -> Component:
        component = spawn(name, argv, log=self.directory / "logs" / f"{name}.log")
        self.components.append(component)
        self._save_state()
        return component

    def _save_state(self) -> None:
        state = ClusterState(
            directory=str(self.directory),
            server=self.server,
            kubeconfig=str(self.kubeconfig),
            nodes=list(self.node_names),
            pgids={c.name: c.process.pid for c in self.components},
            runtime=self.runtime,
            containerd_sockets=[str(r.socket) for r in self.runtimes.values()],
            bridges=[r.bridge for r in self.runtimes.values()],
            kube_proxy=str(self.bin / "kube-proxy") if self.containerd else "",
        )
        (self.directory / "state.json").write_text(json.dumps(asdict(state), indent=2))

    def _write_credentials(self) -> None:
        pki = self.directory / "pki"
        pki.mkdir(exist_ok=True)
        drop_stale_serving_certificate(pki, self._address)
        sa_key = pki / "sa.key"
        if not sa_key.exists():
            subprocess.run(
                ["openssl", "genrsa", "-out", str(sa_key), "2048"],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        (self.directory / "tokens.csv").write_text(f'{TOKEN},admin,admin,"system:masters"\n')

    def _write_kubeconfig(self) -> None:
        """The admin kubeconfig, trusting the serving certificate the apiserver generated for itself."""
        cluster = {
            "server": self.server,
            "certificate-authority": str(self.directory / "pki" / "apiserver.crt"),
        }
        self.kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "local", "cluster": cluster}],
                    "users": [{"name": "admin", "user": {"token": TOKEN}}],
                    "contexts": [{"name": "local", "context": {"cluster": "local", "user": "admin"}}],
                    "current-context": "local",
                },
                indent=2,
            )
        )

    def _start_etcd(self) -> None:
        client = f"http://127.0.0.1:{self._ports['etcd-client']}"
        peer = f"http://127.0.0.1:{self._ports['etcd-peer']}"
        etcd = self._component(
            "etcd",
            [
                str(self.bin / "etcd"),
                "--name=n0",
                f"--data-dir={self.directory / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=n0={peer}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            status, body = http_get(f"{client}/health")
            return status == 200 and json.loads(body).get("health") == "true"

        wait_until(etcd, healthy, what="etcd /health")

    def stop_apiserver(self) -> None:
        """Stop the API server (a control-plane outage); `start_apiserver` brings it back on the same
        port with the same certificate, so every client's kubeconfig stays valid."""
        [apiserver] = [c for c in self.components if c.name == "kube-apiserver"]
        stop_groups([apiserver.process.pid])
        apiserver.process.wait()
        self.components.remove(apiserver)
        self._save_state()

    def start_apiserver(self) -> None:
        pki = self.directory / "pki"
        if self.containerd:
            # Real pods: their service-account tokens (the ServiceAccount admission plugin mounts them),
            # the `kubernetes` Service's endpoint kept by the API server, and webhooks behind Services
            # called at their endpoints' pod IPs (no Service routing inside the API server's process).
            runtime_flags = [
                "--disable-admission-plugins=TaintNodesByCondition",
                "--enable-aggregator-routing=true",
                # Logs and exec: the kubelet at the node's address (its name resolves nowhere).
                "--kubelet-preferred-address-types=InternalIP",
            ]
        else:
            runtime_flags = [
                "--endpoint-reconciler-type=none",
                # No service-account tokens without a token controller for pods, and no not-ready taint
                # on new Nodes: the node lifecycle controller that would lift it is off.
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
            ]
        apiserver = self._component(
            "kube-apiserver",
            [
                str(self.bin / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{self._ports['etcd-client']}",
                f"--bind-address={self._address}",
                f"--advertise-address={self._address}",
                f"--secure-port={self._ports['apiserver']}",
                *self._gate_flags(),
                *([f"--runtime-config={self.runtime_config}"] if self.runtime_config else []),
                f"--cert-dir={pki}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={pki / 'sa.key'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--token-auth-file={self.directory / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                *runtime_flags,
            ],
        )
        wait_until(apiserver, http_ok(f"{self.server}/readyz", token=TOKEN), what="apiserver /readyz")
        self._write_kubeconfig()

    def _start_scheduler(self) -> None:
        config = self.directory / "scheduler.yaml"
        config.write_text(
            json.dumps(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {"kubeconfig": str(self.kubeconfig), "qps": 100, "burst": 200},
                    "leaderElection": {"leaderElect": False},
                    # Retry unschedulable pods quickly: claims made from templates arrive after the pod.
                    "podInitialBackoffSeconds": 1,
                    "podMaxBackoffSeconds": 2,
                    "profiles": [
                        {
                            "schedulerName": "default-scheduler",
                            "pluginConfig": [{"name": "DynamicResources", "args": {"filterTimeout": "30s"}}],
                        }
                    ],
                }
            )
        )
        port = self._ports["scheduler"]
        scheduler = self._component(
            "kube-scheduler",
            [
                str(self.bin / "kube-scheduler"),
                f"--config={config}",
                *self._gate_flags(),
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
            ],
        )
        wait_until(scheduler, http_ok(f"https://127.0.0.1:{port}/healthz"), what="scheduler /healthz")

    def _start_controller_manager(self) -> None:
        port = self._ports["controller-manager"]
        manager = self._component(
            "kube-controller-manager",
            [
                str(self.bin / "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                *self._gate_flags(),
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--service-account-private-key-file={self.directory / 'pki' / 'sa.key'}",
                # The CA in every namespace's kube-root-ca.crt, which pods' clients trust.
                f"--root-ca-file={self.directory / 'pki' / 'apiserver.crt'}",
                "--controllers=*,-node-lifecycle-controller",
                "--kube-api-qps=100",
                "--kube-api-burst=200",
            ],
        )
        wait_until(manager, http_ok(f"https://127.0.0.1:{port}/healthz"), what="controller-manager /healthz")

    def _start_node(self, node: NodePaths) -> None:
        for path in (node.kubelet_root, node.registry_dir, node.plugins_dir, node.cdi_root):
            path.mkdir(parents=True, exist_ok=True)
        if self.containerd:
            endpoint = self._start_containerd(node)
        else:
            node.cri_socket.unlink(missing_ok=True)
            cri = self._component(
                f"fakecri-{node.name}",
                [
                    str(self.bin / "fakecri"),
                    f"--endpoint=unix://{node.cri_socket}",
                    f"--record={node.cri_record}",
                ],
            )
            wait_until(cri, node.cri_socket.exists, what="CRI socket", timeout=20)
            endpoint = f"unix://{node.cri_socket}"
        port, healthz = free_port(), free_port()
        config = node.root / "kubelet.yaml"
        config.write_text(
            json.dumps(self._kubelet_config(node, endpoint=endpoint, port=port, healthz=healthz), indent=2)
        )
        kubelet = self._component(
            f"kubelet-{node.name}",
            [
                str(self.bin / "kubelet"),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={config}",
                f"--root-dir={node.kubelet_root}",
                f"--hostname-override={node.name}",
                # With containerd the host's address: the API server reaches the kubelet there (logs).
                f"--node-ip={self._address}",
                "--v=2",
            ],
        )
        wait_until(kubelet, http_ok(f"http://127.0.0.1:{healthz}/healthz"), what="kubelet /healthz")

    def _start_containerd(self, node: NodePaths) -> str:
        """Start the node's containerd, import the images; returns its CRI endpoint."""
        runtime = self.runtimes[node.name]
        ctrd.share_mount(node.driver_root)
        runtime.write_config(sandbox_image=ctrd.pause_image(self.images[0]), registries=self.registries)
        runtime.socket.unlink(missing_ok=True)
        process = self._component(f"containerd-{node.name}", runtime.argv(self.runtime_bin))
        wait_until(process, runtime.socket.exists, what="containerd socket", timeout=30)
        runtime.import_images(self.runtime_bin, list(self.images))
        return f"unix://{runtime.socket}"

    def _start_kube_proxy(self) -> None:
        """One kube-proxy for the machine (every node shares its network stack)."""
        healthz, metrics = free_port(), free_port()
        config = self.directory / "kube-proxy.yaml"
        config.write_text(
            json.dumps(
                ctrd.kube_proxy_config(
                    kubeconfig=self.kubeconfig, node=self.node_names[0], healthz=healthz, metrics=metrics
                ),
                indent=2,
            )
        )
        proxy = self._component("kube-proxy", [str(self.bin / "kube-proxy"), f"--config={config}"])
        wait_until(
            proxy, http_ok(f"http://127.0.0.1:{healthz}/healthz"), what="kube-proxy /healthz", timeout=60
        )

    def _kubelet_config(
        self, node: NodePaths, *, endpoint: str, port: int, healthz: int
    ) -> dict[str, object]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self._address,
            "port": port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz,
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": endpoint,
            "imageServiceEndpoint": endpoint,
            # No QoS cgroups, no allocatable enforcement, no swap or cgroup-v1 checks: the fake CRI has
            # no containers, and containerd's run in flat cgroups (pods run; the kubelet logs stats errors).
            "cgroupDriver": "cgroupfs",
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            "failSwapOn": False,
            "failCgroupV1": False,
            "localStorageCapacityIsolation": False,
            "resolvConf": "",
            "podLogsDir": str(node.root / "pod-logs"),
            "volumePluginDir": str(node.root / "volume-plugins"),
            "registerNode": True,
            "nodeStatusUpdateFrequency": "4s",
            "syncFrequency": "10s",
            "serializeImagePulls": False,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "1Mi"},
            "maxPods": 250,
            **({"featureGates": dict(self.feature_gates)} if self.feature_gates else {}),
        }

    def _gate_flags(self) -> list[str]:
        if not self.feature_gates:
            return []
        return ["--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in self.feature_gates.items())]

    def _wait_node_ready(self, node: NodePaths) -> None:
        kubelet = next(c for c in self.components if c.name == f"kubelet-{node.name}")

        def ready() -> bool:
            status, body = http_get(f"{self.server}/api/v1/nodes/{node.name}", token=TOKEN)
            if status != 200:
                return False
            conditions = json.loads(body).get("status", {}).get("conditions", [])
            return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

        wait_until(kubelet, ready, what=f"node {node.name} Ready", timeout=120)


def drop_stale_serving_certificate(pki: Path, address: str) -> bool:
    """Remove the API server's self-signed serving certificate (and its key) from `pki` when it does not
    name `address`, so that the API server makes a new one for it; whether it removed them.

    The API server writes that certificate into its --cert-dir on its first start and reuses it after,
    for the addresses of that start only: a cluster directory first run with the fake CRI (127.0.0.1)
    and then with containerd (the host's address) would otherwise keep the old one, and every client
    would refuse it (x509: certificate is valid for 127.0.0.1, not <host address>)."""
    certificate, key = pki / "apiserver.crt", pki / "apiserver.key"
    if not certificate.exists() or certificate_names(certificate, address):
        return False
    certificate.unlink()
    key.unlink(missing_ok=True)
    return True


def certificate_names(certificate: Path, address: str) -> bool:
    """Whether the PEM `certificate` names the IP `address` among its subject alternative names."""
    checked = subprocess.run(
        ["openssl", "x509", "-in", str(certificate), "-noout", "-checkip", address],
        capture_output=True,
        text=True,
        check=False,
    )
    if checked.returncode != 0:
        return False  # not a certificate openssl reads: made again, like one for another address
    return checked.stdout.strip() == f"IP {address} does match certificate"


def stop_cluster(directory: Path) -> bool:
    """Stop the cluster whose state is in `directory` (started by another process). False if none."""
    state_file = directory / "state.json"
    if not state_file.exists():
        return False
    state = json.loads(state_file.read_text())
    pgids = [int(p) for p in state["pgids"].values()]
    if state.get("runtime") == "containerd":
        stop_groups([int(p) for name, p in state["pgids"].items() if name.startswith("kubelet-")])
        for address in state["containerd_sockets"]:
            ctrd.kill_containers(Path(address))
    stop_groups(pgids)
    if any(group_alive(p) for p in pgids):
        raise ClusterError(f"cluster processes still alive: {state['pgids']}")
    unmount_under(Path(state["directory"]))
    if state.get("runtime") == "containerd":
        _cleanup_network(state["bridges"], Path(state["kube_proxy"]))
    state_file.unlink()
    return True


def _cleanup_network(bridges: list[str], kube_proxy: Path) -> None:
    """The pods' bridges and kube-proxy's iptables chains, once every container and netns is gone."""
    for bridge in bridges:
        ctrd.delete_bridge(bridge)
    ctrd.cleanup_kube_proxy(kube_proxy)


# --- mounts the kubelets leave behind ------------------------------------------------------------

_MNT_DETACH = 2  # umount2 flag: detach now, let go once no longer busy (`umount -l`)
_UNMOUNT_ROUNDS = 8  # a mount point can hold stacked mounts: each round takes the top one off


def mounts_under(directory: Path) -> list[Path]:
    """Mount points at or under `directory` in this process's mount namespace, deepest first.

    The kubelet bind-mounts its root directory onto itself (to make it rshared) and mounts pod volumes
    beneath it; those mounts stay after the kubelet exits.
    """
    inside: list[tuple[int, int, Path]] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        point = Path(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[4]))  # \040 is a space
        if point.is_relative_to(directory):
            inside.append((len(point.parts), int(fields[0]), point))
    return [point for _, _, point in sorted(inside, reverse=True)]


def unmount_under(directory: Path) -> None:
    """Unmount everything at or under `directory`, deepest first; a busy mount is detached lazily."""
    libc = ctypes.CDLL(None, use_errno=True)
    for _ in range(_UNMOUNT_ROUNDS):
        points = mounts_under(directory)
        if not points:
            return
        for point in points:
            if libc.umount2(os.fsencode(point), 0) == 0 or libc.umount2(os.fsencode(point), _MNT_DETACH) == 0:
                continue
            code = ctypes.get_errno()
            if code != errno.EINVAL:  # EINVAL: no longer a mount point (it went with its parent)
                raise ClusterError(f"cannot unmount {point}: {os.strerror(code)}")
    raise ClusterError(f"mounts left under {directory}: {mounts_under(directory)}")
