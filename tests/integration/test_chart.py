"""The Helm chart against the real API server: every object it renders (default values and every
example in the chart's ci/) passes a server-side dry run; its RBAC grants the plugin and the controller
what they call and nothing else (SubjectAccessReviews, and the real plugin and controller run with their
service accounts' tokens); the ValidatingAdmissionPolicy confines a node's plugin to its own node's
ResourceSlices (node-bound tokens); the opt-in DeviceClass gives a pod asking `nvidia.com/gpu: 1` a gpudra
GPU; deleting the controller's ClusterRole (helm uninstall) removes what the controller created.

The chart's objects are installed under release `chart` in namespace `gpudra-chart`, apart from what
test_controller.py makes in `gpudra`.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client import ApiException
from kubernetes.dynamic import DynamicClient

from tests.localcluster import LocalCluster
from tests.localcluster.cluster import free_port
from tests.localcluster.controller import ControllerProcess
from tests.localcluster.node_plugin import DRIVER, PluginProcess

from .chart import CHART, NAMESPACE, RELEASE, VALUES_EXAMPLES, apply, helm, render
from .kube_helpers import Resources, claim_pod, claim_template, pod_events, pod_gone, pod_running, wait_for

PLUGIN_SA, CONTROLLER_SA = "chart-gpudra-kubelet-plugin", "chart-gpudra-controller"
# What `kubectl apply` of the chart would install that this test installs for real (the workloads and
# DeviceClasses are only dry-run: there is no container runtime here, and the session's classes stay).
INSTALLED_KINDS = {
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


def _delete(dynamic: DynamicClient, obj: dict[str, Any]) -> None:
    resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    namespace = obj["metadata"].get("namespace") if resource.namespaced else None
    try:
        resource.delete(name=obj["metadata"]["name"], namespace=namespace)
    except ApiException as err:
        if err.status != 404:
            raise


@pytest.fixture(scope="module")
def dynamic(api: client.ApiClient) -> DynamicClient:
    return DynamicClient(api)


@pytest.fixture(scope="module")
def installed(api: client.ApiClient, dynamic: DynamicClient) -> Iterator[list[dict[str, Any]]]:
    """The chart's service accounts, RBAC and policy, installed for real."""
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": NAMESPACE}})
    objects = [o for o in render() if o["kind"] in INSTALLED_KINDS]
    try:
        for obj in objects:
            apply(dynamic, obj)
        yield objects
    finally:
        for obj in objects:
            _delete(dynamic, obj)
        core.delete_namespace(NAMESPACE)


def _token(api: client.ApiClient, account: str, node: str | None = None) -> str:
    """A service account token; bound to the Node `node` when given (as a pod's token on that node
    carries the node's name)."""
    core = client.CoreV1Api(api)
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if node is not None:
        uid = core.read_node(node).metadata.uid
        spec["boundObjectRef"] = {"kind": "Node", "apiVersion": "v1", "name": node, "uid": uid}
    request = core.create_namespaced_service_account_token(account, NAMESPACE, {"spec": spec})
    return str(request.status.token)


def _kubeconfig(cluster: LocalCluster, token: str, name: str) -> Path:
    config = json.loads(cluster.kubeconfig.read_text())
    config["users"][0]["user"] = {"token": token}
    path = cluster.directory / f"kubeconfig-{name}"
    path.write_text(json.dumps(config))
    return path


def _as(api: client.ApiClient, token: str) -> client.ApiClient:
    configuration = client.Configuration()
    source = api.configuration
    configuration.host = source.host
    configuration.ssl_ca_cert = source.ssl_ca_cert
    configuration.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(configuration)


# --- every rendered object is accepted ------------------------------------------------------------


