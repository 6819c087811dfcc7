"""`gpudra migrate` on a corpus of manifests written for NVIDIA's DRA driver and device plugin
(tests/unit/data/migrate/input, the device plugin's configs beside them in device-plugin/).

For every input: the output is the expected one (expected/, written by this test when
GPUDRA_UPDATE_EXPECTED=1 and read by a person before it is committed); the exit code and the parts
left untranslated are those the case names; every document that does not change is in the output
byte for byte; and when the output is complete, it passes `gpudra validate` and `gpudra explain` finds
that its claims and pods fit a simulated DGX H100 or DGX A100 node (as tests/unit/repo/test_docs_examples.py
checks docs/migrate.md). Then: the cut into documents under Hypothesis, and the device plugin's config
refused field by field.
"""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudra import cli
from gpudra.cli import manifest_files
from gpudra.cli import migrate as migrate_command
from gpudra.cli.explain import WORKLOADS
from gpudra.cli.manifest_files import document_texts
from gpudra.cli.migrate import Migrated, migrate_text, read_device_plugin
from gpudra.cli.output_format import documents
from gpudra.cli.validate import validate_files
from gpudra.errors import ConfigError
from gpudra.migrate.translation import DevicePlugin, TranslationOptions, device_plugin_config, translate
from gpudra.model.devices import build_devices
from gpudra.model.slices import build_slices
from gpudra.node import gpu_driver

ROOT = Path(__file__).resolve().parents[3]
DATA = Path(__file__).parents[1] / "data" / "migrate"
INPUTS = DATA / "input"
EXPECTED = DATA / "expected"
PLUGIN = DATA / "device-plugin"
OWN_CLASSES = ROOT / "deploy" / "manifests" / "deviceclasses.yaml"
DRIVER = "gpu.gpudra.io"
CLAIM_KINDS = ("ResourceClaim", "ResourceClaimTemplate")
H100_MEMORY = "81559Mi"
UPDATE = os.environ.get("GPUDRA_UPDATE_EXPECTED") == "1"


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...] = ()
    untranslated: tuple[str, ...] = ()  # one substring per line expected on stderr
    notes: int = 0


def plugin(name: str, *more: str) -> tuple[str, ...]:
    return ("--device-plugin-config", str(PLUGIN / name), *more)


