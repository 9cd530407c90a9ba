"""Counterfactuals ("would run if: ...") for the units a run left waiting, added to what
``simulate``, ``replay --explain`` and ``whatif`` print (:mod:`engine.counterfactual`
finds them on a copy of the engine's state).

The engine asked is the one that sees the whole cluster: the only shard's, or with
several shards the coordinator's view (its engine, run here as one engine: the
coordinator decides with the same plugins over the same nodes and quotas).

Cost: on demand, at the end of a command, for at most :data:`MAX_UNITS` units (the
first by name), each as :mod:`engine.counterfactual` bounds it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from engine.config import SchedulerConfig
from engine.counterfactual import MAX_UNITS, Counterfactual, counterfactual, unit_key
from engine.engine import Engine
from engine.framework.registry import Registry
from events.types import Envelope
from shards.replay import ReplayResult, verify_control
from shards.report import RunReport


def whole_engine(engines: list[Engine], view: Engine | None) -> Engine:
    """The engine that sees every node: the coordinator's view, else the only shard's."""
    return view if view is not None else engines[0]


def find(engine: Engine, pods: Iterable[str], limit: int = MAX_UNITS) -> dict[str, Counterfactual]:
    """The counterfactual of each pending pod of ``pods`` (and of its gang, under the
    gang's key), for the first ``limit`` units by name; units without one are left out."""
    units: dict[str, list[str]] = {}
    for pod in sorted(pods):
        units.setdefault(unit_key(engine, pod), []).append(pod)
    out: dict[str, Counterfactual] = {}
    for unit in sorted(units)[:limit]:
        found = counterfactual(engine, unit)
        if found is None:
            continue
        out[unit] = found
        for pod in units[unit]:
            out[pod] = found
    return out


def replayed(
    parts: Sequence[Sequence[Envelope]],
    result: ReplayResult,
    config: SchedulerConfig | None,
    registry: Registry | None,
) -> Engine | None:
    """The engine that sees the whole cluster after a replay: the one the replay
    leaves (one shard: at ``--until``, if given), or with several shards the
    coordinator's view, folded from the control partition as ``--verify`` folds it."""
    if len(parts) == 1:
        return result.engine
    if result.coordinator is None:
        verify_control(parts, config, result, registry)
    return result.coordinator.engine if result.coordinator is not None else None


def explained(
    parts: Sequence[Sequence[Envelope]],
    result: ReplayResult,
    config: SchedulerConfig | None,
    registry: Registry | None,
    pod: str,
) -> Counterfactual | None:
    """The counterfactual of ``pod`` (of its gang) in a replay (:func:`replayed`)."""
    engine = replayed(parts, result, config, registry)
    return None if engine is None else counterfactual(engine, unit_key(engine, pod))


def unit_json(engine: Engine, pod: str) -> dict[str, Any]:
    """``{"pod", "unit", "counterfactual"}`` for pod ``pod`` of ``engine`` (the live
    view's answer to "would it run if...?")."""
    unit = unit_key(engine, pod)
    found = counterfactual(engine, unit)
    return {"pod": pod, "unit": unit, "counterfactual": found.to_json() if found else None}


def pending(report: RunReport) -> list[str]:
    return [key for key, view in report.pods.items() if view.phase == "Pending"]


def add_to_json(data: dict[str, Any], found: dict[str, Counterfactual]) -> None:
    """Each pending pod's and group's ``answer`` in ``--json`` output gets its
    ``counterfactual`` (null where none was found)."""
    for section in ("pods", "groups"):
        for key, item in data.get(section, {}).items():
            answer = item.get("answer")
            if isinstance(answer, dict):
                cf = found.get(key)
                answer["counterfactual"] = cf.to_json() if cf is not None else None


def lines(found: dict[str, Counterfactual]) -> list[str]:
    """One line per unit, by name: ``UNIT would run if: ...`` (a gang once)."""
    units = {cf.unit: cf for cf in found.values()}
    return [f"{unit} {units[unit].text()}" for unit in sorted(units)]


__all__ = [
    "add_to_json",
    "explained",
    "find",
    "lines",
    "pending",
    "replayed",
    "unit_json",
    "whole_engine",
]
