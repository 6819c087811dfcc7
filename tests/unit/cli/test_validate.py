"""`gpudra validate`: the gpudra configs in claim, template and class manifests, by file, object and field."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpudra import cli
from gpudra.cli import validate
from gpudra.cli.manifest_files import read_documents
from gpudra.cli.validate import validate_files
from gpudra.migrate.migration import migration_problems
from gpudra.model.manifests import Problem, validate_documents

DRIVER = "gpu.gpudra.io"
DATA = Path(__file__).parents[1] / "data"
README = Path(__file__).resolve().parents[3] / "api" / "README.md"
GPU_CONFIG = {"apiVersion": "resource.gpudra.io/v1beta1", "kind": "GpuConfig"}


def claim(config: list[Any], *, requests: list[Any] | None = None, name: str = "c") -> dict[str, Any]:
    requests = (
        [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpudra.io"}}] if requests is None else requests
    )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"devices": {"requests": requests, "config": config}},
    }


def opaque(parameters: Any, *, requests: list[str] | None = None, driver: str = DRIVER) -> dict[str, Any]:
    item: dict[str, Any] = {"opaque": {"driver": driver, "parameters": parameters}}
    if requests is not None:
        item["requests"] = requests
    return item


def check(*documents: dict[str, Any], driver: str = DRIVER) -> list[tuple[str, str, str]]:
    return [
        (p.object, p.field, p.message)
        for p in validate_documents([("f.yaml", d) for d in documents], driver=driver)
    ]


def test_good_manifests_have_no_problems() -> None:
    assert validate_files([DATA / "configs-good.yaml"], driver=DRIVER) == []


def test_bad_manifests_name_file_object_and_field() -> None:
    file = str(DATA / "configs-bad.yaml")
    claim_at = f"{file}: ResourceClaim ml/bad-mps: spec.devices.config[1]"
    mps_at = f"{claim_at}.opaque.parameters.sharing.mpsConfig"
    template_at = f"{file}: ResourceClaimTemplate ml/bad-mig: spec.spec.devices.config[0].opaque.parameters"
    class_at = f"{file}: DeviceClass bad-class.gpudra.io: spec.config[0].opaque.parameters"
    assert [str(p) for p in validate_files([DATA / "configs-bad.yaml"], driver=DRIVER)] == [
        f"{claim_at}.requests[0]: names no request of this claim; its requests are: gpu",
        f"{mps_at}.defaultActiveThreadPercentage: must be an integer from 1 to 100",
        f"{mps_at}.defaultPinnedDeviceMemoryLimit: "
        "must be a Kubernetes quantity such as 512Mi, 10Gi, 1.5G or 1e9, not '10GB'",
        f"{template_at}.sharing.timeSlicingConfig: must not be set when strategy is MPS: it configures "
        "strategy TimeSlicing",
        f"{class_at}.apiVersion: must be resource.gpudra.io/v1beta1 "
        "(the fields are those of resource.nvidia.com/v1beta1: only the apiVersion differs)",
        f"{class_at}.sharing.timeSlicingConfig.interval: must be one of: Default, Short, Medium, Long",
        # the NVIDIA entry of a claim with gpudra's requests: ignored by gpudra (gpudra.migrate.migration)
        f"{file}: ResourceClaim ml/bad-mps: spec.devices.config[0].opaque.driver: gpu.nvidia.com is another "
        "driver's: gpudra ignores this config on request(s) gpu, without a word; gpudra's is opaque.driver: "
        "gpu.gpudra.io with parameters.apiVersion: resource.gpudra.io/v1beta1 (docs/migrate.md)",
    ]


def test_time_slicing_a_mig_device_is_valid_with_a_warning_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "mig.yaml"
    parameters = {
        "apiVersion": "resource.gpudra.io/v1beta1",
        "kind": "MigDeviceConfig",
        "sharing": {"strategy": "TimeSlicing"},
    }
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "m", "namespace": "ml"},
        "spec": {
            "devices": {
                "requests": [{"name": "mig", "exactly": {"deviceClassName": "mig.gpudra.io"}}],
                "config": [{"requests": ["mig"], "opaque": {"driver": DRIVER, "parameters": parameters}}],
            }
        },
    }
    manifest.write_text(json.dumps(claim))
    assert validate.run([manifest], driver=DRIVER) == 0
    out, err = capsys.readouterr()
    assert out == "1 file(s) valid\n"
    assert err == (
        f"gpudra validate: warning: {manifest}: ResourceClaim ml/m: "
        "spec.devices.config[0].opaque.parameters.sharing.strategy: TimeSlicing on a MIG device sets "
        "nothing: the claim's containers share the partition; interval Default is not applied "
        "(the time-slice is the whole GPU's)\n"
    )


def test_list_items_are_checked_with_their_index() -> None:
    assert validate_files([DATA / "list-bad.json"], driver=DRIVER) == [
        Problem(
            file=str(DATA / "list-bad.json"),
            object="ResourceClaim default/listed",
            field="items[1].spec.devices.config[0].opaque.parameters.sharing.mpsConfig",
            message="must not be set when strategy is TimeSlicing: it configures strategy MPS",
        )
    ]


def test_typed_lists_are_checked_too() -> None:
    bad = claim([opaque({**GPU_CONFIG, "x": 1})])
    found = check({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimList", "items": [bad]})
    assert [field for _, field, _ in found] == ["items[0].spec.devices.config[0].opaque.parameters.x"]


def test_other_drivers_are_ignored() -> None:
    assert check(claim([opaque({"anything": "goes"}, driver="gpu.nvidia.com", requests=["missing"])])) == []


def test_the_driver_name_is_configurable() -> None:
    document = claim([opaque({"kind": "GpuConfig"}, driver="gpu.example.com")])
    assert check(document) == []
    assert check(document, driver="gpu.example.com") == [
        (
            "ResourceClaim ns/c",
            "spec.devices.config[0].opaque.parameters.apiVersion",
            "is required; must be resource.gpudra.io/v1beta1",
        ),
    ]


def test_other_objects_are_ignored() -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"devices": {"config": [1]}}}
    foreign = {**claim([opaque({})]), "apiVersion": "example.com/v1"}
    assert check(pod, foreign) == []


REQUESTS = [
    {"name": "gpu", "exactly": {"deviceClassName": "gpu.gpudra.io"}},
    {"name": "accel", "firstAvailable": [{"name": "mig"}, {"name": "big"}]},
]


@pytest.mark.parametrize(
    ("names", "bad"),
    [
        (["gpu"], []),
        (["accel"], []),
        (["accel/mig", "accel/big"], []),
        (["gpus"], [0]),
        (["gpu", "accel/small", "mig"], [1, 2]),
    ],
    ids=["request", "request with subrequests", "subrequests", "unknown request", "unknown subrequest"],
)
def test_requests_must_name_requests_of_the_claim(names: list[str], bad: list[int]) -> None:
    found = check(claim([opaque(GPU_CONFIG, requests=names)], requests=REQUESTS))
    assert found == [
        (
            "ResourceClaim ns/c",
            f"spec.devices.config[0].requests[{index}]",
            "names no request of this claim; its requests are: accel, accel/big, accel/mig, gpu",
        )
        for index in bad
    ]


def test_template_requests_are_checked() -> None:
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"generateName": "t-", "namespace": "ns"},
        "spec": {"spec": {"devices": {"requests": [], "config": [opaque(GPU_CONFIG, requests=["gpu"])]}}},
    }
    assert check(template) == [
        (
            "ResourceClaimTemplate ns/t-*",
            "spec.spec.devices.config[0].requests[0]",
            "names no request of this claim; its requests are: none",
        ),
    ]


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        (None, "is required (a GpuConfig or MigDeviceConfig)"),
        ("GpuConfig", "must be a JSON object (a GpuConfig or MigDeviceConfig)"),
        ([GPU_CONFIG], "must be a JSON object (a GpuConfig or MigDeviceConfig)"),
    ],
    ids=["missing", "string", "list"],
)
def test_parameters_must_be_an_object(parameters: Any, message: str) -> None:
    assert check(claim([opaque(parameters)])) == [
        ("ResourceClaim ns/c", "spec.devices.config[0].opaque.parameters", message)
    ]


def test_parameters_at_most_10_kib() -> None:
    def sized(padding: int) -> dict[str, Any]:
        return {**GPU_CONFIG, "sharing": {"strategy": "MPS", "mpsConfig": {"p" * padding: 1}}}

    fits = sized(10240 - len(json.dumps(sized(0), separators=(",", ":"))))
    assert len(json.dumps(fits, separators=(",", ":"))) == 10240
    assert [msg for _, field, msg in check(claim([opaque(fits)])) if field.endswith("parameters")] == []
    too_big = sized(10241 - len(json.dumps(sized(0), separators=(",", ":"))))
    assert (
        "ResourceClaim ns/c",
        "spec.devices.config[0].opaque.parameters",
        "is 10241 bytes as JSON; must be at most 10 KiB (10240 bytes)",
    ) in check(claim([opaque(too_big)]))


def test_config_not_a_list() -> None:
    document = claim([])
    document["spec"]["devices"]["config"] = {"opaque": {}}
    assert check(document) == [("ResourceClaim ns/c", "spec.devices.config", "must be a list")]


def test_device_class_is_cluster_scoped_and_has_no_requests() -> None:
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.gpudra.io"},
        "spec": {"config": [opaque({**GPU_CONFIG, "sharing": {"strategy": "MPS", "mpsConfig": {"x": 1}}})]},
    }
    assert [(obj, field) for obj, field, _ in check(device_class)] == [
        ("DeviceClass gpu.gpudra.io", "spec.config[0].opaque.parameters.sharing.mpsConfig.x")
    ]


def test_every_problem_in_one_config_is_listed() -> None:
    parameters = {"kind": "GpuConfig", "sharing": {"strategy": "Sliced"}, "extra": True}
    assert [field for _, field, _ in check(claim([opaque(parameters)]))] == [
        "spec.devices.config[0].opaque.parameters.apiVersion",
        "spec.devices.config[0].opaque.parameters.sharing.strategy",
        "spec.devices.config[0].opaque.parameters.extra",
    ]


# --- files that are not manifests are problems, not crashes -----------------------------------------------


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        (
            "broken.yaml",
            "kind: [unclosed\n",
            "is not valid YAML: expected ',' or ']', but got '<stream end>'",
        ),
        ("tabs.yaml", "a:\n\tb: 1\n", "is not valid YAML: found character '\\t' that cannot start any token"),
        ("broken.json", '{"kind": ', "is not valid JSON: Expecting value: line 1 column 10 (char 9)"),
        ("binary.yaml", b"\xff\xfe\x00", "is not YAML or JSON: not UTF-8 text"),
    ],
    ids=["unclosed flow", "tab indent", "truncated JSON", "not text"],
)
def test_unparseable_file(tmp_path: Path, name: str, content: str | bytes, message: str) -> None:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    (problem,) = validate_files([path], driver=DRIVER)
    assert (problem.file, problem.object, problem.field) == (str(path), "", "")
    assert problem.message.startswith(message)
    assert str(problem).startswith(f"{path}: {message}")


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    assert [str(p) for p in validate_files([path], driver=DRIVER)] == [
        f"{path}: cannot be read: No such file or directory"
    ]


def test_documents_that_are_not_objects(tmp_path: Path) -> None:
    path = tmp_path / "mixed.yaml"
    good = claim([opaque(GPU_CONFIG)])
    path.write_text(yaml.safe_dump_all([good, "just text", {"name": "no kind"}, None]))
    assert [str(p) for p in validate_files([path], driver=DRIVER)] == [
        f"{path}: document 2: is not a Kubernetes object (no apiVersion and kind)",
        f"{path}: document 3: is not a Kubernetes object (no apiVersion and kind)",
    ]


def test_several_files_in_order(tmp_path: Path) -> None:
    first, second = tmp_path / "a.yaml", tmp_path / "b.json"
    first.write_text(yaml.safe_dump(claim([opaque({**GPU_CONFIG, "a": 1})], name="first")))
    second.write_text(json.dumps(claim([opaque({**GPU_CONFIG, "b": 1})], name="second")))
    assert [(p.file, p.object) for p in validate_files([first, second], driver=DRIVER)] == [
        (str(first), "ResourceClaim ns/first"),
        (str(second), "ResourceClaim ns/second"),
    ]


def test_readme_examples_are_valid() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(), flags=re.DOTALL)
    manifests = [block for block in blocks if "apiVersion: resource.k8s.io/" in block]
    assert len(manifests) >= 2
    for block in manifests:
        documents = [(str(README), d) for d in yaml.safe_load_all(block) if d is not None]
        assert validate_documents(documents, driver=DRIVER) == []


# --- hostile files: every one ends in one line naming the file, never a hang or a traceback -------

LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)


def hostile(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(content, str):
        content = content.encode()
    path.write_bytes(content)
    return path


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("laughs.yaml", LAUGHS, "expands to more than 1000000 nodes"),
        ("self.yaml", "a: &a [*a]\n", "refers to itself through a YAML alias"),
        ("deep.yaml", "[" * 10_000 + "]" * 10_000, "nests deeper than 100 levels"),
        ("deep-map.yaml", "a:\n" + "".join(" " * i + "a:\n" for i in range(1, 300)), "nests deeper than 100"),
        ("deep.json", "[" * 10_000 + "]" * 10_000, "nests deeper than 100 levels"),
        ("deep-ok-parse.json", "[" * 500 + "]" * 500, "nests deeper than 100 levels"),
    ],
)
def test_hostile_yaml_and_json_are_refused_in_one_line(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    problems = validate_files([hostile(tmp_path, name, content)], driver=DRIVER)
    assert len(problems) == 1
    assert problems[0].file.endswith(name) and message in problems[0].message
    assert "\n" not in str(problems[0])


def test_the_laughs_file_is_small() -> None:
    assert len(LAUGHS) < 1024  # a kilobyte that would expand to 9**9 nodes


def test_an_oversized_file_is_refused_unread(tmp_path: Path) -> None:
    big = hostile(tmp_path, "big.yaml", b"# " + b"x" * (8 * 1024 * 1024))
    [problem] = validate_files([big], driver=DRIVER)
    assert problem.message == "is larger than 8 MiB"


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    [problem] = validate_files([fifo], driver=DRIVER)
    assert problem.message == "is not a regular file"


def test_a_device_is_refused() -> None:
    [problem] = validate_files([Path("/dev/zero")], driver=DRIVER)
    assert problem.message == "is not a regular file"


def test_anchors_used_a_few_times_are_fine(tmp_path: Path) -> None:
    good = hostile(
        tmp_path,
        "anchors.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: &d {a: b}\nextra: [*d, *d, *d]\n",
    )
    assert validate_files([good], driver=DRIVER) == []


# --- one object nested too deeply leaves the others checked ---------------------------------------

BAD_CONFIG = {**GPU_CONFIG, "sharing": {"strategy": "Sometimes"}}
TOO_DEEP = "nests deeper than 100 levels"


def deep_claim(name: str) -> dict[str, Any]:
    return claim([opaque({"deep": "__DEEP__"}, driver="other.example.com")], name=name)


def with_deep(text: str) -> str:
    """`text` with its "__DEEP__" placeholder nested 3000 lists deep, as `kubectl get -o yaml|json`
    writes a tenant's claim that deep."""
    return re.sub(r"""["']?__DEEP__["']?""", "[" * 3000 + "]" * 3000, text)


