"""Reading plain data (YAML or the API's JSON) field by field: each helper checks one
field's shape and raises :class:`InputError` naming it; the caller prefixes file and
document."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Final

from events.errors import InputError
from events.types import SECOND
from shards.inputs.limits import MAX_LABEL_VALUE, MAX_SECONDS, shown
from shards.inputs.quantity import canonical

MAX_NAME: Final = 253


def _map(value: Any, where: str, *, required: bool = False) -> Mapping[str, Any]:
    if value is None:
        if required:
            raise InputError("missing", location=where)
        return {}
    if not isinstance(value, Mapping):
        raise InputError(f"must be a mapping, got {type(value).__name__}", location=where)
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InputError(f"must be a list, got {type(value).__name__}", location=where)
    return value


def _str(value: Any, where: str, *, default: str | None = None) -> str:
    if value is None and default is not None:
        return default
    if not isinstance(value, str):
        raise InputError(
            "missing" if value is None else f"must be a string, got {shown(value)}", location=where
        )
    return value


def _string_map(value: Any, where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, val in _map(value, where).items():
        if not isinstance(key, str) or not key:
            raise InputError(f"keys must be non-empty strings, got {shown(key)}", location=where)
        if isinstance(val, bool) or val is None or not isinstance(val, str | int | float):
            raise InputError(f"value must be a string, got {shown(val)}", location=f"{where}.{key}")
        out[key] = val if isinstance(val, str) else str(val)
    return out


def _labels(value: Any, where: str) -> dict[str, str]:
    """Labels: a string map whose values have at most 63 characters (Kubernetes' rule;
    ``Gt``/``Lt`` read them as numbers, which must fit a float)."""
    labels = _string_map(value, where)
    for key, val in labels.items():
        if len(val) > MAX_LABEL_VALUE:
            raise InputError(
                f"a label value has at most {MAX_LABEL_VALUE} characters, got {len(val)}",
                location=f"{where}.{key}",
            )
    return labels


def _name(meta: Mapping[str, Any], where: str) -> str:
    name = _str(meta.get("name"), f"{where}.name")
    if not name or len(name) > MAX_NAME or "/" in name or name.strip() != name:
        raise InputError(f"invalid name {shown(name)}", location=f"{where}.name")
    return name


def identity(obj: Mapping[str, Any], kind: str) -> tuple[Mapping[str, Any], str, str, str]:
    """A workload object's metadata, name, namespace and uid; without a uid of its own,
    a stable one made from ``kind`` (as ``Kind.group`` or ``Kind``), namespace and name,
    so that a scenario read twice names the same objects."""
    meta = _map(obj.get("metadata"), "metadata", required=True)
    name = _name(meta, "metadata")
    namespace = meta.get("namespace", "default")
    if not isinstance(namespace, str) or not namespace or "/" in namespace:
        raise InputError(f"invalid namespace {shown(namespace)}", location="metadata.namespace")
    uid = meta.get("uid")
    if uid is None:
        uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"shoal:{kind}/{namespace}/{name}"))
    elif not isinstance(uid, str):
        raise InputError("must be a string", location="metadata.uid")
    return meta, name, namespace, uid


def _seconds(value: Any, where: str, *, positive: bool) -> int:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise InputError(
            f"must be a number of seconds, got {shown(value)}", location=where
        ) from None
    if not math.isfinite(seconds) or seconds < 0 or (positive and seconds == 0):
        raise InputError(
            f"must be {'positive' if positive else 'non-negative'}, got {shown(value)}",
            location=where,
        )
    if seconds > MAX_SECONDS:
        raise InputError(
            f"must be at most {MAX_SECONDS} seconds, got {shown(value)}", location=where
        )
    nanoseconds = round(seconds * SECOND)
    if positive and nanoseconds == 0:
        raise InputError(f"must be at least a nanosecond, got {shown(value)}", location=where)
    return nanoseconds


def quantities(value: Any, where: str, *, required: bool = False) -> dict[str, int]:
    out: dict[str, int] = {}
    for resource, amount in _map(value, where, required=required).items():
        loc = f"{where}.{resource}"
        if not isinstance(resource, str) or not resource:
            raise InputError("resource names must be non-empty strings", location=where)
        if amount is None:
            raise InputError("missing quantity", location=loc)
        try:
            out[resource] = canonical(resource, amount)
        except InputError as exc:
            raise InputError(exc.message, location=loc) from None
    return out


def edit_distance(a: str, b: str) -> int:
    """Damerau-Levenshtein distance (optimal string alignment): insertions, deletions,
    substitutions and swaps of two neighbours each count one."""
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                current[j] = min(current[j], previous2[j - 2] + 1)
        previous2, previous = previous, current
    return previous[-1]


def typo_of(word: str, known: Iterable[str]) -> str | None:
    """The name in ``known`` that ``word`` is a typo of (case aside, one edit from a name
    of up to 4 characters, two from a longer one), or None. The closest wins; ties go
    to the first in ``known``'s sorted order."""
    folded = word.lower()
    best: tuple[int, str] | None = None
    for name in sorted(known):
        if abs(len(name) - len(word)) > 2:
            continue
        distance = edit_distance(folded, name.lower())
        if distance <= (1 if len(name) <= 4 else 2) and (best is None or distance < best[0]):
            best = (distance, name)
    return None if best is None else best[1]
