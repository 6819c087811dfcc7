"""`gpudra validate PATH...`: the gpudra configs in ResourceClaims, templates and DeviceClasses, checked
before they reach a cluster. I/O: the files named (read by `gpudra.cli.manifest_files`, bounded) and
stdout; the judging is `gpudra.model.manifests`, the admission webhook's own.

A directory stands for the files directly in it whose names end in .yaml, .yml or .json, in name order,
as `kubectl apply -f DIR` reads it (subdirectories are not entered); one holding none is a problem.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from gpudra.cli.manifest_files import read_documents
from gpudra.model.manifests import Problem, validate_documents

SUFFIXES = (".yaml", ".yml", ".json")


def run(paths: Sequence[Path], *, driver: str) -> int:
    """Print every problem, or that the files are valid. The exit code: 0 when every file is valid, 1
    when there is a problem (a bad config, a file that cannot be read, a directory without manifests)."""
    files, problems = check(paths, driver=driver)
    for problem in problems:
        print(problem)
    if not problems:
        print(f"{files} file(s) valid")
    return 1 if problems else 0


def validate_files(paths: Sequence[Path], *, driver: str) -> list[Problem]:
    """Every problem in the YAML (multi-document) or JSON files and directories; an unreadable file is
    a Problem too."""
    return check(paths, driver=driver)[1]


def check(paths: Sequence[Path], *, driver: str) -> tuple[int, list[Problem]]:
    """How many files were read, and every problem in them (see `validate_files`)."""
    problems: list[Problem] = []
    files = 0
    for given in paths:
        found, problem = _files(given)
        problems += [problem] if problem is not None else []
        for path in found:
            files += 1
            problems += _file_problems(path, driver=driver)
    return files, problems


def _files(path: Path) -> tuple[list[Path], Problem | None]:
    """`path` itself, or the manifests of the directory it names (see the module docstring)."""
    if not path.is_dir():
        return [path], None
    try:
        found = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and not p.is_dir())
    except OSError as err:
        return [], Problem(str(path), "", "", f"cannot be read: {err.strerror}")
    if not found:
        allowed = ", ".join(SUFFIXES)
        return [], Problem(str(path), "", "", f"is a directory holding no {allowed} file")
    return found, None


def _file_problems(path: Path, *, driver: str) -> list[Problem]:
    file = str(path)
    try:
        read = read_documents(path)
    except ValueError as err:
        return [Problem(file, "", "", str(err))]
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
    return problems + validate_documents(objects, driver=driver)
