"""Snapshots of the coordinator: its view (an engine's state) and what it has under way.

The coordinator's state is an engine's (the view of every shard) and its own
bookkeeping (routing, flights, claims, evictions, relays). Both go into one tree of
the engine's snapshot format (:mod:`engine.snapshot`): the engine's attributes under
``engine.``, the coordinator's under ``coordinator.``, the worker's positions under
``worker.``; an object referenced twice is restored once. A snapshot that does not
decode, does not match its digest, or holds anything but these state classes is
refused (:class:`~engine.snapshot.SnapshotError`, a ``ValueError``), and the control
partition is folded from the start instead.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from engine.config import SchedulerConfig, parse_config
from engine.model.pools import PoolRule, Sharding
from engine.snapshot import (
    DERIVED,
    ENUMS,
    NOT_STATE,
    STATE_CLASSES,
    Allowed,
    SnapshotError,
    _Decoder,
    assemble,
    config_source,
    decode_tree,
    digest,
    encode_tree,
    encode_trees,
    rederive,
    snapshot_parts,
)
from events.errors import InputError
from events.types import SnapshotTaken
from shards.coordinator.coordinator import Coordinator
from shards.coordinator.dispatch import ShardDispatch
from shards.coordinator.flights import Claim, Flight, Stage
from shards.coordinator.routing import Routing

COMPONENT: Final = "coordinator"
COORDINATOR: Final = COMPONENT
"""The producer of the coordinator's snapshots."""
TRANSIENT: Final = frozenset(
    {
        "engine",
        "_out",
        "_cache",
        "_cache_at",
        "folded_in_bulk",
        "_preparing",
        "_preparing_of",
        "_due",
        "issued",
        "pass_from",
        "_flying",
        "_flying_of",
    }
)
"""Coordinator attributes that are not state (the engine is written on its own; the
rest is empty or rebuilt between passes, or counts how the fold went: a replay folds
one record at a time)."""
ALLOWED: Final = Allowed(
    {
        **STATE_CLASSES,
        **{c.__qualname__: c for c in (Routing, Flight, Claim, Sharding, PoolRule)},
    },
    {**ENUMS, Stage.__qualname__: Stage},
    DERIVED,
)


def _pairs(coordinator: Coordinator) -> list[tuple[str, Any]]:
    engine = coordinator.engine
    engine.queue.compact()
    engine.deadlines.compact()
    pairs = [(f"engine.{k}", v) for k, v in vars(engine).items() if k not in NOT_STATE]
    pairs += [(f"coordinator.{k}", v) for k, v in vars(coordinator).items() if k not in TRANSIENT]
    return pairs


def coordinator_state(coordinator: Coordinator) -> bytes:
    """The coordinator's state alone, as bytes (what replay compares with a snapshot)."""
    return encode_tree({}, _pairs(coordinator), ALLOWED)


def snapshot_coordinator(
    coordinator: Coordinator,
    position: int,
    written: list[int],
    last_own: list[int],
    relay_from: list[int],
) -> list[SnapshotTaken]:
    worker = [
        ("worker.position", position),
        ("worker.written", written),
        ("worker.last_own", last_own),
        ("worker.relay_from", relay_from),
    ]

    def header(state: bytes) -> dict[str, Any]:
        return {
            "component": COMPONENT,
            "shards": coordinator.n,
            "config": config_source(coordinator.engine.config),
            "state_digest": digest(state),
        }

    # the state is encoded once, for its digest and for the snapshot
    _, raw = encode_trees(header, _pairs(coordinator), worker, ALLOWED)
    return snapshot_parts(raw, position, component=COMPONENT)


def snapshot_digest(parts: Sequence[SnapshotTaken]) -> str:
    """The digest of the coordinator's state recorded in a snapshot."""
    recorded = decode_tree(assemble(parts)).get("state_digest")
    if not isinstance(recorded, str):
        raise SnapshotError("no digest of the coordinator's state")
    return recorded


def restore_coordinator(
    parts: Sequence[SnapshotTaken], sharding: Sharding, config: SchedulerConfig | None
) -> tuple[Coordinator, int, list[int], list[int], list[int]]:
    """The coordinator a snapshot holds, and the worker's positions (position, written,
    last own record, relayed) per partition."""
    tree = decode_tree(assemble(parts))
    if tree.get("component") != COMPONENT or tree.get("shards") != sharding.shards:
        raise SnapshotError("not a snapshot of this coordinator")
    source = tree.get("config")
    if not isinstance(source, str):
        raise SnapshotError("malformed configuration")
    if source:
        try:
            config = parse_config(json.loads(source), "snapshot")
        except (ValueError, InputError) as exc:
            raise SnapshotError(f"its configuration is invalid: {exc}") from None
    coordinator = Coordinator(sharding, config)
    engine = coordinator.engine
    decoder = _Decoder(ALLOWED)
    expected_engine = {k for k in vars(engine) if k not in NOT_STATE}
    expected_own = {k for k in vars(coordinator) if k not in TRANSIENT}
    worker: dict[str, Any] = {}
    seen: set[str] = set()
    try:
        for pair in tree["state"]:
            if not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[0], str):
                raise SnapshotError(f"unexpected entry {pair!r:.60}")
            scope, _, name = pair[0].partition(".")
            value = decoder.decode(pair[1])
            if scope == "engine" and name in expected_engine:
                _check(getattr(engine, name), value, pair[0])
                setattr(engine, name, value)
            elif scope == "coordinator" and name in expected_own:
                _check(getattr(coordinator, name), value, pair[0])
                setattr(coordinator, name, value)
            elif scope == "worker" and name in ("position", "written", "last_own", "relay_from"):
                worker[name] = value
            else:
                raise SnapshotError(f"unexpected attribute {pair[0]!r}")
            seen.add(pair[0])
        rederive(decoder, engine)
    except RecursionError:
        raise SnapshotError("nested too deeply") from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
        if isinstance(exc, SnapshotError):
            raise
        raise SnapshotError(f"inconsistent: {exc}") from None
    wanted = {f"engine.{k}" for k in expected_engine} | {f"coordinator.{k}" for k in expected_own}
    if missing := wanted - seen:
        raise SnapshotError(f"missing state: {', '.join(sorted(missing))}")
    if coordinator.sharding != sharding:
        raise SnapshotError("a snapshot of another sharding")
    engine.dispatch = ShardDispatch(coordinator)
    n = sharding.shards
    position = worker.get("position")
    lists = [worker.get(k) for k in ("written", "last_own", "relay_from")]
    if not isinstance(position, int) or position < 0:
        raise SnapshotError("malformed position")
    if [len(v) if isinstance(v, list) else -1 for v in lists] != [n + 1, n + 1, n] or not all(
        isinstance(x, int) for v in lists if isinstance(v, list) for x in v
    ):
        raise SnapshotError("malformed positions")
    written, last_own, relay_from = (list(v) for v in lists if isinstance(v, list))
    return coordinator, position, written, last_own, relay_from


def _check(before: object, value: object, name: str) -> None:
    if before is not None and type(value) is not type(before):
        raise SnapshotError(f"attribute {name!r} has the wrong kind")
