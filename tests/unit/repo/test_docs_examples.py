"""The manifests in docs/*.md work as written.

Every ```yaml block of a page that holds gpudra objects (claims, templates and DeviceClasses naming
gpudra's classes or driver, bare `resource.gpudra.io` configs, and the pods that use them) passes
`gpudra validate` (gpudra.cli.validate.validate_files, the function behind it) and each of its
claims, templates and pods fits a simulated DGX H100 or DGX A100 node by `gpudra explain --slices`
(gpudra.cli, in-process). A pod without claims that asks for an extended resource (`nvidia.com/gpu: 1`)
is explained as the scheduler treats it under KEP-5004 when a DeviceClass of the page maps that name:
one request of that class per container, for as many devices as the container asks.

Blocks of NVIDIA's device plugin or DRA driver are skipped by design: the line before them is
`<!-- not-gpudra -->` (an HTML comment, invisible once rendered), or they name NVIDIA's config apiVersion
or driver. Any other block with Kubernetes objects but nothing of gpudra's is an error, so is a page with
code blocks and none checked, so that a change in the page cannot make this test pass by checking less.
A block holds the claims and templates its pods name, as a reader would apply it, and no others.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpudra import cli
from gpudra.api import config_problems
from gpudra.cli.output_format import documents
from gpudra.cli.validate import validate_files
from gpudra.model.devices import build_devices
from gpudra.model.manifests import validate_documents
from gpudra.model.slices import build_slices
from gpudra.node import gpu_driver

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
OWN_CLASSES = ROOT / "deploy" / "manifests" / "deviceclasses.yaml"
DRIVER = "gpu.gpudra.io"
MARK = "<!-- not-gpudra -->"
NVIDIA = ("resource.nvidia.com/", "gpu.nvidia.com", "mig.nvidia.com")
SIMULATED_NODES = ("dgx-h100", "dgx-a100")
CLAIM_KINDS = ("ResourceClaim", "ResourceClaimTemplate")
QUOTA_SUFFIX = ".deviceclass.resource.k8s.io/devices"
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[ \t]*$")
PROBE = "docsProbe"  # an unknown field put into each gpudra config: validate must report every one

Obj = dict[str, Any]


@dataclass(frozen=True)
class Block:
    """One fenced ```yaml block of a page."""

    page: Path
    line: int  # of the opening fence, 1-based
    text: str
    marked: bool  # the previous non-blank line is MARK

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def skipped(self) -> bool:
        """Another project's manifest, shown for comparison."""
        return self.marked or any(name in self.text for name in NVIDIA)

    @cached_property
    def objects(self) -> list[Obj]:
        return [d for d in yaml.safe_load_all(self.text) if isinstance(d, dict)]

    @property
    def manifests(self) -> list[Obj]:
        return [o for o in self.objects if "apiVersion" in o and "kind" in o]


@dataclass
class Page:
    path: Path
    blocks: list[Block]
    # DeviceClasses defined by the page's unskipped blocks, and the extended resource names they map
    classes: list[Obj] = field(default_factory=list)
    extended: dict[str, str] = field(default_factory=dict)  # resource name -> DeviceClass name

    def is_gpudra(self, obj: Mapping[str, Any]) -> bool:
        api_version, kind = str(obj.get("apiVersion", "")), obj.get("kind")
        if api_version.startswith("resource.gpudra.io/"):
            return True
        if api_version.startswith("resource.k8s.io/") and kind in (*CLAIM_KINDS, "DeviceClass"):
            return "gpudra.io" in json.dumps(obj)
        if kind == "Pod":
            spec = obj.get("spec") or {}
            return bool(spec.get("resourceClaims")) or bool(extended_requests(obj, self.extended))
        if kind == "ResourceQuota":
            return bool(quota_classes(obj))
        return False

    def checked(self) -> list[Block]:
        return [b for b in self.blocks if not b.skipped and any(self.is_gpudra(o) for o in b.manifests)]


def quota_classes(obj: Mapping[str, Any]) -> list[str]:
    """The gpudra DeviceClasses a ResourceQuota caps (`<class>.deviceclass.resource.k8s.io/devices`)."""
    hard = (obj.get("spec") or {}).get("hard") or {}
    found = [str(name).removesuffix(QUOTA_SUFFIX) for name in hard if str(name).endswith(QUOTA_SUFFIX)]
    return [name for name in found if name.endswith(".gpudra.io")]


def yaml_blocks(path: Path) -> list[Block]:
    """The page's ```yaml blocks, fences indented in lists included (their indent removed)."""
    lines = path.read_text().splitlines()
    blocks, index = [], 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        end = next((i for i in range(index + 1, len(lines)) if lines[i].strip() == "```"), None)
        assert end is not None, f"{path.relative_to(ROOT)}:{index + 1}: the code block is never closed"
        if opening["lang"] in ("yaml", "yml"):
            indent = opening["indent"]
            body = [line.removeprefix(indent) for line in lines[index + 1 : end]]
            previous = next((line.strip() for line in reversed(lines[:index]) if line.strip()), "")
            blocks.append(Block(path, index + 1, "\n".join(body) + "\n", previous == MARK))
        index = end + 1
    return blocks


def extended_requests(pod: Mapping[str, Any], extended: Mapping[str, str]) -> list[Obj]:
    """The device requests the scheduler makes for a pod's extended resources that DeviceClasses map
    (KEP-5004): one per container and resource, `count` the container's request (or limit)."""
    spec = pod.get("spec") or {}
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    requests = []
    for index, container in enumerate(containers):
        resources = container.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for number, name in enumerate(sorted(n for n in asked if n in extended)):
            exactly = {"deviceClassName": extended[name], "count": int(asked[name])}
            requests.append({"name": f"container-{index}-request-{number}", "exactly": exactly})
    return requests


