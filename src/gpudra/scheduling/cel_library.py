"""What a DRA selector may call beyond the CEL core, for cel-python: Kubernetes' `kubernetes.Semver` and
`kubernetes.Quantity` with their libraries (apiserver/pkg/cel/library semverlib.go, quantity.go), the
string extensions, and cel-go's runtime equality. Pure.

Each function takes cel-python values and returns one, or a CELEvalError worded as cel-go words it
("no such overload", blang/semver's parse errors, apimachinery's quantity format error); `FUNCTIONS` is
what `gpudra.scheduling.cel` hands cel-python. Semver and Quantity have no `<`: cel-go has none for them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from celpy import celtypes
from celpy.evaluation import CELEvalError

from gpudra.errors import ConfigError
from gpudra.quantity import parse_quantity

__all__ = ["FUNCTIONS", "Quantity", "Semver", "runtime_type"]

# --- Semver and Quantity -------------------------------------------------------------------------

_DIGITS = re.compile(r"[0-9]*")
_IDENTIFIER_CHARS = re.compile(r"[0-9A-Za-z-]*")


@dataclass(frozen=True, eq=False)
class Semver:
    """A semantic version as blang/semver (Kubernetes' `kubernetes.Semver`) parses and orders it."""

    major: int
    minor: int
    patch: int
    pre: tuple[int | str, ...] = ()
    build: tuple[str, ...] = ()

    @staticmethod
    def parse(text: str, *, normalize: bool = False) -> Semver:
        """ValueError, worded as blang/semver words it, when `text` is no semantic version."""
        if normalize:
            text = _normalize_semver(text)
        if not text:
            raise ValueError("Version string empty")
        parts = text.split(".", 2)
        if len(parts) != 3:
            raise ValueError("No Major.Minor.Patch elements found")
        major, minor = _version_number(parts[0], "major"), _version_number(parts[1], "minor")
        patch_text, pre, build = parts[2], "", ""
        has_build = "+" in patch_text
        if has_build:
            patch_text, build = patch_text.split("+", 1)
        has_pre = "-" in patch_text
        if has_pre:
            patch_text, pre = patch_text.split("-", 1)
        patch = _version_number(patch_text, "patch")
        pre_parts = tuple(_prerelease(p) for p in pre.split(".")) if has_pre else ()
        build_parts = tuple(build.split(".")) if has_build else ()
        for item in build_parts:
            if not item:
                raise ValueError("Build meta data is empty")
            if not _IDENTIFIER_CHARS.fullmatch(item):
                raise ValueError(f"Invalid character(s) found in build meta data {_go_quote(item)}")
        return Semver(major, minor, patch, pre_parts, build_parts)

    def compare(self, other: Semver) -> int:
        """-1, 0 or 1; build metadata does not count, a pre-release sorts before its release."""
        mine, theirs = (self.major, self.minor, self.patch), (other.major, other.minor, other.patch)
        if mine != theirs:
            return -1 if mine < theirs else 1
        if not self.pre or not other.pre:
            return (len(other.pre) > 0) - (len(self.pre) > 0)
        for a, b in zip(self.pre, other.pre, strict=False):
            if a == b:
                continue
            if isinstance(a, int) != isinstance(b, int):
                return -1 if isinstance(a, int) else 1
            return -1 if a < b else 1  # type: ignore[operator]  # same kind, checked above
        return (len(self.pre) > len(other.pre)) - (len(self.pre) < len(other.pre))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Semver):
            raise TypeError("no such overload")
        return self.compare(other) == 0

    def __hash__(self) -> int:
        return hash((self.major, self.minor, self.patch, self.pre))

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.pre:
            text += "-" + ".".join(str(p) for p in self.pre)
        if self.build:
            text += "+" + ".".join(self.build)
        return text


def _version_number(text: str, what: str) -> int:
    if not _DIGITS.fullmatch(text):
        raise ValueError(f"Invalid character(s) found in {what} number {_go_quote(text)}")
    if len(text) > 1 and text[0] == "0":
        raise ValueError(f"{what.capitalize()} number must not contain leading zeroes {_go_quote(text)}")
    if not text:
        raise ValueError('strconv.ParseUint: parsing "": invalid syntax')
    return int(text)


