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
from shards.inputs.limits import MAX_QUANTITY, shown

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
        raise InputError(f"quantity must be a number or string, not {shown(text)}")
    if isinstance(text, int):
        return Decimal(text)
    if isinstance(text, float):
        if not math.isfinite(text):
            raise InputError(f"quantity {shown(text)} is not finite")
        return Decimal(repr(text))
    if not isinstance(text, str):
        raise InputError(f"quantity must be a number or string, not {type(text).__name__}")
    match = _PATTERN.match(text.strip())
    if match is None:
        raise InputError(f"invalid quantity {shown(text)}")
    try:
        number = Decimal(match["num"])
    except InvalidOperation:  # pragma: no cover - the pattern admits only valid numbers
        raise InputError(f"invalid quantity {shown(text)}") from None
    suffix = match["suffix"]
    if suffix in _BINARY:
        value = number * _BINARY[suffix]
    elif len(suffix) > 1 and suffix[0] in "eE":
        exponent = int(suffix[1:])
        if abs(exponent) > 30:
            raise InputError(f"quantity {shown(text)} is out of range")
        value = number.scaleb(exponent)
    else:
        value = number * _DECIMAL[suffix]
    if abs(value) > _MAX:
        raise InputError(f"quantity {shown(text)} is out of range")
    return value


def to_int(value: Decimal, scale: int = 1) -> int:
    """``value * scale`` rounded up to an integer (``scale=1000`` gives milli-units)."""
    return int((value * scale).to_integral_value(rounding=ROUND_CEILING))


def canonical(resource: str, text: str | int | float) -> int:
    """Parse the quantity of ``resource`` into its canonical non-negative integer.

    cpu → millicores; everything else → units (bytes for memory and storage). Extended
    resources and ``pods`` must be whole numbers, as Kubernetes requires. At most
    :data:`~shards.inputs.limits.MAX_QUANTITY` (``16384Ti`` of memory, ``18014398509481984m``
    of cpu): the engine's int64 columns hold sums and products of these.
    """
    value = parse_quantity(text)
    if value < 0:
        raise InputError(f"negative quantity {shown(text)} for {resource}")
    if resource == "cpu":
        amount = to_int(value, 1000)
    elif "/" in resource or resource == "pods":
        if value != value.to_integral_value():
            raise InputError(f"{resource} must be a whole number, got {shown(text)}")
        amount = int(value)
    else:
        amount = to_int(value)
    if amount > MAX_QUANTITY:
        raise InputError(
            f"quantity {shown(text)} of {resource} is out of range "
            f"(at most {format_quantity(resource, MAX_QUANTITY)})"
        )
    return amount


def format_quantity(resource: str, value: int) -> str:
    """Human form of a canonical integer: ``1500m`` → ``1.5``, bytes → ``4Gi``."""
    if resource == "cpu":
        return f"{value // 1000}" if value % 1000 == 0 else f"{value}m"
    if resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-"):
        for suffix, factor in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if value >= factor and value % factor == 0:
                return f"{value // factor}{suffix}"
    return str(value)
