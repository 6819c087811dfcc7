"""examples/*.yaml as a new user applies them: self-contained (a Namespace, everything in it), every
pod tolerating the taint GPU nodes usually carry, every container running until it is deleted, and
every container's output stated in the header (tests/localcluster/examples.py reads it; `make demo
RUNTIME=containerd` checks it against the real logs)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpudra.errors import ConfigError
from tests.localcluster import examples

REPO = Path(__file__).resolve().parents[3]
FILES = examples.files(REPO)
TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def test_there_are_examples() -> None:
    assert len(FILES) >= 10


@pytest.mark.parametrize("example", FILES, ids=[f.name for f in FILES])
def test_an_example_is_self_contained_in_its_namespace(example: Path) -> None:
    [namespace, *rest] = yaml.safe_load_all(example.read_text())
    assert namespace == {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": examples.NAMESPACE}}
    assert rest and all(o["metadata"]["namespace"] == examples.NAMESPACE for o in rest)


@pytest.mark.parametrize("example", FILES, ids=[f.name for f in FILES])
def test_every_pod_tolerates_the_gpu_taint_and_keeps_running(example: Path) -> None:
    pods = [o for o in examples.objects(example) if o["kind"] == "Pod"]
    assert pods
    for pod in pods:
        assert TOLERATION in pod["spec"]["tolerations"]
        for container in pod["spec"]["containers"]:
            script = [*container["command"], *container["args"]]
            assert script[:2] == ["sh", "-c"]
            # Ends waiting (a restart loop otherwise), and ends at once on SIGTERM (no 30 s grace wait).
            assert script[-1].rstrip().endswith("trap 'exit 0' TERM; sleep infinity & wait")


@pytest.mark.parametrize("example", FILES, ids=[f.name for f in FILES])
def test_every_container_says_what_it_prints(example: Path) -> None:
    logs = examples.expected_logs(example)
    assert all(expected.lines for expected in logs.values())


def test_expected_lines_match_with_placeholders_and_nothing_else() -> None:
    expected = examples.Expected(("visible: GPU-<uuid>", "/dev/nvidia<N>"))
    uuid = "GPU-0b6f8ee5-8b4f-5d8c-9c1e-3f1b2a4c5d6e"
    assert expected.matches([f"visible: {uuid}", "/dev/nvidia3"])
    assert not expected.matches([f"visible: {uuid}", "/dev/nvidia3", "/dev/nvidia4"])
    assert not expected.matches(["visible: ", "/dev/nvidia3"])
    assert not expected.matches([f"visible: {uuid}", "/dev/nvidiactl"])


def test_a_header_that_misses_a_container_is_refused(tmp_path: Path) -> None:
    example = tmp_path / "two.yaml"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": examples.NAMESPACE},
        "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
    }
    header = f"# kubectl logs -n {examples.NAMESPACE} POD [-c CONTAINER] shows:\n#   p -c a:\n#     hello\n"
    example.write_text(header + yaml.safe_dump(pod))
    with pytest.raises(ConfigError, match=r"does not say what \[\('p', 'b'\)\] print"):
        examples.expected_logs(example)