def test_a_deep_document_is_left_out_and_the_others_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "claims.yaml"
    documents = [claim([opaque(BAD_CONFIG)], name="bad"), deep_claim("deep"), claim([opaque(GPU_CONFIG)])]
    path.write_text(with_deep(yaml.safe_dump_all(documents)))
    assert [str(p) for p in validate_files([path], driver=DRIVER)] == [
        f"{path}: document 2: {TOO_DEEP}",
        f"{path}: ResourceClaim ns/bad: spec.devices.config[0].opaque.parameters.sharing.strategy: "
        + check(claim([opaque(BAD_CONFIG)], name="bad"))[0][2],
    ]


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_deep_item_of_a_list_is_left_out_and_the_others_keep_their_index(
    tmp_path: Path, suffix: str
) -> None:
    items = [
        claim([opaque(GPU_CONFIG)], name="good"),
        deep_claim("deep"),
        claim([opaque(BAD_CONFIG)], name="bad"),
    ]
    listed = {"apiVersion": "v1", "kind": "List", "items": items}
    path = tmp_path / f"all{suffix}"
    path.write_text(with_deep(json.dumps(listed) if suffix == ".json" else yaml.safe_dump(listed)))
    problems = validate_files([path], driver=DRIVER)
    assert [(p.object, p.field.split(".")[0], p.message) for p in problems][:1] == [
        ("document 1, items[1]", "", TOO_DEEP)
    ]
    assert [(p.object, p.field.split(".opaque")[0]) for p in problems[1:]] == [
        ("ResourceClaim ns/bad", "items[2].spec.devices.config[0]")
    ]


