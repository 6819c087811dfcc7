"""The CEL environment of DRA device selectors, on cel-python. Pure.

A selector sees one variable, `device` (Kubernetes' `kubernetes.DRADevice`, dynamic-resource-allocation
cel/compile.go): `device.driver`, `device.allowMultipleAllocations`, `device.attributes[domain][name]` and
`device.capacity[domain][name]`. Unqualified attribute and capacity names live under the driver's
domain, `resource.kubernetes.io/pciBusID` under `resource.kubernetes.io`; looking up an unknown domain
gives an empty map, an unknown name in a domain is a runtime error ("no such key"). Attribute values are
int, bool, string or `kubernetes.Semver` (version attributes); capacities are `kubernetes.Quantity`.

On top of the CEL core that cel-python evaluates, selectors get what the Kubernetes base environment
offers and gpudra users reach for (`gpudra.scheduling.cel_library`): the semver and quantity libraries
(`semver()`, `isSemver()`, `quantity()`, `isQuantity()`, `sign()`, `.isGreaterThan()`, `.isLessThan()`,
`.compareTo()`, `.major()`, `.minor()`, `.patch()`, `.asInteger()`, `.isInteger()`,
`.asApproximateFloat()`, `.add()`, `.sub()`), the string extensions (`.lowerAscii()`, `.upperAscii()`,
`.trim()`, `.indexOf()`, `.lastIndexOf()`, `.replace()`, `.split()`, `.substring()`, `.charAt()`,
`.join()`), `cel.bind()` (here), and with DRAListTypeAttributes (off by default in 1.36) `.includes()`.

cel-python parses but does not type-check, so `compile_selector` first checks the expression the way the
API server does (`gpudra.scheduling.cel_check`) and raises its words as CelCompileError. What Kubernetes
offers but this evaluator lacks (URL, IP and CIDR functions, regex `find`, list and set extensions,
optional types, two-variable comprehensions, timestamps) raises `CelUnsupported` instead of evaluating
wrongly.

cel-python's interpreter takes about half a millisecond per evaluation, too slow for thousands of
nodes, so a `Selector` remembers its results by the values of exactly the device fields the expression
reads (`references`, found while checking). An expression that reads the device in a way whose fields
cannot be named ahead (`device.attributes.exists(...)`, a computed index) has `references` None and is
evaluated on every device.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Protocol

import celpy
import lark
from celpy import celtypes
from celpy.evaluation import CELEvalError, Evaluator, Result

from gpudra.errors import GpudraError
from gpudra.scheduling.cel_check import Reference, arguments, check, ident_name, is_ident
from gpudra.scheduling.cel_library import FUNCTIONS, Quantity, Semver, runtime_type

__all__ = [
    "CelCompileError",
    "CelDevice",
    "CelError",
    "CelRuntimeError",
    "CelUnsupported",
    "Quantity",
    "Reference",
    "Selector",
    "Semver",
    "compile_selector",
    "reference_getter",
]

_MEMO_LIMIT = 100_000  # remembered results per selector; far more than the distinct devices of a cluster


# --- errors --------------------------------------------------------------------------------------


class CelError(GpudraError):
    """A selector that cannot be compiled or evaluated. `detail` is worded as Kubernetes words it."""

    def __init__(self, expression: str, detail: str) -> None:
        super().__init__(detail)
        self.expression = expression
        self.detail = detail


class CelCompileError(CelError):
    """The API server would refuse the expression when the claim or class is created."""

    def field_error(self, path: str) -> str:
        """The API server's validation message for the expression at `path`."""
        return f"{path}: Invalid value: {json.dumps(self.expression, ensure_ascii=False)}: {self.detail}"


class CelRuntimeError(CelError):
    """Evaluating the expression on a device fails; the scheduler stops allocating the claim."""


class CelUnsupported(CelError):
    """Valid in Kubernetes, but gpudra's evaluator cannot evaluate it faithfully."""


# --- evaluation ----------------------------------------------------------------------------------


