"""The API server's check of a DRA selector expression, for cel-python, which parses but does not check.
Pure.

cel-go types the expression against the DRA environment (`device` is `kubernetes.DRADevice`; attribute
values are `any`, capacities `kubernetes.Quantity`) before the API server stores a claim or class; this
module does the same over cel-python's parse tree and words what it finds as cel-go does ("undeclared
reference to 'x' (in container '')", "undefined field 'x'", "found no matching overload for '_>=_'
applied to '(kubernetes.Quantity, kubernetes.Quantity)'", each with its line, column and caret, then
"must evaluate to bool or the unknown type, not string"). Overloads are those of the functions
`gpudra.scheduling.cel_library` implements; what the Kubernetes environment has beyond them is collected as
`unsupported` rather than called an error.

While typing, it follows every use of `device` and records the fields read
(`device.attributes["d"].name`, `"name" in device.attributes["d"]`, through `cel.bind` aliases); a use
whose fields cannot be named ahead (a computed index, iterating a map) makes `references` None.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import celpy
import lark
from celpy.celparser import CELParseError
from celpy.evaluation import celstr

__all__ = ["CheckedExpression", "Reference", "arguments", "check", "ident_name", "is_ident"]

# ("driver",), ("allowMultipleAllocations",), ("attributes", domain, name) or ("capacity", domain, name)
Reference = tuple[str, ...]

# --- static types --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Type:
    name: str
    params: tuple[_Type, ...] = ()

    def __str__(self) -> str:
        return f"{self.name}({', '.join(str(p) for p in self.params)})" if self.params else self.name

    @property
    def is_dyn(self) -> bool:
        return self.name in ("dyn", "any")


DYN, ANY = _Type("dyn"), _Type("any")
BOOL, INT, UINT, DOUBLE = _Type("bool"), _Type("int"), _Type("uint"), _Type("double")
STRING, BYTES, NULL, TYPE = _Type("string"), _Type("bytes"), _Type("null"), _Type("type")
SEMVER, QUANTITY = _Type("kubernetes.Semver"), _Type("kubernetes.Quantity")
DEVICE = _Type("kubernetes.DRADevice")


def _list(element: _Type) -> _Type:
    return _Type("list", (element,))


def _map(key: _Type, value: _Type) -> _Type:
    return _Type("map", (key, value))


LIST_DYN, MAP_DYN = _list(DYN), _map(DYN, DYN)
_DEVICE_FIELDS = {
    "driver": STRING,
    "allowMultipleAllocations": BOOL,
    "attributes": _map(STRING, _map(STRING, ANY)),
    "capacity": _map(STRING, _map(STRING, QUANTITY)),
}
_NUMBERS = (INT, UINT, DOUBLE)
_TYPE_NAMES = {"bool", "int", "uint", "double", "string", "bytes", "list", "map", "null_type", "type"}


def _assignable(actual: _Type, declared: _Type) -> bool:
    if actual.is_dyn or declared.is_dyn:
        return True
    return (
        actual.name == declared.name
        and len(actual.params) == len(declared.params)
        and all(_assignable(a, d) for a, d in zip(actual.params, declared.params, strict=True))
    )


def _join(a: _Type, b: _Type) -> _Type | None:
    """The type of a value that is either `a` or `b` (a list literal, both arms of `?:`)."""
    if a.is_dyn:
        return b
    if b.is_dyn:
        return a
    return a if _assignable(a, b) else None


# (argument types, result) of each global function; member functions take the receiver first.
_Signature = tuple[tuple[_Type, ...], _Type]
_GLOBALS: dict[str, list[_Signature]] = {
    "size": [((STRING,), INT), ((BYTES,), INT), ((LIST_DYN,), INT), ((MAP_DYN,), INT)],
    "matches": [((STRING, STRING), BOOL)],
    "int": [((t,), INT) for t in (INT, UINT, DOUBLE, STRING)],
    "uint": [((t,), UINT) for t in (INT, UINT, DOUBLE, STRING)],
    "double": [((t,), DOUBLE) for t in (INT, UINT, DOUBLE, STRING)],
    "string": [((t,), STRING) for t in (INT, UINT, DOUBLE, STRING, BOOL, BYTES)],
    "bool": [((BOOL,), BOOL), ((STRING,), BOOL)],
    "bytes": [((BYTES,), BYTES), ((STRING,), BYTES)],
    "type": [((DYN,), TYPE)],
    "semver": [((STRING,), SEMVER), ((STRING, BOOL), SEMVER)],
    "isSemver": [((STRING,), BOOL), ((STRING, BOOL), BOOL)],
    "quantity": [((STRING,), QUANTITY)],
    "isQuantity": [((STRING,), BOOL)],
    "sign": [((QUANTITY,), INT)],
}
_MEMBERS: dict[str, list[_Signature]] = {
    "size": [((STRING,), INT), ((BYTES,), INT), ((LIST_DYN,), INT), ((MAP_DYN,), INT)],
    "contains": [((STRING, STRING), BOOL)],
    "startsWith": [((STRING, STRING), BOOL)],
    "endsWith": [((STRING, STRING), BOOL)],
    "matches": [((STRING, STRING), BOOL)],
    "isGreaterThan": [((SEMVER, SEMVER), BOOL), ((QUANTITY, QUANTITY), BOOL)],
    "isLessThan": [((SEMVER, SEMVER), BOOL), ((QUANTITY, QUANTITY), BOOL)],
    "compareTo": [((SEMVER, SEMVER), INT), ((QUANTITY, QUANTITY), INT)],
    "major": [((SEMVER,), INT)],
    "minor": [((SEMVER,), INT)],
    "patch": [((SEMVER,), INT)],
    "asInteger": [((QUANTITY,), INT)],
    "isInteger": [((QUANTITY,), BOOL)],
    "asApproximateFloat": [((QUANTITY,), DOUBLE)],
    "add": [((QUANTITY, QUANTITY), QUANTITY), ((QUANTITY, INT), QUANTITY)],
    "sub": [((QUANTITY, QUANTITY), QUANTITY), ((QUANTITY, INT), QUANTITY)],
    "lowerAscii": [((STRING,), STRING)],
    "upperAscii": [((STRING,), STRING)],
    "trim": [((STRING,), STRING)],
    "indexOf": [((STRING, STRING), INT), ((STRING, STRING, INT), INT)],
    "lastIndexOf": [((STRING, STRING), INT), ((STRING, STRING, INT), INT)],
    "replace": [((STRING, STRING, STRING), STRING), ((STRING, STRING, STRING, INT), STRING)],
    "split": [((STRING, STRING), _list(STRING)), ((STRING, STRING, INT), _list(STRING))],
    "substring": [((STRING, INT), STRING), ((STRING, INT, INT), STRING)],
    "charAt": [((STRING, INT), STRING)],
    "join": [((_list(STRING),), STRING), ((_list(STRING), STRING), STRING)],
}
_INCLUDES: list[_Signature] = [((DYN, DYN), BOOL)]  # DRAListTypeAttributes

# In the Kubernetes base environment of 1.36, but not evaluated here.
_UNSUPPORTED_FUNCTIONS = frozenset(
    {
        "url", "isURL", "getScheme", "getHost", "getHostname", "getPort", "getEscapedPath", "getQuery",
        "ip", "isIP", "cidr", "isCIDR", "family", "isUnspecified", "isLoopback", "isLinkLocalMulticast",
        "isLinkLocalUnicast", "isGlobalUnicast", "containsIP", "containsCIDR", "masked", "prefixLength",
        "find", "findAll", "format", "quote", "reverse", "isSorted", "sum", "min", "max", "slice",
        "flatten", "distinct", "sort", "sortBy", "first", "last", "transformList", "transformMap",
        "transformMapEntry", "existsOne", "timestamp", "duration", "getFullYear", "getMonth", "getDate",
        "getDayOfMonth", "getDayOfWeek", "getDayOfYear", "getHours", "getMinutes", "getSeconds",
        "getMilliseconds", "hasValue", "orValue", "value", "optMap", "optFlatMap", "or",
    }
)  # fmt: skip
_UNSUPPORTED_NAMESPACES = frozenset({"sets", "lists", "strings", "optional"})
_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})

_OPERATOR_NAMES = {
    "relation_lt": ("_<_", "<"),
    "relation_le": ("_<=_", "<="),
    "relation_gt": ("_>_", ">"),
    "relation_ge": ("_>=_", ">="),
    "relation_eq": ("_==_", "=="),
    "relation_ne": ("_!=_", "!="),
    "relation_in": ("@in", "in"),
    "addition_add": ("_+_", "+"),
    "addition_sub": ("_-_", "-"),
    "multiplication_mul": ("_*_", "*"),
    "multiplication_div": ("_/_", "/"),
    "multiplication_mod": ("_%_", "%"),
}
_ARITHMETIC: dict[str, tuple[_Type, ...]] = {
    "_+_": (INT, UINT, DOUBLE, STRING, BYTES),
    "_-_": _NUMBERS,
    "_*_": _NUMBERS,
    "_/_": _NUMBERS,
    "_%_": (INT, UINT),
}
_ORDERED = (STRING, BYTES, BOOL)


# --- checking ------------------------------------------------------------------------------------

# What a subexpression denotes when it is (part of) the device: the device itself, one of its two maps,
# or one domain of them. Anything else is a plain value (None).
_Path = tuple[str, ...] | None


@dataclass(frozen=True)
class _Typed:
    type: _Type
    path: _Path = None


@dataclass(frozen=True)
class CheckedExpression:
    """A checked expression: its tree, the device fields it reads (None: cannot tell), or why the API
    server refuses it (`problem`, in its words) or what in it gpudra cannot evaluate (`unsupported`)."""

    tree: lark.Tree[lark.Token] | None
    references: frozenset[Reference] | None
    problem: str | None = None
    unsupported: str | None = None


class _Checker:
    """Types an expression the way cel-go's checker does, and collects the device fields it reads."""

    def __init__(self, text: str, *, list_type_attributes: bool) -> None:
        self.text = text
        self.errors: list[tuple[int, int, str]] = []  # (line, 1-based column, message)
        self.unsupported: list[str] = []
        self.references: set[Reference] = set()
        self.dynamic = False
        self.scopes: list[dict[str, _Typed]] = []
        self.members = dict(_MEMBERS)
        if list_type_attributes:
            self.members["includes"] = _INCLUDES

    # -- helpers --

    def error(self, where: lark.Tree[lark.Token] | lark.Token | tuple[int, int], message: str) -> None:
        if isinstance(where, tuple):
            line, column = where
        elif isinstance(where, lark.Token):
            line, column = where.line or 1, where.column or 1
        else:
            line, column = (1, 1) if where.meta.empty else (where.meta.line, where.meta.column)
        self.errors.append((line, column, message))

    def value(self, typed: _Typed) -> _Type:
        """`typed` used as a plain value: a device path escaping into it can no longer be named."""
        if typed.path is not None:
            self.dynamic = True
        return typed.type

    def overload(
        self, where: Any, name: str, signatures: Sequence[_Signature], args: Sequence[_Type], member: bool
    ) -> _Type:
        results = {
            result
            for params, result in signatures
            if len(params) == len(args) and all(_assignable(a, p) for a, p in zip(args, params, strict=True))
        }
        if not results:
            shown = [str(a) for a in args]
            signature = f"{shown[0]}.({', '.join(shown[1:])})" if member else f"({', '.join(shown)})"
            self.error(where, f"found no matching overload for '{name}' applied to '{signature}'")
            return DYN
        return results.pop() if len(results) == 1 else DYN

    # -- the tree --

    def visit(self, tree: lark.Tree[lark.Token]) -> _Typed:
        handler: Callable[[lark.Tree[lark.Token]], _Typed] | None = getattr(self, f"_{tree.data}", None)
        if handler is None:  # a rule this checker does not know: let the evaluator decide
            for child in tree.children:
                if isinstance(child, lark.Tree):
                    self.value(self.visit(child))
            return _Typed(DYN)
        return handler(tree)

    def _single(self, tree: lark.Tree[lark.Token]) -> _Typed:
        child = tree.children[0]
        assert isinstance(child, lark.Tree)
        return self.visit(child)

    _member = _single
    _primary = _single
    _paren_expr = _single

    def _expr(self, tree: lark.Tree[lark.Token]) -> _Typed:
        if len(tree.children) == 1:
            return self._single(tree)
        condition, yes, no = (self.value(self.visit(c)) for c in _trees(tree))
        if not _assignable(condition, BOOL):
            self.error(
                tree, f"found no matching overload for '_?_:_' applied to '({condition}, {yes}, {no})'"
            )
            return DYN_TYPED
        joined = _join(yes, no)
        if joined is None:
            self.error(
                tree, f"found no matching overload for '_?_:_' applied to '({condition}, {yes}, {no})'"
            )
            return DYN_TYPED
        return _Typed(joined)

    def _logical(self, tree: lark.Tree[lark.Token], name: str) -> _Typed:
        if len(tree.children) == 1:
            return self._single(tree)
        left, right = (self.value(self.visit(c)) for c in _trees(tree))
        return _Typed(
            self.overload(_operator_at(tree, name), name, [((BOOL, BOOL), BOOL)], [left, right], False)
        )

    def _conditionalor(self, tree: lark.Tree[lark.Token]) -> _Typed:
        return self._logical(tree, "_||_")

    def _conditionaland(self, tree: lark.Tree[lark.Token]) -> _Typed:
        return self._logical(tree, "_&&_")

    def _binary(self, tree: lark.Tree[lark.Token]) -> _Typed:
        if len(tree.children) == 1:
            return self._single(tree)
        operator_tree, right_tree = _trees(tree)
        (left_tree,) = _trees(operator_tree)
        name, symbol = _OPERATOR_NAMES[operator_tree.data]
        where = _operator_at(operator_tree, symbol)
        if name == "@in":
            return self._in(where, left_tree, right_tree)
        left, right = self.value(self.visit(left_tree)), self.value(self.visit(right_tree))
        return _Typed(self._operator(where, name, left, right))

    _relation = _binary
    _addition = _binary
    _multiplication = _binary

    def _operator(self, where: tuple[int, int], name: str, left: _Type, right: _Type) -> _Type:
        shown = f"found no matching overload for '{name}' applied to '({left}, {right})'"
        if name in ("_==_", "_!=_"):
            if not _assignable(left, right):
                self.error(where, shown)
            return BOOL
        if name in ("_<_", "_<=_", "_>_", "_>=_"):
            numeric = (left.is_dyn or _is_number(left)) and (right.is_dyn or _is_number(right))
            same = any(_assignable(left, t) and _assignable(right, t) for t in _ORDERED)
            if not (numeric or same):
                self.error(where, shown)
            return BOOL
        if name == "_+_" and (left.name == "list" or right.name == "list"):
            joined = _join(left, right) if left.name == right.name == "list" else None
            if joined is None and not (left.is_dyn or right.is_dyn):
                self.error(where, shown)
                return DYN
            return joined or LIST_DYN
        candidates = [t for t in _ARITHMETIC[name] if _assignable(left, t) and _assignable(right, t)]
        if not candidates:
            self.error(where, shown)
            return DYN
        return candidates[0] if len(candidates) == 1 else DYN

    def _in(
        self, where: tuple[int, int], left_tree: lark.Tree[lark.Token], right_tree: lark.Tree[lark.Token]
    ) -> _Typed:
        right = self.visit(right_tree)
        key = _string_literal(left_tree)
        if right.path is not None and right.path[0] == "domain" and key is not None:
            self.references.add((right.path[1], right.path[2], key))
            left = STRING
        else:
            left = self.value(self.visit(left_tree))
            self.value(right)
        container = right.type
        if container.is_dyn:
            return _Typed(BOOL)
        if container.name in ("list", "map") and _assignable(left, container.params[0]):
            return _Typed(BOOL)
        self.error(where, f"found no matching overload for '@in' applied to '({left}, {container})'")
        return _Typed(BOOL)

    def _unary(self, tree: lark.Tree[lark.Token]) -> _Typed:
        if len(tree.children) == 1:
            return self._single(tree)
        operator_tree, operand_tree = _trees(tree)
        operand = self.value(self.visit(operand_tree))
        if operator_tree.data == "unary_not":
            return _Typed(self.overload(operator_tree, "!_", [((BOOL,), BOOL)], [operand], False))
        return _Typed(
            self.overload(operator_tree, "-_", [((INT,), INT), ((DOUBLE,), DOUBLE)], [operand], False)
        )

    def _member_dot(self, tree: lark.Tree[lark.Token]) -> _Typed:
        target_tree, name_token = tree.children
        assert isinstance(target_tree, lark.Tree) and isinstance(name_token, lark.Token)
        name = str(name_token)
        if is_ident(target_tree, "cel") and self._resolve("cel") is None:
            self.error(name_token, "undeclared reference to 'cel' (in container '')")
            return DYN_TYPED
        if _namespace(target_tree) in _UNSUPPORTED_NAMESPACES:
            self.unsupported.append(f"{_namespace(target_tree)}.{name}")
            return DYN_TYPED
        target = self.visit(target_tree)
        return self._select(target, name, _dot_at(name_token))

    def _select(self, target: _Typed, name: str, where: tuple[int, int]) -> _Typed:
        if target.path == ("device",):
            if name not in _DEVICE_FIELDS:
                self.error(where, f"undefined field '{name}'")
                return DYN_TYPED
            if name in ("driver", "allowMultipleAllocations"):
                self.references.add((name,))
                return _Typed(_DEVICE_FIELDS[name])
            return _Typed(_DEVICE_FIELDS[name], (name,))
        if target.path is not None and target.path[0] == "domain":
            self.references.add((target.path[1], target.path[2], name))
            return _Typed(target.type.params[1])
        kind = self.value(target)
        if kind.is_dyn:
            return DYN_TYPED
        if kind.name == "map":
            return _Typed(kind.params[1])
        self.error(where, f"type '{kind}' does not support field selection")
        return DYN_TYPED

    def _member_index(self, tree: lark.Tree[lark.Token]) -> _Typed:
        target_tree, index_tree = _trees(tree)
        target = self.visit(target_tree)
        key = _string_literal(index_tree)
        if target.path in (("attributes",), ("capacity",)) and key is not None:
            assert target.path is not None
            return _Typed(target.type.params[1], ("domain", target.path[0], key))
        if target.path is not None and target.path[0] == "domain" and key is not None:
            self.references.add((target.path[1], target.path[2], key))
            return _Typed(target.type.params[1])
        container = self.value(target)
        index = self.value(self.visit(index_tree))
        if container.is_dyn:
            return DYN_TYPED
        if container.name == "list" and _assignable(index, INT):
            return _Typed(container.params[0])
        if container.name == "map" and _assignable(index, container.params[0]):
            return _Typed(container.params[1])
        self.error(
            _index_at(tree), f"found no matching overload for '_[_]' applied to '({container}, {index})'"
        )
        return DYN_TYPED

    def _member_dot_arg(self, tree: lark.Tree[lark.Token]) -> _Typed:
        target_tree, name_token = tree.children[:2]
        assert isinstance(target_tree, lark.Tree) and isinstance(name_token, lark.Token)
        args = arguments(tree.children[2] if len(tree.children) > 2 else None)
        name = str(name_token)
        if is_ident(target_tree, "cel") and self._resolve("cel") is None:
            if name == "bind":
                return self._bind(tree, name_token, args)
            self.error(name_token, f"undeclared reference to 'cel.{name}' (in container '')")
            return DYN_TYPED
        namespace = _namespace(target_tree)
        if namespace in _UNSUPPORTED_NAMESPACES:
            self.unsupported.append(f"{namespace}.{name}()")
            return DYN_TYPED
        if name in _MACROS and args and ident_name(args[0]) is not None:
            return self._comprehension(tree, name_token, target_tree, args)
        target = self.value(self.visit(target_tree))
        arg_types = [self.value(self.visit(a)) for a in args]
        if name in _UNSUPPORTED_FUNCTIONS:
            self.unsupported.append(f".{name}()")
            return DYN_TYPED
        signatures = self.members.get(name)
        if signatures is None:
            self.error(_call_at(name_token), f"undeclared reference to '{name}' (in container '')")
            return DYN_TYPED
        return _Typed(self.overload(_call_at(name_token), name, signatures, [target, *arg_types], True))

    def _bind(
        self, tree: lark.Tree[lark.Token], token: lark.Token, args: list[lark.Tree[lark.Token]]
    ) -> _Typed:
        variable = ident_name(args[0]) if len(args) == 3 else None
        if variable is None:
            self.error(_call_at(token), "cel.bind() variable name must be a simple identifier")
            return DYN_TYPED
        bound = self.visit(args[1])
        self.scopes.append({variable: bound})
        try:
            return _Typed(self.value(self.visit(args[2])))
        finally:
            self.scopes.pop()

    def _comprehension(
        self,
        tree: lark.Tree[lark.Token],
        token: lark.Token,
        target_tree: lark.Tree[lark.Token],
        args: list[lark.Tree[lark.Token]],
    ) -> _Typed:
        name = str(token)
        if len(args) != 2:
            self.unsupported.append(f".{name}() with {len(args)} arguments")
            return DYN_TYPED
        variable = ident_name(args[0])
        assert variable is not None
        target = self.value(self.visit(target_tree))
        if target.is_dyn:
            element = DYN
        elif target.name in ("list", "map"):
            element = target.params[0]
        else:
            self.error(
                target_tree,
                f"expression of type '{target}' cannot be range of a comprehension "
                "(must be list, map, or dynamic)",
            )
            element = DYN
        self.scopes.append({variable: _Typed(element)})
        try:
            body = self.value(self.visit(args[1]))
        finally:
            self.scopes.pop()
        if name in ("all", "exists", "exists_one", "filter"):
            if not _assignable(body, BOOL):
                operator = "_||_" if name == "exists" else "_&&_"
                self.error(
                    args[1], f"found no matching overload for '{operator}' applied to '(bool, {body})'"
                )
            return _Typed(BOOL if name != "filter" else _list(element))
        return _Typed(_list(body))

    def _ident_arg(self, tree: lark.Tree[lark.Token]) -> _Typed:
        name_token = tree.children[0]
        assert isinstance(name_token, lark.Token)
        name = str(name_token)
        args = arguments(tree.children[1] if len(tree.children) > 1 else None)
        if name == "has":
            return self._has(tree, args)
        if name == "dyn" and len(args) == 1:
            self.value(self.visit(args[0]))
            return DYN_TYPED
        arg_types = [self.value(self.visit(a)) for a in args]
        if name in _UNSUPPORTED_FUNCTIONS:
            self.unsupported.append(f"{name}()")
            return DYN_TYPED
        signatures = _GLOBALS.get(name)
        if signatures is None:
            self.error(_call_at(name_token), f"undeclared reference to '{name}' (in container '')")
            return DYN_TYPED
        return _Typed(self.overload(_call_at(name_token), name, signatures, arg_types, False))

    def _has(self, tree: lark.Tree[lark.Token], args: list[lark.Tree[lark.Token]]) -> _Typed:
        selection = _unwrap(args[0]) if len(args) == 1 else None
        if selection is None or selection.data != "member_dot":
            self.error(tree, "invalid argument to has() macro")
            return _Typed(BOOL)
        target_tree, name_token = selection.children
        assert isinstance(target_tree, lark.Tree) and isinstance(name_token, lark.Token)
        target = self.visit(target_tree)
        self._select(target, str(name_token), _dot_at(name_token))
        return _Typed(BOOL)

    def _ident(self, tree: lark.Tree[lark.Token]) -> _Typed:
        token = tree.children[0]
        assert isinstance(token, lark.Token)
        name = str(token)
        bound = self._resolve(name)
        if bound is not None:
            return bound
        if name == "device":
            return _Typed(DEVICE, ("device",))
        if name in _TYPE_NAMES:
            return _Typed(TYPE)
        if name in _UNSUPPORTED_NAMESPACES:
            self.unsupported.append(name)
            return DYN_TYPED
        self.error(token, f"undeclared reference to '{name}' (in container '')")
        return DYN_TYPED

    def _dot_ident(self, tree: lark.Tree[lark.Token]) -> _Typed:
        return self._ident(tree)

    def _dot_ident_arg(self, tree: lark.Tree[lark.Token]) -> _Typed:
        self.unsupported.append(f".{tree.children[0]}()")
        return DYN_TYPED

    def _resolve(self, name: str) -> _Typed | None:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    def _literal(self, tree: lark.Tree[lark.Token]) -> _Typed:
        token = tree.children[0]
        assert isinstance(token, lark.Token)
        return _Typed(
            {
                "INT_LIT": INT,
                "UINT_LIT": UINT,
                "FLOAT_LIT": DOUBLE,
                "STRING_LIT": STRING,
                "MLSTRING_LIT": STRING,
                "BYTES_LIT": BYTES,
                "BOOL_LIT": BOOL,
                "NULL_LIT": NULL,
            }.get(token.type, DYN)
        )

    def _list_lit(self, tree: lark.Tree[lark.Token]) -> _Typed:
        element = DYN
        items = arguments(tree.children[0] if tree.children else None)
        for index, item in enumerate(items):
            kind = self.value(self.visit(item))
            joined = _join(element, kind) if index else kind
            if joined is None:
                self.error(item, f"expected type '{element}' but found '{kind}'")
            else:
                element = joined
        return _Typed(_list(element))

    def _map_lit(self, tree: lark.Tree[lark.Token]) -> _Typed:
        key, value = DYN, DYN
        entries = arguments(tree.children[0] if tree.children else None)
        for index in range(0, len(entries) - 1, 2):
            key_type = self.value(self.visit(entries[index]))
            value_type = self.value(self.visit(entries[index + 1]))
            if index == 0:
                key, value = key_type, value_type
                continue
            for seen, kind, item in (
                (key, key_type, entries[index]),
                (value, value_type, entries[index + 1]),
            ):
                if _join(seen, kind) is None:
                    self.error(item, f"expected type '{seen}' but found '{kind}'")
        return _Typed(_map(key, value))

    def _member_object(self, tree: lark.Tree[lark.Token]) -> _Typed:
        self.unsupported.append("message construction")
        return DYN_TYPED


