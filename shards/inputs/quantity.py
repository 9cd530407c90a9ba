"""Kubernetes resource quantities, parsed exactly into canonical integers.

Grammar (``k8s.io/apimachinery/pkg/api/resource``)::

    quantity ::= <signedNumber><suffix>
    suffix   ::= Ki | Mi | Gi | Ti | Pi | Ei | n | u | m | "" | k | M | G | T | P | E
               | (e|E)<signedNumber>

Arithmetic is exact (``Decimal``); conversion to integers rounds up, as Kubernetes'
``Value()`` and ``MilliValue()`` do.
"""

from __future__ import annotations

import math
import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Final

from events.errors import InputError

_BINARY: Final = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL: Final = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_PATTERN: Final = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]+|[numkMGTPE]?)$"
)
_MAX: Final = Decimal(2**62)


def parse_quantity(text: str | int | float) -> Decimal:
    """Parse a quantity to an exact ``Decimal``; raises ``InputError`` on bad syntax."""
    if isinstance(text, bool):
        raise InputError(f"quantity must be a number or string, not {text!r}")
    if isinstance(text, int):
        return Decimal(text)
    if isinstance(text, float):
        if not math.isfinite(text):
            raise InputError(f"quantity {text!r} is not finite")
        return Decimal(repr(text))
    if not isinstance(text, str):
        raise InputError(f"quantity must be a number or string, not {type(text).__name__}")
    match = _PATTERN.match(text.strip())
    if match is None:
        raise InputError(f"invalid quantity {text!r}")
    try:
        number = Decimal(match["num"])
    except InvalidOperation:  # pragma: no cover - the pattern admits only valid numbers
        raise InputError(f"invalid quantity {text!r}") from None
    suffix = match["suffix"]
    if suffix in _BINARY:
        value = number * _BINARY[suffix]
    elif len(suffix) > 1 and suffix[0] in "eE":
        exponent = int(suffix[1:])
        if abs(exponent) > 30:
            raise InputError(f"quantity {text!r} is out of range")
        value = number.scaleb(exponent)
    else:
        value = number * _DECIMAL[suffix]
    if abs(value) > _MAX:
        raise InputError(f"quantity {text!r} is out of range")
    return value


def to_int(value: Decimal, scale: int = 1) -> int:
    """``value * scale`` rounded up to an integer (``scale=1000`` gives milli-units)."""
    return int((value * scale).to_integral_value(rounding=ROUND_CEILING))


def canonical(resource: str, text: str | int | float) -> int:
    """Parse the quantity of ``resource`` into its canonical non-negative integer.

    cpu → millicores; everything else → units (bytes for memory and storage). Extended
    resources and ``pods`` must be whole numbers, as Kubernetes requires.
    """
    value = parse_quantity(text)
    if value < 0:
        raise InputError(f"negative quantity {text!r} for {resource}")
    if resource == "cpu":
        return to_int(value, 1000)
    if "/" in resource or resource == "pods":
        if value != value.to_integral_value():
            raise InputError(f"{resource} must be a whole number, got {text!r}")
        return int(value)
    return to_int(value)


def format_quantity(resource: str, value: int) -> str:
    """Human form of a canonical integer: ``1500m`` → ``1.5``, bytes → ``4Gi``."""
    if resource == "cpu":
        return f"{value // 1000}" if value % 1000 == 0 else f"{value}m"
    if resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-"):
        for suffix, factor in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if value >= factor and value % factor == 0:
                return f"{value // factor}{suffix}"
    return str(value)
