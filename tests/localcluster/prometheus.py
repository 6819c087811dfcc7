"""Prometheus for the tests: the chart's monitoring objects read as the Prometheus Operator reads them,
and a real Prometheus (Debian's package, deploy/local/build-prometheus.sh) scraping what they select.
I/O: runs promtool and prometheus, reads the API server and the Prometheus HTTP API.

The Operator is not run here (it is a Go program with its own CRDs and a StatefulSet to manage); what it
would do with the chart's objects is small and written down in `scrape_configs`: a PodMonitor becomes
a job that discovers pods (role pod), a ServiceMonitor one that discovers the Service's EndpointSlices
(role endpointslice), each keeping the targets whose labels match the selector and whose port has the
endpoint's name, labelled namespace, pod, container, service, job and endpoint as the Operator labels
them, then the endpoint's own relabelings. Debian builds Prometheus without its Kubernetes discovery, so
the candidates that discovery would list come from the API server here (`discover_from`), with the same
`__meta_kubernetes_*` labels, as static targets; Prometheus scrapes the pods' addresses.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from gpudra.errors import ClusterError
from tests.localcluster.binaries import repo_root
from tests.localcluster.cluster import free_port

GROUP, VERSION = "monitoring.coreos.com", "v1"
KINDS = {
    "PodMonitor": "podmonitors",
    "ServiceMonitor": "servicemonitors",
    "PrometheusRule": "prometheusrules",
}
# `helm template` flags that make the chart see the Operator's CRDs.
API_VERSIONS = tuple(arg for kind in KINDS for arg in ("--api-versions", f"{GROUP}/{VERSION}/{kind}"))
# The dashboard's variables, set to "All" as Grafana sends it (allValue ".*").
DASHBOARD_VARIABLES = {"$node": ".*", "$namespace": ".*"}
_SELECTOR = re.compile(r"\b(gpudra_[a-z_]+)(\{[^}]*\})?")
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def promtool() -> Path:
    """promtool, installed by deploy/local/build-prometheus.sh when missing."""
    script = repo_root() / "deploy" / "local" / "build-prometheus.sh"
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ClusterError(
            f"installing Prometheus failed ({script} exited {result.returncode}):\n{result.stderr}"
        )
    return Path(result.stdout.strip().splitlines()[-1])


def prometheus_binary() -> Path:
    return promtool().with_name("prometheus")


def crds() -> list[dict[str, Any]]:
    """The Operator's three kinds as CustomResourceDefinitions that keep any spec: enough for the API
    server to store the chart's objects and for Helm to see the kinds (`.Capabilities.APIVersions`),
    without the Operator's own validation (its CRDs are not part of this project)."""
    return [
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{GROUP}"},
            "spec": {
                "group": GROUP,
                "names": {
                    "kind": kind,
                    "plural": plural,
                    "singular": kind.lower(),
                    "listKind": f"{kind}List",
                },
                "scope": "Namespaced",
                "versions": [
                    {
                        "name": VERSION,
                        "served": True,
                        "storage": True,
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "properties": {
                                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                                },
                            }
                        },
                    }
                ],
            },
        }
        for kind, plural in KINDS.items()
    ]


# --- what the chart's objects hold ----------------------------------------------------------------


