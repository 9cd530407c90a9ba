"""The coordinator over its lifetime: relays it folds (and those it ignores), replay of
its outputs, the control worker, pool moves with what runs there, names used again by
other pods and gangs, and sharding configurations refused at the door."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.model.pools import POOL_LABEL, Sharding
from events.errors import LogCorruptedError
from events.memory import MemoryLog
from events.types import (
    SECOND,
    ClockTicked,
    Envelope,
    Event,
    GroupSpec,
    NodeAdded,
    PodAdopted,
    PodBound,
    PodGroupSubmitted,
    PodHandedBack,
    PodRouted,
    PoolHandedOver,
    PoolReleased,
    ReservationCommitted,
    ReservationRequested,
    ShardingConfigured,
    ShardSummary,
)
from shards.cli import main
from shards.control import ControlWorker
from shards.coordinator.coordinator import RELAY, Coordinator
from shards.inputs.scenario import TimedEvent
from shards.replay import replay_routed
from tests.builders import make_node, make_pod, relayed
from tests.shards.coordinator_kit import (
    SHARDS,
    Parts,
    at,
    found,
    handed_to_shard,
    pool_move,
    pool_node,
    records,
    sharding,
    shoal,
    simulated,
)
from tests.shards.scenario_text import node, pod

# -------------------------------------------------------------------- relays and replay


@pytest.mark.parametrize("shards", SHARDS)
def test_relays_this_coordinator_did_not_make_or_has_seen_are_ignored(shards: int) -> None:
    """Only copies the control worker made (``relay-<shard>`` of an existing shard, each
    shard's causations rising) are shard reports; anything else changes nothing."""
    control, last = handed_to_shard(shards)
    coordinator = control.coordinator
    placed = ShardSummary(shard=last, seen=2, placed={"default/p": "a"}, nodes=1)
    for producer in ("relay-x", f"relay-{shards}", "relay-", "relay--1", "ingest", "shard-0"):
        env = Envelope(event=placed, stream=RELAY, producer=producer, causation=40, offset=40)
        coordinator.apply(env)
        assert coordinator.schedule() == []
    assert "default/p" in coordinator.flights, "a forged summary answered nothing"
    assert "default/p" not in coordinator.engine.state.pods
    assert control.report(last, placed) == []
    assert "default/p" not in coordinator.flights
    assert coordinator.engine.state.names[coordinator.engine.state.pods["default/p"].slot] == "a"
    # the same copy again, or an older one from that shard: already seen
    handback = PodHandedBack(pod="default/p", reason="full", shard=last)
    for causation in (control.offset, control.offset - 1):
        env = relayed(handback, last, causation)
        coordinator.apply(env)
        assert coordinator.schedule() == []
    assert coordinator.counters["handbacks"] == 0
    assert coordinator.engine.bindings["default/p"] == "default/p#1"


@pytest.mark.parametrize("producer", ["relay-\u00b2", "relay-\u0661"])
def test_a_relay_named_with_other_digits_is_ignored(producer: str) -> None:
    control, _ = handed_to_shard(2)
    coordinator = control.coordinator
    placed = ShardSummary(shard=1, seen=2, placed={"default/p": "a"}, nodes=1)
    coordinator.apply(Envelope(event=placed, stream=RELAY, producer=producer, causation=9))
    assert coordinator.schedule() == []
    assert "default/p" in coordinator.flights


@pytest.mark.parametrize("shards", SHARDS)
def test_replay_tolerates_an_unforwarded_tail_but_not_a_gap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """The coordinator appends a pass's records partition by partition, the control
    partition last. One stopped in the middle of its last pass leaves a tail of some
    partitions missing (the shards never saw it, so derived nothing from it): replay
    counts what is missing. A record missing before later ones is a mismatch."""
    text = sharding(
        "pools: [" + ", ".join(f"{{name: p{i}, shard: {i}}}" for i in range(shards)) + "]"
    )
    text += "".join(pool_node(f"n{i}", f"p{i}", cpu=4) for i in range(shards))
    text += "".join(pod(f"early-{i}", cpu="1", pool=f"p{i}") for i in range(shards))
    text += "".join(pod(f"late-{i}", cpu="2", pool=f"p{i}", at=3) for i in range(shards))
    text += pod("huge", cpu="9", at=3, priority=10)  # decided first in that pass: no room
    _, parts = shoal(tmp_path, capsys, text, shards)
    ours = [
        (p, i, env)
        for p, part in enumerate(parts)
        for i, env in enumerate(part)
        if env.producer == "router"
    ]
    last = max(env.causation for _, _, env in ours)
    lost = [(p, i) for p, i, env in ours if env.causation == last and p >= 1]
    assert {p for p, _ in lost} == set(range(1, shards + 1))  # every shard but 0, and control
    tail = [list(part) for part in parts]
    for p in range(1, shards + 1):
        del tail[p][min(i for q, i in lost if q == p) :]
    result = replay_routed(tail, verify=True)
    assert result.mismatch is None, result.mismatch
    assert result.unforwarded == len(lost)
    gap = [list(part) for part in parts]
    early = next(i for i, env in enumerate(parts[shards - 1]) if isinstance(env.event, PodRouted))
    del gap[shards - 1][early]
    mismatch = replay_routed(gap, verify=True).mismatch
    assert mismatch is not None
    assert f"partition {shards - 1}: the coordinator derives PodRouted" in str(mismatch)
    assert "never appended though later records were" in str(mismatch)


def test_routed_replay_needs_the_sharding_record() -> None:
    parts: Parts = [[], [], [Envelope(event=ClockTicked(), partition=2, offset=0)]]
    with pytest.raises(LogCorruptedError, match="sharding configuration"):
        replay_routed(parts, verify=True)
    bad: Parts = [[], [], [Envelope(event=ShardingConfigured(config="{nope"), partition=2)]]
    with pytest.raises(LogCorruptedError, match="invalid"):
        replay_routed(bad, verify=True)


# --------------------------------------------------------------------------- pool moves


@pytest.mark.parametrize("shards", SHARDS)
def test_a_pool_moves_to_another_shard_with_what_runs_there(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    """Pool pa moves from shard 0 to the last shard at 10 s: shard 0 lets its node go
    with the pod running there (PoolReleased → PoolHandedOver), the new owner takes the
    node and adopts the pod, and places what comes later knowing the node holds it."""
    last = shards - 1
    text = sharding(f"pools: [{{name: pa, shard: 0}}, {{name: pb, shard: {last}}}]")
    text += pool_node("a", "pa", gpu=5) + pool_node("b", "pb", gpu=5)
    text += pod("running", gpu=3, pool="pa") + pool_move("pa", last, at=10)
    text += pod("later", gpu=3, pool="pa", at=20) + pod("fits", gpu=2, pool="pa", at=21)
    data, parts = shoal(tmp_path, capsys, text, shards)
    pods = data["pods"]
    assert pods["default/running"] == {**pods["default/running"], "node": "a", "phase": "Bound"}
    assert pods["default/later"]["phase"] == "Pending"
    assert "Insufficient nvidia.com/gpu" in pods["default/later"]["reason"]
    assert pods["default/fits"] == {**pods["default/fits"], "node": "a", "shard": last}
    ((released_env, released),) = found(parts, PoolReleased, 0)
    assert released == PoolReleased(pool="pa", nodes=("a",), to=last)
    assert released_env.time == 10 * SECOND
    ((_, over),) = found(parts, PoolHandedOver, 0)
    assert [p.pod.key for p in over.placements] == ["default/running"]
    adopted = [e.placement for _, e in found(parts, PodAdopted, last)]
    assert [(p.pod.key, p.node) for p in adopted] == [("default/running", "a")]
    assert [e.node.name for _, e in found(parts, NodeAdded, last)] == ["b", "a"]


@pytest.mark.parametrize("shards", SHARDS)
def test_a_pod_that_arrives_as_its_pool_moves_is_placed_by_the_new_owner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shards: int
) -> None:
    last = shards - 1
    text = sharding(f"pools: [{{name: pa, shard: 0}}, {{name: pb, shard: {last}}}]")
    text += pool_node("a", "pa", gpu=5) + pool_node("b", "pb", gpu=5)
    text += pool_move("pa", last, at=10) + pod("mover", gpu=3, pool="pa", at=10)
    data, _ = shoal(tmp_path, capsys, text, shards)
    assert data["pods"]["default/mover"] == {
        **data["pods"]["default/mover"],
        "node": "a",
        "phase": "Bound",
        "shard": last,
    }


# ------------------------------------------------------------------- the control worker


@pytest.mark.parametrize("fold_slice", [3, 4])
async def test_the_control_worker_folds_a_burst_in_slices(fold_slice: int) -> None:
    """A burst of control records is folded ``fold_slice`` at a time, a pass after each
    slice with its outputs appended (caused by the slice's last record) before the next
    is folded: shards start on the first slice while the coordinator folds the rest.
    One poll folds the whole burst, and the shards are told what one big slice would
    have told them, in the same order."""

    async def run_burst(size: int) -> tuple[ControlWorker, list[tuple[int, int, Event]]]:
        log = MemoryLog(3)
        worker = ControlWorker(Coordinator(Sharding(shards=2)), log)
        worker.fold_slice = size
        assert await worker.poll() == 0  # recovered, on an empty log
        events: list[Event] = [
            make_node(f"n{i}").cpu("8").label(POOL_LABEL, f"p{i % 2}").added() for i in range(8)
        ]
        events += [make_pod(f"pod{i}").cpu("1").submitted() for i in range(7)]
        await log.append([Envelope(event=e, producer="ingest") for e in events], 2)
        await worker.poll()
        assert worker.position == len(events), "one poll folds the whole burst"
        told = [(p, env.causation, env.event) for p in range(2) for env in await log.read(p, 0)]
        return worker, told

    sliced, in_slices = await run_burst(fold_slice)
    whole, at_once = await run_burst(1000)
    assert [(p, e) for p, _, e in in_slices] == [(p, e) for p, _, e in at_once]
    assert sum(isinstance(e, PodRouted) for _, _, e in at_once) == 7
    ends = {min(end, 15) - 1 for end in range(fold_slice, 15 + fold_slice, fold_slice)}
    assert {cause for _, cause, _ in in_slices} == ends
    assert {cause for _, cause, _ in at_once} == {14}
    assert sliced.passes == len(ends) and whole.passes == 1


# --------------------------------------------------------------------- names used again


def test_a_name_used_again_by_another_pod_is_scheduled_again() -> None:
    """Kubernetes lets a name be used again once its pod is gone: ``web-0`` runs 5 s
    (uid u1), is told again after it succeeded (the same pod: nothing happens), then
    comes back with uid u2 (another pod: it runs again), told twice too."""
    web = make_pod("web-0").cpu("1").runtime(5)
    events = at(
        0, [make_node(f"n{i}").cpu("4").label(POOL_LABEL, f"p{i}").added() for i in range(3)]
    )
    events += at(0, [web.uid("u1").submitted()], order=10)
    events += at(8, [web.uid("u1").submitted()], order=20)
    events += at(12, [web.uid("u2").submitted(), web.uid("u2").submitted()], order=30)
    data, parts = simulated(events, Sharding(shards=3))
    assert data["pods"]["default/web-0"]["phase"] == "Succeeded"
    binds = sorted(
        (env.time, e.decision_id)
        for p in range(3)
        for env, e in found(parts, PodBound, p)
        if e.pod == "default/web-0"
    )
    assert [t for t, _ in binds] == [0, 12 * SECOND]
    assert binds[0][1] != binds[1][1]
    routed = [e.pod.uid for p in range(3) for _, e in found(parts, PodRouted, p)]
    assert sorted(routed) == ["u1", "u2"]


def job(uid: str, name: str, size: int, at_seconds: int) -> list[TimedEvent]:
    """A gang of ``size`` one-card pods under PodGroup ``name`` (object ``uid``), each
    running 10 s, arriving at ``at_seconds``."""
    group = GroupSpec(namespace="ml", name=name, min_member=size, uid=uid)
    events: list[Event] = [PodGroupSubmitted(group=group)]
    for m in range(size):
        member = make_pod(f"{name}-{m}", "ml").cpu("1").gpu(1).group(group.key).uid(f"{uid}-{m}")
        events.append(member.runtime(10).submitted())
    return at(at_seconds, events, order=at_seconds * 100)


@pytest.mark.parametrize("shards", SHARDS)
def test_gangs_run_again_under_their_names_over_several_shards(shards: int) -> None:
    """A job that finished is applied again (its PodGroup and pods under the same names,
    other uids): a gang one shard holds is handed to it again, and one too big for any
    shard is prepared across shards and committed again, under a fresh id."""
    nodes = [
        make_node(f"n{i}").cpu("32").gpu(4).label(POOL_LABEL, f"p{i % shards}").added()
        for i in range(2 * shards)
    ]
    wide = 8 + shards + 1  # more than the 8 cards a shard has
    events = at(0, nodes)
    for uid, start in (("a", 0), ("b", 20)):  # each run lasts 10 s: the second finds it over
        events += job(f"small-{uid}", "small", 2, start)  # a shard has 2 nodes for it
        events += job(f"wide-{uid}", "wide", wide, start + 1)
    data, parts = simulated(events, Sharding(shards=shards))
    runs: dict[str, int] = {}
    for bind in records(parts, PodBound):
        runs[bind.pod] = runs.get(bind.pod, 0) + 1
    expected = [f"ml/small-{m}" for m in range(2)] + [f"ml/wide-{m}" for m in range(wide)]
    assert runs == dict.fromkeys(expected, 2)
    assert all(data["pods"][k]["phase"] == "Succeeded" for k in expected)
    requests = records(parts, ReservationRequested)
    small = {r.rid for r in requests if r.group.name.startswith("small")}
    assert len(small) == 2 and all(
        r.at_once and not r.placements for r in requests if r.rid in small
    )
    committed = {c.rid for c in records(parts, ReservationCommitted)}
    assert len(committed) == 2 and all(rid.startswith("ml/wide#") for rid in committed)


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("pools: {a: 1}", "pools"),
        ("pools: [{shard: 0}]", "pools[0].name"),
        ("pools: [{name: a}, {name: a}]", "pools[1].name"),
        ("pools: [{name: a, shard: -1}]", "pools[0].shard"),
        ("pools: [{name: a, shard: true}]", "pools[0].shard"),
        ("pools: [{name: a, nodeSelector: {x: 1}}]", "pools[0].nodeSelector"),
        ("tenants: [{namespace: t}]", "tenants[0].pools"),
        ("tenants: [{namespace: t, pools: [a]}, {namespace: u, pools: [a]}]", "tenants[1].pools"),
        ("reservationTimeoutSeconds: 0", "reservationTimeoutSeconds"),
        ("reservationTimeoutSeconds: lots", "reservationTimeoutSeconds"),
        ("reservationTimeoutSecond: 30", "reservationTimeoutSecond"),  # a typo, not ignored
        ("pools: [{name: a, weight: 3}]", "pools[0].weight"),
        ("tenants: [{namespace: t, pools: [a], quota: 1}]", "tenants[0].quota"),
    ],
)
def test_a_malformed_sharding_configuration_exits_2_naming_file_document_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, field: str
) -> None:
    refused(tmp_path, capsys, node("n0") + sharding(body), f"ShardingConfiguration): {field}")


def refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, where: str) -> None:
    """``shoal simulate`` of ``text`` exits 2 with one line naming the file, the second
    document and ``where`` in it (``Kind): field``)."""
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", str(path), "--shards", "3", "--json"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"{path}: document 2 ({where}: " in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(("shards", "pinned_to"), [(2, 2), (4, 7)])
@pytest.mark.parametrize("command", ["simulate", "serve"])
def test_a_pool_pinned_to_a_shard_that_does_not_exist_exits_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    shards: int,
    pinned_to: int,
) -> None:
    """From a scenario (``simulate``) and from ``serve --sharding`` alike: one line
    naming the file, the document and the field, before anything starts."""
    config = sharding(f"pools: [{{name: a, shard: 0}}, {{name: far, shard: {pinned_to}}}]")
    path = tmp_path / "sharding.yaml"
    if command == "simulate":
        path.write_text(config + node("n0", labels={POOL_LABEL: "far"}))
        argv = ["simulate", str(path), "--shards", str(shards)]
    else:
        path.write_text(config)
        argv = ["serve", "--shards", str(shards), "--sharding", str(path)]
        argv += ["--listen", "127.0.0.1:0", "--host", "http://127.0.0.1:9"]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"{path}: document 1 (ShardingConfiguration): pools[1].shard: " in err, err
    assert f"assigned to shard {pinned_to}, but there are {shards}" in err, err


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ("{shard: 1}", "spec.pool"),
        ("{pool: a, shard: -1}", "spec.shard"),
        ("{pool: a, shard: 1, drain: true}", "spec.drain"),
        ("[a, 1]", "spec"),
    ],
)
def test_a_malformed_pool_reassignment_exits_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: str, field: str
) -> None:
    move = f"\napiVersion: shoal.io/v1alpha1\nkind: PoolReassignment\nspec: {spec}\n"
    refused(tmp_path, capsys, node("n0") + move, f"PoolReassignment): {field}")
