"""The value types of gpudra's options: each turns the text given on the command line (or in a
GPUDRA_<OPTION> variable, which is how the Helm chart passes them) into a value, or refuses it with one
line naming the allowed values; and each says the same rule as a JSON Schema fragment. Pure.

One definition serves both the binaries and the chart: `scripts/gen_chart_schema.py` writes each
option's `schema()` into the chart's values.schema.json, so `helm install` refuses what the pods would
otherwise refuse by crash-looping. argparse calls a type on a string default too, so a bad environment
variable is refused like a bad flag.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from gpudra.errors import ConfigError
from gpudra.quantity import QUANTITY_PATTERN, parse_quantity

T = TypeVar("T")


class OptionType(Generic[T]):
    """A callable argparse `type=` with its JSON Schema. Refusals are `argparse.ArgumentTypeError`, whose
    text argparse prints as is after the option's name."""

    @property
    def metavar(self) -> str | None:
        """How --help shows the value (None: argparse's default, the option's name)."""
        return None

    def __call__(self, text: str) -> T:
        try:
            return self.parse(text)
        except ConfigError as err:
            raise argparse.ArgumentTypeError(err.reason) from None

    def parse(self, text: str) -> T:
        raise NotImplementedError

    def schema(self) -> dict[str, Any]:
        """The JSON Schema of the option's value in the chart (null keeps the CLI default)."""
        raise NotImplementedError


@dataclass(frozen=True)
class Choice(OptionType[str]):
    values: tuple[str, ...]
    case_insensitive: bool = False
    label: str | None = None  # --help's name for the value, where the values are too many to list

    def parse(self, text: str) -> str:
        for value in self.values:
            if text == value or (self.case_insensitive and text.upper() == value.upper()):
                return value
        raise ConfigError(f"{text!r} is not one of {', '.join(self.values)}")

    def schema(self) -> dict[str, Any]:
        spelt = [*self.values]
        if self.case_insensitive:
            spelt += [v.lower() for v in self.values if v.lower() != v]
        return {"enum": [*spelt, None]}

    @property
    def metavar(self) -> str:
        return self.label or "{" + ",".join(self.values) + "}"


@dataclass(frozen=True)
class Seconds(OptionType[float]):
    """A duration in seconds, fractions allowed, at least `minimum` (`exclusive`: above it)."""

    minimum: float = 0
    exclusive: bool = False
    zero_means: str | None = None  # what 0 does, when 0 is allowed (e.g. "off")

    def parse(self, text: str) -> float:
        try:
            seconds = float(text)
        except ValueError:
            seconds = math.nan
        below = seconds <= self.minimum if self.exclusive else seconds < self.minimum
        if not math.isfinite(seconds) or below:
            raise ConfigError(f"{text!r} is not {self._rule()}")
        return seconds

    def _rule(self) -> str:
        bound = f"{'>' if self.exclusive else '>='} {self.minimum:g}"
        zero = f" (0: {self.zero_means})" if self.zero_means else ""
        return f"a number of seconds {bound}{zero}"

    def schema(self) -> dict[str, Any]:
        key = "exclusiveMinimum" if self.exclusive else "minimum"
        return {"type": ["number", "null"], key: self.minimum}


@dataclass(frozen=True)
class Port(OptionType[int]):
    """A TCP port; 0 turns the listener off."""

    def parse(self, text: str) -> int:
        if not re.fullmatch(r"[0-9]{1,5}", text.strip()) or int(text) > 65535:
            raise ConfigError(f"{text!r} is not a port: 1 to 65535, or 0 (off)")
        return int(text)

    def schema(self) -> dict[str, Any]:
        return {"type": ["integer", "null"], "minimum": 0, "maximum": 65535}


@dataclass(frozen=True)
class Count(OptionType[int]):
    """A whole number from `minimum` to `maximum`, or 0 when `zero_means` says what 0 does."""

    minimum: int
    maximum: int
    zero_means: str | None = None

    def parse(self, text: str) -> int:
        value = int(text) if re.fullmatch(r"[0-9]{1,9}", text.strip()) else None
        if value is None or not (self.minimum <= value <= self.maximum or (value == 0 and self.zero_means)):
            zero = f", or 0 ({self.zero_means})" if self.zero_means else ""
            raise ConfigError(f"{text!r} is not a whole number from {self.minimum} to {self.maximum}{zero}")
        return value

    def schema(self) -> dict[str, Any]:
        between = {"type": "integer", "minimum": self.minimum, "maximum": self.maximum}
        allowed: list[dict[str, Any]] = [between, {"type": "null"}]
        if self.zero_means:
            allowed.insert(1, {"const": 0})
        return {"anyOf": allowed}


@dataclass(frozen=True)
class Minor(OptionType[int]):
    """A Kubernetes 1.x minor, at least `oldest`."""

    oldest: int

    def parse(self, text: str) -> int:
        if not text.strip().isdigit():
            raise ConfigError(f"{text!r} is not a Kubernetes 1.x minor >= {self.oldest} (e.g. 36 for 1.36)")
        if int(text) < self.oldest:
            raise ConfigError(f"1.{int(text)} is older than 1.{self.oldest}, the oldest gpudra supports")
        return int(text)

    def schema(self) -> dict[str, Any]:
        return {"type": ["integer", "null"], "minimum": self.oldest}