DYN_TYPED = _Typed(DYN)


def _is_number(kind: _Type) -> bool:
    return kind in _NUMBERS


def _trees(tree: lark.Tree[lark.Token]) -> list[lark.Tree[lark.Token]]:
    return [c for c in tree.children if isinstance(c, lark.Tree)]


def arguments(exprlist: lark.Tree[lark.Token] | lark.Token | None) -> list[lark.Tree[lark.Token]]:
    return _trees(exprlist) if isinstance(exprlist, lark.Tree) else []


# Rules that wrap a single child when an expression has no operator at that level.
_PASS_THROUGH = frozenset(
    {"expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication", "unary", "member",
     "primary", "paren_expr"}
)  # fmt: skip


def _unwrap(tree: lark.Tree[lark.Token]) -> lark.Tree[lark.Token]:
    """The innermost node of a chain of single-child wrappers."""
    while tree.data in _PASS_THROUGH and len(tree.children) == 1 and isinstance(tree.children[0], lark.Tree):
        tree = tree.children[0]
    return tree


def _string_literal(tree: lark.Tree[lark.Token]) -> str | None:
    inner = _unwrap(tree)
    if inner.data == "literal":
        token = inner.children[0]
        if isinstance(token, lark.Token) and token.type in ("STRING_LIT", "MLSTRING_LIT"):
            return str(celstr(token))
    return None


