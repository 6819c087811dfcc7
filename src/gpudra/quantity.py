"""Kubernetes resource quantities (`10Gi`, `1.5G`, `512M`, `1e9`) parsed to exact numbers. Pure.

The kubernetes client's `kubernetes.utils.parse_quantity` is not used: importing it runs
`kubernetes/__init__.py`, which imports the whole client (the pure modules must not), it rounds through
28-digit Decimals, and it accepts spellings the API server refuses (`1K`, `1_000`, `NaN`). This parser
follows the API server's grammar (k8s.io/apimachinery `resource.ParseQuantity`):

    quantity ::= [+-] number suffix
    number   ::= digits | digits "." [digits] | "." digits
    suffix   ::= "" | Ki | Mi | Gi | Ti | Pi | Ei | n | u | m | k | M | G | T | P | E | (e|E) [+-] digits
"""

from __future__ import annotations

import re
from fractions import Fraction

from gpudra.errors import ConfigError

__all__ = ["QUANTITY_PATTERN", "Amount", "parse_quantity"]

# A quantity's exact value: an int when it is whole (nearly always, and far faster to add up), else a Fraction
Amount = int | Fraction

_MULTIPLIERS: dict[str, Fraction] = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}

# Also the JSON Schema `pattern` of quantity fields, hence plain groups (ECMAScript has no `(?P<name>`).
# The exponent alternative comes first so that `1E3` is 1000 while a bare `1E` stays one exa.
QUANTITY_PATTERN = (
    r"^([+-]?)(?:([0-9]+)(?:\.([0-9]*))?|\.([0-9]+))(?:[eE]([+-]?[0-9]+)|([KMGTPE]i|[numkMGTPE]))?$"
)
_QUANTITY = re.compile(QUANTITY_PATTERN)

# Far beyond any real quantity; the caps keep a hostile `1e999999999` from costing minutes to expand.
_MAX_LENGTH = 64
_MAX_EXPONENT = 100

_EXPECTED = "must be a Kubernetes quantity such as 512Mi, 10Gi, 1.5G or 1e9"


def parse_quantity(text: str) -> Fraction:
    """The exact value of a quantity string; ConfigError (without a field) when it is not one."""
    if len(text) > _MAX_LENGTH:
        raise ConfigError(f"{_EXPECTED}; {len(text)} characters is too long (at most {_MAX_LENGTH})")
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise ConfigError(f"{_EXPECTED}, not {text!r}")
    sign, whole, fraction, bare_fraction, exponent, suffix = match.groups()
    fraction = fraction or bare_fraction or ""
    value = Fraction(int((whole or "") + fraction or "0"), 10 ** len(fraction))
    if exponent is not None:
        if abs(int(exponent)) > _MAX_EXPONENT:
            raise ConfigError(f"{_EXPECTED}; the exponent of {text!r} is out of range (-100 to 100)")
        value *= Fraction(10) ** int(exponent)
    else:
        value *= _MULTIPLIERS[suffix or ""]
    return -value if sign == "-" else value
