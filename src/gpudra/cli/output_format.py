"""One output convention for every command, kubectl's: `-o table` (the default), `wide` (more
columns or detail), `json` and `yaml` (objects with camelCase fields; several as a `v1 List`). No
command colours its output, so a pipe or a file gets the same bytes as a terminal. Pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from gpudra.options.types import Choice

OUTPUT = Choice(("table", "wide", "json", "yaml"))
OUTPUT_HELP = "table (default), wide (more detail), json or yaml (camelCase objects; several as a v1 List)"


def as_list(items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": list(items)}


def one_or_list(items: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """One object as itself, any other number as a List (as `kubectl get` prints one name or several)."""
    return items[0] if len(items) == 1 else as_list(items)


def dump(document: Mapping[str, Any], output: str) -> str:
    """`document` as `output` (json or yaml), ending in a newline."""
    if output == "json":
        return json.dumps(document, indent=2) + "\n"
    return yaml.safe_dump(dict(document), sort_keys=False)


def documents(text: str) -> list[Any]:
    """What `dump` wrote, back as its objects (a List's items): for tools and tests that read it."""
    document = json.loads(text) if text.lstrip().startswith("{") else yaml.safe_load(text)
    if isinstance(document, Mapping) and document.get("kind") == "List":
        return list(document.get("items") or [])
    return [document]
