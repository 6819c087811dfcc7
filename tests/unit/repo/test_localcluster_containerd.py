"""The local cluster's containerd node configuration: what each setting the sandbox needs is, read back
as containerd and the CNI plugins read it (TOML, JSON). The running cluster is tests/e2e."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from tests.localcluster.containerd import NodeRuntime, kube_proxy_config


def node(tmp_path: Path, index: int = 0) -> NodeRuntime:
    return NodeRuntime(tmp_path / f"n{index}", index=index, cdi_root=tmp_path / "cdi", cluster_dir=tmp_path)


def test_config_keeps_everything_under_the_node_and_enables_cdi(tmp_path: Path) -> None:
    runtime = node(tmp_path)
    runtime.write_config(sandbox_image="localhost/pause:v1.36.3")
    config = tomllib.loads(runtime.config_path.read_text())
    assert config["version"] == 3
    for path in (config["root"], config["state"], config["grpc"]["address"], config["ttrpc"]["address"]):
        assert Path(path).is_relative_to(runtime.root)
    cri = config["plugins"]["io.containerd.cri.v1.runtime"]
    assert cri["enable_cdi"] is True
    assert cri["cdi_spec_dirs"] == [str(tmp_path / "cdi")]
    assert cri["restrict_oom_score_adj"] is True  # without it no sandbox starts in this VM
    assert cri["netns_mounts_under_state_dir"] is True
    runc = cri["containerd"]["runtimes"]["runc"]["options"]
    assert Path(runc["Root"]).is_relative_to(runtime.root)
    assert runc["SystemdCgroup"] is False
    assert cri["cni"]["conf_dir"] == str(runtime.cni_conf_dir)
    images = config["plugins"]["io.containerd.cri.v1.images"]
    assert images["pinned_images"]["sandbox"] == "localhost/pause:v1.36.3"
    assert "io.containerd.nri.v1.nri" in config["disabled_plugins"]  # a machine-wide socket


def test_each_node_gets_its_own_bridge_and_subnet(tmp_path: Path) -> None:
    first, second = node(tmp_path, 0), node(tmp_path, 1)
    for runtime in (first, second):
        runtime.write_config(sandbox_image="p:1")
    configs = [json.loads((r.cni_conf_dir / "10-gpudra.conflist").read_text()) for r in (first, second)]
    bridges = [c["plugins"][0]["bridge"] for c in configs]
    subnets = [c["plugins"][0]["ipam"]["ranges"][0][0]["subnet"] for c in configs]
    assert len(set(bridges)) == 2 and all(len(b) <= 15 for b in bridges)  # IFNAMSIZ
    assert subnets == ["10.244.0.0/24", "10.244.1.0/24"]
    assert all(Path(c["plugins"][0]["ipam"]["dataDir"]).is_relative_to(tmp_path) for c in configs)
    other = NodeRuntime(tmp_path / "x", index=0, cdi_root=tmp_path, cluster_dir=tmp_path / "other")
    assert other.bridge != first.bridge  # two clusters' bridges never share a name


def test_kube_proxy_leaves_the_machines_sysctls_alone(tmp_path: Path) -> None:
    config = kube_proxy_config(kubeconfig=tmp_path / "k", node="node-1", healthz=1, metrics=2)
    assert config["mode"] == "iptables"
    assert config["conntrack"] == {"maxPerCore": 0, "min": 0}
    assert config["iptables"] == {"localhostNodePorts": False}


def test_a_loopback_registry_is_pulled_from_over_plain_http(tmp_path: Path) -> None:
    runtime = node(tmp_path)
    runtime.write_config(sandbox_image="localhost/pause:v1.36.3", registries=("127.0.0.1:40123",))
    config = tomllib.loads(runtime.config_path.read_text())
    registry = config["plugins"]["io.containerd.cri.v1.images"]["registry"]
    assert registry["config_path"] == str(runtime.registry_hosts_dir)
    hosts = tomllib.loads((runtime.registry_hosts_dir / "127.0.0.1:40123" / "hosts.toml").read_text())
    assert hosts["server"] == "http://127.0.0.1:40123"
    assert hosts["host"]["http://127.0.0.1:40123"]["capabilities"] == ["pull", "resolve"]
