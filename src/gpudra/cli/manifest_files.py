"""Reads the manifests `gpudra validate FILE...` checks and `gpudra explain` explains, within bounds. I/O:
the files named.

A file may come from anyone (a pull request, a tenant), so reading it is bounded before anything is
judged: only regular files (a FIFO would block forever, /dev/zero would never end), at most
MAX_FILE_BYTES, YAML aliases counted as the nodes they expand to (a kilobyte "billion laughs" file
would otherwise become gigabytes once walked), at most MAX_NODES expanded nodes per file. Each breach
is one line naming the file and the limit (a ValueError the command turns into its message; an
`UnreadableFile` one when the file could not be read at all, which `gpudra validate` counts as an I/O
error rather than a problem in the file). `-` names standard input, read within the same bounds.

Nesting is bounded per object, as in everything gpudra reads that others write (`gpudra.bounded_json`):
a document, or an item of a List (`kubectl get resourceclaims -A -o yaml` holds every tenant's claims),
that nests deeper than MAX_DEPTH levels is left out (None in its place) and named in `Documents.skipped`,
and the rest of the file is used.

Every file is read in time proportional to its size (about 2 s per MiB of YAML here, 8 MiB at most):
PyYAML's scanner costs the square of the nesting for each token inside flow collections (`[[[[...`),
so past MAX_DEPTH flow levels the rest of such a collection is read past by a linear scan, as one
value (which the nesting bound then leaves out), never tokenised. An integer of more than
MAX_INT_DIGITS digits is refused naming its line (CPython's own limit, which would otherwise end the
read with its own words).
"""

from __future__ import annotations

import os
import re
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.events import AliasEvent, CollectionEndEvent, CollectionStartEvent
from yaml.nodes import Node, ScalarNode
from yaml.scanner import ScannerError
from yaml.tokens import ScalarToken

from gpudra import bounded_json

MAX_FILE_BYTES = 8 * 1024 * 1024
MAX_NODES = 1_000_000
MAX_DEPTH = bounded_json.MAX_DEPTH
MAX_INT_DIGITS = 4300  # CPython's int() refuses longer decimal text (sys.get_int_max_str_digits())
_TOO_DEEP = f"nests deeper than {MAX_DEPTH} levels"


STDIN = Path("-")


class UnreadableFile(ValueError):
    """The file cannot be read: missing, not a regular file, a directory, too large, unreadable."""


@dataclass(frozen=True)
class Skipped:
    """A document, or an item of a List, left out of a file: which ("document 2", "document 1,
    items[3]", counted from 1 and 0 as `gpudra validate` counts them) and why."""

    where: str
    reason: str


@dataclass
class Documents:
    """A file's documents, None in place of each document or List item left out (`skipped`)."""

    documents: list[Any]
    skipped: list[Skipped] = field(default_factory=list)


def read_documents(path: Path) -> Documents:
    """The documents of a YAML or (by suffix) JSON file, or of standard input (`-`: YAML, of which JSON
    is a part); ValueError says what is wrong with the file."""
    return parse_documents(read_text(path), json_text=path.suffix == ".json")


def read_text(path: Path) -> str:
    """The text of a file or of standard input (`-`), within the bounds above; `UnreadableFile` or
    ValueError (not UTF-8) says what is wrong."""
    return _read_stdin() if path == STDIN else _read_text(path)


class NodeBudget:
    """The MAX_NODES bound shared by the parses of one file's pieces (`gpudra migrate` parses each
    document's text on its own)."""

    def __init__(self) -> None:
        self.nodes = 0


def parse_documents(
    text: str, *, json_text: bool = False, budget: NodeBudget | None = None, first: int = 1
) -> Documents:
    """The documents of YAML text (or JSON, one document), within the bounds above; `budget` counts
    the nodes of several texts of one file together, whose first document here is number `first`."""
    if json_text:
        return _json_documents(text)
    loader = _BoundedLoader(text, budget or NodeBudget())
    try:
        documents = []
        while loader.check_data():  # type: ignore[no-untyped-call]
            documents.append(loader.get_data())
    except _TooBig as err:
        raise ValueError(str(err)) from err
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ValueError(f"is not valid YAML: {err.problem or err.context}{where}") from err
    except yaml.YAMLError as err:
        raise ValueError(f"is not valid YAML: {err}") from err
    finally:
        loader.dispose()
    found = Documents(documents)
    for number, item in sorted(loader.too_deep, key=lambda at: (at[0], -1 if at[1] is None else at[1])):
        _leave_out(found, number, item, _TOO_DEEP, first=first)
    return found


