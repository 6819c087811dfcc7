"""`gpudra validate FILE...`: the gpudra configs in ResourceClaims, templates and DeviceClasses, checked
before they reach a cluster. I/O: the files named (read by `gpudra.cli.manifest_files`, bounded) and
stdout; the judging is `gpudra.model.manifests`, the admission webhook's own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from gpudra.cli.manifest_files import read_documents
from gpudra.model.manifests import Problem, validate_documents


def run(files: Sequence[Path], *, driver: str) -> int:
    """Print every problem, or that the files are valid; the exit code: 1 when there is a problem."""
    problems = validate_files(files, driver=driver)
    for problem in problems:
        print(problem)
    if not problems:
        print(f"{len(files)} file(s) valid")
    return 1 if problems else 0


def validate_files(paths: Sequence[Path], *, driver: str) -> list[Problem]:
    """Every problem in the YAML (multi-document) or JSON files; an unreadable file is a Problem too."""
    problems = []
    for path in paths:
        file = str(path)
        try:
            documents = read_documents(path)
        except ValueError as err:
            problems.append(Problem(file, "", "", str(err)))
            continue
        objects = []
        for number, document in enumerate(documents, start=1):
            if document is None:
                continue
            if isinstance(document, Mapping) and "kind" in document and "apiVersion" in document:
                objects.append((file, document))
            else:
                problems.append(
                    Problem(
                        file, f"document {number}", "", "is not a Kubernetes object (no apiVersion and kind)"
                    )
                )
        problems.extend(validate_documents(objects, driver=driver))
    return problems