def ident_name(tree: lark.Tree[lark.Token]) -> str | None:
    inner = _unwrap(tree)
    if inner.data == "ident":
        return str(inner.children[0])
    return None


def is_ident(tree: lark.Tree[lark.Token], name: str) -> bool:
    return ident_name(tree) == name


def _namespace(tree: lark.Tree[lark.Token]) -> str | None:
    name = ident_name(tree)
    return name if name in _UNSUPPORTED_NAMESPACES else None


def _operator_at(tree: lark.Tree[lark.Token], symbol: str) -> tuple[int, int]:
    """Where the operator that ends `tree`'s text stands (lark keeps no operator tokens)."""
    # lark leaves a tree's end unset when it ends in a literal it folded away (`... && true`).
    if tree.meta.empty or tree.meta.end_line is None or tree.meta.end_column is None:
        return (1, 1)
    return (tree.meta.end_line, max(1, tree.meta.end_column - len(symbol)))


def _dot_at(name_token: lark.Token) -> tuple[int, int]:
    return (name_token.line or 1, max(1, (name_token.column or 2) - 1))


def _call_at(name_token: lark.Token) -> tuple[int, int]:
    return (name_token.line or 1, name_token.end_column or 1)


def _index_at(tree: lark.Tree[lark.Token]) -> tuple[int, int]:
    target = tree.children[0]
    if isinstance(target, lark.Tree) and not target.meta.empty:
        return (target.meta.end_line, target.meta.end_column)
    return (1, 1)


