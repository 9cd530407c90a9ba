"""Elastic quotas over several shards (hypothesis): whatever the slicing does as nodes
come and go, no namespace uses more than its quota's ``max`` in total, and the log
replays exactly (gangs stay whole: the chaos tests check that under faults)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.model.pools import Sharding
from events.memory import MemoryLog
from events.types import QuotaDefined
from shards.inputs.scenario import Scenario
from shards.replay import replay_routed
from shards.simulate import simulate
from tests.shards.test_batch_properties import batch_scenario


@given(batch_scenario(), st.integers(2, 3))
async def test_sharded_quotas_hold_in_total_and_replay(s: Scenario, shards: int) -> None:
    log = MemoryLog(shards + 1)
    result = await simulate(s, log, sharding=Sharding(shards=shards))
    used: dict[str, int] = {}
    for engine in result.engines:
        engine.state.check_invariants()
        for ns, quota in engine.quotas.quotas.items():
            used[ns] = used.get(ns, 0) + quota.used.get("nvidia.com/gpu", 0)
    for e in s.events:
        if isinstance(e.event, QuotaDefined):
            spec = e.event.quota
            limit = spec.max.get("nvidia.com/gpu", 0)
            assert used.get(spec.namespace, 0) <= limit, (spec, used)
    control = result.control
    assert control is not None
    for ns, quota in control.quotas.items():  # the slices as the run left them
        pieces = control.quota_slices.get(ns)
        if pieces is None:
            continue  # no pod of the namespace arrived: never sliced
        assert len(pieces) == shards
        for bound in ("min", "max"):
            for resource, total in getattr(quota, bound).items():
                assert sum(getattr(p, bound).get(resource, 0) for p in pieces) == total
        for piece in pieces:
            assert all(piece.max.get(r, a) >= a for r, a in piece.min.items() if r in quota.max)
    parts = [await log.read(p, 0) for p in range(shards + 1)]
    verified = replay_routed(parts, verify=True)
    assert verified.mismatch is None, str(verified.mismatch)
