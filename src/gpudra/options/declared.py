"""Each daemon option declared once, as a field of the options object it fills.

A field declared with `option(...)` carries everything about its option: the flag (`--<flag>`, by
default the field's name with dashes), the GPUDRA_<FLAG> variable the Helm chart sets it by, the value
type that parses and checks the text (`gpudra.options.types`), the default text, the help, and, when the
chart's templates set it themselves, why (so the chart's values schema leaves it out). From that one
declaration come the command line (`add_arguments`), the options object (`build`), and the chart's
values schema (`options_of`, read by scripts/gen_chart_schema.py). A field declared with `group(C)`
holds a nested options object whose own fields are options of the same command (what a node
publishes is one, shared by `gpudra inventory` and `gpudra kubelet-plugin`).

The options classes are keyword-only frozen dataclasses: a field with a default text has that text's
parsed value as its Python default, so code and tests that make an options object get the command's
defaults. A class may define `check_options(self)`, raising ConfigError for combinations of its fields
no single value type can refuse; `build` calls it. Pure but for reading the environment's GPUDRA_*
variables in `add_arguments`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from gpudra.errors import ConfigError
from gpudra.options.types import OptionType, Text

_OPTION = "gpudra.option"
_GROUP = "gpudra.option-group"

T = TypeVar("T")

# A default text, or a function of the fields declared before it (their values) that gives one, for a
# default that depends on another option (the plugin directory on the driver name).
Default = str | Callable[[Mapping[str, Any]], str] | None


@dataclass(frozen=True)
class Declaration:
    help: str
    type: OptionType[Any]
    default: Default
    flag: str | None
    required: bool
    chart: str | None


@dataclass(frozen=True)
class Option:
    """A declared option of a command, bound to its field."""

    field: str  # the attribute of the options object it fills
    flag: str  # without the dashes
    help: str
    type: OptionType[Any]
    default: Default
    required: bool
    chart: str | None  # how the chart sets it itself; None: a value the chart's users set
    optional: bool  # the field may be None: empty text gives None

    @property
    def env(self) -> str:
        return "GPUDRA_" + self.flag.upper().replace("-", "_")

    @property
    def dest(self) -> str:
        return self.flag.replace("-", "_")


def option(
    help: str,
    *,
    type: OptionType[Any] | None = None,
    default: Default = None,
    flag: str | None = None,
    required: bool = False,
    chart: str | None = None,
) -> Any:
    """Declare a field as an option (see the module's docstring); `type` defaults to any text."""
    kind = type or Text()
    declaration = Declaration(help, kind, default, flag, required, chart)
    metadata = {_OPTION: declaration}
    if isinstance(default, str):
        return dataclasses.field(default=kind.parse(default), metadata=metadata)
    if default is None and not required:
        return dataclasses.field(default=None, metadata=metadata)
    return dataclasses.field(metadata=metadata)


def group(cls: Callable[[], T]) -> Any:
    """Declare a field as a nested options object whose declared fields are options of the command."""
    return dataclasses.field(default_factory=cls, metadata={_GROUP: True})


def options_of(cls: type) -> list[Option]:
    """Every option `cls` declares, nested groups' included, in declaration order."""
    return [found for found, _ in _walk(cls)]


def _walk(cls: type) -> Iterator[tuple[Option, tuple[str, ...]]]:
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if field.metadata.get(_GROUP):
            for found, path in _walk(hints[field.name]):
                yield found, (field.name, *path)
            continue
        declaration = field.metadata.get(_OPTION)
        if declaration is None:
            continue
        yield (
            Option(
                field=field.name,
                flag=declaration.flag or field.name.replace("_", "-"),
                help=declaration.help,
                type=declaration.type,
                default=declaration.default,
                required=declaration.required,
                chart=declaration.chart,
                optional=_may_be_none(hints[field.name]),
            ),
            (),
        )


def _may_be_none(hint: object) -> bool:
    return isinstance(hint, types.UnionType) and type(None) in typing.get_args(hint)


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """--<flag> for every option `cls` declares, each also settable as GPUDRA_<FLAG>: the variable's
    text is the flag's default, which argparse parses with the option's type like a flag's."""
    for found in options_of(cls):
        text = os.environ.get(found.env)
        if text is None and isinstance(found.default, str):
            text = found.default
        required = " (required)" if found.required else ""
        parser.add_argument(
            f"--{found.flag}",
            dest=found.dest,
            default=text,
            help=f"{found.help}{required} (env {found.env})",
            type=found.type,
            metavar=found.type.metavar,
        )


def build(cls: type[T], namespace: argparse.Namespace) -> T:
    """The options object `cls` that `namespace` (add_arguments' parser's result) gives: derived
    defaults filled in, empty text as None where the field may be None, and the class's
    check_options run. Refusals are ConfigError naming the flag."""
    values: dict[str, Any] = {}
    hints = typing.get_type_hints(cls)
    declared: type = cls  # any class: fields() refuses one that is not a dataclass
    for field in dataclasses.fields(declared):
        if field.metadata.get(_GROUP):
            values[field.name] = build(hints[field.name], namespace)
    for found, path in _walk(cls):
        if path:
            continue
        values[found.field] = _value(found, getattr(namespace, found.dest), values)
    made = cls(**values)
    check = getattr(made, "check_options", None)
    if check is not None:
        check()
    return made


def _value(found: Option, given: object, before: Mapping[str, Any]) -> object:
    if given in (None, "") and found.required:
        raise ConfigError(f"is required (or {found.env}): {found.help}", field=f"--{found.flag}")
    if given is None and callable(found.default):
        try:
            return found.type.parse(found.default(before))
        except ConfigError as err:
            raise ConfigError(err.reason, field=f"--{found.flag}") from None
    if given == "" and found.optional:
        return None
    return given