@pytest.mark.parametrize("values", [None, *VALUES_EXAMPLES], ids=lambda v: "default" if v is None else v.name)
def test_every_rendered_object_passes_a_server_side_dry_run(
    dynamic: DynamicClient, installed: list[dict[str, Any]], values: Path | None
) -> None:
    objects = render(*(["--values", str(values)] if values else []))
    kinds = {o["kind"] for o in objects}
    assert {"DaemonSet", "ClusterRole", "ValidatingAdmissionPolicy"} <= kinds
    # A release for a further group of nodes leaves the DeviceClasses to the first (ci/node-group-values).
    classes = yaml.safe_load(values.read_text()).get("deviceClasses", {}) if values else {}
    assert ("DeviceClass" in kinds) == any(
        classes.get(kind, True) for kind in ("gpu", "shared", "mig", "migShared")
    )
    refused = []
    for obj in objects:
        try:
            apply(dynamic, obj, dry_run=True)
        except ApiException as err:
            refused.append(f"{obj['kind']} {obj['metadata']['name']}: {err.status} {err.body}")
    assert refused == []


WEBHOOK, HTTP, PLUGIN_HTTP = ({"port": p, "protocol": "TCP"} for p in (9443, 8080, 9400))
MONITORING_NS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}


def _policies(*args: str) -> dict[str, list[dict[str, Any]]]:
    """Each rendered NetworkPolicy's ingress rules by the component it selects; checks that each
    selects that component's pods (their template's labels) and restricts ingress only: egress stays
    open, the pods must reach the API server."""
    objects = render(*args)
    pods = {
        o["metadata"]["labels"]["app.kubernetes.io/component"]: o["spec"]["template"]["metadata"]["labels"]
        for o in objects
        if o["kind"] in ("Deployment", "DaemonSet")
    }
    found = {}
    for policy in (o for o in objects if o["kind"] == "NetworkPolicy"):
        component = policy["metadata"]["labels"]["app.kubernetes.io/component"]
        assert policy["spec"]["policyTypes"] == ["Ingress"] and "egress" not in policy["spec"]
        assert policy["spec"]["podSelector"]["matchLabels"].items() <= pods[component].items()
        found[component] = policy["spec"]["ingress"]
    return found


def test_network_policies_are_on_by_default_and_open_the_http_ports_only_to_whom_they_name() -> None:
    """On by default: the webhook port admits every source (the API server calls from an address that
    depends on the cluster; /status there needs a token RBAC allows), the HTTP ports (/metrics, probes)
    nobody over the network, mps-host nothing. `enabled: false` renders none."""
    assert _policies() == {"controller": [{"ports": [WEBHOOK]}], "kubelet-plugin": [], "mps-host": []}
    assert _policies("--set", "networkPolicy.enabled=false") == {}
    assert _policies("--set", "controller.enabled=false", "--set", "mpsHost.enabled=false") == {
        "kubelet-plugin": []
    }
    # The ports follow their values.
    moved = _policies(
        "--set",
        "controller.webhookPort=10443",
        "--set",
        "kubeletPlugin.port=9500",
        *("-f", str(CHART / "ci" / "network-policy-values.yaml")),
    )
    assert moved["controller"][0] == {"ports": [{"port": 10443, "protocol": "TCP"}]}
    assert moved["kubelet-plugin"][0]["ports"] == [{"port": 9500, "protocol": "TCP"}]

    opened = _policies("-f", str(CHART / "ci" / "network-policy-values.yaml"))
    assert opened == {
        "controller": [{"ports": [WEBHOOK]}, {"ports": [HTTP], "from": [MONITORING_NS]}],
        "kubelet-plugin": [{"ports": [PLUGIN_HTTP], "from": [MONITORING_NS]}],
        "mps-host": [],
    }


