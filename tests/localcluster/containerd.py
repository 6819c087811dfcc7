"""A real container runtime for the local cluster's nodes: containerd 2.x, runc, CNI bridge, kube-proxy.

I/O: processes, files, network interfaces, iptables (through kube-proxy).

Each node gets its own containerd (root, state, sockets, CNI config, netns mounts, runc state, pod logs
all under the node's directory) with CDI injection reading the node's CDI root, and its own Linux
bridge with a /24 of its own for pod addresses. One kube-proxy (iptables mode) serves the whole
machine, since every node of this cluster shares the host's network stack: it makes Service
ClusterIPs work, the `kubernetes` Service above all, which a pod's in-cluster client configuration
names. For that the API server advertises and listens on the host's own address (a Service endpoint
cannot be a loopback address).

Teardown must leave nothing behind (`teardown_runtime`): kubelets and containerd do not stop their
containers when they exit, and a shim runs in a session of its own, outside containerd's process group.
So the containers are killed through their shims' process trees, then the netns and overlay mounts go
with the node directory's mounts, then the bridges and kube-proxy's iptables chains. Only one cluster
with this runtime runs at a time on a machine: kube-proxy's chains are machine-wide (`RUNTIME_LOCK`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import tarfile
import time
from pathlib import Path

from gpudra.errors import ClusterError
from tests.localcluster.binaries import repo_root
from tests.localcluster.processes import live_processes

CNI_BIN_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
RUNC = Path("/usr/sbin/runc")  # Debian's runc
RUNTIME_LOCK = Path("/run/gpudra-localcluster-containerd.lock")
CLUSTER_CIDR = "10.244.0.0/16"  # every node's bridge takes a /24 of it


def ensure_runtime() -> tuple[Path, Path]:
    """containerd's bin directory and the pause image archive, built by deploy/local/build-runtime.sh."""
    script = repo_root() / "deploy" / "local" / "build-runtime.sh"
    result = subprocess.run(["bash", str(script)], stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        raise ClusterError(f"building the container runtime failed ({script} exited {result.returncode})")
    bin_dir = Path(result.stdout.strip().splitlines()[-1])
    archive = bin_dir.parent / "images" / "pause.tar"
    for path in (bin_dir / "containerd", bin_dir / "containerd-shim-runc-v2", bin_dir / "ctr", archive, RUNC):
        if not path.exists():
            raise ClusterError(f"{path} is missing (deploy/local/build-runtime.sh installs and builds it)")
    return bin_dir, archive


def pause_image(archive: Path) -> str:
    return (archive.parent / "pause.ref").read_text().strip()


def archive_tags(archive: Path) -> tuple[str, ...]:
    """The names a docker-archive gives its image (`ctr images import` registers them as they are)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("manifest.json")
        if member is None:
            raise ClusterError(f"{archive} is not a docker-archive: it has no manifest.json")
        return tuple(json.load(member)[0]["RepoTags"])


def host_address() -> str:
    """The host's own IPv4 address on its default route: what pods reach the API server at."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 9))  # UDP connect sends nothing; it only picks a route
        except OSError as err:
            raise ClusterError(f"no default IPv4 route, so no host address for pods to reach: {err}") from err
        address = str(probe.getsockname()[0])
    if address.startswith("127."):
        raise ClusterError(f"the default route's source address is {address}, a loopback address")
    return address


def lock_runtime(directory: Path) -> int:
    """Hold the machine-wide lock for a cluster with real containers; returns the lock's descriptor."""
    fd = os.open(RUNTIME_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    holder = Path(RUNTIME_LOCK).read_text().strip()
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # `make cluster-up` exits and leaves its cluster running: its state file says it still runs.
        if holder and holder != str(directory) and (Path(holder) / "state.json").exists():
            raise BlockingIOError
    except BlockingIOError:
        os.close(fd)
        raise ClusterError(
            f"another local cluster with RUNTIME=containerd is running ({holder}); kube-proxy's iptables "
            "chains are machine-wide, so stop it first (make cluster-down)"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, str(directory).encode())
    return fd


class NodeRuntime:
    """One node's containerd: its config, paths and network."""

    def __init__(self, node_root: Path, *, index: int, cdi_root: Path, cluster_dir: Path) -> None:
        self.root = node_root / "containerd"
        self.index = index
        self.cdi_root = cdi_root
        # Interface names are at most 15 bytes; the hash keeps two checkouts' clusters apart.
        tag = hashlib.sha256(str(cluster_dir).encode()).hexdigest()[:6]
        self.bridge = f"gd{tag}n{index}"
        self.subnet = f"10.244.{index}.0/24"

    @property
    def socket(self) -> Path:
        return self.root / "containerd.sock"

    @property
    def config_path(self) -> Path:
        return self.root / "config.toml"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "net.d"

    @property
    def registry_hosts_dir(self) -> Path:
        return self.root / "certs.d"

    def write_config(self, *, sandbox_image: str, registries: tuple[str, ...] = ()) -> None:
        for path in (self.root, self.cni_conf_dir, self.root / "opt", self.root / "runc"):
            path.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self._config(sandbox_image))
        # containerd asks a registry over HTTPS unless its hosts.toml names an http:// host: each
        # loopback registry of the test (registry.py) is one, for pulling and resolving only.
        for registry in registries:
            host = self.registry_hosts_dir / registry
            host.mkdir(parents=True, exist_ok=True)
            (host / "hosts.toml").write_text(
                f'server = "http://{registry}"\n\n'
                f'[host."http://{registry}"]\n  capabilities = ["pull", "resolve"]\n'
            )
        (self.cni_conf_dir / "10-gpudra.conflist").write_text(json.dumps(self._cni_config(), indent=2))

    def _config(self, sandbox_image: str) -> str:
        q = json.dumps  # a JSON string is a TOML basic string
        root = self.root
        return f"""# Written by tests/localcluster/containerd.py for one node of the local cluster.
version = 3
root = {q(str(root / "root"))}
state = {q(str(root / "state"))}
# NRI listens on a machine-wide socket path; two nodes' containerds would collide on it.
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = {q(str(self.socket))}

[ttrpc]
  address = {q(str(root / "containerd.sock.ttrpc"))}

[plugins."io.containerd.internal.v1.opt"]
  path = {q(str(root / "opt"))}

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = {q(sandbox_image)}
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = {q(str(self.registry_hosts_dir))}

[plugins."io.containerd.cri.v1.runtime"]
  enable_cdi = true
  cdi_spec_dirs = [{q(str(self.cdi_root))}]
  # This sandbox's VM lacks CAP_SYS_RESOURCE: without it every sandbox fails to start.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = {q(str(RUNC))}
        Root = {q(str(root / "runc"))}
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [{q(str(CNI_BIN_DIR))}]
    conf_dir = {q(str(self.cni_conf_dir))}

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""

    def _cni_config(self) -> dict[str, object]:
        return {
            "cniVersion": "1.0.0",
            "name": "gpudra-local",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": True,
                    # Pods reach the host (API server) and each other; nothing leaves the machine.
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.subnet}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.root / "ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }

    def argv(self, bin_dir: Path) -> list[str]:
        return [str(bin_dir / "containerd"), f"--config={self.config_path}", "--log-level=warn"]

    def ctr(self, bin_dir: Path, *args: str, timeout: float = 300) -> str:
        result = subprocess.run(
            [str(bin_dir / "ctr"), f"--address={self.socket}", "--namespace=k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            raise ClusterError(f"ctr {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def import_images(self, bin_dir: Path, archives: list[Path]) -> None:
        """Import image archives; the CRI sees them at once (namespace k8s.io) and never pulls them."""
        for archive in archives:
            # --all-platforms: the archives name no platform for a single-arch image.
            self.ctr(bin_dir, "images", "import", "--all-platforms", "--no-unpack", str(archive))

    def images(self, bin_dir: Path) -> list[str]:
        return self.ctr(bin_dir, "images", "list", "--quiet").split()


def kube_proxy_config(*, kubeconfig: Path, node: str, healthz: int, metrics: int) -> dict[str, object]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "iptables",
        "hostnameOverride": node,
        "clusterCIDR": CLUSTER_CIDR,
        "healthzBindAddress": f"127.0.0.1:{healthz}",
        "metricsBindAddress": f"127.0.0.1:{metrics}",
        # Leave the machine's conntrack and localnet sysctls alone: nothing here needs them changed.
        "conntrack": {"maxPerCore": 0, "min": 0},
        "iptables": {"localhostNodePorts": False},
    }


def share_mount(directory: Path) -> None:
    """Make `directory` a mount point of its own with shared propagation.

    A container's mount with HostToContainer propagation (the chart mounts the driver root so) needs its
    source on a shared or slave mount. Systemd makes / shared on a real node, and so does kind's node
    image; this machine's / is private, and the cluster does not change the machine's root, so the
    node's driver root is a shared bind mount of its own, taken away with the node's other mounts."""
    directory.mkdir(parents=True, exist_ok=True)
    for argv in (
        ["mount", "--bind", str(directory), str(directory)],
        ["mount", "--make-rshared", str(directory)],
    ):
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ClusterError(f"{' '.join(argv)} failed: {result.stderr.strip()}")


# --- teardown -----------------------------------------------------------------------------------------


def shim_pids(address: Path) -> list[int]:
    """containerd shims started by the containerd at `address` (they name its socket in their argv)."""
    socket_arg = os.fsencode(str(address))
    return [
        pid
        for pid, argv in live_processes()
        if argv[0].endswith(b"containerd-shim-runc-v2") and socket_arg in argv
    ]


def _descendants(pid: int) -> list[int]:
    found = []
    pending = [pid]
    while pending:
        current = pending.pop()
        for task in Path(f"/proc/{current}/task").glob("*"):
            with contextlib.suppress(OSError):
                children = [int(c) for c in (task / "children").read_text().split()]
                found += children
                pending += children
    return found


def kill_containers(address: Path, *, timeout: float = 10) -> None:
    """SIGKILL every shim of the containerd at `address` with its containers (its process tree)."""
    for shim in shim_pids(address):
        for pid in [*_descendants(shim), shim]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while shim_pids(address):
        if time.monotonic() > deadline:
            raise ClusterError(f"shims of {address} still alive: {shim_pids(address)}")
        time.sleep(0.1)


def delete_bridge(name: str) -> None:
    subprocess.run(["ip", "link", "delete", name], capture_output=True, check=False)


def bridge_exists(name: str) -> bool:
    return Path(f"/sys/class/net/{name}").exists()


def cleanup_kube_proxy(kube_proxy: Path) -> None:
    """Remove kube-proxy's iptables chains (`kube-proxy --cleanup`)."""
    subprocess.run([str(kube_proxy), "--cleanup"], capture_output=True, check=False)