def load_page(path: Path) -> Page:
    page = Page(path, yaml_blocks(path))
    for block in page.blocks:
        if block.skipped:
            continue
        for obj in block.manifests:
            if obj["kind"] == "DeviceClass" and "gpudra.io" in json.dumps(obj):
                page.classes.append(obj)
                name = (obj.get("spec") or {}).get("extendedResourceName")
                if name:
                    page.extended[name] = obj["metadata"]["name"]
    return page


PAGES = [load_page(p) for p in sorted(DOCS.glob("*.md"))]
CHECKED = [(page, block) for page in PAGES for block in page.checked()]
SKIPPED = [block for page in PAGES for block in page.blocks if block.skipped]


PAGE_IDS = [page.path.name for page in PAGES]


def where(pairs: list[tuple[Page, Block]]) -> list[str]:
    return [block.where for _, block in pairs]


# --- what is checked ---------------------------------------------------------------------------


def test_the_migration_guide_is_checked() -> None:
    assert any(page.path.name == "migrate.md" for page in PAGES)


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_a_page_with_code_blocks_has_checked_gpudra_blocks(page: Page) -> None:
    raw = sum(1 for line in page.path.read_text().splitlines() if re.match(r"\s*```ya?ml\s*$", line))
    assert raw == len(page.blocks), f"{page.path.name}: found {len(page.blocks)} of {raw} yaml blocks"
    if page.blocks:
        assert page.checked(), f"{page.path.name}: none of its {len(page.blocks)} yaml blocks is checked"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_every_unmarked_manifest_block_is_gpudra_s(page: Page) -> None:
    unclaimed = [
        b.where
        for b in page.blocks
        if not b.skipped and b.manifests and not any(page.is_gpudra(o) for o in b.manifests)
    ]
    assert not unclaimed, f"no gpudra object in {unclaimed}: mark another project's block {MARK}"


@pytest.mark.parametrize("block", SKIPPED, ids=[block.where for block in SKIPPED])
def test_a_skipped_block_holds_nothing_of_gpudra_s(block: Block) -> None:
    assert "gpudra" not in block.text, f"{block.where} is skipped but names gpudra"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_a_quota_names_deviceclasses_gpudra_makes(page: Page) -> None:
    """A ResourceQuota on the page caps classes that exist: gpudra's own, the page's, or a per-profile
    MIG class of the chart's deviceClasses.migProfiles (mig-<profile as a DNS label>.gpudra.io)."""
    own = {d["metadata"]["name"] for d in yaml.safe_load_all(OWN_CLASSES.read_text()) if isinstance(d, dict)}
    own |= {c["metadata"]["name"] for c in page.classes}
    for block in page.checked():
        for obj in block.manifests:
            if obj.get("kind") == "ResourceQuota":
                for name in quota_classes(obj):
                    assert name in own or re.fullmatch(r"mig-[1-7]g[0-9]+gb[a-z]*\.gpudra\.io", name), (
                        f"{block.where}: ResourceQuota caps {name}, which no chart value makes"
                    )


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_a_page_s_copy_of_gpudra_s_own_class_selects_the_same_devices(page: Page) -> None:
    documents = [d for d in yaml.safe_load_all(OWN_CLASSES.read_text()) if isinstance(d, dict)]
    own = {d["metadata"]["name"]: d["spec"]["selectors"] for d in documents}
    assert own, f"no DeviceClass in {OWN_CLASSES}"
    for cls in page.classes:
        name = cls["metadata"]["name"]
        if name in own:
            assert cls["spec"]["selectors"] == own[name], f"{page.path.name}: DeviceClass {name} differs"


