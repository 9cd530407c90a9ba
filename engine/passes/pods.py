"""A pod's attempt: the profile's pre-filters, filters and scores; if nothing fits, its
post-filters (preemption) against staged state; then the dispatch commits it, or the pod
says why it waits.

Within a pass, capacity only shrinks until something is evicted, so a pod shape (in a
namespace, where quotas are involved) that found no node finds none again: the failed
attempt is reused instead of repeated (``SchedulingPass.failed``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from engine.config import DEFAULT_SCHEDULER
from engine.framework.cycle import CycleState
from engine.framework.handle import STATEMENT
from engine.framework.results import Attempt
from engine.framework.runtime import Framework
from engine.framework.status import Code
from engine.model.pods import PodInfo
from engine.model.shard import QUOTA_PLUGIN
from engine.model.statement import Statement

if TYPE_CHECKING:
    from engine.passes.run import SchedulingPass

NO_PROFILE: Final = "no scheduling profile serves schedulerName {!r}"


def no_profile(pod: PodInfo) -> str:
    return NO_PROFILE.format(pod.spec.scheduler_name or DEFAULT_SCHEDULER)


def attempt_pod(p: SchedulingPass, pod: PodInfo) -> None:
    e = p.e
    pod.attempts += 1
    e.count("attempts")
    framework = p.profiles.framework_for(pod)
    if framework is None:
        p.unschedulable(pod, no_profile(pod), ())
        return
    explain = pod.key == p.explain
    cache_key = (id(framework), pod.shape_key, pod.spec.namespace if e.quotas else "")
    attempt = None if explain else p.failed.get(cache_key)
    if attempt is None:
        attempt = framework.schedule(pod, e.state, explain=explain)
    if attempt.slot >= 0:
        p.record(pod, attempt)
        if attempt.devices is not None:
            p.devices[pod.key] = attempt.devices
        p.dispatch.commit(p, None, [(pod, attempt.slot, attempt.score)])
        return
    if attempt.diagnosis is not None and (attempt.diagnosis.plugins or attempt.status.plugin):
        p.failed[cache_key] = attempt
    if attempt.status.code != Code.UNSCHEDULABLE_AND_UNRESOLVABLE and may_preempt(p, pod, attempt):
        statement = Statement(e.state, e.quotas)
        slot = preempt_into(p, statement, pod, framework)
        if slot is not None:
            p.record(pod, attempt)
            p.dispatch.commit(p, statement, [(pod, slot, 0)])
            return
        statement.discard()
    p.record(pod, attempt)
    diagnosis = attempt.diagnosis
    plugins = tuple(diagnosis.plugins) if diagnosis else ()
    if not plugins and attempt.status.plugin:
        plugins = (attempt.status.plugin,)
    p.unschedulable(
        pod, attempt.status.message(), plugins, diagnosis.rejections() if diagnosis else {}
    )


def may_preempt(p: SchedulingPass, pod: PodInfo, attempt: Attempt) -> bool:
    """Could preemption make room at all (a cheap test before planning)? Never for a
    pod the coordinator handed this shard (the coordinator plans its preemption)."""
    e = p.e
    if pod.spec.preemption_policy == "Never" or pod.key in e.delegated:
        return False
    if attempt.status.plugin == QUOTA_PLUGIN or e.quotas.get(pod.spec.namespace) is not None:
        return True
    return e.preemptible_below(pod.priority)


def preempt_into(
    p: SchedulingPass,
    statement: Statement,
    pod: PodInfo,
    framework: Framework,
    exclude_group: str = "",
) -> int | None:
    """Stage the evictions that make room for ``pod`` (the profile's post-filters) and
    its placement; the slot, or None (the caller discards the statement)."""
    from engine.plugins.preemption import EXCLUDE, NAME

    e = p.e
    if statement.evicted():
        # earlier evictions of this attempt (a gang) may already have made room
        attempt = framework.schedule(pod, e.state)
        if attempt.slot >= 0:
            statement.assume_pod(pod, attempt.slot)
            return attempt.slot
    cycle = CycleState()
    cycle.write("", STATEMENT, statement)
    if exclude_group:
        cycle.write(NAME, EXCLUDE, exclude_group)
    result = framework.run_post_filters(cycle, pod, e.state)
    if not result.status.ok:
        return None
    attempt = framework.schedule(pod, e.state)
    if attempt.slot < 0:
        return None
    statement.assume_pod(pod, attempt.slot)
    return attempt.slot