class CelDevice(Protocol):
    """What a selector sees of a device: the ResourceSlice's own shapes."""

    @property
    def driver(self) -> str: ...

    @property
    def attributes(self) -> Mapping[str, Mapping[str, Any]]: ...

    @property
    def capacity(self) -> Mapping[str, Mapping[str, Any]]: ...

    @property
    def allow_multiple_allocations(self) -> bool: ...


class _DomainMap(celtypes.MapType):
    """device.attributes and device.capacity: an unknown domain is an empty map, not an error."""

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str) and not dict.__contains__(self, key):
            return celtypes.MapType()
        return super().__getitem__(key)


def _attribute_value(name: str, attribute: Mapping[str, Any]) -> Any:
    if "int" in attribute:
        return celtypes.IntType(attribute["int"])
    if "bool" in attribute:
        return celtypes.BoolType(bool(attribute["bool"]))
    if "string" in attribute:
        return celtypes.StringType(attribute["string"])
    if "version" in attribute:
        try:
            return Semver.parse(str(attribute["version"]))
        except ValueError as err:
            raise _ConversionError(f"attribute {name}: parse semantic version: {err}") from None
    raise _ConversionError(f"attribute {name}: unsupported attribute value")


class _ConversionError(Exception):
    """A runtime error found while turning the device into CEL values."""


def _device_value(device: CelDevice) -> celtypes.MapType:
    """`device` as the CEL value `device`: driver, allowMultipleAllocations, attributes, capacity."""
    attributes: dict[str, dict[Any, Any]] = {}
    for name, attribute in device.attributes.items():
        domain, identifier = _split_first(name, device.driver)
        attributes.setdefault(domain, {})[celtypes.StringType(identifier)] = _attribute_value(name, attribute)
    capacity: dict[str, dict[Any, Any]] = {}
    for name, entry in device.capacity.items():
        domain, identifier = _split_first(name, device.driver)
        try:
            amount = Quantity.parse(str(entry["value"]))
        except (ValueError, KeyError):
            raise _ConversionError(f"capacity {name}: invalid quantity {entry.get('value')!r}") from None
        capacity.setdefault(domain, {})[celtypes.StringType(identifier)] = amount
    fields: dict[Any, Any] = {
        celtypes.StringType("driver"): celtypes.StringType(device.driver),
        celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(device.allow_multiple_allocations),
        celtypes.StringType("attributes"): _DomainMap(
            {celtypes.StringType(k): celtypes.MapType(v) for k, v in attributes.items()}
        ),
        celtypes.StringType("capacity"): _DomainMap(
            {celtypes.StringType(k): celtypes.MapType(v) for k, v in capacity.items()}
        ),
    }
    return celtypes.MapType(fields)


def _split_first(name: str, driver: str) -> tuple[str, str]:
    """Kubernetes' parseQualifiedName: the domain is what precedes the first "/", else the driver."""
    domain, slash, identifier = name.partition("/")
    return (domain, identifier) if slash else (driver, name)


def reference_getter(reference: Reference) -> Callable[[CelDevice], Hashable]:
    """The value at `reference` in a device, hashable, None when absent."""
    if reference == ("driver",):
        return lambda device: device.driver
    if reference == ("allowMultipleAllocations",):
        return lambda device: device.allow_multiple_allocations
    kind, domain, name = reference
    qualified = f"{domain}/{name}"

    def get(device: CelDevice) -> Hashable:
        entries = device.attributes if kind == "attributes" else device.capacity
        entry = entries.get(name) if device.driver == domain else None
        if entry is None:
            entry = entries.get(qualified)
        if entry is None:
            return None
        if kind == "capacity":
            return entry.get("value")
        return next(iter(entry.items()), None)

    return get


class _BindingEvaluator(Evaluator):
    """cel-python's interpreter, plus `cel.bind(name, value, expression)` (cel-go's ext.Bindings)."""

    def sub_evaluator(self, ast: lark.Tree[Any]) -> Evaluator:
        return _BindingEvaluator(ast, activation=self.activation)

    def member_dot_arg(self, tree: lark.Tree[Any]) -> Result:
        target, name = tree.children[:2]
        if isinstance(target, lark.Tree) and is_ident(target, "cel") and str(name) == "bind":
            variable_tree, value_tree, body = arguments(tree.children[2])
            value = self.visit(value_tree)
            if isinstance(value, CELEvalError):
                return value
            try:
                return self.sub_evaluator(body).evaluate({str(ident_name(variable_tree)): value})
            except CELEvalError as err:
                return err
        result: Result = super().member_dot_arg(tree)
        return result