MEMORY = ("--gpu-memory", H100_MEMORY)
CASES = {
    # NVIDIA's DRA driver
    "dra-gpu-test1.yaml": Case(),
    "dra-gpu-test2.yaml": Case(),
    "dra-gpu-test3.yaml": Case(),
    "dra-gpu-test4-mig.yaml": Case(),
    "dra-time-slicing.yaml": Case(),
    "dra-mps.yaml": Case(),
    "dra-mig-mps.yaml": Case(),
    "dra-selector-attributes.yaml": Case(),
    "dra-v1beta1.yaml": Case(),
    "dra-tolerations.yaml": Case(),
    "dra-first-available.yaml": Case(),
    "dra-topology.yaml": Case(),
    "dra-consumable-shares-memory.yaml": Case(),
    "dra-consumable-shares-mig.yaml": Case(notes=1),
    "dra-device-class.yaml": Case(),
    "dra-vfio.yaml": Case(
        untranslated=(
            "requests[0].exactly.deviceClassName: a GPU bound to vfio-pci for a VM",
            "config[0].opaque.parameters: resource.nvidia.com/v1beta1 VfioDeviceConfig",
        )
    ),
    "dra-compute-domain.yaml": Case(untranslated=("ComputeDomain imex-domain: kind: ",)),
    "dra-mps-multi-user.yaml": Case(
        untranslated=(
            "mpsConfig.defaultActiveThreadPercentage: gpudra refuses it: must be an integer from 1 to 100",
            "mpsConfig.multiUser: gpudra refuses it: unknown field",
        )
    ),
    "dra-consumable-shares-count.yaml": Case(notes=1),
    "classic-dra.yaml": Case(
        untranslated=(
            "GpuClaimParameters two-gpus: apiVersion: gpu.resource.nvidia.com/v1alpha1 GpuClaimParameters "
            "is a parameter object of NVIDIA's classic-DRA driver",
            "ResourceClaimTemplate two-gpus: apiVersion: resource.k8s.io/v1alpha2 ResourceClaimTemplate is "
            "classic DRA",
        )
    ),
    "dra-v1alpha3.yaml": Case(),
    "dra-unknown-attributes.yaml": Case(
        untranslated=(
            "names NVIDIA's attribute addressingMode, which gpudra does not publish",
            "matchAttribute: gpu.nvidia.com/partition2: gpudra publishes no attribute partition2",
        )
    ),
    "dra-nvidia-device-classes.yaml": Case(
        untranslated=(
            "DeviceClass gpu.nvidia.com: metadata.name: gpu.nvidia.com is one of NVIDIA's own classes",
            "DeviceClass mig.nvidia.com: metadata.name: mig.nvidia.com is one of NVIDIA's own classes",
        )
    ),
    # NVIDIA's device plugin
    "dp-whole-gpus.yaml": Case(notes=1),
    "dp-job-two-containers.yaml": Case(),
    "dp-time-slicing-renamed.yaml": Case(plugin("time-slicing-renamed.yaml", *MEMORY)),
    "dp-time-slicing.yaml": Case(plugin("time-slicing.yaml", *MEMORY)),
    "dp-mps.yaml": Case(plugin("mps.yaml", *MEMORY)),
    "dp-mps-configmap.yaml": Case(plugin("mps-configmap.yaml", *MEMORY)),
    "dp-mig-single.yaml": Case(plugin("mig-single.yaml"), notes=1),
    "dp-mig-mixed.yaml": Case(plugin("mig-mixed.yaml")),
    "dp-helm-rendered.yaml": Case(),
    "dp-list.yaml": Case(("--mig-strategy", "mixed")),
    "dp-workloads.yaml": Case(),
    "dp-init-containers.yaml": Case(),
    "dp-pod.json": Case(),
    "dp-shared-two-replicas.yaml": Case(
        plugin("time-slicing-renamed.yaml", *MEMORY),
        untranslated=("limits[nvidia.com/gpu.shared]: asks 2 of 4 time-slicing replicas",),
    ),
    "dp-time-slicing-no-memory.yaml": Case(
        plugin("time-slicing-renamed.yaml"),
        untranslated=("time-slicing replicas: a gpudra share states its memory",),
    ),
    "dp-mig-replicas.yaml": Case(
        plugin("mig-mixed-time-slicing.yaml", *MEMORY),
        untranslated=(
            "Pod tiny-inference: spec.containers[0].resources.limits[nvidia.com/mig-1g.10gb]: "
            "nvidia.com/mig-1g.10gb is 3 time-slicing replicas of a MIG partition",
            "Pod half-gpu: spec.containers[0].resources.limits[nvidia.com/gpu]: "
            "nvidia.com/gpu shares only some",
        ),
    ),
    "dp-unknown-resource.yaml": Case(
        untranslated=(
            "Pod mystery: spec.containers[0].resources.limits[nvidia.com/gpu.shared]: not nvidia.com/gpu",
            "Pod mystery: spec.containers[1].resources.limits[nvidia.com/hostdev]: not nvidia.com/gpu",
        )
    ),
    "unrelated-only.yaml": Case(),
}


def test_the_corpus_is_the_cases() -> None:
    assert sorted(p.name for p in INPUTS.iterdir()) == sorted(CASES)
    assert len(CASES) >= 30


@dataclass
class Run:
    code: int
    out: str
    err: list[str] = field(default_factory=list)


