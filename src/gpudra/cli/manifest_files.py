"""Reads the manifests `gpudra validate FILE...` checks and `gpudra explain` explains, within bounds. I/O:
the files named.

A file may come from anyone (a pull request, a tenant), so reading it is bounded before anything is
judged: only regular files (a FIFO would block forever, /dev/zero would never end), at most
MAX_FILE_BYTES, YAML aliases counted as the nodes they expand to (a kilobyte "billion laughs" file
would otherwise become gigabytes once walked), at most MAX_NODES expanded nodes and MAX_DEPTH levels
of nesting per file. Each breach is one line naming the file and the limit (a ValueError the command
turns into its message).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.events import AliasEvent
from yaml.nodes import Node

MAX_FILE_BYTES = 8 * 1024 * 1024
MAX_NODES = 1_000_000
MAX_DEPTH = 100


def read_documents(path: Path) -> list[Any]:
    """The documents of a YAML or (by suffix) JSON file; ValueError says what is wrong with it."""
    text = _read_text(path)
    if path.suffix == ".json":
        try:
            documents = [json.loads(text)]
        except json.JSONDecodeError as err:
            raise ValueError(f"is not valid JSON: {err}") from err
        except RecursionError as err:
            raise ValueError(f"nests deeper than {MAX_DEPTH} levels") from err
        for document in documents:
            _check_shape(document)
        return documents
    try:
        return list(yaml.load_all(text, Loader=_BoundedLoader))
    except _TooBig as err:
        raise ValueError(str(err)) from err
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ValueError(f"is not valid YAML: {err.problem or err.context}{where}") from err
    except yaml.YAMLError as err:
        raise ValueError(f"is not valid YAML: {err}") from err


def _read_text(path: Path) -> str:
    try:
        # O_NONBLOCK: opening a FIFO with no writer must not wait for one.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as err:
        raise ValueError(f"cannot be read: {err.strerror}") from err
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError("is a directory, not a file" if stat.S_ISDIR(mode) else "is not a regular file")
        with os.fdopen(os.dup(fd), "rb") as file:
            content = file.read(MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(content) > MAX_FILE_BYTES:
        raise ValueError(f"is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError("is not YAML or JSON: not UTF-8 text") from err


class _TooBig(ComposerError):
    pass


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts every node as often as aliases repeat it, and bounds the nesting."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._nodes = 0
        self._depth = 0
        self._sizes: dict[int, int] = {}  # id(node) -> nodes it expands to, for aliases to it

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(AliasEvent):
            node = super().compose_node(parent, index)
            if id(node) not in self._sizes:  # the anchored node is still being composed
                raise _TooBig("refers to itself through a YAML alias")
            self._count(self._sizes[id(node)])
            return node
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _TooBig(f"nests deeper than {MAX_DEPTH} levels")
        before = self._nodes
        self._count(1)
        node = super().compose_node(parent, index)
        self._depth -= 1
        self._sizes[id(node)] = self._nodes - before
        return node

    def _count(self, nodes: int) -> None:
        self._nodes += nodes
        if self._nodes > MAX_NODES:
            raise _TooBig(f"expands to more than {MAX_NODES} nodes (YAML aliases count as what they repeat)")


def _check_shape(document: Any) -> None:
    """Depth and node bounds for a parsed JSON document (iterative: deep input must not recurse)."""
    nodes = 0
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if depth > MAX_DEPTH:
            raise ValueError(f"nests deeper than {MAX_DEPTH} levels")
        if nodes > MAX_NODES:
            raise ValueError(f"has more than {MAX_NODES} values")
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        stack.extend((child, depth + 1) for child in children)