def _runtime_error(err: CELEvalError) -> str:
    """cel-python's wording of an evaluation error, in cel-go's."""
    message = str(err.args[0]) if err.args else "evaluation failed"
    if message.startswith("no such member in mapping: "):
        return "no such key: " + message.removeprefix("no such member in mapping: ").strip("'\"")
    if message == "no such key" and len(err.args) > 2 and err.args[2]:
        return f"no such key: {err.args[2][0]}"
    if message.startswith(("found no matching overload", "no such overload")):
        return "no such overload"
    return message


@dataclass(eq=False)
class Selector:
    """A compiled selector expression. `references` are the device fields it reads (None: cannot tell)."""

    expression: str
    references: frozenset[Reference] | None
    _tree: lark.Tree[lark.Token] = field(repr=False)
    _getters: tuple[Callable[[CelDevice], Hashable], ...] = field(repr=False, default=())
    _memo: dict[tuple[Hashable, ...], bool | CelRuntimeError] = field(repr=False, default_factory=dict)

    def key(self, device: CelDevice) -> tuple[Hashable, ...] | None:
        """The values of `device` that decide this selector; None when the selector reads too much."""
        if self.references is None:
            return None
        return tuple([get(device) for get in self._getters])

    def matches(self, device: CelDevice) -> bool:
        """Whether `device` satisfies the expression; CelRuntimeError when evaluating it fails."""
        key = self.key(device)
        if key is None:
            return self.evaluate(device)
        known = self._memo.get(key)
        if known is None:
            try:
                known = self.evaluate(device)
            except CelRuntimeError as err:
                known = err
            if len(self._memo) >= _MEMO_LIMIT:
                self._memo.clear()
            self._memo[key] = known
        if isinstance(known, CelRuntimeError):
            raise known
        return known

    def evaluate(self, device: CelDevice) -> bool:
        """`matches` without remembering: cel-python runs the expression on `device`."""
        try:
            value = _device_value(device)
        except _ConversionError as err:
            raise CelRuntimeError(self.expression, str(err)) from None
        evaluator = _BindingEvaluator(self._tree, activation=_ACTIVATION)
        try:
            result = evaluator.evaluate({"device": value})
        except CELEvalError as err:
            raise CelRuntimeError(self.expression, _runtime_error(err)) from None
        if isinstance(result, bool | celtypes.BoolType):
            return bool(result)
        kind = runtime_type(result)
        raise CelRuntimeError(
            self.expression,
            f"CEL result of type {kind} could not be converted to bool: "
            f"type conversion error from '{kind}' to 'bool'",
        )


@lru_cache(maxsize=4096)
def compile_selector(expression: str, *, list_type_attributes: bool = False) -> Selector:
    """The selector for `expression`, compiled once; CelCompileError or CelUnsupported when it cannot be.

    `list_type_attributes` is the DRAListTypeAttributes feature gate (alpha, off by default in 1.36),
    which adds `.includes()`.
    """
    checked = check(expression, list_type_attributes=list_type_attributes)
    if checked.unsupported is not None:
        raise CelUnsupported(
            expression,
            f"gpudra explain cannot evaluate {checked.unsupported}: "
            "Kubernetes supports it, gpudra's evaluator does not",
        )
    if checked.problem is not None or checked.tree is None:
        raise CelCompileError(expression, checked.problem or "compilation failed")
    getters = tuple(reference_getter(r) for r in sorted(checked.references or ()))
    return Selector(expression, checked.references, checked.tree, getters)


_ENVIRONMENT = celpy.Environment()
_ACTIVATION = _ENVIRONMENT.program(lark.Tree("expr", []), functions=FUNCTIONS).new_activation()
