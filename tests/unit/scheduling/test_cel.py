"""The DRA selector CEL environment (gpudra.scheduling.cel): Kubernetes' fields, functions and error words."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpudra.scheduling import cel
from gpudra.scheduling.cel import (
    CelCompileError,
    CelRuntimeError,
    CelUnsupported,
    Quantity,
    Semver,
    compile_selector,
)

DRIVER = "gpu.gpudra.io"
A = f'device.attributes["{DRIVER}"]'
C = f'device.capacity["{DRIVER}"]'


@dataclass
class Device:
    driver: str = DRIVER
    attributes: dict[str, dict[str, Any]] = field(default_factory=dict)
    capacity: dict[str, dict[str, Any]] = field(default_factory=dict)
    allow_multiple_allocations: bool = False


def h100(**attributes: dict[str, Any]) -> Device:
    return Device(
        attributes={
            "type": {"string": "gpu"},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "index": {"int": 3},
            "migCapable": {"bool": True},
            "driverVersion": {"version": "580.65.6"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "resource.kubernetes.io/pciBusID": {"string": "0000:18:00.0"},
            **attributes,
        },
        capacity={"memory": {"value": "81559Mi"}, "multiprocessors": {"value": "132"}},
    )


def matches(expression: str, device: Device | None = None, **options: Any) -> bool:
    return compile_selector(expression, **options).evaluate(device or h100())


# --- the device variable -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('device.driver == "gpu.gpudra.io"', True),
        ("device.allowMultipleAllocations", False),
        (f'{A}.type == "gpu"', True),
        (f'{A}["productName"].startsWith("NVIDIA H100")', True),
        (f"{A}.index == 3 && {A}.migCapable", True),
        # qualified names live under their own domain, not the driver's
        ('device.attributes["resource.kubernetes.io"].pciBusID == "0000:18:00.0"', True),
        (f'"resource.kubernetes.io/pciBusID" in {A}', False),
        # an unknown domain is an empty map
        ('device.attributes["other.example.com"].size() == 0', True),
        ('"model" in device.attributes["other.example.com"]', False),
        (f"has({A}.profile)", False),
        (f"has({A}.type)", True),
        (f'{C}.memory.compareTo(quantity("80Gi")) < 0', True),
        (f'{C}.memory.isGreaterThan(quantity("79Gi"))', True),
        (f"{C}.multiprocessors.asInteger() == 132", True),
        (f'cel.bind(g, {A}, g.type == "gpu" && g.index < 4)', True),
        (f"cel.bind(x, 2, cel.bind(y, x * 3, y == 6)) && {A}.index == 3", True),
        # a literal operand: the parser keeps no end position for such a tree
        (f'{A}.type == "gpu" && true', True),
        (f'{A}.type == "mig" || false', False),
    ],
)
def test_selectors_see_the_device_as_kubernetes_does(expression: str, expected: bool) -> None:
    assert matches(expression) is expected


def test_an_unknown_attribute_is_a_runtime_error_worded_as_cel_go_words_it() -> None:
    with pytest.raises(CelRuntimeError) as caught:
        matches(f'{A}.profile == "1g.10gb"')
    assert caught.value.detail == "no such key: profile"
    with pytest.raises(CelRuntimeError, match="no such key: foo"):
        matches(f'{A}["foo"] == 1')


def test_multiple_allocations_and_capacity_of_a_shared_device() -> None:
    shared = h100()
    shared.allow_multiple_allocations = True
    assert matches("device.allowMultipleAllocations", shared)


# --- semver --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        (f'{A}.driverVersion.isGreaterThan(semver("550.0.0"))', True),
        (f'{A}.driverVersion.isLessThan(semver("580.65.6"))', False),
        (f'{A}.driverVersion.compareTo(semver("580.65.6")) == 0', True),
        (f'{A}.driverVersion == semver("580.65.6")', True),
        (f"{A}.cudaComputeCapability.major() == 9 && {A}.cudaComputeCapability.minor() == 0", True),
        (f"{A}.driverVersion.patch() == 6", True),
        (f'{A}.driverVersion.compareTo(semver("v580.65", true)) > 0', True),
        ('semver("01.02.03", true) == semver("1.2.3")', True),
        ('isSemver("1.2.3") && !isSemver("1.2") && isSemver("1.2", true) && !isSemver("v1.2.3")', True),
        ('semver("1.0.0-alpha").isLessThan(semver("1.0.0"))', True),
        ('semver("1.0.0-alpha.1").isLessThan(semver("1.0.0-alpha.beta"))', True),
        ('semver("1.0.0+build.1") == semver("1.0.0+build.2")', True),
    ],
)
def test_the_semver_library(expression: str, expected: bool) -> None:
    assert matches(expression) is expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "Version string empty"),
        ("1.2", "No Major.Minor.Patch elements found"),
        ("01.2.3", 'Major number must not contain leading zeroes "01"'),
        ("1.x.3", 'Invalid character(s) found in minor number "x"'),
        ("1.2.3-", "Prerelease is empty"),
        ("1.2.3-01", 'Numeric PreRelease version must not contain leading zeroes "01"'),
        ("1.2.3+", "Build meta data is empty"),
    ],
)
def test_semver_errors_read_as_blang_semver_words_them(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=None) as caught:
        Semver.parse(text)
    assert str(caught.value) == message
    with pytest.raises(CelRuntimeError) as in_cel:
        matches(f'semver("{text}") == semver("1.0.0")')
    assert in_cel.value.detail == message


@given(
    st.tuples(st.integers(0, 999), st.integers(0, 999), st.integers(0, 999)),
    st.tuples(st.integers(0, 999), st.integers(0, 999), st.integers(0, 999)),
)
def test_release_versions_order_as_their_numbers(a: tuple[int, int, int], b: tuple[int, int, int]) -> None:
    left, right = Semver.parse(".".join(map(str, a))), Semver.parse(".".join(map(str, b)))
    assert left.compare(right) == (a > b) - (a < b)
    assert Semver.parse(str(left)) == left


# --- quantities ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('quantity("200M").compareTo(quantity("0.2G")) == 0', True),
        ('quantity("50M").compareTo(quantity("50Mi")) == -1', True),
        ('quantity("50k").add(20).sub(quantity("100k")).sub(-50000) == quantity("20")', True),
        ('quantity("1Gi").add(quantity("1Gi")) == quantity("2Gi")', True),
        ('quantity("1.5").isInteger()', False),
        ('quantity("1.5").asApproximateFloat() == 1.5', True),
        ('sign(quantity("-1")) == -1 && sign(quantity("0")) == 0', True),
        ('isQuantity("1.3Gi") && !isQuantity("200K") && !isQuantity("Three")', True),
    ],
)
def test_the_quantity_library(expression: str, expected: bool) -> None:
    assert matches(expression) is expected


def test_a_bad_quantity_and_an_integer_overflow_are_runtime_errors() -> None:
    with pytest.raises(CelRuntimeError, match="quantities must match the regular expression"):
        matches('quantity("200K").isInteger()')
    with pytest.raises(CelRuntimeError, match="cannot convert value to integer"):
        matches('quantity("9999999999999999999999999999999999999G").asInteger() > 0')


@given(st.integers(0, 2**40), st.integers(0, 2**40))
def test_quantity_comparison_is_by_value(a: int, b: int) -> None:
    assert matches(f'quantity("{a}").compareTo(quantity("{b}Ki")) == {(a > b * 1024) - (a < b * 1024)}')
    assert Quantity.parse(f"{b}Ki").value == Fraction(b * 1024)


# --- strings, lists, macros ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        f'{A}.productName.lowerAscii().contains("h100")',
        f'{A}.productName.upperAscii() == "NVIDIA H100 80GB HBM3"',
        f'{A}.productName.split(" ")[1] == "H100"',
        f'{A}.productName.indexOf("H100") == 7 && {A}.productName.lastIndexOf("B") == 18',
        f'{A}.productName.substring(0, 6) == "NVIDIA" && {A}.productName.charAt(7) == "H"',
        f'{A}.productName.replace(" ", "-") == "NVIDIA-H100-80GB-HBM3"',
        '["a", "b"].join("-") == "a-b" && " x ".trim() == "x"',
        f'{A}.productName.matches("^NVIDIA H[0-9]+")',
        "[1, 2, 3].all(x, x > 0) && [1, 2, 3].exists(x, x == 2) && [1, 2, 3].exists_one(x, x == 2)",
        "[1, 2, 3].map(x, x * 2) == [2, 4, 6] && [1, 2, 3].filter(x, x > 1).size() == 2",
        f'{A}.index in [1, 3] && "productName" in {A}',
        f"{A}.index == 3.0 && {A}.index == 3u",  # numbers compare across int, uint and double at runtime
        f'{A}.index != "3"',  # mixed types are unequal, not an error
    ],
)
def test_core_and_extension_functions(expression: str) -> None:
    assert matches(expression)


def test_includes_comes_with_list_type_attributes_only() -> None:
    with pytest.raises(CelCompileError, match="undeclared reference to 'includes'"):
        compile_selector(f'{A}.productName.includes("x")')
    assert matches(f"{A}.index.includes(3)", list_type_attributes=True)


# --- what the API server refuses -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "detail"),
    [
        (
            "foo == 1",
            "compilation failed: ERROR: <input>:1:1: undeclared reference to 'foo' (in container '')\n"
            " | foo == 1\n | ^",
        ),
        (
            "device.model == 1",
            "compilation failed: ERROR: <input>:1:7: undefined field 'model'\n"
            " | device.model == 1\n | ......^",
        ),
        (
            "device.driver == 1",
            "compilation failed: ERROR: <input>:1:15: found no matching overload for '_==_' applied to "
            "'(string, int)'\n | device.driver == 1\n | ..............^",
        ),
        (
            f'{C}.memory >= quantity("1Gi")',
            "compilation failed: ERROR: <input>:1:41: found no matching overload for '_>=_' applied to "
            "'(kubernetes.Quantity, kubernetes.Quantity)'\n"
            f' | {C}.memory >= quantity("1Gi")\n | {"." * 40}^',
        ),
        ("device.driver", "must evaluate to bool or the unknown type, not string"),
        ("semver(1) == semver(2)", None),
        ('quantity("1").major() == 1', None),
        ("device.driver.size", None),
        ('nosuch("x")', None),
        ("[1, 'a'] == [1]", None),
        ("device.driver == ", None),
    ],
)
def test_invalid_expressions_fail_to_compile_as_the_api_server_says(
    expression: str, detail: str | None
) -> None:
    with pytest.raises(CelCompileError) as caught:
        compile_selector(expression)
    if detail is not None:
        assert caught.value.detail == detail
    assert caught.value.detail.startswith(("compilation failed: ERROR: <input>:1:", "must evaluate to bool"))
    assert caught.value.field_error("spec.selectors[0].cel.expression").startswith(
        "spec.selectors[0].cel.expression: Invalid value: "
    )


def test_a_syntax_error_points_at_where_parsing_stopped() -> None:
    with pytest.raises(CelCompileError) as caught:
        compile_selector("device.driver == ")
    assert caught.value.detail.startswith(
        "compilation failed: ERROR: <input>:1:15: Syntax error: mismatched input"
    )


@pytest.mark.parametrize(
    ("expression", "detail"),
    [
        (f'{A}.driverVersion == "580.65.6"', "no such overload"),
        (
            f"{A}.index",
            "CEL result of type int could not be converted to bool: "
            "type conversion error from 'int' to 'bool'",
        ),
        (f"{A}.index / 0 == 1", None),
    ],
)
def test_type_errors_the_checker_cannot_see_fail_at_runtime(expression: str, detail: str | None) -> None:
    selector = compile_selector(expression)
    with pytest.raises(CelRuntimeError) as caught:
        selector.evaluate(h100())
    if detail is not None:
        assert caught.value.detail == detail


@pytest.mark.parametrize(
    "expression",
    [
        'ip("10.0.0.1").family() == 4',
        "sets.contains([1], [1])",
        f'{A}.productName.find("H[0-9]+") == "H100"',
        f"{A}.?productName == 'x'",
        "[1].all(i, v, v > 0)",
    ],
)
def test_what_kubernetes_has_and_gpudra_cannot_evaluate_is_said_so(expression: str) -> None:
    with pytest.raises(CelUnsupported, match="gpudra explain"):
        compile_selector(expression)


# --- what a selector reads, and remembering by it ------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "references"),
    [
        ('device.driver == "x"', {("driver",)}),
        (
            f'{A}.type == "gpu" && !device.allowMultipleAllocations',
            {("attributes", DRIVER, "type"), ("allowMultipleAllocations",)},
        ),
        (f'{A}["productName"] == "x"', {("attributes", DRIVER, "productName")}),
        (f"has({A}.profile)", {("attributes", DRIVER, "profile")}),
        (f'"profile" in {A}', {("attributes", DRIVER, "profile")}),
        (f"{C}.memory.asInteger() > 1", {("capacity", DRIVER, "memory")}),
        (
            f"cel.bind(g, {A}, g.index > 1 && g.minor < 3)",
            {("attributes", DRIVER, "index"), ("attributes", DRIVER, "minor")},
        ),
        (
            'device.attributes["resource.kubernetes.io"].pciBusID != ""',
            {("attributes", "resource.kubernetes.io", "pciBusID")},
        ),
        ("semver('1.0.0').major() == 1", set()),
        # the whole map escapes: the fields it reads cannot be named
        (f"{A}.size() > 3", None),
        ("device.attributes.exists(d, d == 'x')", None),
        (f"{A}[device.driver] == 'x'", None),
        ("cel.bind(d, device, d.driver == 'x')", {("driver",)}),  # an alias of the device is followed
        ("cel.bind(d, device, d == d)", None),
    ],
)
def test_references_name_exactly_the_fields_an_expression_reads(
    expression: str, references: set[tuple[str, ...]] | None
) -> None:
    selector = compile_selector(expression)
    assert selector.references == (None if references is None else frozenset(references))


def test_a_selector_evaluates_once_per_distinct_value_of_what_it_reads() -> None:
    selector = compile_selector(f'{A}.productName.startsWith("NVIDIA H1") && {A}.minor >= 0')
    devices = [h100(minor={"int": n % 2}, uuid={"string": f"GPU-{n}"}) for n in range(10)]
    with mock.patch.object(
        cel.Selector, "evaluate", autospec=True, side_effect=cel.Selector.evaluate
    ) as evaluate:
        assert all(selector.matches(d) for d in devices)
    assert evaluate.call_count == 2  # minor 0 and minor 1; the uuid is not read


def test_an_expression_that_reads_everything_is_evaluated_on_every_device() -> None:
    selector = compile_selector(f"{A}.size() > 0")
    with mock.patch.object(
        cel.Selector, "evaluate", autospec=True, side_effect=cel.Selector.evaluate
    ) as evaluate:
        assert all(selector.matches(h100()) for _ in range(3))
    assert evaluate.call_count == 3


def test_runtime_errors_are_remembered_too() -> None:
    selector = compile_selector(f'{A}.profile == "x"')
    for _ in range(2):
        with pytest.raises(CelRuntimeError, match="no such key: profile"):
            selector.matches(h100())


@given(st.integers(-1000, 1000), st.integers(-1000, 1000))
def test_remembered_results_equal_fresh_evaluation(index: int, bound: int) -> None:
    selector = compile_selector(f"{A}.index < {bound}")
    device = h100(index={"int": index})
    assert selector.matches(device) == selector.evaluate(device) == (index < bound)