def migrate(name: str, capsys: pytest.CaptureFixture[str]) -> Run:
    case = CASES[name]
    code = cli.main(["migrate", str(INPUTS / name), *case.args])
    captured = capsys.readouterr()
    return Run(code, captured.out, captured.err.splitlines())


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_output_is_the_expected_one(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    run = migrate(name, capsys)
    expected = EXPECTED / (Path(name).stem + ".yaml")
    if UPDATE:
        expected.write_text(run.out)
    assert run.out == expected.read_text(), f"{name}: GPUDRA_UPDATE_EXPECTED=1 writes the new one; read it"


@pytest.mark.parametrize("name", sorted(CASES))
def test_what_is_left_untranslated_is_reported(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    case = CASES[name]
    run = migrate(name, capsys)
    left = [line for line in run.err if line.startswith("gpudra migrate: not translated: ")]
    notes = [line for line in run.err if line.startswith("gpudra migrate: note: ")]
    assert len(left) == len(case.untranslated), "\n".join(run.err)
    for line, says in zip(left, case.untranslated, strict=True):
        assert says in line and line.split(": ")[2].endswith(name), line
    assert len(notes) == case.notes, "\n".join(run.err)
    assert run.code == (1 if case.untranslated else 0), "\n".join(run.err)
    if case.untranslated:
        assert run.err[-1].endswith("the output is incomplete")
    else:
        assert len(run.err) == case.notes


@pytest.mark.parametrize("name", sorted(CASES))
def test_documents_that_do_not_change_pass_through_byte_for_byte(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run = migrate(name, capsys)
    text = (INPUTS / name).read_text()
    options = _options(CASES[name])
    rewritten = 0
    for piece in [text] if name.endswith(".json") else document_texts(text):
        obj = _only_object(piece)
        if obj is not None and translate(obj, options).obj is not None:
            rewritten += 1
            continue
        assert piece in run.out, piece
    assert rewritten or run.out == text


@pytest.fixture(scope="module")
def node_slices(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """What `gpudra inventory --nvml sim:<machine> --mig-mode partitionable --shares on -o json`
    prints, one file per simulated node."""
    where = tmp_path_factory.mktemp("nodes")
    files = []
    for machine in ("dgx-h100", "dgx-a100"):
        with gpu_driver.connect(f"sim:{machine}", state_file=where / machine / "state.json") as session:
            inventory = session.inventory()
        # 1g.10gb also shareable: what dra-consumable-shares-mig.yaml's note asks of the nodes; the H100s
        # also by count, four a GPU: what dra-consumable-shares-count.yaml's note asks
        model = build_devices(
            inventory,
            mig_mode="partitionable",
            mig_share_profiles=frozenset({"1g.10gb"}),
            shares_per_gpu=4 if machine == "dgx-h100" else 0,
        )
        items = build_slices(model, driver=DRIVER, node_name=machine, generation=1, server_minor=36)
        files.append(where / f"{machine}.json")
        files[-1].write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    return files


COMPLETE = sorted(name for name, case in CASES.items() if not case.untranslated)


@pytest.mark.parametrize("name", COMPLETE)
def test_a_complete_output_validates_and_fits_a_simulated_dgx(
    name: str, node_slices: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = migrate(name, capsys)
    output = tmp_path / "migrated.yaml"
    output.write_text(run.out)
    assert [str(p) for p in validate_files([output], driver=DRIVER)] == []
    objects = list(_objects(yaml.safe_load_all(run.out)))
    classes = [o for o in objects if o.get("kind") == "DeviceClass"]
    ours = ["gpudra.io", *(f'"{c["metadata"]["name"]}"' for c in classes)]
    claims = [o for o in objects if o.get("kind") in CLAIM_KINDS and any(m in json.dumps(o) for m in ours)]
    names = {o["metadata"]["name"] for o in claims}
    # the pods explain reads (PodTemplates it does not) whose claims all are in the output
    pods = [
        o
        for o in objects
        if o.get("kind") in ("Pod", *WORKLOADS) and _claim_names(o) and _claim_names(o) <= names
    ]
    targets = claims + pods
    if not targets:
        assert name == "unrelated-only.yaml"
        return
    target = tmp_path / "targets.yaml"
    target.write_text(yaml.safe_dump_all(targets))
    own = tmp_path / "classes.yaml"
    own.write_text(OWN_CLASSES.read_text() + "\n---\n" + yaml.safe_dump_all(classes))
    slices = [arg for path in node_slices for arg in ("--slices", str(path))]
    code = cli.main(["explain", str(target), *slices, "--classes", str(own), "-o", "json"])
    captured = capsys.readouterr()
    results = documents(captured.out)
    verdicts = "\n".join(f"{', '.join(r['claims'])}: {r['verdict']}" for r in results) + captured.err
    assert len(results) == (len(pods) or len(targets)), verdicts
    assert code == 0 and all(r["fits"] for r in results), verdicts


def _objects(docs: Iterator[Any]) -> Iterator[dict[str, Any]]:
    for doc in docs:
        if isinstance(doc, dict) and str(doc.get("kind", "")).endswith("List"):
            yield from _objects(iter(doc.get("items") or []))
        elif isinstance(doc, dict):
            yield doc


def _claim_names(obj: Mapping[str, Any]) -> set[str]:
    """The claims and templates a workload's pods name."""
    found: set[str] = set()
    pending: list[Any] = [obj]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            for key in ("resourceClaimName", "resourceClaimTemplateName"):
                if isinstance(value.get(key), str):
                    found.add(value[key])
            pending += value.values()
        elif isinstance(value, list):
            pending += value
    return found


def _options(case: Case) -> TranslationOptions:
    args = dict(zip(case.args[::2], case.args[1::2], strict=True))
    config = args.get("--device-plugin-config")
    strategy = args.get("--mig-strategy")
    found = read_device_plugin(Path(config) if config else None, mig_strategy=strategy)
    memory = 81559 * 1024**2 if "--gpu-memory" in args else None
    return TranslationOptions(driver=DRIVER, device_plugin=found, gpu_memory=memory)


def _only_object(piece: str) -> dict[str, Any] | None:
    try:
        found = [d for d in yaml.safe_load_all(piece) if d is not None]
    except yaml.YAMLError:
        return None
    return found[0] if len(found) == 1 and isinstance(found[0], dict) else None


# --- the cut into documents -------------------------------------------------------------------------

_KEYS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=8)
_SCALARS = st.one_of(st.integers(), st.booleans(), st.text(max_size=20), st.none())
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=3),
    max_leaves=8,
)
_OBJECTS = st.builds(
    lambda kind, name, data: {"apiVersion": "v1", "kind": kind, "metadata": {"name": name}, "data": data},
    st.sampled_from(["ConfigMap", "Secret", "Service", "Pod", "Deployment", "ResourceClaim"]),
    _KEYS,
    st.dictionaries(_KEYS, _VALUES, max_size=4),
)
_COMMENTS = st.lists(st.text(alphabet="abc #:/-.", max_size=20).map(lambda t: f"# {t}\n"), max_size=2)
_SEPARATORS = st.sampled_from(["---\n", "--- # next\n", "---\n\n", "...\n---\n"])
_STYLES = st.sampled_from([{}, {"default_flow_style": True}, {"indent": 4}, {"explicit_start": True}])


@st.composite
def _streams(draw: st.DrawFn) -> str:
    parts = []
    for index in range(draw(st.integers(min_value=1, max_value=5))):
        if index:
            parts.append(draw(_SEPARATORS))
        parts += draw(_COMMENTS)
        parts.append(yaml.safe_dump(draw(_OBJECTS), **draw(_STYLES)))
        parts += draw(_COMMENTS)
    return "".join(parts)


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.sampled_from(["-", ".", " ", "\n", "\r", "a", "#", ":", "\t"]), max_size=60))
def test_the_documents_joined_are_the_text(text: str) -> None:
    assert "".join(document_texts(text)) == text


