from __future__ import annotations

import pytest

from events.errors import InputError
from shards.inputs.quantity import canonical, format_quantity, parse_quantity


@pytest.mark.parametrize(
    ("resource", "text", "expected"),
    [
        ("cpu", "500m", 500),
        ("cpu", "1", 1000),
        ("cpu", "2.5", 2500),
        ("cpu", 3, 3000),
        ("cpu", 0.1, 100),
        ("cpu", "1e3", 1_000_000),
        ("cpu", "0.0001", 1),  # rounds up, as Kubernetes' MilliValue does
        ("cpu", "100u", 1),
        ("memory", "4Gi", 4 << 30),
        ("memory", "128Mi", 128 << 20),
        ("memory", "1k", 1000),
        ("memory", "1M", 1_000_000),
        ("memory", "1.5Ki", 1536),
        ("memory", "16Pi", 2**54),  # the most a quantity may be (shards.inputs.limits)
        ("cpu", "18014398509481984m", 2**54),
        ("memory", "12e-1", 2),  # 1.2 bytes rounds up
        ("memory", "+5", 5),
        ("nvidia.com/gpu", "8", 8),
        ("pods", 110, 110),
        ("ephemeral-storage", "10Gi", 10 << 30),
    ],
)
def test_canonical(resource: str, text: str | int | float, expected: int) -> None:
    assert canonical(resource, text) == expected


@pytest.mark.parametrize(
    ("resource", "text", "message"),
    [
        ("cpu", "-1", "negative"),
        ("memory", "-1Gi", "negative"),
        ("cpu", "abc", "invalid quantity"),
        ("cpu", "1.2.3", "invalid quantity"),
        ("cpu", "", "invalid quantity"),
        ("cpu", "1Kb", "invalid quantity"),
        ("memory", "1 Gi", "invalid quantity"),
        ("memory", "1e999", "out of range"),
        ("memory", "99999999999Ei", "out of range"),
        ("memory", "1E", "out of range"),
        ("cpu", "100P", "out of range"),
        ("cpu", "18014398509481985m", "out of range"),
        ("nvidia.com/gpu", "0.5", "whole number"),
        ("pods", "1.5", "whole number"),
        ("cpu", True, "number or string"),
        ("cpu", None, "number or string"),
        ("cpu", [1], "number or string"),
        ("cpu", float("nan"), "not finite"),
        ("cpu", float("inf"), "not finite"),
    ],
)
def test_bad_quantities(resource: str, text: object, message: str) -> None:
    with pytest.raises(InputError, match=message):
        canonical(resource, text)  # type: ignore[arg-type]


def test_parse_is_exact() -> None:
    assert parse_quantity("0.1") * 3 == parse_quantity("0.3")


@pytest.mark.parametrize(
    ("resource", "value", "text"),
    [
        ("cpu", 1500, "1500m"),
        ("cpu", 2000, "2"),
        ("memory", 4 << 30, "4Gi"),
        ("memory", 1000, "1000"),
    ],
)
def test_format(resource: str, value: int, text: str) -> None:
    assert format_quantity(resource, value) == text
