"""Kubernetes quantity parsing: the API server's grammar, exact values."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils.quantity import parse_quantity as client_parse_quantity

from gpudra.errors import ConfigError
from gpudra.quantity import parse_quantity

SUFFIXES = {
    "": 1,
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("1", 1),
        ("10Gi", 10 * 2**30),
        ("1.5Gi", 3 * 2**29),
        ("512Mi", 512 * 2**20),
        ("1.5G", 1_500_000_000),
        ("100m", Fraction(1, 10)),
        (".5", Fraction(1, 2)),
        ("1.", 1),
        ("5.Mi", 5 * 2**20),
        ("+3k", 3000),
        ("-2M", -2_000_000),
        ("1e9", 10**9),
        ("1E3", 1000),
        ("1e+3", 1000),
        ("25e-1", Fraction(5, 2)),
        ("1E", 10**18),
        ("007", 7),
        ("123456789012345678901234567890Ei", 123456789012345678901234567890 * 2**60),
    ],
    ids=str,
)
def test_parses_exactly(text: str, value: Fraction | int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "",
        ".",
        "Gi",
        "e3",
        "1e",
        "1K",
        "1ki",
        "1KI",
        "1 Gi",
        " 1",
        "1\n",
        "1.5.5",
        "1_000",
        "NaN",
        "Infinity",
        "0x10",
        "1Gib",
        "--1",
        "\u0661",
    ],
    ids=repr,
)
def test_rejects_what_the_api_server_rejects(text: str) -> None:
    with pytest.raises(
        ConfigError, match=r"^must be a Kubernetes quantity such as 512Mi, 10Gi, 1.5G or 1e9, not "
    ):
        parse_quantity(text)


def test_rejects_huge_exponents_quickly() -> None:
    with pytest.raises(ConfigError, match=r"exponent of '1e999999999' is out of range \(-100 to 100\)"):
        parse_quantity("1e999999999")


def test_rejects_overlong_text() -> None:
    with pytest.raises(ConfigError, match="65 characters is too long"):
        parse_quantity("1" * 65)


@given(
    sign=st.sampled_from(["", "+", "-"]),
    whole=st.integers(0, 10**20),
    fraction=st.text("0123456789", max_size=9),
    suffix=st.sampled_from(sorted(SUFFIXES)),
)
def test_round_trip_with_suffix(sign: str, whole: int, fraction: str, suffix: str) -> None:
    text = f"{sign}{whole}{'.' + fraction if fraction else ''}{suffix}"
    expected = (whole + Fraction(int(fraction or "0"), 10 ** len(fraction))) * SUFFIXES[suffix]
    assert parse_quantity(text) == (-expected if sign == "-" else expected)


@given(mantissa=st.integers(-(10**12), 10**12), exponent=st.integers(-100, 100), letter=st.sampled_from("eE"))
def test_round_trip_with_exponent(mantissa: int, exponent: int, letter: str) -> None:
    assert parse_quantity(f"{mantissa}{letter}{exponent}") == mantissa * Fraction(10) ** exponent


@given(
    whole=st.integers(0, 10**6),
    fraction=st.text("0123456789", max_size=2),
    suffix=st.sampled_from(sorted(SUFFIXES)),
)
def test_agrees_with_the_kubernetes_client(whole: int, fraction: str, suffix: str) -> None:
    text = f"{whole}{'.' + fraction if fraction else ''}{suffix}"
    assert parse_quantity(text) == Fraction(Decimal(client_parse_quantity(text)))
