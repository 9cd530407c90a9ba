"""Folding submissions and placements in bulk (:mod:`engine.model.bulk`) leaves exactly
the state that folding them one by one leaves: the same pods, sequence numbers, queue,
shape counts, columns, journal, quota and bookkeeping."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.engine import Engine
from engine.model.bulk import place_all, submit_all
from engine.model.shapes import ShapeCounts
from events.types import (
    Envelope,
    Event,
    PodRouted,
    PodSpec,
    PodSucceeded,
    QuotaDefined,
    QuotaSpec,
)
from tests.builders import make_node, make_pod

TEMPLATES = 5


def _spec(template: int, name: str, group: bool, uid: str, namespace: str = "default") -> PodSpec:
    pod = make_pod(name, namespace)
    if template == 0:
        pod = pod.cpu("1")
    elif template == 1:
        pod = pod.cpu("2").memory("1Gi").selector(zone="a")
    elif template == 2:
        pod = pod.cpu("1").gpu(1)
    elif template == 3:
        pod = pod.cpu("500m").host_port(8080 + len(name) % 2)
    else:
        pod = pod.cpu("1").priority(7).require("zone", "In", "a", "b")
    if group:
        pod = pod.group("g")
    if uid:
        pod = pod.uid(uid)
    return pod.spec()


def _engine(nodes: int = 4) -> Engine:
    engine = Engine()
    for i in range(nodes):
        spec = make_node(f"n{i}").cpu("64").memory("256Gi").gpu(8).label("zone", "ab"[i % 2])
        engine.apply(Envelope(event=spec.added(), producer="ingest"))
    return engine


def _fold(engine: Engine, event: Event) -> None:
    engine.apply(Envelope(event=event, producer="ingest"))


def _state(engine: Engine) -> dict[str, Any]:
    """Everything the folds change, in a form that compares order too."""
    s = engine.state
    q = engine.queue
    return {
        "pods": [
            (k, p.request, p.seq, p.static_key, p.shape_key, p.tiebreak, p.gpu, p.spec)
            for k, p in engine.pods.items()
        ],
        "submissions": engine.submissions,
        "queue": [
            (k, e.where, e.generation, e.priority, e.seq, e.queue) for k, e in q._entries.items()
        ],
        "heads": {name: sorted(heap) for name, heap in q._active.items()},
        "generation": q.generation,
        "shapes": (
            list(engine.shapes.counts.items()),
            engine.shapes.total,
            engine.shapes.learned,
            engine.shapes.version,
        ),
        "groups": [(k, list(g.members)) for k, g in engine.groups.items()],
        "dirty": list(engine.dirty),
        "outcomes": list(engine.outcomes.items()),
        "placed": [
            (k, p.slot, p.request, p.priority, p.ports, p.devices, p.delta.tolist())
            for k, p in s.pods.items()
        ],
        "node_pods": [list(p) for p in s.node_pods],
        "columns": s._columns.tolist(),
        "by_priority": [(p, a.tolist()) for p, a in s.used_by_priority.items()],
        "levels": list(s._level_pods.items()),
        "journal": (s.journal_base, list(s.journal)),
        "quota": engine.quotas._usage,
        "bindings": list(engine.bindings.items()),
        "started": list(engine.started.items()),
        "priorities": list(engine.placed_priorities.items()),
        "totals": (engine.placed_total, engine.moved_total),
        "dispatched": list(engine.dispatched.items()),
    }


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    for field, value in a.items():
        assert value == b[field], field


submissions = st.lists(
    st.tuples(
        st.integers(0, TEMPLATES - 1),  # template
        st.integers(0, 9),  # name: some told twice
        st.booleans() | st.just(False),  # in gang g
        st.sampled_from(["", "", "u1", "u2"]),  # uid: a pod named like one that finished
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(submissions, st.lists(st.integers(0, 9), max_size=3, unique=True))
def test_submitting_in_bulk_is_submitting_one_by_one(
    pods: list[tuple[int, int, bool, str]], finished: list[int]
) -> None:
    bulk, loop = _engine(), _engine()
    for engine in (bulk, loop):
        for i in finished:  # names used before, by pods that are over
            _fold(engine, make_pod(f"p{i}").cpu("1").uid("u1").submitted())
            _fold(engine, PodSucceeded(pod=f"default/p{i}"))
    specs = [_spec(t, f"p{n}", group, uid) for t, n, group, uid in pods]
    submit_all(bulk, specs)
    for spec in specs:
        loop.submit(spec)
    _same(_state(bulk), _state(loop))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, TEMPLATES - 1),
            st.integers(0, 9),  # name: some handed twice
            st.sampled_from(["", "", "u1", "u2"]),  # uid: a pod named like one that finished
            st.sampled_from(["routed", "routed", "late", "budgets", "huge", "finished"]),
        ),
        min_size=1,
        max_size=30,
    ),
    st.lists(st.integers(0, 9), max_size=3, unique=True),
)
def test_folding_hand_overs_in_bulk_is_folding_them_one_by_one(
    records: list[tuple[int, int, str, str]], finished: list[int]
) -> None:
    """A shard's records: pods handed over (some told twice, named like a finished pod,
    later than the time reached, counted against disruption budgets, or asking for more
    than a column holds), among other records, folded with :meth:`Engine.apply_handed`
    and one by one with :meth:`Engine.apply`: the same state, the same pods noted as
    handed over with the same decisions, the same records refused."""
    bulk, loop = _engine(), _engine()
    for engine in (bulk, loop):
        for i in finished:
            _fold(engine, make_pod(f"p{i}").cpu("1").uid("u1").submitted())
            _fold(engine, PodSucceeded(pod=f"default/p{i}"))
    envelopes: list[Envelope] = []
    for at, (t, n, uid, kind) in enumerate(records):
        spec = _spec(t, f"p{n}", False, uid)
        if kind == "finished":
            event: Event = PodSucceeded(pod=spec.key)
        else:
            if kind == "huge":
                spec = make_pod(f"p{n}").cpu("1").priority(1 << 63).spec()
            budgets = {"default/b": 1} if kind == "budgets" else None
            event = PodRouted(pod=spec, decision_id=f"{spec.key}#{at}", disruptions=budgets)
        time = 5 if kind == "late" else 0
        envelopes.append(Envelope(event=event, time=time, producer="router", causation=at))
    bulk.apply_handed(envelopes)
    for envelope in envelopes:
        loop.apply(envelope)
    _same(_state(bulk), _state(loop))
    for name in ("delegated", "routed_disruptions", "arrived", "unfolded", "counters"):
        assert getattr(bulk, name) == getattr(loop, name), name
    assert (bulk.seen, bulk.now) == (loop.seen, loop.now)


@settings(max_examples=20, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, TEMPLATES - 1), st.integers(0, 9), st.sampled_from("abc")),
        min_size=1,
        max_size=30,
    )
)
def test_submitting_in_bulk_across_queues_is_submitting_one_by_one(
    pods: list[tuple[int, int, str]],
) -> None:
    """Namespaces with a quota have a queue of their own: runs of submissions that
    alternate between queues are queued in bulk one queue's run at a time, in order
    (the same entries, generations and heaps as one by one)."""
    bulk, loop = _engine(), _engine()
    for engine in (bulk, loop):
        for namespace in "ab":  # c: the shared queue
            quota = QuotaSpec(namespace=namespace, name="q", min={"cpu": 4000})
            _fold(engine, QuotaDefined(quota=quota))
    specs = [_spec(t, f"p{n}", False, "", namespace) for t, n, namespace in pods]
    submit_all(bulk, specs)
    for spec in specs:
        loop.submit(spec)
    _same(_state(bulk), _state(loop))
    # (several queues taken: "c" has no quota, so the shared one)
    assert set(bulk.queue._active) == {"" if ns == "c" else ns for _, _, ns in pods}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, TEMPLATES - 1), min_size=4, max_size=20),
    st.data(),
    st.booleans(),
)
def test_placing_in_bulk_is_placing_one_by_one(
    templates: list[int], data: st.DataObject, charged: bool
) -> None:
    # on the first 4 nodes of 4 (placements counted over every slot) or of 200 (a few
    # placements among many slots: counted by sorting, ``ClusterState.assume_all``)
    nodes = data.draw(st.sampled_from([4, 200]))
    bulk, loop = _engine(nodes), _engine(nodes)
    specs = [_spec(t, f"p{i}", False, "") for i, t in enumerate(templates)]
    for engine in (bulk, loop):
        submit_all(engine, specs)
    # every pod at least once (in an order drawn), some twice: several land on one node
    picked = data.draw(st.permutations(range(len(specs))))
    picked += data.draw(st.lists(st.integers(0, len(specs) - 1), max_size=len(specs)))
    slots = data.draw(st.lists(st.integers(0, 3), min_size=len(picked), max_size=len(picked)))
    placements = [
        (specs[i].key, slot, f"{specs[i].key}#{n}")
        for n, (i, slot) in enumerate(zip(picked, slots, strict=True))
    ]
    place_all(bulk, placements, charged)
    for key, slot, decision in placements:
        loop.place(key, slot, decision, charged)
    _same(_state(bulk), _state(loop))
    assert np.array_equal(bulk.state.used, loop.state.used)


@settings(max_examples=30, deadline=None)
@given(
    st.integers(0, 3000),
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1500)), min_size=1, max_size=6),
)
def test_counting_shapes_in_runs_is_counting_them_one_by_one(
    before: int, runs: list[tuple[int, int]]
) -> None:
    """The counts are taken at the same totals (powers of two, multiples of EVERY),
    holding the same counts, whether a run of pods of one shape is counted at once."""
    shapes = [(1, 0, 0, ()), (2, 0, 0, ()), (1, 1, 0, ("gpu",))]
    bulk, loop = ShapeCounts(), ShapeCounts()
    for counts in (bulk, loop):
        for _ in range(before):
            counts.add_shape(shapes[0])
    for shape, count in runs:
        bulk.add_shapes(shapes[shape], count)
        for _ in range(count):
            loop.add_shape(shapes[shape])
    assert (bulk.counts, bulk.total, bulk.learned, bulk.version) == (
        loop.counts,
        loop.total,
        loop.learned,
        loop.version,
    )
