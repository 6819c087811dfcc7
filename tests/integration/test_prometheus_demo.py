"""A real Prometheus scraping the fake-CRI demo's plugins and controller has data for every query of the
chart's Grafana dashboard and every series its alerts read, and no alert fires on the healthy cluster.

The demo's cluster and steps (tests/localcluster/demo.py), with gpudra as processes on this machine
(their metrics ports on localhost, each plugin labelled with its node as the chart's PodMonitor labels
it); a claim nobody uses stays pending meanwhile. Queries are asked over the whole run (a range query),
so the claims' series count while the claims were prepared, and the unprepares' once the pods are gone.
Here the targets are named by hand: that the chart's PodMonitor and ServiceMonitor select the pods
themselves is tests/e2e/test_demo_prometheus_containerd.py (containerd, the chart installed); this one
runs in `make test` and catches a metric renamed under the dashboard or the alerts.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config

from tests.localcluster import LocalCluster, prometheus
from tests.localcluster.api import DemoApi
from tests.localcluster.demo import MACHINES, NAMESPACE, Demo
from tests.localcluster.demo_installs import HostProcesses

from .conftest import CLUSTER_PREFIX, REPO
from .kube_helpers import unsatisfiable_claim, wait_for
from .monitoring import MONITORING, render


def static_jobs(gpudra: HostProcesses) -> list[dict[str, Any]]:
    """The plugins and the controller as the chart's monitors label them (honorLabels, the plugin's node)."""
    plugins = [
        {
            "targets": [f"127.0.0.1:{plugin.metrics_port}"],
            "labels": {"namespace": "gpudra", "pod": f"plugin-{node}", "container": "plugin", "node": node},
        }
        for node, plugin in gpudra.plugins.items()
    ]
    controller = {
        "targets": [f"127.0.0.1:{gpudra.controller_process.metrics_port}"],
        "labels": {"namespace": "gpudra", "pod": "controller-0", "container": "controller"},
    }
    return [
        {"job_name": "plugins", "honor_labels": True, "static_configs": plugins},
        {"job_name": "controller", "honor_labels": True, "static_configs": [controller]},
    ]


def test_prometheus_has_data_for_every_dashboard_query_and_alert_series_during_the_demo() -> None:
    objects = render(*MONITORING, "--set=monitoring.rules.idleAlertSeconds=14400", *prometheus.API_VERSIONS)
    rules = prometheus.rule_groups(objects)
    queries = prometheus.checked_queries(prometheus.dashboard(objects), rules)
    root = Path(tempfile.mkdtemp(prefix=CLUSTER_PREFIX, dir="/tmp"))
    with LocalCluster(root, nodes=tuple(MACHINES)) as cluster:
        api = config.new_client_from_config(str(cluster.kubeconfig))
        # Claims sampled every 5 s and idle after 10 s, so that a minute of the demo shows idle devices.
        gpudra = HostProcesses(cluster, MACHINES, metrics=True, usage_interval=5, idle_after_seconds=10)
        demo = Demo(DemoApi(api), gpudra, repo=REPO, kubeconfig=cluster.kubeconfig)
        started = time.time()
        try:
            demo.install()
            with prometheus.Prometheus(
                root / "prometheus", scrape=static_jobs(gpudra), rules=rules
            ) as server:

                def every_target_up() -> bool:
                    targets = server.targets()
                    return len(targets) == 4 and all(t["health"] == "up" for t in targets)

                wait_for("Prometheus to scrape the 3 plugins and the controller", every_target_up)
                demo.apply()
                client.CustomObjectsApi(api).create_namespaced_custom_object(
                    "resource.k8s.io", "v1", NAMESPACE, "resourceclaims", unsatisfiable_claim()
                )
                demo.show()
                idle = {"idle devices": "gpudra_cluster_idle_device_seconds"}
                server.wait_for_series(idle, since=started, timeout=120)
                firing = [a["labels"]["alertname"] for a in server.firing()]
                assert firing == [], f"alerts firing on a healthy cluster: {firing}"
                demo.clean_up()
                server.wait_for_series(queries, since=started, timeout=60)
        finally:
            gpudra.stop()