@settings(max_examples=150, deadline=None)
@given(_streams())
def test_a_stream_without_gpus_passes_through_unchanged(text: str) -> None:
    pieces = document_texts(text)
    assert len([p for p in pieces if _only_object(p)]) == len([d for d in yaml.safe_load_all(text) if d])
    migrated = Migrated()
    migrate_text("stream.yaml", text, TranslationOptions(driver=DRIVER), migrated)
    assert migrated.text == text and not migrated.untranslated


_GPU_POD = """\
# Source: chart/templates/pod.yaml
apiVersion: v1
kind: Pod
metadata:
  name: gpu
spec:
  containers:
  - name: app
    image: cuda
    resources:
      limits:
        nvidia.com/gpu: 1
"""


@settings(max_examples=100, deadline=None)
@given(_streams(), _streams())
def test_only_the_gpu_document_is_rewritten(before: str, after: str) -> None:
    text = before + "---\n" + _GPU_POD + "---\n" + after
    migrated = Migrated()
    migrate_text("stream.yaml", text, TranslationOptions(driver=DRIVER), migrated)
    assert migrated.text.startswith(before + "---\n")
    assert migrated.text.endswith("---\n" + after)
    middle = migrated.text[len(before) + 4 : len(migrated.text) - len(after) - 4]
    template, pod = middle.split("---\n")
    assert yaml.safe_load(template)["metadata"]["name"] == "gpudra-gpu"
    assert pod.startswith("# Source: chart/templates/pod.yaml\n")
    assert yaml.safe_load(pod)["spec"]["resourceClaims"] == [
        {"name": "app-gpu", "resourceClaimTemplateName": "gpudra-gpu"}
    ]


