"""Kubernetes resource quantities (``512Mi``, ``2``, ``250m``, ``1e3``) read as the API server reads them.

Where it sits: a leaf of the library (standard library only), below :mod:`monarch_spmd.spec`,
whose rules check the pod template's resources and ``spec.shmSize`` with it, and beside the
CEL functions ``isQuantity()`` and ``quantity()`` that the CRD's rules use for the same checks on
the API server (Kubernetes' CEL quantity library, which calls ``resource.ParseQuantity``).

:func:`parse` follows ``k8s.io/apimachinery/pkg/api/resource.ParseQuantity``: an optional sign,
digits with at most one ``.``, then a suffix: a binary one (``Ki Mi Gi Ti Pi Ei``), a decimal
one (``n u m k M G T P E`` or none) or a decimal exponent (``e3``, ``E-2``). The value is exact
(a :class:`fractions.Fraction`), with Kubernetes' rounding (up to a whole nano-unit) and cap
(2^63-1, for a value too long for its exact int64 form, unless written with an exponent). Anything else is
not a quantity: the API server answers a pod carrying one with "quantities must match the
regular expression ...", naming no field.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Final

_DECIMAL_SUFFIXES: Final = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SUFFIXES: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_SUFFIX_CHARS: Final = frozenset("eEinumkKMGTP")
_DIGITS: Final = frozenset("0123456789")
#: The largest quantity Kubernetes keeps for the binary and decimal suffixes (int64).
MAX: Final = Fraction(2**63 - 1)
_NANO: Final = Fraction(1, 10**9)


def _split(text: str) -> tuple[bool, str, str, str] | None:
    """``parseQuantityString``: (positive, numerator digits, denominator digits, suffix), or None."""
    pos, end = 0, len(text)
    positive = True
    if text[:1] in ("-", "+"):
        positive = text[0] == "+"
        pos = 1
    while pos < end and text[pos] == "0":
        pos += 1
    if pos >= end:
        return positive, "0", "", ""
    start = pos
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    num = text[start:pos] or "0"
    denom = ""
    if pos < end and text[pos] == ".":
        pos += 1
        start = pos
        while pos < end and text[pos] in _DIGITS:
            pos += 1
        denom = text[start:pos]
    suffix_start = pos
    while pos < end and text[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos < end and text[pos] in "+-":
        pos += 1
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    if pos < end:
        return None
    return positive, num, denom, text[suffix_start:]


def _go_int32(value: int) -> int:
    """int32(value) as Go truncates an int64."""
    value &= 0xFFFFFFFF
    return value - 2**32 if value >= 2**31 else value


def _exponent(suffix: str) -> tuple[int, int, str] | None:
    """(base, exponent, format) of a suffix, or None when Kubernetes does not know it."""
    if suffix in _DECIMAL_SUFFIXES:
        return 10, _DECIMAL_SUFFIXES[suffix], "DecimalSI"
    if suffix in _BINARY_SUFFIXES:
        return 2, _BINARY_SUFFIXES[suffix], "BinarySI"
    if len(suffix) > 1 and suffix[0] in "eE":
        digits = suffix[1:]
        body = digits[1:] if digits[:1] in "+-" else digits
        if not body or not set(body) <= _DIGITS:
            return None
        value = int(digits)
        if not -(2**63) <= value < 2**63:
            return None
        return 10, _go_int32(value), "DecimalExponent"
    return None


def parse(text: object) -> Fraction | None:
    """The value of a quantity string as Kubernetes stores it, or None if it is not one.

    >>> parse("512Mi") == 512 * 2**20, parse("250m"), parse("2 Gi")
    (True, Fraction(1, 4), None)
    """
    if not isinstance(text, str) or not text:
        return None
    if text == "0":
        return Fraction(0)
    split = _split(text)
    if split is None:
        return None
    positive, num, denom, suffix = split
    found = _exponent(suffix)
    if found is None:
        return None
    base, exponent, fmt = found
    sign = 1 if positive else -1
    # The fast path of ParseQuantity: few digits, kept exactly as an int64 and a scale, never capped.
    if base == 10:
        scale, mantissa, precision = exponent, 1, 18 - (len(num) + len(denom))
    elif exponent >= 0 and not denom:
        scale, mantissa, precision = 0, 2**exponent, 15 - len(num) - int(exponent * 3 / 10) - 1
    else:
        scale, mantissa, precision = 0, 1, -1
    if precision >= 0 and scale - len(denom) >= -9:
        result = int(num + denom) * mantissa
        if result < 2**63:
            # An int64 and a scale of up to 2^31: past 10^4000 only the order matters to anyone.
            return sign * Fraction(result) * Fraction(10) ** min(scale - len(denom), 4000)
    # The slow path: exact, rounded up to a whole nano-unit, capped at 2^63-1 (but a decimal exponent).
    digits = int(num + denom)
    if digits == 0:
        return Fraction(0)
    if base == 2:
        amount = Fraction(digits, 10 ** len(denom)) * 2**exponent
    else:
        power = exponent - len(denom)
        magnitude = len(str(digits)) + power
        # Bound the arithmetic: past 10^40 a value is over the cap (or, with an exponent, simply
        # huge); below 10^-30 every non-zero value rounds up to 1n.
        if magnitude > 40:
            if fmt != "DecimalExponent":
                return sign * MAX
            return sign * Fraction(10) ** min(magnitude, 4000)
        if magnitude < -30:
            return sign * _NANO
        amount = Fraction(digits) * Fraction(10) ** power
    amount = math.ceil(amount / _NANO) * _NANO
    if fmt != "DecimalExponent" and amount > MAX:
        amount = MAX
    return sign * amount


def is_quantity(text: object) -> bool:
    """Whether ``text`` is a quantity string (CEL's ``isQuantity``)."""
    return parse(text) is not None


def show(value: Fraction) -> str:
    """A quantity in bytes for messages: ``1Mi``, ``1Ti``, or the plain number."""
    for suffix, power in sorted(_BINARY_SUFFIXES.items(), key=lambda kv: -kv[1]):
        unit = 2**power
        if value >= unit and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value if value.denominator != 1 else value.numerator)
