"""The chart's Prometheus and Grafana objects, checked by the real tools without a cluster: promtool
checks the rendered PrometheusRule and runs each alert's unit tests (data/alerts-test.yaml), every
dashboard query is PromQL that promtool accepts, every alert has its runbook in docs/troubleshooting.md,
the objects render only when enabled and where the Operator's CRDs exist, and the scrape configuration
made from the monitors as the Operator would make it is one Prometheus accepts. That a real Prometheus
scraping the chart's monitors gets data for every query is tests/e2e/test_demo_prometheus_containerd.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.localcluster import prometheus

from .conftest import REPO
from .monitoring import MONITORING, render

ALERTS_TEST = Path(__file__).parent / "data" / "alerts-test.yaml"
TROUBLESHOOTING = REPO / "docs" / "troubleshooting.md"
OPERATOR_KINDS = set(prometheus.KINDS)


def promtool(*args: str, cwd: Path) -> str:
    result = subprocess.run(
        [str(prometheus.promtool()), *args], capture_output=True, text=True, cwd=cwd, check=False
    )
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def rules() -> dict[str, Any]:
    """The PrometheusRule's groups with the chart's default values (alerts-test.yaml's thresholds)."""
    return prometheus.rule_groups(render("--set", "monitoring.rules.enabled=true", *prometheus.API_VERSIONS))


def test_promtool_checks_the_rules_and_every_alert_passes_its_unit_tests(
    rules: dict[str, Any], tmp_path: Path
) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    shutil.copy(ALERTS_TEST, tmp_path / ALERTS_TEST.name)
    checked = promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert f"SUCCESS: {len(prometheus.alerts(rules))} rules found" in checked
    assert "SUCCESS" in promtool("test", "rules", ALERTS_TEST.name, cwd=tmp_path)


def test_every_alert_the_issue_names_is_there_and_fires_in_a_unit_test(rules: dict[str, Any]) -> None:
    names = [rule["alert"] for rule in prometheus.alerts(rules)]
    assert names == [
        "GpudraPluginNotReady",
        "GpudraCheckpointUnusable",
        "GpudraSliceSyncFailing",
        "GpudraGpuUnhealthy",
        "GpudraMpsDaemonRestartsFailing",
        "GpudraAllocatedGpuIdle",
        "GpudraWebhookFailing",
        "GpudraNoLeader",
    ]
    cases = yaml.safe_load(ALERTS_TEST.read_text())["tests"]
    fired = {case["alertname"] for test in cases for case in test["alert_rule_test"] if case["exp_alerts"]}
    quiet = {
        case["alertname"] for test in cases for case in test["alert_rule_test"] if not case["exp_alerts"]
    }
    assert fired == set(names)
    assert quiet == set(names)  # the healthy cluster of the first test raises none


def test_every_alert_links_its_runbook_section_in_the_troubleshooting_guide(rules: dict[str, Any]) -> None:
    text = TROUBLESHOOTING.read_text()
    alerts_part = text.split("\n## Alerts\n", 1)[1].split("\n## ", 1)[0]
    sections = re.findall(r"^### (\w+)$", alerts_part, re.MULTILINE)
    for rule in prometheus.alerts(rules):
        assert rule["alert"] in sections, f"docs/troubleshooting.md has no '### {rule['alert']}' under Alerts"
        url = rule["annotations"]["runbook_url"]
        assert url.endswith(f"docs/troubleshooting.md#{rule['alert'].lower()}")
        for selector in prometheus.selectors(rule["expr"]):
            name = selector.split("{")[0]
            assert name in alerts_part.split(f"### {rule['alert']}\n", 1)[1].split("\n### ", 1)[0], (
                f"the runbook of {rule['alert']} does not name {name}"
            )


def test_every_dashboard_query_is_promql_promtool_accepts(tmp_path: Path) -> None:
    queries = prometheus.panel_queries(prometheus.dashboard(render(*MONITORING)))
    assert len(queries) >= 30
    # As recording rules, so that promtool parses each expression.
    recording = [{"record": f"dashboard:query_{i}", "expr": expr} for i, expr in enumerate(queries.values())]
    (tmp_path / "dashboard.yaml").write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": recording}]}))
    assert f"SUCCESS: {len(queries)} rules found" in promtool(
        "check", "rules", "dashboard.yaml", cwd=tmp_path
    )


def test_the_dashboard_has_the_overview_per_node_per_claim_and_mig_rows() -> None:
    document = prometheus.dashboard(render(*MONITORING))
    rows = [p["title"] for p in document["panels"] if p["type"] == "row"]
    assert rows == ["Cluster overview", "Per node", "Claims by namespace", "MIG room"]
    variables = [v["name"] for v in document["templating"]["list"]]
    assert variables == ["datasource", "node", "namespace"]
    for panel in document["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]


def test_monitoring_objects_render_only_when_enabled_and_where_the_operator_is_installed() -> None:
    def kinds(objects: list[dict[str, Any]]) -> set[str]:
        return {o["kind"] for o in objects} & OPERATOR_KINDS

    def dashboards(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")
        ]

    default = render(*prometheus.API_VERSIONS)
    assert kinds(default) == set() and dashboards(default) == []
    # Enabled on a cluster without the Operator's CRDs: only the dashboard, which needs none.
    without_crds = render(*MONITORING)
    assert kinds(without_crds) == set()
    [config_map] = dashboards(without_crds)
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "GPUs"}
    enabled = render(*MONITORING, *prometheus.API_VERSIONS)
    assert kinds(enabled) == OPERATOR_KINDS
    for monitor in (o for o in enabled if o["kind"] in ("PodMonitor", "ServiceMonitor")):
        assert monitor["metadata"]["labels"]["release"] == "prometheus"
    plugin_only = render(*MONITORING, *prometheus.API_VERSIONS, "--set", "controller.enabled=false")
    assert kinds(plugin_only) == {"PodMonitor", "PrometheusRule"}
    [rule] = [o for o in plugin_only if o["kind"] == "PrometheusRule"]
    [no_leader] = [r for g in rule["spec"]["groups"] for r in g["rules"] if r["alert"] == "GpudraNoLeader"]
    assert "absent(" not in no_leader["expr"]  # a release without a controller must not call it missing
    elsewhere = render(*MONITORING, "--set", "monitoring.dashboard.namespace=grafana")
    assert dashboards(elsewhere)[0]["metadata"]["namespace"] == "grafana"


def test_the_scrape_configuration_made_from_the_monitors_is_one_prometheus_accepts(tmp_path: Path) -> None:
    objects = render(*MONITORING, *prometheus.API_VERSIONS)
    plugin_pod = {
        "__meta_kubernetes_namespace": "gpudra",
        "__meta_kubernetes_pod_name": "gpudra-kubelet-plugin-x",
        "__meta_kubernetes_pod_node_name": "node-1",
        "__meta_kubernetes_pod_container_port_name": "http",
    }
    jobs = prometheus.scrape_configs(
        objects, discover=lambda role, namespaces: [("10.0.0.5:9400", plugin_pod)]
    )
    assert [job["job_name"] for job in jobs] == [
        "podMonitor/gpudra/gpudra-kubelet-plugin/0",
        "serviceMonitor/gpudra/gpudra-controller/0",
    ]
    assert all(job["honor_labels"] and job["scrape_interval"] == "15s" for job in jobs)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(prometheus.rule_groups(objects)))
    config = {"rule_files": ["rules.yaml"], "scrape_configs": jobs}
    (tmp_path / "prometheus.yaml").write_text(yaml.safe_dump(config))
    promtool("check", "config", "prometheus.yaml", cwd=tmp_path)