# --- a directory ------------------------------------------------------------------------------------


def test_a_directory_stands_for_its_manifests_as_kubectl_reads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(claim([opaque(GPU_CONFIG)], name="a")))
    (tmp_path / "b.yml").write_text(yaml.safe_dump(claim([opaque(GPU_CONFIG)], name="b")))
    (tmp_path / "notes.txt").write_text("not a manifest")
    (tmp_path / "nested").mkdir()
    (tmp_path / "nested" / "bad.yaml").write_text(yaml.safe_dump(claim([opaque(BAD_CONFIG)])))
    assert cli.main(["validate", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "2 file(s) valid\n"

    (tmp_path / "c.json").write_text(json.dumps(claim([opaque(BAD_CONFIG)], name="c")))
    assert cli.main(["validate", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith(f"{tmp_path / 'c.json'}: ResourceClaim ns/c: spec.devices")


def test_a_directory_without_manifests_is_one_line_and_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "README").write_text("x")
    assert cli.main(["validate", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"gpudra validate: {tmp_path}: is a directory holding no .yaml, .yml, .json file\n"
    assert captured.out == ""


def test_a_directory_where_a_file_must_be_is_one_line() -> None:
    with pytest.raises(ValueError, match=r"^is a directory, not a file$"):
        read_documents(Path("/"))


# --- what a move from NVIDIA's DRA driver leaves behind (gpudra.migrate.migration) ------------------

NVIDIA_CLAIM = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: old, namespace: ml}
spec:
  spec:
    devices:
      requests:
      - name: gpus
        exactly:
          deviceClassName: gpu.nvidia.com
          selectors:
          - cel: {expression: 'device.attributes["gpu.nvidia.com"].architecture == "Hopper"'}
          tolerations: [{key: gpu.nvidia.com/xid, operator: Exists}]
      constraints:
      - {requests: [gpus], matchAttribute: gpu.nvidia.com/parentUUID}
      config:
      - opaque:
          driver: gpu.nvidia.com
          parameters: {apiVersion: resource.nvidia.com/v1beta1, kind: GpuConfig}
"""


def _lines(tmp_path: Path, name: str, text: str) -> list[str]:
    path = tmp_path / name
    path.write_text(text)
    return [str(p).removeprefix(f"{path}: ") for p in validate_files([path], driver=DRIVER)]


def test_an_unmigrated_nvidia_claim_is_named_at_every_leftover(tmp_path: Path) -> None:
    at = "ResourceClaimTemplate ml/old: spec.spec.devices"
    assert _lines(tmp_path, "old.yaml", NVIDIA_CLAIM) == [
        f"{at}.requests[0].exactly.deviceClassName: gpu.nvidia.com is NVIDIA's DRA driver's name "
        "(docs/migrate.md); gpudra's is gpu.gpudra.io (gpu-shared.gpudra.io for a share)",
        f"{at}.requests[0].exactly.selectors[0].cel.expression: names gpu.nvidia.com, NVIDIA's DRA "
        "driver's attributes and capacities (docs/migrate.md); gpudra's are under \"gpu.gpudra.io\" (this "
        "selector matches no gpudra device)",
        f"{at}.requests[0].exactly.tolerations[0].key: gpu.nvidia.com/xid is NVIDIA's DRA driver's taint "
        "(docs/migrate.md); gpudra's is gpudra.io/unhealthy",
        f"{at}.constraints[0].matchAttribute: gpu.nvidia.com/parentUUID is NVIDIA's DRA driver's name "
        "(docs/migrate.md); gpudra's is gpu.gpudra.io/parentUUID",
        f"{at}.config[0].opaque.driver: gpu.nvidia.com is another driver's: gpudra ignores this config on "
        "request(s) gpus, without a word; gpudra's is opaque.driver: gpu.gpudra.io with "
        "parameters.apiVersion: resource.gpudra.io/v1beta1 (docs/migrate.md)",
    ]


def test_a_half_migrated_claim_whose_config_gpudra_would_ignore(tmp_path: Path) -> None:
    half = NVIDIA_CLAIM.replace("deviceClassName: gpu.nvidia.com", "deviceClassName: gpu.gpudra.io")
    half = half.replace("gpu.nvidia.com/parentUUID", "gpu.gpudra.io/parentUUID")
    half = half.replace('"gpu.nvidia.com"', '"gpu.gpudra.io"').replace("gpu.nvidia.com/xid", "gpudra.io/x")
    [only] = _lines(tmp_path, "half.yaml", half)
    assert only.startswith("ResourceClaimTemplate ml/old: spec.spec.devices.config[0].opaque.driver: ")
    assert "gpudra ignores this config on request(s) gpus" in only


def test_another_drivers_config_on_gpudra_requests_only_is_a_problem(tmp_path: Path) -> None:
    def fields(document: dict[str, Any]) -> list[str]:
        return [p.field for p in migration_problems([("f.yaml", document)], driver=DRIVER)]

    assert fields(claim([opaque({"x": 1}, driver="other.example.com")])) == [
        "spec.devices.config[0].opaque.driver"
    ]
    fpga = {"name": "fpga", "exactly": {"deviceClassName": "fpga.example.com"}}
    gpu = {"name": "gpu", "exactly": {"deviceClassName": "gpu.gpudra.io"}}
    both = claim([opaque({"x": 1}, driver="other.example.com")], requests=[gpu, fpga])
    assert fields(both) == []  # for all requests, fpga among them: the other driver's own


def test_a_template_without_its_spec_spec_level(tmp_path: Path) -> None:
    flat = NVIDIA_CLAIM.replace("spec:\n  spec:\n", "spec:\n  x:\n").replace("\n  x:\n", "\n")
    assert _lines(tmp_path, "flat.yaml", flat) == [
        "ResourceClaimTemplate ml/old: spec.devices: a ResourceClaimTemplate holds the claim's spec one "
        "level down: spec.spec.devices, not spec.devices (the API server drops or refuses the misplaced "
        "field, and pods get claims without devices)"
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "apiVersion: resource.gpudra.io/v1beta1\nkind: GpuConfig\nsharing: {strategy: Sometimes}\n",
            "GpuConfig: sharing.strategy: must be one of",
        ),
        (
            "apiVersion: resource.nvidia.com/v1beta1\nkind: GpuConfig\n",
            "GpuConfig: apiVersion: must be resource.gpudra.io/v1beta1",
        ),
    ],
)
def test_a_bare_config_file_is_validated_as_a_config(tmp_path: Path, text: str, expected: str) -> None:
    [problem] = _lines(tmp_path, "config.yaml", text)
    assert problem.startswith(expected)


def test_a_good_bare_config_is_valid(tmp_path: Path) -> None:
    assert _lines(tmp_path, "ok.yaml", "apiVersion: resource.gpudra.io/v1beta1\nkind: GpuConfig\n") == []


@pytest.mark.parametrize("text", ["", "\n# only a comment\n", "---\n---\n"])
def test_an_empty_file_is_a_problem(tmp_path: Path, text: str) -> None:
    assert _lines(tmp_path, "empty.yaml", text) == ["holds no Kubernetes object (it is empty)"]


def test_standard_input_is_read_for_a_dash(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import io  # noqa: PLC0415

    stdin = io.TextIOWrapper(io.BytesIO(NVIDIA_CLAIM.encode()))
    monkeypatch.setattr("sys.stdin", stdin)
    assert cli.main(["validate", "-"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 5 and all(
        line.startswith("(standard input): ResourceClaimTemplate ml/old") for line in out
    )


def test_classic_dra_and_v1alpha3_manifests_are_named_not_valid(capsys: pytest.CaptureFixture[str]) -> None:
    """A pre-1.31 classic-DRA claim and NVIDIA's parameters for it are served by no API server gpudra
    runs on: each is a problem naming its apiVersion, exit 1; a v1alpha3 claim says migrate rewrites it."""
    inputs = DATA / "migrate" / "input"
    assert cli.main(["validate", str(inputs / "classic-dra.yaml"), str(inputs / "dra-v1alpha3.yaml")]) == 1
    lines = capsys.readouterr().out.splitlines()
    found = [line for line in lines if ": apiVersion: " in line]
    assert len(found) == 4, lines
    assert (
        "GpuClaimParameters two-gpus: apiVersion: gpu.resource.nvidia.com/v1alpha1 GpuClaimParameters"
        in found[0]
    )
    assert "resource.k8s.io/v1alpha2 ResourceClaimTemplate is classic DRA" in found[1]
    assert all("gpudra migrate` rewrites it as resource.k8s.io/v1" in line for line in found[2:])


def test_flow_nesting_far_past_the_bound_is_read_past_linearly_and_left_out(tmp_path: Path) -> None:
    """100,000 nested flow lists (PyYAML's scanner alone would take hours on them) in one item of a
    List, with brackets inside quoted text and a comment: the item is left out, the others checked."""
    deep = "[" * 1000 + '\'x]]\', "y\\"]", # a comment ]]\n' + "[" * 99_000 + "]" * 100_000
    items = [
        claim([opaque(GPU_CONFIG)], name="good"),
        deep_claim("deep"),
        claim([opaque(BAD_CONFIG)], name="bad"),
    ]
    path = tmp_path / "all.yaml"
    text = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items})
    path.write_text(re.sub(r"""["']?__DEEP__["']?""", lambda _: deep, text))
    problems = validate_files([path], driver=DRIVER)
    assert [(p.object, p.message) for p in problems][:1] == [("document 1, items[1]", TOO_DEEP)]
    assert [p.object for p in problems[1:]] == ["ResourceClaim ns/bad"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("a: 1\nb: " + "9" * 10_000 + "\n", "an integer of 10000 digits (at most 4300) at line 2, column 4"),
        ("a: " + "[" * 200, "found the end of the file at line 1, column 204"),
        ("a: " + "[" * 200 + "'open", "found the end of the file at line 1, column 209"),
    ],
)
def test_a_huge_integer_or_an_unclosed_deep_collection_is_one_line_naming_where(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    assert [str(p) for p in validate_files([path], driver=DRIVER)] == [
        f"{path}: is not valid YAML: {message}"
    ]
