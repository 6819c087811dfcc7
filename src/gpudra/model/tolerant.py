"""Reading JSON that others wrote without raising: a field of the wrong type reads as absent. Pure.

The API server's objects, a user's manifest files and a tenant's fields can hold anything where an
object, a list or a string belongs (a file is never validated; anyone may write a claim's
`status.devices`). The readers of those objects (`gpudra.model.claim`,
`gpudra.model.cluster_objects`, the migration tooling) take each field through one of these, so that
"absent" and "not what it should be" mean the same everywhere, and no reader needs its own `or {}`.
A reader that must tell the two apart (a spec whose problems are reported) checks the type itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

__all__ = ["EMPTY", "flag", "items", "mapping", "objects", "scalar", "text", "text_or_none"]

# Read-only, so that no caller can fill the fallback every absent object shares.
EMPTY: Mapping[str, Any] = MappingProxyType({})


def mapping(value: object) -> Mapping[str, Any]:
    """`value` when it is an object, else an empty one."""
    return value if isinstance(value, Mapping) else EMPTY


def items(value: object) -> list[Any]:
    """`value` when it is a list, else an empty one; its entries as written (each still to be checked)."""
    return value if isinstance(value, list) else []


def objects(value: object) -> list[Mapping[str, Any]]:
    """The entries of a list that are objects; the others are left out."""
    return [entry for entry in items(value) if isinstance(entry, Mapping)]


def text(value: object) -> str:
    """`value` when it is a string, else empty."""
    return value if isinstance(value, str) else ""


def text_or_none(value: object) -> str | None:
    """`value` when it is a string, else None: for a field whose absence means something of its own."""
    return value if isinstance(value, str) else None


def scalar(value: object) -> str | None:
    """A label's, a selector value's or a quantity's text: a string, or a number's or boolean's text as
    `str` writes it (YAML reads `gpus: 8` as a number, and a hand-written file is compared as
    written); None for null, an object or a list."""
    if isinstance(value, str):
        return value
    return str(value) if isinstance(value, int | float) else None


def flag(value: object) -> bool:
    """True only for JSON's true (a string "true" is no boolean)."""
    return value is True