def _display(text: str, errors: list[tuple[int, int, str]]) -> str:
    """cel-go's `Issues.String()`: each error with its line and the caret under its column."""
    lines = text.splitlines() or [""]
    shown = []
    for line, column, message in sorted(errors, key=lambda e: (e[0], e[1])):
        entry = f"ERROR: <input>:{line}:{column}: {message}"
        if 0 < line <= len(lines):
            snippet = lines[line - 1].replace("\t", " ")
            entry += f"\n | {snippet}\n | {'.' * (column - 1)}^"
        shown.append(entry)
    return "\n".join(shown)


def _syntax_error(text: str, err: CELParseError) -> CheckedExpression:
    if ".?" in text or "[?" in text:
        return CheckedExpression(None, None, unsupported="optional field selection (.? and [?)")
    cause = err.__context__
    token = getattr(cause, "token", None)
    if isinstance(token, lark.Token):
        what = "<EOF>" if token.type == "$END" else str(token)
        message = f"Syntax error: mismatched input '{what}'"
    elif cause is not None and hasattr(cause, "char"):
        message = f"Syntax error: token recognition error at: '{cause.char}'"
    else:
        message = "Syntax error: " + str(err.args[0]).splitlines()[0]
    line = err.line or 1
    column = err.column if isinstance(err.column, int) and err.column > 0 else len(text) + 1
    return CheckedExpression(
        None, None, problem="compilation failed: " + _display(text, [(line, column, message)])
    )


def check(text: str, *, list_type_attributes: bool) -> CheckedExpression:
    """`text` parsed and checked as the API server checks a new selector; `problem` or `unsupported`
    set when it fails."""
    try:
        tree = _ENVIRONMENT.compile(text)
    except CELParseError as err:
        return _syntax_error(text, err)
    checker = _Checker(text, list_type_attributes=list_type_attributes)
    result = checker.visit(tree)
    if checker.errors:
        return CheckedExpression(tree, None, problem="compilation failed: " + _display(text, checker.errors))
    if checker.unsupported:
        return CheckedExpression(tree, None, unsupported=", ".join(dict.fromkeys(checker.unsupported)))
    if not (result.type == BOOL or result.type.is_dyn):
        return CheckedExpression(
            tree, None, problem=f"must evaluate to bool or the unknown type, not {result.type}"
        )
    if result.path is not None:  # the expression is `device` or one of its maps itself
        checker.dynamic = True
    return CheckedExpression(tree, None if checker.dynamic else frozenset(checker.references))


_ENVIRONMENT = celpy.Environment()