def test_the_monitors_prometheus_is_admitted_to_the_http_ports_while_monitoring_is_on() -> None:
    """Turning the monitors on must not leave their Prometheus refused on an enforcing CNI: the HTTP
    ports then admit `prometheusFrom` too (default: the namespace `monitoring`, a label the API server
    sets), beside `httpFrom`; rules and dashboard alone scrape nothing and open nothing."""
    monitors = ("--set", "monitoring.monitors.enabled=true")

    def http_from(*args: str) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]] | None]:
        found = _policies(*args)
        controller = [r for r in found["controller"] if r["ports"] == [HTTP]]
        plugin = [r for r in found["kubelet-plugin"] if r["ports"] == [PLUGIN_HTTP]]
        assert all(r["ports"] == [WEBHOOK] and "from" not in r for r in found["controller"][:1])
        return (controller[0]["from"] if controller else None, plugin[0]["from"] if plugin else None)

    assert http_from(*monitors) == ([MONITORING_NS], [MONITORING_NS])
    others = ("--set", "monitoring.rules.enabled=true", "--set", "monitoring.dashboard.enabled=true")
    assert http_from(*others) == (None, None)
    # Their Prometheus elsewhere: the list replaces the default.
    observability = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}}
    renamed = "networkPolicy.prometheusFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name"
    assert http_from(*monitors, "--set", f"{renamed}=observability") == ([observability], [observability])
    # Beside httpFrom, each peer once.
    scraper = {"podSelector": {"matchLabels": {"app": "scraper"}}}
    both = http_from(*monitors, "--set", "networkPolicy.httpFrom[0].podSelector.matchLabels.app=scraper")
    assert both == ([scraper, MONITORING_NS], [scraper, MONITORING_NS])
    same = http_from(*monitors, "-f", str(CHART / "ci" / "network-policy-values.yaml"))
    assert same == ([MONITORING_NS], [MONITORING_NS])
    # Emptied on purpose: closed, and the install notes say scraping will fail.
    assert http_from(*monitors, "--set", "networkPolicy.prometheusFrom=null") == (None, None)
    assert "Prometheus cannot scrape gpudra" in _notes(
        *monitors, "--set", "networkPolicy.prometheusFrom=null"
    )
    assert "prometheusFrom's default: namespace monitoring" in _notes(*monitors)
    assert "prometheusFrom" not in _notes()