@dataclass(frozen=True)
class Switch(OptionType[bool]):
    """On or off, spelt as one of two words (`on` is the one that means on)."""

    values: tuple[str, str]
    on: str

    def parse(self, text: str) -> bool:
        return Choice(self.values).parse(text) == self.on

    def schema(self) -> dict[str, Any]:
        return Choice(self.values).schema()

    @property
    def metavar(self) -> str:
        return Choice(self.values).metavar


@dataclass(frozen=True)
class AbsolutePath(OptionType["Path | None"]):
    """An absolute path; the empty text too when `empty` says what it means (the value is then None)."""

    empty: str | None = None

    def parse(self, text: str) -> Path | None:
        if text == "" and self.empty is not None:
            return None
        if not text.startswith("/"):
            empty = f" (empty: {self.empty})" if self.empty else ""
            raise ConfigError(f"{text!r} is not an absolute path (one starting with /){empty}")
        return Path(text)

    def schema(self) -> dict[str, Any]:
        return {"type": ["string", "null"], "pattern": "^/" if self.empty is None else "^(/|$)"}


@dataclass(frozen=True)
class PathList(OptionType[tuple[Path, ...]]):
    """Absolute paths separated by ':', as PATH is (empty: none)."""

    empty: str

    def parse(self, text: str) -> tuple[Path, ...]:
        rule = Pattern(
            r"/[^:]*(:/[^:]*)*", "':'-separated absolute paths (e.g. /etc/cdi:/var/run/cdi)", self.empty
        )
        return tuple(Path(p) for p in rule.parse(text).split(":") if p)

    def schema(self) -> dict[str, Any]:
        return {"type": ["string", "null"], "pattern": "^(/[^:]*(:/[^:]*)*)?$"}


@dataclass(frozen=True)
class Pattern(OptionType[str]):
    """Text matching `regex` (the empty text too when `empty` says what it means)."""

    regex: str
    rule: str
    empty: str | None = None
    max_length: int | None = None

    def parse(self, text: str) -> str:
        if text == "" and self.empty is not None:
            return text
        if re.fullmatch(self.regex, text) and len(text) <= (self.max_length or len(text)):
            return text
        raise ConfigError(f"{text!r} is not {self.rule}" + (f" (empty: {self.empty})" if self.empty else ""))

    def schema(self) -> dict[str, Any]:
        regex = f"^({self.regex})$" if self.empty is None else f"^({self.regex})?$"
        found: dict[str, Any] = {"type": ["string", "null"], "pattern": regex}
        if self.max_length is not None:
            found["maxLength"] = self.max_length
        return found


@dataclass(frozen=True)
class CheckedText(OptionType[str]):
    """Text that a parser of the model accepts (it raises ConfigError naming what is wrong); the text is
    kept, for the command parses it where it uses it. `pattern` is the same rule as a regular expression
    for the chart."""

    parser: Callable[[str], object]
    pattern: str

    def parse(self, text: str) -> str:
        self.parser(text)
        return text

    def schema(self) -> dict[str, Any]:
        return {"type": ["string", "null"], "pattern": f"^({self.pattern})$"}


@dataclass(frozen=True)
class Parsed(OptionType[T]):
    """Text that a parser of the model turns into its value (it raises ConfigError naming what is
    wrong). `pattern` is the same rule as a regular expression for the chart."""

    parser: Callable[[str], T]
    pattern: str

    def parse(self, text: str) -> T:
        return self.parser(text)

    def schema(self) -> dict[str, Any]:
        return {"type": ["string", "null"], "pattern": f"^({self.pattern})$"}


@dataclass(frozen=True)
class Names(OptionType["frozenset[str] | None"]):
    """A comma-separated set of names each matching `item` (blanks around them, empty entries
    ignored); `none_when_empty`: no name at all is None, which means every name."""

    item: str
    rule: str
    none_when_empty: bool = False

    def parse(self, text: str) -> frozenset[str] | None:
        Pattern(comma_list(self.item), self.rule).parse(text)
        names = frozenset(n.strip() for n in text.split(",") if n.strip())
        return None if self.none_when_empty and not names else names

    def schema(self) -> dict[str, Any]:
        return Pattern(comma_list(self.item), self.rule).schema()


@dataclass(frozen=True)
class Bytes(OptionType[int]):
    """An amount of memory as a Kubernetes quantity (80Gi, 81559Mi), at least `minimum` bytes."""

    minimum: str = "1"

    def parse(self, text: str) -> int:
        try:
            amount = parse_quantity(text.strip())
        except ConfigError as err:
            raise ConfigError(f"{text!r} is not an amount of memory: {err.reason}") from None
        if amount < parse_quantity(self.minimum):
            raise ConfigError(f"{text!r} is less than {self.minimum}")
        return int(amount)

    @property
    def metavar(self) -> str:
        return "QUANTITY"

    def schema(self) -> dict[str, Any]:
        return {"type": ["string", "null"], "pattern": QUANTITY_PATTERN}


@dataclass(frozen=True)
class Text(OptionType[str]):
    """Any text (names, addresses, URLs the program checks when it uses them)."""

    def parse(self, text: str) -> str:
        return text

    def schema(self) -> dict[str, Any]:
        return {"type": ["string", "null"]}


def comma_list(item: str) -> str:
    """A regex for a comma-separated list of `item` (blanks around entries, empty entries allowed)."""
    entry = rf"\s*({item})?\s*"
    return rf"{entry}(,{entry})*"


def one_of(values: Sequence[str]) -> str:
    return "|".join(re.escape(v) for v in values)