# --- the device plugin's config ---------------------------------------------------------------------

BAD_CONFIGS = {
    "not a mapping": ("- a\n", "must be the device plugin's config"),
    "unknown top field": (
        "version: v1\nsharng: {}\n",
        "sharng: is not a field here; the fields are: version",
    ),
    "version": ("version: v2\n", "version: 'v2' is not v1"),
    "strategy": (
        "flags: {migStrategy: double}\n",
        "flags.migStrategy: 'double' is not one of none, single, mixed",
    ),
    "both sharings": (
        "sharing:\n  mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\n"
        "  timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\n",
        "sharing: timeSlicing and mps exclude each other",
    ),
    "sharing field": ("sharing: {timeslicing: {}}\n", "sharing.timeslicing: is not a field here"),
    "no resources": ("sharing: {mps: {renameByDefault: true}}\n", "sharing.mps.resources: is required"),
    "rename flag": (
        "sharing: {mps: {renameByDefault: yes please, resources: [{name: nvidia.com/gpu, replicas: 2}]}}\n",
        "sharing.mps.renameByDefault: 'yes please' is not true or false",
    ),
    "replicas": (
        "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 0}]}}\n",
        "sharing.timeSlicing.resources[0].replicas: 0 is not a whole number >= 1",
    ),
    "resource name": (
        "sharing: {timeSlicing: {resources: [{name: nvidia.com/tpu, replicas: 2}]}}\n",
        "resources[0].name: 'nvidia.com/tpu' is not nvidia.com/gpu or nvidia.com/mig-<profile>",
    ),
    "resource field": (
        "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replica: 2}]}}\n",
        "resources[0].replica: is not a field here; the fields are: name, rename, replicas, devices",
    ),
    "rename": (
        "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2, rename: 'a b'}]}}\n",
        "resources[0].rename: 'a b' is not a resource name",
    ),
}


@pytest.mark.parametrize("text", [t for t, _ in BAD_CONFIGS.values()], ids=list(BAD_CONFIGS))
def test_a_bad_device_plugin_config_names_the_field(text: str) -> None:
    says = next(s for t, s in BAD_CONFIGS.values() if t == text)
    with pytest.raises(ConfigError) as refused:
        device_plugin_config(yaml.safe_load(text))
    assert says in str(refused.value)


def test_the_mig_strategy_option_wins_over_the_config() -> None:
    config = yaml.safe_load((PLUGIN / "mig-mixed.yaml").read_text())
    assert device_plugin_config(config).mig_strategy == "mixed"
    assert device_plugin_config(config, mig_strategy="single").mig_strategy == "single"
    assert read_device_plugin(None, mig_strategy="single") == DevicePlugin(mig_strategy="single")
    assert read_device_plugin(None, mig_strategy=None) is None


# --- pods, one ask at a time --------------------------------------------------------------------------


def _pod(limits: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
    meta = {"name": "p", **({"namespace": namespace} if namespace else {})}
    container = {"name": "app", "image": "cuda", "resources": {"limits": limits}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [container]}}


