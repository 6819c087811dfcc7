"""A real Prometheus scrapes gpudra through the chart's own monitors while the demo's workload runs,
and every query of the chart's Grafana dashboard and every series its alerts read returns data.

The demo's cluster (three nodes with containerd, one Helm release per node) with the Prometheus
Operator's kinds installed, so the chart renders its PodMonitor, ServiceMonitor and PrometheusRule
(`.Capabilities`); the objects are read back from the API server and turned into Prometheus's
configuration as the Operator would (tests/localcluster/prometheus.py), and Prometheus (Debian's
package) scrapes the plugins' and the controller's pods at their addresses and evaluates the rules.
The demo applies every example, shows what was prepared, and deletes the pods; a claim nobody uses
stays pending meanwhile. The queries are asked over the whole run (a range query), so series that live
only while claims are prepared count, and so do the unprepares at the end. No alert fires on this
healthy cluster.

It starts a cluster of its own, so it runs before test_helm_containerd.py's session cluster starts
(only one cluster with containerd runs on a machine at a time), which pytest's file order gives.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config, utils

from tests.integration.kube_helpers import unsatisfiable_claim, wait_for
from tests.localcluster import LocalCluster, prometheus
from tests.localcluster.api import DemoApi
from tests.localcluster.controller import NAMESPACE as CONTROLLER_NAMESPACE
from tests.localcluster.demo import MACHINES, NAMESPACE, Demo
from tests.localcluster.demo_installs import ChartSource, HelmReleases

from .conftest import REPO, Published

pytestmark = pytest.mark.e2e

# Scraped and sampled often, and idle soon, so that a few minutes of the demo show every series.
VALUES = (
    "--set=monitoring.monitors.enabled=true",
    "--set=monitoring.monitors.interval=5s",
    "--set=kubeletPlugin.options.usageIntervalSeconds=5",
)
CONTROLLER_VALUES = (
    "--set=monitoring.rules.enabled=true",
    "--set=monitoring.dashboard.enabled=true",
    "--set=controller.options.idleAfterSeconds=10",
)


def operator_objects(api: client.ApiClient) -> list[dict[str, Any]]:
    """Every PodMonitor, ServiceMonitor and PrometheusRule in the cluster, as the Operator lists them."""
    custom = client.CustomObjectsApi(api)
    return [
        item
        for plural in prometheus.KINDS.values()
        for item in custom.list_cluster_custom_object(prometheus.GROUP, prometheus.VERSION, plural)["items"]
    ]


def test_prometheus_through_the_charts_monitors_has_data_for_every_dashboard_and_alert_query(
    published: Published,
) -> None:
    # A short root: the plugins' MPS pipes live under it, within a unix socket path's 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="gd-", dir="/tmp"))
    registries = (published.registry.address,)
    with LocalCluster(root, nodes=tuple(MACHINES), runtime="containerd", registries=registries) as cluster:
        api = config.new_client_from_config(str(cluster.kubeconfig))
        utils.create_from_yaml(api, yaml_objects=prometheus.crds())
        extensions = client.ApiextensionsV1Api(api)

        def established() -> bool:
            return all(
                any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])
                for crd in extensions.list_custom_resource_definition().items
                if crd.spec.group == prometheus.GROUP
            )

        wait_for("the Operator's CRDs to be established", established)
        gpudra = HelmReleases(
            cluster,
            MACHINES,
            source=ChartSource.published(published.registry.address, published.version),
            values=VALUES,
            first_values=CONTROLLER_VALUES,
        )
        demo = Demo(DemoApi(api), gpudra, repo=REPO, kubeconfig=cluster.kubeconfig)
        started = time.time()
        demo.install()
        objects = operator_objects(api)
        assert sorted(o["kind"] for o in objects) == ["PodMonitor"] * 3 + ["PrometheusRule", "ServiceMonitor"]
        rules = prometheus.rule_groups(objects)
        assert scrapers_admitted(api) == {"monitoring"}
        scrape = prometheus.scrape_configs(objects, discover=prometheus.discover_from(api))
        with prometheus.Prometheus(root / "prometheus", scrape=scrape, rules=rules) as server:

            def every_target_up() -> bool:
                targets = server.targets()
                return len(targets) == 4 and all(t["health"] == "up" for t in targets)

            wait_for("Prometheus to scrape the 3 plugins and the controller", every_target_up, timeout=60)
            targets = server.targets()
            plugin_nodes = sorted(
                t["labels"].get("node", "") for t in targets if t["labels"]["container"] == "plugin"
            )
            assert plugin_nodes == sorted(MACHINES)
            demo.apply()
            client.CustomObjectsApi(api).create_namespaced_custom_object(
                "resource.k8s.io", "v1", NAMESPACE, "resourceclaims", unsatisfiable_claim()
            )
            demo.show()
            idle = "gpudra_cluster_idle_device_seconds"
            wait_for(
                "the controller to report idle devices",
                lambda: server.series_over(idle, start=started, end=time.time()),
                timeout=120,
            )
            firing = [a["labels"]["alertname"] for a in server.firing()]
            assert firing == [], f"alerts firing on a healthy cluster: {firing}"
            demo.clean_up()
            queries = prometheus.checked_queries(prometheus.dashboard(installed_dashboard(api)), rules)
            # Over the whole run: the claims' series while they were prepared, the unprepares' rates
            # once two scrapes have followed them.
            server.wait_for_series(queries, since=started, timeout=60)
    for runtime_of_node in cluster.runtimes.values():
        shutil.rmtree(runtime_of_node.root / "root", ignore_errors=True)


def scrapers_admitted(api: client.ApiClient) -> set[str]:
    """The namespaces the installed NetworkPolicies (the chart's default) admit to every release's
    HTTP port, each of the 3 plugins' and the controller's: with the monitors on, the chart adds
    `networkPolicy.prometheusFrom` (namespace `monitoring`). This cluster's CNI bridge does not enforce
    NetworkPolicies and its Prometheus runs on the host, so the scrapes below do not test them; on an
    enforcing CNI a Prometheus elsewhere would be refused (docs/install.md, "Who can reach gpudra")."""
    policies = client.NetworkingV1Api(api).list_namespaced_network_policy(CONTROLLER_NAMESPACE).items
    http_ports = {8080, 9400}
    rules = [r for p in policies for r in p.spec.ingress or [] if {q.port for q in r.ports} <= http_ports]
    assert len(rules) == len(MACHINES) + 1, [p.metadata.name for p in policies]
    return {
        peer.namespace_selector.match_labels["kubernetes.io/metadata.name"]
        for rule in rules
        for peer in rule._from or []
    }


def installed_dashboard(api: client.ApiClient) -> list[dict[str, Any]]:
    """The dashboard's ConfigMap as installed (the controller's release, in the demo's namespace)."""
    config_maps = client.CoreV1Api(api).list_config_map_for_all_namespaces(
        label_selector="grafana_dashboard=1"
    )
    return [
        {"kind": "ConfigMap", "metadata": {"name": c.metadata.name}, "data": c.data}
        for c in config_maps.items
    ]