def rule_groups(objects: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The rule file of the PrometheusRules among `objects` (their groups, in order)."""
    groups = [g for o in objects if o["kind"] == "PrometheusRule" for g in o["spec"]["groups"]]
    return {"groups": groups}


def alerts(rules: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule]


def dashboard(objects: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The dashboard JSON of the chart's ConfigMap."""
    [config_map] = [
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")
    ]
    [text] = config_map["data"].values()
    document: dict[str, Any] = json.loads(text)
    return document


def panel_queries(document: Mapping[str, Any]) -> dict[str, str]:
    """Every panel's PromQL ("panel title / refId" -> expression), the variables set to All."""
    queries = {}
    for panel in document["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in DASHBOARD_VARIABLES.items():
                expr = expr.replace(variable, value)
            queries[f"{panel['title']} / {target['refId']}"] = expr
    return queries


def checked_queries(dashboard_document: Mapping[str, Any], rules: Mapping[str, Any]) -> dict[str, str]:
    """What must return series on a cluster running the demo's workload: every dashboard query, and
    every series an alert reads (its expression as a whole returns nothing while all is well)."""
    queries = panel_queries(dashboard_document)
    for alert in alerts(rules):
        for index, selector in enumerate(selectors(alert["expr"])):
            queries[f"alert {alert['alert']} / {index}"] = selector
    return queries


def selectors(expr: str) -> list[str]:
    """The gpudra series an expression selects (name and matchers), each once, in order."""
    return list(dict.fromkeys(name + (matchers or "") for name, matchers in _SELECTOR.findall(expr)))


# --- the Operator's part ---------------------------------------------------------------------------

# Candidates for a job: (address, the meta labels Prometheus's Kubernetes discovery would give it).
Discover = Callable[[str, Sequence[str]], list[tuple[str, dict[str, str]]]]


def scrape_configs(monitors: Iterable[Mapping[str, Any]], *, discover: Discover) -> list[dict[str, Any]]:
    """Prometheus's scrape_configs for the PodMonitors and ServiceMonitors among `monitors`, with the
    relabelings the Operator writes. Debian's Prometheus is built without Kubernetes discovery, so the
    candidates come from `discover(role, namespaces)` (`discover_from`: the API server, as that
    discovery would list them, with its `__meta_kubernetes_*` labels) as static targets; the Operator's
    relabelings then keep and label them exactly as they would discovered ones."""
    jobs = []
    for monitor in monitors:
        kind = monitor["kind"]
        if kind not in ("PodMonitor", "ServiceMonitor"):
            continue
        meta, spec = monitor["metadata"], monitor["spec"]
        namespaces = spec.get("namespaceSelector", {}).get("matchNames") or [meta["namespace"]]
        pod_monitor = kind == "PodMonitor"
        endpoints = spec["podMetricsEndpoints"] if pod_monitor else spec["endpoints"]
        role = "pod" if pod_monitor else "endpointslice"
        for index, endpoint in enumerate(endpoints):
            selected = "pod" if pod_monitor else "service"
            relabel: list[dict[str, Any]] = [
                {
                    "source_labels": ["__meta_kubernetes_pod_phase"],
                    "regex": "(Failed|Succeeded)",
                    "action": "drop",
                }
            ]
            for key, value in sorted(spec["selector"].get("matchLabels", {}).items()):
                label = sanitize(key)
                relabel.append(
                    {
                        "action": "keep",
                        "source_labels": [
                            f"__meta_kubernetes_{selected}_label_{label}",
                            f"__meta_kubernetes_{selected}_labelpresent_{label}",
                        ],
                        "regex": f"({re.escape(value)});true",
                    }
                )
            port_label = (
                "__meta_kubernetes_pod_container_port_name"
                if pod_monitor
                else "__meta_kubernetes_endpointslice_port_name"
            )
            relabel.append({"action": "keep", "source_labels": [port_label], "regex": endpoint["port"]})
            relabel += [
                {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
                {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            ]
            if pod_monitor:
                relabel.append({"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"})
            else:
                relabel += [
                    {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
                    {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"},
                ]
            relabel.append({"target_label": "endpoint", "replacement": endpoint["port"]})
            relabel += [_snake_keys(r) for r in endpoint.get("relabelings", [])]
            job: dict[str, Any] = {
                "job_name": f"{kind[0].lower()}{kind[1:]}/{meta['namespace']}/{meta['name']}/{index}",
                "honor_labels": bool(endpoint.get("honorLabels", False)),
                "metrics_path": endpoint.get("path", "/metrics"),
                "static_configs": [
                    {"targets": [address], "labels": labels} for address, labels in discover(role, namespaces)
                ],
                "relabel_configs": relabel,
            }
            if "interval" in endpoint:
                job["scrape_interval"] = endpoint["interval"]
            jobs.append(job)
    return jobs


def discover_from(api: client.ApiClient) -> Discover:
    """What Prometheus's Kubernetes discovery lists (roles pod and endpointslice), read from `api`:
    a candidate per container port of each pod, per port of each endpoint of each EndpointSlice."""
    core = client.CoreV1Api(api)
    discovery = client.DiscoveryV1Api(api)

    def pods(namespace: str) -> dict[str, client.V1Pod]:
        return {str(p.metadata.name): p for p in core.list_namespaced_pod(namespace).items}

    def pod_labels(pod: client.V1Pod) -> dict[str, str]:
        labels: dict[str, str] = {
            "__meta_kubernetes_namespace": str(pod.metadata.namespace),
            "__meta_kubernetes_pod_name": str(pod.metadata.name),
            "__meta_kubernetes_pod_node_name": pod.spec.node_name or "",
            "__meta_kubernetes_pod_phase": pod.status.phase or "",
            "__meta_kubernetes_pod_ip": pod.status.pod_ip or "",
        }
        for key, value in (pod.metadata.labels or {}).items():
            labels[f"__meta_kubernetes_pod_label_{sanitize(key)}"] = value
            labels[f"__meta_kubernetes_pod_labelpresent_{sanitize(key)}"] = "true"
        return labels

    def discover(role: str, namespaces: Sequence[str]) -> list[tuple[str, dict[str, str]]]:
        found = []
        for namespace in namespaces:
            by_name = pods(namespace)
            if role == "pod":
                for pod in by_name.values():
                    for container in pod.spec.containers:
                        for port in container.ports or []:
                            if pod.status.pod_ip:
                                labels = pod_labels(pod) | {
                                    "__meta_kubernetes_pod_container_name": container.name,
                                    "__meta_kubernetes_pod_container_port_name": port.name or "",
                                }
                                found.append((f"{pod.status.pod_ip}:{port.container_port}", labels))
                continue
            for endpoint_slice in discovery.list_namespaced_endpoint_slice(namespace).items:
                service_name = (endpoint_slice.metadata.labels or {}).get("kubernetes.io/service-name", "")
                service = core.read_namespaced_service(service_name, namespace)
                service_labels = {"__meta_kubernetes_service_name": service_name}
                for key, value in (service.metadata.labels or {}).items():
                    service_labels[f"__meta_kubernetes_service_label_{sanitize(key)}"] = value
                    service_labels[f"__meta_kubernetes_service_labelpresent_{sanitize(key)}"] = "true"
                for endpoint in endpoint_slice.endpoints or []:
                    ref = endpoint.target_ref
                    pod = by_name.get(ref.name) if ref is not None and ref.kind == "Pod" else None
                    for port in endpoint_slice.ports or []:
                        labels = dict(service_labels)
                        labels["__meta_kubernetes_namespace"] = namespace
                        labels["__meta_kubernetes_endpointslice_port_name"] = port.name or ""
                        if pod is not None:
                            labels |= pod_labels(pod)
                            labels |= _container_of(pod, port.port)
                        for address in endpoint.addresses:
                            found.append((f"{address}:{port.port}", labels))
        return found

    return discover


def _container_of(pod: client.V1Pod, number: int) -> dict[str, str]:
    for container in pod.spec.containers:
        for port in container.ports or []:
            if port.container_port == number:
                return {"__meta_kubernetes_pod_container_name": container.name}
    return {}


def sanitize(label: str) -> str:
    """A Kubernetes label's name as a Prometheus label's (what discovery does)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def _snake_keys(relabeling: Mapping[str, Any]) -> dict[str, Any]:
    return {_CAMEL.sub("_", key).lower(): value for key, value in relabeling.items()}


# --- a real Prometheus -----------------------------------------------------------------------------


class Prometheus:
    """`prometheus` with `scrape` jobs and the `rules` file, its data in `root`, on a free local port."""

    def __init__(self, root: Path, *, scrape: list[dict[str, Any]], rules: Mapping[str, Any]) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        root.mkdir(parents=True, exist_ok=True)
        (root / "rules.yaml").write_text(yaml.safe_dump(dict(rules), sort_keys=False))
        config = {
            "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
            "rule_files": [str(root / "rules.yaml")],
            "scrape_configs": scrape,
        }
        (root / "prometheus.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Prometheus:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        # The child keeps its own copy of the log's descriptor.
        with (self.root / "prometheus.log").open("wb") as log:
            self._process = subprocess.Popen(
                [
                    str(prometheus_binary()),
                    f"--config.file={self.root / 'prometheus.yaml'}",
                    f"--storage.tsdb.path={self.root / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 60
        while not self._ready():
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise ClusterError(f"prometheus did not start: {self.log()[-3000:]}")
            time.sleep(0.5)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def log(self) -> str:
        return (self.root / "prometheus.log").read_text(errors="replace")

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
        shutil.rmtree(self.root / "data", ignore_errors=True)

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as response:
            answer = json.load(response)
        if answer.get("status") != "success":
            raise ClusterError(f"prometheus /api/v1/{path} {params}: {answer}")
        return answer["data"]

    def targets(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.api("targets", state="active")["activeTargets"]
        return found

    def series_over(self, expr: str, *, start: float, end: float) -> list[dict[str, Any]]:
        """The series `expr` returns at any 5 s step between `start` and `end` (Unix seconds)."""
        result: list[dict[str, Any]] = self.api(
            "query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step="5"
        )["result"]
        return result

    def without_series(self, queries: Mapping[str, str], *, since: float) -> dict[str, str]:
        """The `queries` (name -> expression) that returned no series at any step since `since`."""
        now = time.time()
        return {
            name: expr for name, expr in queries.items() if not self.series_over(expr, start=since, end=now)
        }

    def wait_for_series(self, queries: Mapping[str, str], *, since: float, timeout: float) -> None:
        """Until every query has returned series since `since`; AssertionError naming those that have
        not after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while missing := self.without_series(queries, since=since):
            if time.monotonic() > deadline:
                names = "\n".join(f"  {name}: {expr}" for name, expr in missing.items())
                raise AssertionError(f"queries without data after {timeout:.0f}s:\n{names}")
            time.sleep(2)

    def firing(self) -> Iterator[dict[str, Any]]:
        for alert in self.api("alerts")["alerts"]:
            if alert["state"] == "firing":
                yield alert