# A line that starts a document (`---`) or ends one (`...`): at column 0, then a blank, a comment or the
# end of the line. YAML allows neither at column 0 inside a document's content, block scalars included.
_DOCUMENT_START = re.compile(r"---(?=[ \t\r\n]|$)")
_DOCUMENT_END = re.compile(r"\.\.\.(?=[ \t\r\n]|$)")
_LINE = re.compile(r"[^\n]*\n|[^\n]+$")


def document_texts(text: str) -> list[str]:
    """`text` cut into the text of each document: a `---` line begins one, a `...` line ends one (and
    belongs to it). Joined, the pieces are `text`, byte for byte; each holds at most one document, so
    that one can be rewritten and the others written back untouched (`gpudra migrate`)."""
    pieces: list[str] = []
    current = ""
    for line in _LINE.findall(text):
        if _DOCUMENT_START.match(line) and current:
            pieces.append(current)
            current = ""
        current += line
        if _DOCUMENT_END.match(line):
            pieces.append(current)
            current = ""
    if current:
        pieces.append(current)
    return pieces


def _json_documents(text: str) -> Documents:
    try:
        document = bounded_json.decode(text, {"items": bounded_json.EACH}, keep=())
    except bounded_json.Unreadable as err:
        reason = _TOO_DEEP if err.poisoned.reason == "too-deep" else f"the object {err.poisoned.problem}"
        return Documents([None], [Skipped("document 1", reason)])
    except ValueError as err:
        raise ValueError(f"is not valid JSON: {err}") from err
    found = Documents([document])
    items = document.get("items") if isinstance(document, dict) else None
    for index, item in enumerate(items if isinstance(items, list) else []):
        if isinstance(item, bounded_json.Poisoned):
            reason = _TOO_DEEP if item.reason == "too-deep" else f"the object {item.problem}"
            _leave_out(found, 1, index, reason)
    _check_shape(document)
    return found


def _leave_out(found: Documents, number: int, item: int | None, reason: str, *, first: int = 1) -> None:
    """Document `number` (from 1), or item `item` of its List, replaced by None and named in `skipped`
    (as document `number + first - 1` of the file)."""
    document = found.documents[number - 1]
    named = number + first - 1
    items = document.get("items") if isinstance(document, dict) and item is not None else None
    if isinstance(items, list) and item is not None and item < len(items):
        items[item] = None
        found.skipped.append(Skipped(f"document {named}, items[{item}]", reason))
    elif document is not None:
        found.documents[number - 1] = None
        found.skipped.append(Skipped(f"document {named}", reason))


def _read_stdin() -> str:
    try:
        content = sys.stdin.buffer.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise UnreadableFile(f"cannot be read: {err.strerror}") from err
    return _decoded(content)


def _read_text(path: Path) -> str:
    try:
        # O_NONBLOCK: opening a FIFO with no writer must not wait for one.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as err:
        raise UnreadableFile(f"cannot be read: {err.strerror}") from err
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnreadableFile(
                "is a directory, not a file" if stat.S_ISDIR(mode) else "is not a regular file"
            )
        with os.fdopen(os.dup(fd), "rb") as file:
            content = file.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise UnreadableFile(f"cannot be read: {err.strerror}") from err
    finally:
        os.close(fd)
    return _decoded(content)


