"""JSON that other tenants wrote, decoded object by object within bounds. Pure.

Anyone who may create a ResourceClaim can nest its opaque parameters thousands of levels deep; the API
server stores it, and Python's JSON decoder refuses it with RecursionError. Decoding a whole LIST page
(or a watch event, or an AdmissionReview) at once lets that one object fail everything around it: the
controller once lost its picture of the cluster to one such claim of another driver. So `decode` takes
the *shape* of a document: which members hold objects that others write (`{"items": EACH}` for a list
page, `{"object": ONE}` for a watch event). Each such object is decoded on its own and checked against
MAX_DEPTH and MAX_CHARS; one that breaks a bound is replaced by a `Poisoned` record (its namespace, name
and resourceVersion, read without building it) and the rest of the document is used. A part of the
document outside the shape that breaks a bound makes the whole document `Unreadable`.

The bounds: MAX_DEPTH = 100 levels of objects and arrays, as `gpudra validate` allows in a file. Real
Kubernetes objects nest about 15 deep (a claim's CEL selector, a Pod's volume), and what gpudra does
with them afterwards (copies, JSON encoding, pydantic) recurses once or more per level: 100 keeps every
such walk far from Python's recursion limit of 1000, whatever thread it runs in. MAX_CHARS = 4 MiB of
JSON text per object: above anything a default API server stores (its request limit is 3 MiB, etcd's
1.5 MiB), so it drops nothing real, but a decoder fed by something else (a webhook's client, a file)
cannot be made to build one arbitrarily large object.

Checking the depth of an object the decoder accepted costs a few C-speed passes over its text (strings
and scalars deleted, then the innermost pairs of brackets removed once per level), about a sixth of
decoding it; finding where an undecodable object ends is a token scan, paid only for poisoned objects.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

MAX_DEPTH = 100
MAX_CHARS = 4 * 1024 * 1024

# A shape: ONE (the value is one object others write), EACH (an array of them), or a mapping from member
# names to shapes (an object whose other members are the document's own).
ONE: Final = "one"
EACH: Final = "each"
Shape = Mapping[str, Any] | str

Path = tuple[str, ...]  # keys from the object's top; "*" stands for any index of an array
NAMESPACE: Path = ("metadata", "namespace")
NAME: Path = ("metadata", "name")
RESOURCE_VERSION: Path = ("metadata", "resourceVersion")
METADATA: frozenset[Path] = frozenset({NAMESPACE, NAME, RESOURCE_VERSION})

_DECODER = json.JSONDecoder()
_WHITESPACE = re.compile(r"[ \t\n\r]*")
# Escapes are removed first (none can be a bracket or end a string), then everything but quotes and
# brackets: the brackets of strings are then between adjacent quotes, and the rest is structure.
_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_NOT_STRUCTURE = bytes(set(range(256)) - set(b'"[]{}'))
_NOT_VALUE_STRUCTURE = bytes(set(range(256)) - set(b'"[]{},'))
_STRING_LEFT = re.compile(rb'"[^"]*"')
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}:,]', re.DOTALL)


@dataclass(frozen=True)
class Poisoned:
    """An object left out of a document: why (`reason`, a metric label: "too-deep", "too-large" or
    "too-many-values", the webhook's bound on a review), and
    the strings found at the paths asked for (by default its namespace, name and resourceVersion)."""

    reason: str
    strings: Mapping[Path, tuple[str, ...]] = field(default_factory=dict)

    @property
    def problem(self) -> str:
        """What is wrong, to follow "the object": e.g. "nests too deeply to decode (more than 100 levels)"."""
        if self.reason == "too-large":
            return f"is too large to decode (more than {MAX_CHARS // (1024 * 1024)} MiB of JSON)"
        if self.reason == "too-many-values":
            return "holds too many values to decode"
        return f"nests too deeply to decode (more than {MAX_DEPTH} levels)"

    def first(self, path: Path) -> str:
        return next(iter(self.strings.get(path, ())), "")

    @property
    def namespace(self) -> str:
        return self.first(NAMESPACE)

    @property
    def name(self) -> str:
        return self.first(NAME)

    @property
    def resource_version(self) -> str:
        return self.first(RESOURCE_VERSION)

    @property
    def ref(self) -> str:
        """namespace/name, or the name of a cluster-scoped object, or "(unnamed)"."""
        name = self.name or "(unnamed)"
        return f"{self.namespace}/{name}" if self.namespace else name


class Unreadable(ValueError):
    """The document itself breaks a bound (outside the members its shape names)."""

    def __init__(self, poisoned: Poisoned) -> None:
        super().__init__(poisoned.problem)
        self.poisoned = poisoned


def decode(text: str, shape: Shape, *, keep: Collection[Path] = METADATA) -> Any:
    """The JSON document `text`, the objects its `shape` names each checked on its own: one that breaks
    a bound is a `Poisoned` in its place, carrying the strings at the paths `keep` names. ValueError when
    the text is not JSON; `Unreadable` when a part outside the shape breaks a bound."""
    value, end = _value(text, _skip_space(text, 0), shape, keep)
    end = _skip_space(text, end)
    if end != len(text):
        raise ValueError(f"extra data after the JSON value at character {end}")
    return value


def _skeleton(text: str, keep: bytes = _NOT_STRUCTURE) -> bytes:
    """The structure of the JSON text: its brackets (and what `keep` leaves), strings removed."""
    skeleton = text.encode()
    if b"\\" in skeleton:
        skeleton = _ESCAPE.sub(b"", skeleton)
    skeleton = skeleton.translate(None, keep).replace(b'""', b"")
    if b'"' in skeleton:
        skeleton = _STRING_LEFT.sub(b"", skeleton)
    return skeleton


def count_values(text: str) -> int:
    """How many values decoding the JSON text would build, at most: its objects and arrays, and one per
    comma (the members and items after each first), counted at C speed without building any, so that a
    body can be refused before it costs the memory of a million empty objects."""
    skeleton = _skeleton(text, _NOT_VALUE_STRUCTURE)
    return 1 + skeleton.count(b"{") + skeleton.count(b"[") + skeleton.count(b",")


def nesting_exceeds(text: str, limit: int = MAX_DEPTH) -> bool:
    """Whether the JSON value `text` nests objects and arrays more than `limit` levels deep."""
    skeleton = _skeleton(text)
    for _ in range(limit):
        if not skeleton:
            return False
        # One level: every innermost pair at once. The mark keeps "{[]}" from losing two levels in a pass.
        skeleton = skeleton.replace(b"[]", b"\0").replace(b"{}", b"\0").replace(b"\0", b"")
    return bool(skeleton)


def _skip_space(text: str, index: int) -> int:
    return _WHITESPACE.match(text, index).end()  # type: ignore[union-attr]  # matches the empty string


def _value(text: str, index: int, shape: Shape, keep: Collection[Path]) -> tuple[Any, int]:
    opening = text[index : index + 1]
    if shape == EACH and opening == "[":
        return _array(text, index, keep)
    if isinstance(shape, Mapping) and opening == "{":
        return _object(text, index, shape, keep)
    value, end = _bounded(text, index, keep)
    if isinstance(value, Poisoned) and shape != ONE:
        raise Unreadable(value)  # the document's own part (or the wrong type where a shape was expected)
    return value, end


def _array(text: str, index: int, keep: Collection[Path]) -> tuple[list[Any], int]:
    items: list[Any] = []
    index = _skip_space(text, index + 1)
    if text.startswith("]", index):
        return items, index + 1
    while True:
        item, index = _bounded(text, index, keep)
        items.append(item)
        index = _skip_space(text, index)
        if text.startswith("]", index):
            return items, index + 1
        index = _skip_space(text, _expect(text, index, ","))


def _object(text: str, index: int, shape: Mapping[str, Any], keep: Collection[Path]) -> tuple[Any, int]:
    members: dict[str, Any] = {}
    index = _skip_space(text, index + 1)
    if text.startswith("}", index):
        return members, index + 1
    while True:
        key, index = _DECODER.raw_decode(text, index)
        if not isinstance(key, str):
            raise ValueError(f"expected a member name at character {index}")
        index = _skip_space(text, _expect(text, _skip_space(text, index), ":"))
        inner = shape.get(key)
        members[key], index = _value(text, index, inner, keep) if inner else _own(text, index)
        index = _skip_space(text, index)
        if text.startswith("}", index):
            return members, index + 1
        index = _skip_space(text, _expect(text, index, ","))


def _own(text: str, index: int) -> tuple[Any, int]:
    value, end = _bounded(text, index, ())
    if isinstance(value, Poisoned):
        raise Unreadable(value)
    return value, end


def _expect(text: str, index: int, char: str) -> int:
    if not text.startswith(char, index):
        raise ValueError(f"expected {char!r} at character {index}")
    return index + 1


def _bounded(text: str, index: int, keep: Collection[Path]) -> tuple[Any, int]:
    """The value at `index` and where it ends; a `Poisoned` in its place when it breaks a bound."""
    try:
        value, end = _DECODER.raw_decode(text, index)
    except RecursionError:
        end, strings = _scan(text, index, keep)
        return Poisoned("too-deep", strings), end
    if not isinstance(value, dict | list):
        return (Poisoned("too-large"), end) if end - index > MAX_CHARS else (value, end)
    if end - index > MAX_CHARS:
        return Poisoned("too-large", _scan(text, index, keep)[1]), end
    if nesting_exceeds(text[index:end]):
        return Poisoned("too-deep", _scan(text, index, keep)[1]), end
    return value, end


def _scan(text: str, index: int, keep: Collection[Path]) -> tuple[int, dict[Path, tuple[str, ...]]]:
    """Where the object or array at `index` ends, and the strings at the paths `keep` names, read token
    by token without building anything (iterative: any depth is safe)."""
    longest = max((len(path) for path in keep), default=0)
    found: dict[Path, list[str]] = {}
    # A frame per open container: [is it an object, the member (or "*": an array's item) being read,
    # whether the next string is a member's name].
    frames: list[list[Any]] = []
    for match in _TOKEN.finditer(text, index):
        token = match.group()
        if token in ("{", "["):
            frames.append([token == "{", "*", token == "{"])
        elif token in ("}", "]"):
            frames.pop()
            if not frames:
                return match.end(), {path: tuple(values) for path, values in found.items()}
        elif token == ",":
            frames[-1][2] = frames[-1][0]
        elif token == ":":
            continue
        elif frames[-1][2]:
            frames[-1][1], frames[-1][2] = json.loads(token), False
        elif len(frames) <= longest:
            path = tuple(frame[1] for frame in frames)
            if path in keep:
                found.setdefault(path, []).append(json.loads(token))
    raise ValueError("the JSON text ends inside an object or array")
