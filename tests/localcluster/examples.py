"""The manifests in examples/ as the demo and the tests use them. I/O: reads the files.

Every example is self-contained for `kubectl apply -f`: a Namespace (`gpudra-examples`), then its claims
and pods in it. Its header comment says what each container prints, in a block the demo with containerd
checks against the containers' logs:

    # ... kubectl logs -n gpudra-examples POD [-c CONTAINER] shows:
    #   pod-a, pod-b -c worker:
    #     visible: GPU-<uuid>
    #     /dev/nvidia<N>

A line ending in `:` names the containers (a pod alone means its only container); the lines under it
are what each of them prints, in order, `<uuid>` and `<N>` standing for the parts that differ per run.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from gpudra.errors import ConfigError

Obj = dict[str, Any]
NAMESPACE: Final = "gpudra-examples"
_LOGS: Final = f"kubectl logs -n {NAMESPACE} POD [-c CONTAINER] shows:"
_TARGETS: Final = re.compile(r"#   (\S.*):")
_LINE: Final = re.compile(r"#     (\S.*)")
_PLACEHOLDERS: Final = {"<uuid>": "[0-9a-f-]{36}", "<N>": "[0-9]+"}


def files(repo: Path) -> list[Path]:
    return sorted((repo / "examples").glob("*.yaml"))


def objects(example: Path, *, namespace: str | None = None) -> list[Obj]:
    """The example's objects without its Namespace; with `namespace`, moved into that one (for a test
    that keeps each run in a namespace of its own)."""
    found = [o for o in yaml.safe_load_all(example.read_text()) if o["kind"] != "Namespace"]
    if namespace is not None:
        for obj in found:
            obj["metadata"]["namespace"] = namespace
    return found


@dataclass(frozen=True)
class Expected:
    """What one container of an example prints: a pattern per line."""

    lines: tuple[str, ...]  # as the example writes them

    def matches(self, output: list[str]) -> bool:
        return len(output) == len(self.lines) and all(
            _pattern(line).fullmatch(got) for line, got in zip(self.lines, output, strict=True)
        )


def expected_logs(example: Path) -> dict[tuple[str, str], Expected]:
    """(pod, container) -> what the example says that container prints; every container of every pod
    in the example must be named (ConfigError otherwise)."""
    comment = [line for line in example.read_text().splitlines() if line.startswith("#")]
    try:
        start = next(i for i, line in enumerate(comment) if line.endswith(_LOGS)) + 1
    except StopIteration:
        raise ConfigError(f"no '{_LOGS}' block in its header", field=example.name) from None
    blocks: list[tuple[list[str], list[str]]] = []
    for line in comment[start:]:
        if (targets := _TARGETS.fullmatch(line)) is not None:
            blocks.append((targets[1].split(", "), []))
        elif (printed := _LINE.fullmatch(line)) is not None and blocks:
            blocks[-1][1].append(printed[1])
        else:
            break
    pods = {o["metadata"]["name"]: o for o in objects(example) if o["kind"] == "Pod"}
    found: dict[tuple[str, str], Expected] = {}
    for targets, lines in blocks:
        for target in targets:
            found[_container(target, pods, example)] = Expected(tuple(lines))
    every = {(name, c["name"]) for name, pod in pods.items() for c in pod["spec"]["containers"]}
    if missing := sorted(every - set(found)):
        raise ConfigError(f"its header does not say what {missing} print", field=example.name)
    return found


def _container(target: str, pods: Mapping[str, Obj], example: Path) -> tuple[str, str]:
    pod, _, container = target.partition(" -c ")
    if pod not in pods:
        raise ConfigError(f"its header names pod {pod!r}, not one of {sorted(pods)}", field=example.name)
    names = [c["name"] for c in pods[pod]["spec"]["containers"]]
    if not container and len(names) == 1:
        return pod, names[0]
    if container not in names:
        raise ConfigError(f"{target!r}: name one of the containers {names} with -c", field=example.name)
    return pod, container


def _pattern(line: str) -> re.Pattern[str]:
    parts = re.split(r"(<[^>]+>)", line)
    return re.compile("".join(_PLACEHOLDERS.get(p) or re.escape(p) for p in parts))