def _decoded(content: bytes) -> str:
    if len(content) > MAX_FILE_BYTES:
        raise UnreadableFile(f"is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError("is not YAML or JSON: not UTF-8 text") from err


class _TooBig(ComposerError):
    pass


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts every node as often as aliases repeat it, and leaves out what nests too
    deeply: such a node's events are read past without composing them, a null takes its place, and
    `too_deep` names its document (from 1) and, inside a List's `items`, its item (else None)."""

    def __init__(self, stream: str, budget: NodeBudget) -> None:
        super().__init__(stream)
        self._budget = budget
        self._sizes: dict[int, int] = {}  # id(node) -> nodes it expands to, for aliases to it
        self._document = 0
        self._path: list[object] = []  # per open node, its index in its parent (compose_node's)
        self.too_deep: set[tuple[int, int | None]] = set()

    def compose_document(self) -> Node | None:
        self._document += 1
        return super().compose_document()

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(AliasEvent):
            node = super().compose_node(parent, index)
            if id(node) not in self._sizes:  # the anchored node is still being composed
                raise _TooBig("refers to itself through a YAML alias")
            self._count(self._sizes[id(node)])
            return node
        if len(self._path) >= MAX_DEPTH:
            return self._skip()
        self._path.append(index)
        before = self._budget.nodes
        self._count(1)
        node = super().compose_node(parent, index)
        self._path.pop()
        self._sizes[id(node)] = self._budget.nodes - before
        return node

    def _skip(self) -> Node:
        """Reads past the node that starts here; records where it was; a null in its place."""
        start = event = self.get_event()  # type: ignore[no-untyped-call]
        level = int(isinstance(event, CollectionStartEvent))
        while level:
            event = self.get_event()  # type: ignore[no-untyped-call]
            level += isinstance(event, CollectionStartEvent) - isinstance(event, CollectionEndEvent)
        key = self._path[1] if len(self._path) > 1 else None  # the root's member holding the node
        item = self._path[2] if len(self._path) > 2 else None
        in_items = isinstance(key, ScalarNode) and key.value == "items" and isinstance(item, int)
        self.too_deep.add((self._document, item if in_items and isinstance(item, int) else None))
        return ScalarNode("tag:yaml.org,2002:null", "", start.start_mark, event.end_mark)

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:
        """PyYAML's, but past MAX_DEPTH flow levels the collection is read past (see the module's
        docstring) and stands as one plain scalar, which the composer leaves out as too deep."""
        if self.flow_level < MAX_DEPTH:
            super().fetch_flow_collection_start(TokenClass)
            return
        self.save_possible_simple_key()
        self.allow_simple_key = False
        start = self.get_mark()
        self._read_past_flow_collection(start)
        self.tokens.append(ScalarToken("", True, start, self.get_mark()))

    def _read_past_flow_collection(self, start: Any) -> None:
        """From its opening bracket to its closing one, quoted scalars and comments included: linear."""
        depth = 0
        while True:
            char = self.peek()
            if char == "\0":
                raise ScannerError(
                    "while scanning a flow collection", start, "found the end of the file", self.get_mark()
                )
            if char in "[{":
                depth += 1
            elif char in "]}":
                depth -= 1
                if depth == 0:
                    self.forward()
                    return
            elif char in "'\"":
                self._read_past_quoted(char, start)
                continue
            elif char == "#" and self.peek(-1) in " \t\r\n":
                while self.peek() not in "\0\r\n\x85\u2028\u2029":
                    self.forward()
                continue
            self.forward()

    def _read_past_quoted(self, quote: str, start: Any) -> None:
        self.forward()
        while True:
            char = self.peek()
            if char == "\0":
                raise ScannerError(
                    "while scanning a quoted scalar", start, "found the end of the file", self.get_mark()
                )
            if quote == '"' and char == "\\":
                self.forward(2)
                continue
            self.forward()
            if char == quote:
                if quote == "'" and self.peek() == "'":
                    self.forward()  # '' is a quote inside
                    continue
                return

    def construct_yaml_int(self, node: Any) -> Any:
        digits = sum(char.isdigit() for char in str(node.value))
        if digits > MAX_INT_DIGITS:
            raise ConstructorError(
                None, None, f"an integer of {digits} digits (at most {MAX_INT_DIGITS})", node.start_mark
            )
        return super().construct_yaml_int(node)

    def _count(self, nodes: int) -> None:
        self._budget.nodes += nodes
        if self._budget.nodes > MAX_NODES:
            raise _TooBig(f"expands to more than {MAX_NODES} nodes (YAML aliases count as what they repeat)")


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def _check_shape(document: Any) -> None:
    """The node bound for a parsed JSON document (iterative; its depth is bounded per object already)."""
    nodes = 0
    stack: list[Any] = [document]
    while stack:
        value = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise ValueError(f"has more than {MAX_NODES} values")
        stack.extend(value.values() if isinstance(value, dict) else value if isinstance(value, list) else ())