# --- validate ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("page", "block"), CHECKED, ids=where(CHECKED))
def test_gpudra_validate_accepts_the_block(page: Page, block: Block, tmp_path: Path) -> None:
    path = tmp_path / "block.yaml"
    path.write_text(block.text)
    assert [str(p) for p in validate_files([path], driver=DRIVER)] == [], block.where
    for obj in block.manifests:
        if str(obj["apiVersion"]).startswith("resource.gpudra.io/"):
            assert [str(e) for e in config_problems(obj)] == [], block.where


@pytest.mark.parametrize(("page", "block"), CHECKED, ids=where(CHECKED))
def test_validate_reaches_every_gpudra_config_of_the_block(page: Page, block: Block) -> None:
    """A config written at the wrong place would be ignored by validate, by the API server's pruning
    and so by gpudra: an unknown field put into each must come back as one problem each."""
    probed = copy.deepcopy(block.manifests)
    count = 0
    for parameters in _gpudra_parameters(probed):
        parameters[PROBE] = True
        count += 1
    problems = validate_documents([(block.where, o) for o in probed], driver=DRIVER)
    assert len([p for p in problems if PROBE in p.field]) == count, block.where


def _gpudra_parameters(value: Any) -> Iterator[dict[str, Any]]:
    if isinstance(value, list):
        for item in value:
            yield from _gpudra_parameters(item)
    elif isinstance(value, dict):
        if value.get("driver") == DRIVER and isinstance(value.get("parameters"), dict):
            yield value["parameters"]
        for item in value.values():
            yield from _gpudra_parameters(item)


# --- explain -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def node_slices(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """What `gpudra inventory --nvml sim:<machine> -o json` prints, one file per simulated node (JSON
    rather than YAML: explain reads it ten times faster)."""
    where = tmp_path_factory.mktemp("nodes")
    files = []
    for machine in SIMULATED_NODES:
        with gpu_driver.connect(f"sim:{machine}", state_file=where / machine / "state.json") as session:
            inventory = session.inventory()
        model = build_devices(inventory, mig_mode="partitionable")
        items = build_slices(model, driver=DRIVER, node_name=machine, generation=1, server_minor=36)
        files.append(where / f"{machine}.json")
        files[-1].write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    return files


@dataclass
class Targets:
    """What explain is given for a block, and what it should answer."""

    objects: list[Obj] = field(default_factory=list)
    verdicts: int = 0  # one per pod, else one per claim and template
    unused: list[str] = field(default_factory=list)  # claims and templates beside pods that no pod names


def explain_targets(page: Page, block: Block) -> Targets:
    """The block's objects, each pod's extended resources turned into the claim the scheduler would
    make for it (KEP-5004)."""
    targets = Targets(objects=copy.deepcopy(block.manifests))
    pods = [o for o in targets.objects if o["kind"] == "Pod"]
    claims = [o["metadata"]["name"] for o in targets.objects if o["kind"] in CLAIM_KINDS]
    named = set()
    for pod in pods:
        spec = pod["spec"]
        for entry in spec.get("resourceClaims") or []:
            named.add(entry.get("resourceClaimName") or entry.get("resourceClaimTemplateName"))
        requests = extended_requests(pod, page.extended)
        if requests:
            name = f"{pod['metadata']['name']}-extended-resources"
            targets.objects.append(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": name},
                    "spec": {"devices": {"requests": requests}},
                }
            )
            spec.setdefault("resourceClaims", []).append(
                {"name": "extended-resources", "resourceClaimName": name}
            )
    targets.verdicts = len(pods) or len(claims)
    # explain takes a file's pods, when it has any, and only the claims they name
    targets.unused = [name for name in claims if pods and name not in named]
    return targets


# DeviceClass-only blocks have nothing to explain
EXPLAINED = [(page, block) for page, block in CHECKED if explain_targets(page, block).verdicts]


@pytest.mark.parametrize(("page", "block"), EXPLAINED, ids=where(EXPLAINED))
def test_the_block_s_claims_fit_a_simulated_dgx(
    page: Page,
    block: Block,
    node_slices: list[Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    targets = explain_targets(page, block)
    assert not targets.unused, f"{block.where}: no pod of the block names {targets.unused}"
    target = tmp_path / "block.yaml"
    target.write_text(yaml.safe_dump_all(targets.objects))
    classes = tmp_path / "classes.yaml"
    classes.write_text(OWN_CLASSES.read_text() + "\n---\n" + yaml.safe_dump_all(page.classes))
    slices = [arg for path in node_slices for arg in ("--slices", str(path))]
    code = cli.main(["explain", str(target), *slices, "--classes", str(classes), "-o", "json"])
    captured = capsys.readouterr()
    results = documents(captured.out)
    verdicts = "\n".join(f"{', '.join(r['claims'])}: {r['verdict']}" for r in results) + captured.err
    assert len(results) == targets.verdicts, f"{block.where}:\n{verdicts}"
    assert code == 0 and all(r["fits"] for r in results), f"{block.where}:\n{verdicts}"
