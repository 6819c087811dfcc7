"""`gpudra validate PATH...`: the gpudra configs in ResourceClaims, templates and DeviceClasses, checked
before they reach a cluster, and what a move from NVIDIA's DRA driver left behind. I/O: the files named
(read by `gpudra.cli.manifest_files`, bounded; `-` is standard input) and stdout; the judging is
`gpudra.model.manifests` (the admission webhook's own config checks) and `gpudra.migrate.migration` (NVIDIA
leftovers, another driver's config on gpudra's requests, a template without spec.spec, bare configs).

A directory stands for the files directly in it whose names end in .yaml, .yml or .json, in name order,
as `kubectl apply -f DIR` reads it (subdirectories are not entered).

A valid config that does otherwise than it may seem to (TimeSlicing on a MIG device sets nothing) is
named on stderr as a warning, which does not change the exit code.

Exit codes: 0 when every file is valid; 1 when there is a problem in one (a bad config, a leftover, a
file that is not YAML, an empty file); 2 when a path cannot be read (missing, not a regular file, a
directory holding no manifests, too large) or the command line is wrong.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpudra.cli.manifest_files import STDIN, UnreadableFile, read_documents
from gpudra.cli.output_format import as_list, dump
from gpudra.migrate.migration import migration_problems
from gpudra.model.manifests import Problem, document_warnings, validate_documents

SUFFIXES = (".yaml", ".yml", ".json")
EXIT_PROBLEMS = 1
EXIT_UNREADABLE = 2


@dataclass
class Findings:
    """What `check` found: how many files were read, the problems in them, the paths not read."""

    files: int = 0
    problems: list[Problem] = field(default_factory=list)
    unreadable: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)  # valid configs that do otherwise than they seem


def run(paths: Sequence[Path], *, driver: str, output: str = "table") -> int:
    """Print every problem (stdout; json, yaml: a List of them) and every path that cannot be read
    (stderr), or that the files are valid; the exit code as the module says."""
    found = check(paths, driver=driver)
    structured = output in ("json", "yaml")
    if structured:
        sys.stdout.write(dump(as_list([asdict(p) for p in found.problems]), output))
    for problem in [] if structured else found.problems:
        print(problem)
    for problem in found.unreadable:
        print(f"gpudra validate: {problem}", file=sys.stderr)
    for warning in found.warnings:
        print(f"gpudra validate: warning: {warning}", file=sys.stderr)
    if not found.problems and not found.unreadable and not structured:
        print(f"{found.files} file(s) valid")
    return EXIT_UNREADABLE if found.unreadable else EXIT_PROBLEMS if found.problems else 0


def validate_files(paths: Sequence[Path], *, driver: str) -> list[Problem]:
    """Every problem in the YAML (multi-document) or JSON files and directories; an unreadable file is
    a Problem too."""
    found = check(paths, driver=driver)
    return found.unreadable + found.problems


def check(paths: Sequence[Path], *, driver: str) -> Findings:
    found = Findings()
    for given in paths:
        files, problem = _files(given)
        found.unreadable += [problem] if problem is not None else []
        for path in files:
            _check_file(path, driver=driver, found=found)
    return found


def _files(path: Path) -> tuple[list[Path], Problem | None]:
    """`path` itself, or the manifests of the directory it names (see the module docstring)."""
    if path == STDIN or not path.is_dir():
        return [path], None
    try:
        found = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and not p.is_dir())
    except OSError as err:
        return [], Problem(str(path), "", "", f"cannot be read: {err.strerror}")
    if not found:
        allowed = ", ".join(SUFFIXES)
        return [], Problem(str(path), "", "", f"is a directory holding no {allowed} file")
    return found, None


def _check_file(path: Path, *, driver: str, found: Findings) -> None:
    file = "(standard input)" if path == STDIN else str(path)
    try:
        read = read_documents(path)
    except UnreadableFile as err:
        found.unreadable.append(Problem(file, "", "", str(err)))
        return
    except ValueError as err:
        found.files += 1
        found.problems.append(Problem(file, "", "", str(err)))
        return
    found.files += 1
    problems = [Problem(file, skipped.where, "", skipped.reason) for skipped in read.skipped]
    objects = []
    for number, document in enumerate(read.documents, start=1):
        if document is None:  # empty, or left out (then in read.skipped)
            continue
        if isinstance(document, Mapping) and "kind" in document and "apiVersion" in document:
            objects.append((file, document))
        else:
            problems.append(
                Problem(file, f"document {number}", "", "is not a Kubernetes object (no apiVersion and kind)")
            )
    if not objects and not problems:
        problems.append(Problem(file, "", "", "holds no Kubernetes object (it is empty)"))
    found.problems += (
        problems + validate_documents(objects, driver=driver) + migration_problems(objects, driver=driver)
    )
    found.warnings += document_warnings(objects, driver=driver)
