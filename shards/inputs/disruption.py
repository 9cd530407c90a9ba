"""``PodDisruptionBudget`` objects (``policy/v1`` and ``policy/v1beta1``) → :class:`BudgetSpec`.

Read as the API server validates them: ``spec.selector`` a label selector,
``minAvailable`` or ``maxUnavailable`` (not both), each a non-negative integer or a
percent ``0%``..``100%``; neither: ``minAvailable`` 1 (the API's default). Selectors
differ by version: in ``policy/v1beta1`` an empty (or absent) selector picks no pod, in
``policy/v1`` an empty one picks every pod of the namespace and an absent one none.
``unhealthyPodEvictionPolicy`` is read and not acted on (the engine counts placed pods
as healthy, and a pod not placed is never moved). Any other field of ``spec`` is an
error naming it. Used for scenario files and for Kubernetes ingest alike.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from events.errors import InputError
from events.types import BudgetSpec
from shards.inputs.fields import _map, _name
from shards.inputs.limits import shown
from shards.inputs.podaffinity import label_selector

VERSIONS: Final = ("policy/v1", "policy/v1beta1")
KIND: Final = "PodDisruptionBudget"
SPEC_FIELDS: Final = frozenset(
    {"selector", "minAvailable", "maxUnavailable", "unhealthyPodEvictionPolicy"}
)
POLICIES: Final = ("IfHealthyBudget", "AlwaysAllow")
_PERCENT: Final = re.compile(r"^(\d{1,3})%$")
MAX_COUNT: Final = 1 << 31


def _int_or_percent(value: Any, where: str) -> int | str:
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < MAX_COUNT:
            raise InputError(f"must be 0 or more, got {shown(value)}", location=where)
        return value
    if isinstance(value, str):
        match = _PERCENT.match(value)
        if match is not None and int(match.group(1)) <= 100:
            return f"{int(match.group(1))}%"
    raise InputError(
        f"must be an integer or a percent 0%..100%, got {shown(value)}", location=where
    )


def disruption_budget(obj: Mapping[str, Any]) -> tuple[BudgetSpec, list[tuple[str, str]]]:
    """The budget, and the fields read but not acted on (field, why)."""
    version = obj.get("apiVersion")
    meta = _map(obj.get("metadata"), "metadata", required=True)
    namespace = meta.get("namespace", "default")
    if not isinstance(namespace, str) or not namespace or "/" in namespace:
        raise InputError(f"invalid namespace {shown(namespace)}", location="metadata.namespace")
    uid = meta.get("uid", "")
    if not isinstance(uid, str):
        raise InputError(f"must be a string, got {shown(uid)}", location="metadata.uid")
    spec = _map(obj.get("spec"), "spec")
    for key in spec:
        if key not in SPEC_FIELDS:
            raise InputError(
                f"unknown field {shown(key)} (known: {', '.join(sorted(SPEC_FIELDS))})",
                location=f"spec.{key}",
            )
    warnings: list[tuple[str, str]] = []
    policy = spec.get("unhealthyPodEvictionPolicy")
    if policy is not None:
        if policy not in POLICIES:
            raise InputError(
                f"must be one of {', '.join(POLICIES)}, got {shown(policy)}",
                location="spec.unhealthyPodEvictionPolicy",
            )
        warnings.append(
            (
                "spec.unhealthyPodEvictionPolicy",
                "not acted on: shoal never moves or evicts a pod that is not running",
            )
        )
    minimum = spec.get("minAvailable")
    maximum = spec.get("maxUnavailable")
    if minimum is not None and maximum is not None:
        raise InputError(
            "minAvailable and maxUnavailable cannot both be set", location="spec.maxUnavailable"
        )
    selector = label_selector(spec.get("selector"), "spec.selector")
    if (
        version != "policy/v1"
        and selector is not None
        and not selector.match_labels
        and not selector.match_expressions
    ):
        selector = None  # policy/v1beta1: an empty selector picks no pod
    return (
        BudgetSpec(
            namespace=namespace,
            name=_name(meta, "metadata"),
            selector=selector,
            min_available=_int_or_percent(minimum, "spec.minAvailable")
            if minimum is not None
            else (1 if maximum is None else None),
            max_unavailable=_int_or_percent(maximum, "spec.maxUnavailable")
            if maximum is not None
            else None,
            uid=uid,
        ),
        warnings,
    )