def test_a_misspelt_option_is_refused_by_the_schema_with_its_name() -> None:
    result = subprocess.run(
        [helm(), "template", RELEASE, str(CHART), "--set", "kubeletPlugin.options.migMod=static"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    assert "/kubeletPlugin/options" in result.stderr and "migMod" in result.stderr


@pytest.mark.parametrize("root", ["/", "/run/nvidia/driver"], ids=["host", "gpu-operator"])
def test_the_plugin_directory_is_at_its_host_path_inside_any_driver_root(root: str) -> None:
    """MPS daemons run chrooted into the driver root and keep their pipes in the plugin directory,
    which must be the same directory there: with the host's / and with the GPU Operator's root."""
    [plugin] = [
        o
        for o in render("--set", f"kubeletPlugin.driverRoot={root}")
        if o["kind"] == "DaemonSet"
        and o["metadata"]["labels"]["app.kubernetes.io/component"] == "kubelet-plugin"
    ]
    spec = plugin["spec"]["template"]["spec"]
    [container] = spec["containers"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    plugin_dir = "/var/lib/kubelet/plugins/gpu.gpudra.io"
    assert mounts[plugin_dir]["name"] == mounts[f"/driver-root{plugin_dir}"]["name"] == "plugin-dir"
    assert volumes["plugin-dir"] == plugin_dir
    assert mounts["/driver-root"]["name"] == "driver-root" and volumes["driver-root"] == root
    # The runtime makes the mount point inside the root: possible only where the root is writable.
    assert mounts["/driver-root"]["readOnly"] is (root == "/")


def _notes(*args: str) -> str:
    out = subprocess.run(
        [helm(), "install", "--dry-run=client", RELEASE, str(CHART), "--namespace", NAMESPACE, *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.partition("NOTES:")[2]


def test_the_install_notes_say_where_the_image_and_the_operator_need_care() -> None:
    default = _notes()
    assert "Image: ghcr.io/gpudra/gpudra:0.1.0 (pull policy IfNotPresent)." in default
    assert "Pods in ErrImagePull or ImagePullBackOff" in default
    assert "is a local build" not in default and "docs/gpu-operator.md" not in default
    local = _notes("--set", "image.repository=localhost/gpudra")
    assert "localhost/gpudra is a local build: no registry serves it." in local
    operator = _notes(
        "-f", str(CHART / "ci" / "gpu-operator-values.yaml"), "--set", "image.repository=r.io/gpudra"
    )
    assert "Image: r.io/gpudra:0.1.0" in operator and "is a local build" not in operator
    assert "The driver root is /run/nvidia/driver: see docs/gpu-operator.md" in operator


# --- least privilege --------------------------------------------------------------------------------


def _allowed(api: client.ApiClient, account: str, **attributes: str) -> bool:
    review = {
        "spec": {
            "user": f"system:serviceaccount:{NAMESPACE}:{account}",
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{NAMESPACE}",
                "system:authenticated",
            ],
            "resourceAttributes": attributes,
        }
    }
    result = client.AuthorizationV1Api(api).create_subject_access_review(review)
    return bool(result.status.allowed)


def _a(verb: str, group: str, resource: str, *, ns: str = "", name: str = "") -> dict[str, str]:
    """SubjectAccessReview resource attributes; `resource` may name a subresource (claims/status)."""
    plural, _, sub = resource.partition("/")
    found = {"verb": verb, "group": group, "resource": plural, "subresource": sub, "namespace": ns}
    return {**found, "name": name}


R, CORE, ADMISSION = "resource.k8s.io", "", "admissionregistration.k8s.io"
LEASES, RBAC = "coordination.k8s.io", "rbac.authorization.k8s.io"
TLS = "chart-gpudra-webhook-tls"
PLUGIN_ALLOWED = [
    _a("create", R, "resourceslices"),
    _a("watch", R, "resourceslices"),
    _a("delete", R, "resourceslices", name="x"),
    _a("get", R, "resourceclaims", ns="team-a", name="c"),
    _a("patch", R, "resourceclaims/status", ns="team-a"),
    _a("associated-node:patch", R, "resourceclaims/driver", ns="team-a", name=DRIVER),
    _a("get", CORE, "nodes", name="node-h100"),
    _a("create", CORE, "events", ns="default"),
]
PLUGIN_DENIED = [
    _a("get", CORE, "secrets", ns=NAMESPACE),
    _a("list", CORE, "secrets"),
    _a("create", CORE, "pods/exec", ns="team-a"),
    _a("list", CORE, "pods"),
    _a("update", CORE, "nodes", name="node-h100"),
    _a("create", CORE, "events", ns="team-a"),
    _a("list", R, "resourceclaims"),
    _a("update", R, "resourceclaims", ns="team-a"),
    _a("update", R, "resourceclaims/status", ns="team-a"),
    _a("arbitrary-node:patch", R, "resourceclaims/driver", ns="team-a", name=DRIVER),
    _a("associated-node:patch", R, "resourceclaims/driver", ns="team-a", name="gpu.nvidia.com"),
    _a("update", R, "resourceclaims/binding"),
    _a("update", R, "deviceclasses", name="gpu.gpudra.io"),
    _a("delete", ADMISSION, "validatingadmissionpolicies"),
]
CONTROLLER_ALLOWED = [
    _a("watch", R, "resourceslices"),
    _a("list", R, "resourceclaims"),
    _a("watch", R, "deviceclasses"),
    _a("update", R, "resourceclaims/status", ns="team-a"),
    _a("arbitrary-node:update", R, "resourceclaims/driver", ns="team-a", name=DRIVER),
    _a("get", CORE, "secrets", ns=NAMESPACE, name=TLS),
    _a("create", CORE, "secrets", ns=NAMESPACE),
    _a("update", LEASES, "leases", ns=NAMESPACE, name=CONTROLLER_SA),
    _a("update", ADMISSION, "validatingwebhookconfigurations", name="chart-gpudra"),
    _a("get", RBAC, "clusterroles", name=CONTROLLER_SA),
    _a("create", "authentication.k8s.io", "tokenreviews"),
    _a("create", "authorization.k8s.io", "subjectaccessreviews"),
    _a("list", CORE, "namespaces"),
]
CONTROLLER_DENIED = [
    _a("get", CORE, "namespaces", name="kube-system"),
    _a("update", CORE, "namespaces", name="team-a"),
    _a("get", CORE, "secrets", ns=NAMESPACE, name="other"),
    _a("list", CORE, "secrets", ns=NAMESPACE),
    _a("get", CORE, "secrets", ns="kube-system", name=TLS),
    _a("update", LEASES, "leases", ns="kube-system", name="kube-scheduler"),
    _a("update", ADMISSION, "validatingwebhookconfigurations", name="someone-elses"),
    _a("create", R, "resourceslices"),
    _a("update", R, "resourceclaims", ns="team-a"),
    _a("update", R, "resourceclaims/binding"),
    _a("create", CORE, "pods/exec", ns="team-a"),
    _a("update", RBAC, "clusterroles", name=CONTROLLER_SA),
    _a("get", RBAC, "clusterroles", name="cluster-admin"),
]


@pytest.mark.parametrize(
    ("account", "allowed", "denied"),
    [(PLUGIN_SA, PLUGIN_ALLOWED, PLUGIN_DENIED), (CONTROLLER_SA, CONTROLLER_ALLOWED, CONTROLLER_DENIED)],
    ids=["kubelet-plugin", "controller"],
)
def test_service_accounts_get_what_they_call_and_nothing_else(
    api: client.ApiClient,
    installed: list[dict[str, Any]],
    account: str,
    allowed: list[dict[str, str]],
    denied: list[dict[str, str]],
) -> None:
    assert [a for a in allowed if not _allowed(api, account, **a)] == []
    assert [d for d in denied if _allowed(api, account, **d)] == []


# --- the node restriction ---------------------------------------------------------------------------


def _slice(node: str | None) -> dict[str, Any]:
    # A driver of its own, so that no running plugin mistakes the test's slices for its own.
    spec: dict[str, Any] = {
        "driver": "policy-test.gpudra.io",
        "pool": {"name": f"pool-{uuid.uuid4().hex[:6]}", "generation": 0, "resourceSliceCount": 1},
        "devices": [],
    }
    if node is None:
        spec["allNodes"] = True
    else:
        spec["nodeName"] = node
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": "p-"},
        "spec": spec,
    }


def _refusal(resources: Resources, body: dict[str, Any], *, admin: Resources) -> str | None:
    """The API server's refusal of creating `body`, or None when created (then deleted again by `admin`:
    a slice created before the policy took effect may be one the same token can no longer delete)."""
    try:
        created = resources.create("resourceslices", body)
    except ApiException as err:
        assert err.status == 403, err.body
        return str(json.loads(err.body)["message"])
    admin.delete("resourceslices", created["metadata"]["name"])
    return None


def test_a_node_bound_plugin_token_writes_only_its_own_nodes_slices(
    api: client.ApiClient, cluster: LocalCluster, installed: list[dict[str, Any]]
) -> None:
    node_a, node_b = "node-h100", "node-a100"
    as_a = Resources(_as(api, _token(api, PLUGIN_SA, node=node_a)))
    admin = Resources(api)
    # A new policy takes effect once the API server has compiled it (about a second).
    refused = wait_for(
        "the policy to take effect", lambda: _refusal(as_a, _slice(node_b), admin=admin), timeout=30
    )
    assert (
        f"on node {node_a} may only write ResourceSlices with spec.nodeName {node_a}, not {node_b}" in refused
    )
    assert "without spec.nodeName" in (_refusal(as_a, _slice(None), admin=admin) or "")
    assert _refusal(as_a, _slice(node_a), admin=admin) is None

    # Node B's own slice: node A's token can neither change nor delete it.
    mine_b = Resources(_as(api, _token(api, PLUGIN_SA, node=node_b))).create("resourceslices", _slice(node_b))
    name = mine_b["metadata"]["name"]
    with pytest.raises(ApiException) as deleting:
        as_a.delete("resourceslices", name)
    assert deleting.value.status == 403 and f"may not change or delete ResourceSlices of node {node_b}" in (
        deleting.value.body
    )
    Resources(api).delete("resourceslices", name)

    # A token bound to no node (not a pod's) writes nothing.
    unbound = Resources(_as(api, _token(api, PLUGIN_SA)))
    assert "bound to its node" in (_refusal(unbound, _slice(node_a), admin=admin) or "")


def test_the_plugin_runs_on_its_service_accounts_node_bound_token(
    api: client.ApiClient,
    cluster: LocalCluster,
    gpudra: dict[str, PluginProcess],
    installed: list[dict[str, Any]],
) -> None:
    """The real plugin with the chart's credentials: re-publishes its slices, prepares a claim and writes
    its Idle condition, with no request refused."""
    node = "node-h100"  # whole GPUs (node-a100's are all in MIG mode)
    plugin = gpudra[node]
    kubeconfig = _kubeconfig(cluster, _token(api, PLUGIN_SA, node=node), f"plugin-{node}")
    core = client.CoreV1Api(api)
    namespace = f"chart-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    log_start = plugin.log.stat().st_size
    plugin.stop()
    try:
        plugin.start(kubeconfig=kubeconfig, usage_interval=1)
        Resources(api).custom.create_namespaced_custom_object(
            "resource.k8s.io", "v1", namespace, "resourceclaimtemplates", claim_template("one-gpu")
        )
        core.create_namespaced_pod(namespace, claim_pod("p", {"gpu": "one-gpu"}, node=node))
        try:
            pod = wait_for("the pod running", lambda: pod_running(core, "p", namespace), timeout=90)
        except AssertionError as err:
            raise AssertionError(f"{err}: {pod_events(core, 'p', namespace)}\n{plugin.tail()}") from None
        claim_name = pod.status.resource_claim_statuses[0].resource_claim_name

        def idle_written() -> list[dict[str, Any]] | None:
            claim = Resources(api).get("resourceclaims", claim_name, namespace)
            devices = (claim.get("status") or {}).get("devices") or []
            return [d for d in devices if any(c["type"] == "Idle" for c in d.get("conditions") or [])]

        assert wait_for("the plugin's Idle condition", idle_written, timeout=60)
        core.delete_namespaced_pod("p", namespace)
        wait_for("the pod gone (unprepared)", lambda: pod_gone(core, "p", namespace), timeout=120)
    finally:
        plugin.stop()
        plugin.start()
        core.delete_namespace(namespace)
    log = plugin.log.read_bytes()[log_start:].decode(errors="replace")
    assert "Forbidden" not in log and " 403" not in log, log[-3000:]


# --- nvidia.com/gpu through DRA -------------------------------------------------------------------


def test_a_pod_asking_nvidia_com_gpu_gets_a_gpudra_gpu(
    api: client.ApiClient, dynamic: DynamicClient, cluster: LocalCluster, gpudra: dict[str, PluginProcess]
) -> None:
    values = ["--values", str(CHART / "ci" / "extended-resource-values.yaml")]
    (gpu_class,) = [
        o
        for o in render(*values, "--show-only", "templates/deviceclasses.yaml")
        if o["metadata"]["name"] == DRIVER
    ]
    assert gpu_class["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    (plain,) = [
        o for o in render("--show-only", "templates/deviceclasses.yaml") if o["metadata"]["name"] == DRIVER
    ]
    core = client.CoreV1Api(api)
    namespace = f"ext-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": namespace}})
    apply(dynamic, gpu_class)
    try:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "legacy"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": "node-h100"},
                "containers": [
                    {"name": "cuda", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                ],
            },
        }
        core.create_namespaced_pod(namespace, pod)
        running = wait_for(
            "the nvidia.com/gpu pod running", lambda: pod_running(core, "legacy", namespace), timeout=90
        )
        raw = api.sanitize_for_serialization(running)
        claim_name = raw["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
        claim = Resources(api).get("resourceclaims", claim_name, namespace)
        results = claim["status"]["allocation"]["devices"]["results"]
        assert [(r["driver"], r["pool"]) for r in results] == [(DRIVER, "node-h100")]
        uid = claim["metadata"]["uid"]
        assert uid in gpudra["node-h100"].cdi_specs()  # prepared: its CDI spec written
        core.delete_namespaced_pod("legacy", namespace)
        wait_for("the pod gone (unprepared)", lambda: pod_gone(core, "legacy", namespace), timeout=120)
        wait_for("the claim unprepared", lambda: uid not in gpudra["node-h100"].cdi_specs(), timeout=30)
    finally:
        apply(dynamic, plain)
        core.delete_namespace(namespace)
    restored = dynamic.resources.get(api_version="resource.k8s.io/v1", kind="DeviceClass").get(name=DRIVER)
    assert "extendedResourceName" not in restored.to_dict()["spec"]


# --- uninstall ----------------------------------------------------------------------------------------


def test_the_controller_on_its_service_account_and_uninstall_leaves_nothing(
    api: client.ApiClient, dynamic: DynamicClient, cluster: LocalCluster, installed: list[dict[str, Any]]
) -> None:
    """The controller with the chart's credentials and names becomes ready and leads (its Secret, webhook
    configuration and Lease written) and answers /status for a token; deleting its ClusterRole, as helm
    uninstall does, removes all three."""
    kubeconfig = _kubeconfig(cluster, _token(api, CONTROLLER_SA), "controller")
    replica = ControllerProcess(
        cluster,
        "chart-0",
        webhook_url_port=free_port(),
        namespace=NAMESPACE,
        kubeconfig=kubeconfig,
        extra_args=(
            "--webhook-configuration=chart-gpudra",
            "--webhook-secret=chart-gpudra-webhook-tls",
            f"--lease-name={CONTROLLER_SA}",
            f"--owner-cluster-role={CONTROLLER_SA}",
        ),
    )
    core = client.CoreV1Api(api)
    admission = client.AdmissionregistrationV1Api(api)
    coordination = client.CoordinationV1Api(api)
    made = {
        "secret": lambda: core.read_namespaced_secret("chart-gpudra-webhook-tls", NAMESPACE),
        "webhook configuration": lambda: admission.read_validating_webhook_configuration("chart-gpudra"),
        "lease": lambda: coordination.read_namespaced_lease(CONTROLLER_SA, NAMESPACE),
    }
    role = next(o for o in installed if o["kind"] == "ClusterRole" and o["metadata"]["name"] == CONTROLLER_SA)
    replica.start()
    try:
        replica.wait(replica.leading, "leading", 30)
        for what, read in made.items():
            owners = wait_for(what, partial(_owners, read))
            assert [(o.kind, o.name) for o in owners] == [("ClusterRole", CONTROLLER_SA)], what
        # /status: the chart's ClusterRole lets the controller make TokenReviews and SubjectAccessReviews
        assert replica.status()["kind"] == "ClusterStatus"
        assert "Forbidden" not in replica.tail(200)
    finally:
        replica.stop()
    _delete(dynamic, role)
    try:
        for what, read in made.items():
            wait_for(f"the {what} garbage-collected", partial(_gone, read), timeout=60)
    finally:
        apply(dynamic, role)


def _owners(read: Callable[[], Any]) -> list[Any]:
    return list(read().metadata.owner_references or [])


def _gone(read: Callable[[], Any]) -> bool:
    try:
        read()
    except ApiException as err:
        return err.status == 404
    time.sleep(0.2)
    return False