def test_a_container_asking_two_resources_gets_a_claim_of_each() -> None:
    done = translate(
        _pod({"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 2, "cpu": "1"}), TranslationOptions()
    )
    assert done.obj is not None and not done.untranslated
    [container] = done.obj["spec"]["containers"]
    assert container["resources"] == {
        "limits": {"cpu": "1"},
        "claims": [{"name": "app-gpu"}, {"name": "app-mig"}],
    }
    assert done.obj["spec"]["resourceClaims"] == [
        {"name": "app-gpu", "resourceClaimTemplateName": "gpudra-gpu"},
        {"name": "app-mig", "resourceClaimTemplateName": "gpudra-mig-1g10gb-x2"},
    ]
    assert [t["metadata"]["name"] for t in done.added] == ["gpudra-gpu", "gpudra-mig-1g10gb-x2"]


def test_a_count_of_zero_goes_without_a_claim_and_a_bad_count_stays() -> None:
    done = translate(_pod({"nvidia.com/gpu": 0}), TranslationOptions())
    assert done.obj is not None and not done.added and not done.untranslated
    assert done.obj["spec"]["containers"][0]["resources"] == {}
    assert "resourceClaims" not in done.obj["spec"]
    for bad in ("2.5", "²"):  # "²".isdigit() is true, int("²") raises
        left = translate(_pod({"nvidia.com/gpu": bad}), TranslationOptions())
        assert left.obj is None and [r.reason for r in left.untranslated] == [
            f"{bad!r} is not a whole number of devices"
        ]


def test_a_template_is_made_once_per_namespace_over_all_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(yaml.safe_dump(_pod({"nvidia.com/gpu": 1}, "ml")).rstrip("\n"))  # no final newline
    second.write_text(
        yaml.safe_dump_all([_pod({"nvidia.com/gpu": 1}, "ml"), _pod({"nvidia.com/gpu": 1}, "web")])
    )
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(second.read_bytes())))
    assert cli.main(["migrate", str(first), "-"]) == 0
    objects = list(yaml.safe_load_all(capsys.readouterr().out))
    made = [(o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects if o["kind"] != "Pod"]
    assert made == [("ml", "gpudra-gpu"), ("web", "gpudra-gpu")]
    assert [o["kind"] for o in objects] == [
        "ResourceClaimTemplate",
        "Pod",
        "Pod",
        "ResourceClaimTemplate",
        "Pod",
    ]


def test_replicas_become_shares_by_count_that_fit_a_node_offering_that_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--shares-by-count: no --gpu-memory needed; the share asks `shares: 1` (and MPS its 1/N of the SMs),
    and fits a node whose plugin runs with --shares-per-gpu N."""
    code = cli.main(["migrate", str(INPUTS / "dp-mps.yaml"), *plugin("mps.yaml"), "--shares-by-count"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    objects = list(_objects(yaml.safe_load_all(captured.out)))
    [template] = [o for o in objects if o["kind"] == "ResourceClaimTemplate"]
    assert template["metadata"]["name"] == "gpudra-gpu-shared-1of4-mps-25pct"
    [request] = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "gpu-shared.gpudra.io"
    assert request["exactly"]["capacity"] == {"requests": {"shares": "1", "compute": "25"}}
    assert any("sharesPerGpu=4" in line for line in captured.err.splitlines() if "note:" in line), (
        captured.err
    )

    output = tmp_path / "migrated.yaml"
    output.write_text(captured.out)
    assert [str(p) for p in validate_files([output], driver=DRIVER)] == []
    with gpu_driver.connect("sim:dgx-h100", state_file=tmp_path / "sim" / "state.json") as session:
        inventory = session.inventory()
    model = build_devices(inventory, mig_mode="partitionable", shares=True, shares_per_gpu=4)
    items = build_slices(model, driver=DRIVER, node_name="dgx-h100", generation=1, server_minor=36)
    node = tmp_path / "node.json"
    node.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    pods = [o for o in objects if o["kind"] in (*CLAIM_KINDS, "Deployment")]
    targets = tmp_path / "targets.yaml"
    targets.write_text(yaml.safe_dump_all(pods))
    code = cli.main(["explain", str(targets), "--slices", str(node), "-o", "json"])
    results = documents(capsys.readouterr().out)
    assert code == 0 and results and all(r["fits"] for r in results), [r["verdict"] for r in results]


def test_each_document_is_parsed_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bounds hold over the whole file while each document's text is parsed once, not the file
    again as a whole."""
    parsed: list[str] = []
    real = manifest_files.parse_documents

    def counted(text: str, **kwargs: Any) -> Any:
        parsed.append(text)
        return real(text, **kwargs)

    monkeypatch.setattr(migrate_command, "parse_documents", counted)
    name = "dra-v1alpha3.yaml"
    assert cli.main(["migrate", str(INPUTS / name)]) == 0
    assert parsed == document_texts((INPUTS / name).read_text())
