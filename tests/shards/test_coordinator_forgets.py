"""The coordinator's view forgets what is over as a shard does (the same retention
window, from the recorded configuration), and its own bookkeeping of pods keeps
nothing of a pod once it is gone: a long run of several shards holds what is live and
recent, decides as before, and replays exactly."""

from __future__ import annotations

import asyncio

from msgspec.structs import replace

from engine.config import parse_config
from engine.model.pools import POOL_LABEL, Sharding
from events.memory import MemoryLog
from events.types import SECOND, GroupSpec, NodeAdded, PodGroupSubmitted, PodSubmitted
from shards.inputs.scenario import Scenario, TimedEvent
from shards.replay import replay_routed
from shards.simulate import simulate
from tests.builders import make_node, make_pod

WINDOW = 60


def test_a_long_run_of_two_shards_keeps_what_is_live_and_recent() -> None:
    config = parse_config(
        {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "finishedRetentionSeconds": WINDOW,
        }
    )
    events: list[TimedEvent] = []

    def at(seconds: float, event: object) -> None:
        events.append(TimedEvent(round(seconds * SECOND), len(events), event))  # type: ignore[arg-type]

    for i in range(4):
        at(0, NodeAdded(node=make_node(f"n{i}").cpu("8").label(POOL_LABEL, f"p{i % 2}").spec()))
    rounds = 60
    for n in range(rounds):  # 20 minutes: a pod and a gang of 3 every 20 s, each 10 s long
        t = n * 20
        at(t, PodSubmitted(pod=make_pod(f"p{n}").cpu("1").uid(f"u{n}").runtime(10).spec()))
        group = GroupSpec(
            namespace="default", name=f"g{n}", min_member=3, timeout=30 * SECOND, uid=f"g{n}"
        )
        at(t, PodGroupSubmitted(group=group))
        for i in range(3):
            pod = make_pod(f"g{n}-{i}").cpu("2").uid(f"g{n}-{i}").group(group.key).runtime(10)
            at(t, PodSubmitted(pod=pod.spec()))
    # a dependency on a pod that finished within the window: met
    late = replace(
        make_pod("after").cpu("1").runtime(5).spec(), depends_on=(f"default/p{rounds - 1}",)
    )
    at((rounds - 1) * 20 + 30, PodSubmitted(pod=late))
    sharding = Sharding(shards=2)

    async def go() -> tuple[object, list[list[object]]]:
        log = MemoryLog(3)
        result = await simulate(Scenario(events=events, config=config), log, sharding=sharding)
        return result, [await log.read(p, 0) for p in range(3)]

    result, parts = asyncio.run(go())
    report = result.report.to_json()  # type: ignore[attr-defined]
    phases = {key: pod["phase"] for key, pod in report["pods"].items()}
    assert set(phases.values()) == {"Succeeded"}, {
        k: v for k, v in phases.items() if v != "Succeeded"
    }
    assert len(phases) == rounds * 4 + 1
    coordinator = result.control  # type: ignore[attr-defined]
    view = coordinator.engine
    assert not view.pods
    # 20 minutes of pods and gangs: a window's worth kept (and the sweep's slack)
    assert len(view.outcomes) <= 4 * 5, len(view.outcomes)
    assert len(view.groups) <= 5, len(view.groups)
    assert len(view.deadlines) <= 3
    for bookkeeping in ("decisions", "hard", "held_by", "claim_of", "claims", "flights"):
        assert not getattr(coordinator, bookkeeping), bookkeeping
    for engine in result.engines:  # type: ignore[attr-defined]
        assert not engine.pods and len(engine.outcomes) <= 4 * 5 and len(engine.groups) <= 5
    verified = replay_routed(parts, verify=True)  # type: ignore[arg-type]
    assert verified.mismatch is None, verified.mismatch