def _prerelease(text: str) -> int | str:
    if not text:
        raise ValueError("Prerelease is empty")
    if _DIGITS.fullmatch(text):
        if len(text) > 1 and text[0] == "0":
            raise ValueError(f"Numeric PreRelease version must not contain leading zeroes {_go_quote(text)}")
        return int(text)
    if not _IDENTIFIER_CHARS.fullmatch(text):
        raise ValueError(f"Invalid character(s) found in prerelease {_go_quote(text)}")
    return text


def _normalize_semver(text: str) -> str:
    """Kubernetes' semver(s, true): no leading "v", no leading zeros, missing minor and patch as 0."""
    parts = text.removeprefix("v").split(".", 2)
    for index, part in enumerate(parts):
        if len(part) > 1:
            trimmed = part.lstrip("0")
            parts[index] = trimmed if trimmed and trimmed[0].isdigit() else "0" + trimmed
    if len(parts) < 3:
        if "+" in parts[-1] or "-" in parts[-1]:
            raise ValueError("short version cannot contain PreRelease/Build meta data")
        parts += ["0"] * (3 - len(parts))
    return ".".join(parts)


def _go_quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


@dataclass(frozen=True, eq=False)
class Quantity:
    """A Kubernetes quantity (`kubernetes.Quantity`): exact value, and the text it was written as."""

    value: Fraction
    text: str

    @staticmethod
    def parse(text: str) -> Quantity:
        try:
            return Quantity(parse_quantity(text), text)
        except ConfigError:
            # apimachinery's resource.ErrFormatWrong, what quantity() reports for a bad string
            raise ValueError(
                "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
            ) from None

    def compare(self, other: Quantity) -> int:
        return (self.value > other.value) - (self.value < other.value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Quantity):
            raise TypeError("no such overload")
        return self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __str__(self) -> str:
        return self.text


def runtime_type(value: object) -> str:
    if isinstance(value, Semver):
        return "kubernetes.Semver"
    if isinstance(value, Quantity):
        return "kubernetes.Quantity"
    for kind, name in (
        (celtypes.BoolType, "bool"),
        (celtypes.UintType, "uint"),
        (celtypes.IntType, "int"),
        (celtypes.DoubleType, "double"),
        (celtypes.StringType, "string"),
        (celtypes.BytesType, "bytes"),
        (celtypes.ListType, "list"),
        (celtypes.MapType, "map"),
    ):
        if isinstance(value, kind):
            return name
    return "null_type" if value is None else type(value).__name__


# --- the functions -------------------------------------------------------------------------------


def _error(message: str) -> CELEvalError:
    return CELEvalError(message)


def _cel_equal(left: Any, right: Any) -> Any:
    """cel-go's runtime equality: numbers across int/uint/double, other mixed types unequal, except
    that a Semver or Quantity compared with anything else is an error (their Equal has no overload)."""
    if isinstance(left, CELEvalError):
        return left
    if isinstance(right, CELEvalError):
        return right
    if isinstance(left, Semver | Quantity):
        if type(left) is not type(right):
            return _error("no such overload")
        return celtypes.BoolType(left == right)
    if left is None or right is None:
        return celtypes.BoolType(left is None and right is None)
    if _numeric(left) and _numeric(right):
        return celtypes.BoolType(_number(left) == _number(right))
    if isinstance(left, celtypes.ListType) and isinstance(right, celtypes.ListType):
        if len(left) != len(right):
            return celtypes.BoolType(False)
        return _all_equal(zip(left, right, strict=True))
    if isinstance(left, celtypes.MapType) and isinstance(right, celtypes.MapType):
        if set(left) != set(right):
            return celtypes.BoolType(False)
        return _all_equal((left[k], right[k]) for k in left)
    if _kind(left) != _kind(right):
        return celtypes.BoolType(False)
    return celtypes.BoolType(left == right)


def _all_equal(pairs: Any) -> Any:
    for a, b in pairs:
        same = _cel_equal(a, b)
        if isinstance(same, CELEvalError) or not same:
            return same
    return celtypes.BoolType(True)


def _cel_not_equal(left: Any, right: Any) -> Any:
    same = _cel_equal(left, right)
    return same if isinstance(same, CELEvalError) else celtypes.BoolType(not same)


def _numeric(value: Any) -> bool:
    return isinstance(value, celtypes.IntType | celtypes.UintType | celtypes.DoubleType) and not isinstance(
        value, celtypes.BoolType
    )


def _number(value: Any) -> Fraction | float:
    if isinstance(value, celtypes.DoubleType):
        return float(value) if math.isnan(value) or math.isinf(value) else Fraction(float(value))
    return Fraction(int(value))


def _kind(value: Any) -> str:
    return runtime_type(value)


def _string_args(*values: Any) -> bool:
    return all(isinstance(v, celtypes.StringType) for v in values)


def _semver(text: Any, normalize: Any = False) -> Any:
    if not isinstance(text, celtypes.StringType) or not isinstance(normalize, bool | celtypes.BoolType):
        return _error("no such overload")
    try:
        return Semver.parse(str(text), normalize=bool(normalize))
    except ValueError as err:
        return _error(str(err))


def _is_semver(text: Any, normalize: Any = False) -> Any:
    parsed = _semver(text, normalize)
    if isinstance(parsed, CELEvalError) and parsed.args[0] == "no such overload":
        return parsed
    return celtypes.BoolType(isinstance(parsed, Semver))


def _quantity(text: Any) -> Any:
    if not isinstance(text, celtypes.StringType):
        return _error("no such overload")
    try:
        return Quantity.parse(str(text))
    except ValueError as err:
        return _error(str(err))


def _is_quantity(text: Any) -> Any:
    parsed = _quantity(text)
    if isinstance(parsed, CELEvalError) and parsed.args[0] == "no such overload":
        return parsed
    return celtypes.BoolType(isinstance(parsed, Quantity))


def _comparison(receiver: Any, other: Any) -> int | CELEvalError:
    if isinstance(receiver, Semver) and isinstance(other, Semver):
        return receiver.compare(other)
    if isinstance(receiver, Quantity) and isinstance(other, Quantity):
        return receiver.compare(other)
    return _error("no such overload")


def _is_greater_than(receiver: Any, other: Any) -> Any:
    order = _comparison(receiver, other)
    return order if isinstance(order, CELEvalError) else celtypes.BoolType(order == 1)


def _is_less_than(receiver: Any, other: Any) -> Any:
    order = _comparison(receiver, other)
    return order if isinstance(order, CELEvalError) else celtypes.BoolType(order == -1)


def _compare_to(receiver: Any, other: Any) -> Any:
    order = _comparison(receiver, other)
    return order if isinstance(order, CELEvalError) else celtypes.IntType(order)


def _semver_part(part: str) -> Callable[[Any], Any]:
    def get(receiver: Any) -> Any:
        if not isinstance(receiver, Semver):
            return _error("no such overload")
        return celtypes.IntType(getattr(receiver, part))

    get.__name__ = part
    return get


_INT64 = (-(2**63), 2**63 - 1)


def _as_integer(receiver: Any) -> Any:
    if not isinstance(receiver, Quantity):
        return _error("no such overload")
    value = receiver.value
    if value.denominator != 1 or not _INT64[0] <= value.numerator <= _INT64[1]:
        return _error("cannot convert value to integer")
    return celtypes.IntType(value.numerator)


def _is_integer(receiver: Any) -> Any:
    if not isinstance(receiver, Quantity):
        return _error("no such overload")
    value = receiver.value
    return celtypes.BoolType(value.denominator == 1 and _INT64[0] <= value.numerator <= _INT64[1])


def _as_float(receiver: Any) -> Any:
    if not isinstance(receiver, Quantity):
        return _error("no such overload")
    try:
        return celtypes.DoubleType(float(receiver.value))
    except OverflowError:
        return celtypes.DoubleType(math.inf if receiver.value > 0 else -math.inf)


def _sign(receiver: Any) -> Any:
    if not isinstance(receiver, Quantity):
        return _error("no such overload")
    return celtypes.IntType((receiver.value > 0) - (receiver.value < 0))


def _arithmetic(sign: int) -> Callable[[Any, Any], Any]:
    def combine(receiver: Any, other: Any) -> Any:
        if not isinstance(receiver, Quantity):
            return _error("no such overload")
        if isinstance(other, Quantity):
            amount = other.value
        elif isinstance(other, celtypes.IntType) and not isinstance(other, celtypes.BoolType):
            amount = Fraction(int(other))
        else:
            return _error("no such overload")
        value = receiver.value + sign * amount
        return Quantity(value, _quantity_text(value))

    return combine


def _quantity_text(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else str(float(value))


def _string_method(function: Callable[..., Any], *kinds: type) -> Callable[..., Any]:
    """A string extension function: no overload unless the arguments have `kinds`."""

    def call(*args: Any) -> Any:
        if len(args) > len(kinds) or not all(isinstance(a, k) for a, k in zip(args, kinds, strict=False)):
            return _error("no such overload")
        try:
            return function(*args)
        except IndexError as err:
            return _error(str(err))

    return call


def _index_of(text: str, needle: str, start: int | None = None) -> Any:
    begin = 0 if start is None else start
    if not 0 <= begin <= len(text):
        raise IndexError(f"index out of range: {begin}")
    return celtypes.IntType(text.find(needle, begin))


def _last_index_of(text: str, needle: str, start: int | None = None) -> Any:
    if start is None:
        return celtypes.IntType(text.rfind(needle))
    if not 0 <= start <= len(text):
        raise IndexError(f"index out of range: {start}")
    return celtypes.IntType(text.rfind(needle, 0, start + len(needle)))


def _substring(text: str, start: int, end: int | None = None) -> Any:
    stop = len(text) if end is None else end
    if not 0 <= start <= len(text) or not start <= stop <= len(text):
        raise IndexError(f"index out of range: {start if not 0 <= start <= len(text) else stop}")
    return celtypes.StringType(text[start:stop])


def _char_at(text: str, index: int) -> Any:
    if not 0 <= index <= len(text):
        raise IndexError(f"index out of range: {index}")
    return celtypes.StringType(text[index : index + 1])


def _split_string(text: str, separator: str, limit: int = -1) -> Any:
    if limit == 0:
        return celtypes.ListType()
    parts = text.split(separator, limit - 1) if limit > 0 else text.split(separator)
    return celtypes.ListType([celtypes.StringType(p) for p in parts])


def _join_strings(items: Any, separator: Any = "") -> Any:
    if not isinstance(items, celtypes.ListType) or not _string_args(*items) or not isinstance(separator, str):
        return _error("no such overload")
    return celtypes.StringType(str(separator).join(str(item) for item in items))


def _replace(text: str, old: str, new: str, count: int = -1) -> Any:
    return celtypes.StringType(text.replace(old, new, count))


def _includes(target: Any, item: Any) -> Any:
    if isinstance(target, celtypes.ListType):
        for element in target:
            same = _cel_equal(element, item)
            if same is True or (not isinstance(same, CELEvalError) and same):
                return celtypes.BoolType(True)
        return celtypes.BoolType(False)
    same = _cel_equal(target, item)
    return celtypes.BoolType(False) if isinstance(same, CELEvalError) else same


_S, _I = celtypes.StringType, celtypes.IntType
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "_==_": _cel_equal,
    "_!=_": _cel_not_equal,
    "semver": _semver,
    "isSemver": _is_semver,
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "sign": _sign,
    "isGreaterThan": _is_greater_than,
    "isLessThan": _is_less_than,
    "compareTo": _compare_to,
    "major": _semver_part("major"),
    "minor": _semver_part("minor"),
    "patch": _semver_part("patch"),
    "asInteger": _as_integer,
    "isInteger": _is_integer,
    "asApproximateFloat": _as_float,
    "add": _arithmetic(1),
    "sub": _arithmetic(-1),
    "lowerAscii": _string_method(lambda s: _S("".join(c.lower() if c.isascii() else c for c in s)), _S),
    "upperAscii": _string_method(lambda s: _S("".join(c.upper() if c.isascii() else c for c in s)), _S),
    "trim": _string_method(lambda s: _S(s.strip()), _S),
    "indexOf": _string_method(_index_of, _S, _S, _I),
    "lastIndexOf": _string_method(_last_index_of, _S, _S, _I),
    "replace": _string_method(_replace, _S, _S, _S, _I),
    "split": _string_method(_split_string, _S, _S, _I),
    "substring": _string_method(_substring, _S, _I, _I),
    "charAt": _string_method(_char_at, _S, _I),
    "join": _join_strings,
    "includes": _includes,
}
