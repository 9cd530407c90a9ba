"""A pod's attempt: the profile's pre-filters, filters and scores; if nothing fits, its
post-filters (preemption) against staged state; then the dispatch commits it, or the pod
says why it waits.

Within a pass, capacity only shrinks until something is evicted, so a pod shape (in a
namespace, where quotas are involved) that found no node finds none again: the failed
attempt is reused instead of repeated (``PassContext.failed``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Final

from engine.config import DEFAULT_SCHEDULER
from engine.framework.cycle import CycleState
from engine.framework.handle import STATEMENT
from engine.framework.results import Attempt
from engine.framework.runtime import Framework
from engine.framework.status import Code
from engine.model.pods import PodInfo
from engine.model.shard import QUOTA_PLUGIN
from engine.model.statement import Statement
from engine.passes.context import PassContext
from engine.passes.extenders import applicable, ask_if_needed, verdict_for
from engine.plugins.preemption import EXCLUDE
from engine.plugins.preemption import NAME as PREEMPTION
from engine.plugins.preemption import SKIP as NO_PREEMPTION
from engine.plugins.rescheduler import CHEAPEST, PLACED, ROOM, SKIP
from engine.plugins.rescheduler import NAME as RESCHEDULER

NO_PROFILE: Final = "no scheduling profile serves schedulerName {!r}"


def no_profile(pod: PodInfo) -> str:
    return NO_PROFILE.format(pod.spec.scheduler_name or DEFAULT_SCHEDULER)


def place_where_told(
    p: PassContext, pod: PodInfo, framework: Framework, node: str, devices: tuple[int, ...]
) -> None:
    """Place delegated ``pod`` on ``node``, the node the coordinator chose on its view of
    every shard (``PodRouted.node``), on GPU ``devices`` where each still has room: if
    its pre-filters pass, and its filters on that node (those that read this shard's
    nodes only: the coordinator checked the rules that read pods on other shards'
    nodes); else it goes back to the coordinator. One node looked at, no scores."""
    e = p.e
    slot = e.state.index.get(node)
    cycle = CycleState()
    if slot is None:
        p.unschedulable(pod, f"node {node} is not on this shard", ())
        return
    status = framework.run_pre_filters(cycle, pod, e.state)
    if not status.ok:
        p.unschedulable(pod, status.message(), (status.plugin,) if status.plugin else ())
        return
    if not framework.feasible_on(cycle, pod, e.state, slot, local_only=True):
        p.unschedulable(pod, f"{pod.key} no longer fits node {node}", ("NodeResourcesFit",))
        return
    cards = e.state.cards_if_free(slot, pod.request, devices)
    if cards is not None:
        p.devices[pod.key] = cards
    p.dispatch.commit(p, None, [(pod, slot, 0)])


def attempt_pod(p: PassContext, pod: PodInfo, *, trial: bool = False) -> None:
    """Attempt ``pod``: the dispatch commits what fits (or what preemption or moves make
    fit); else the pod says why it waits (:meth:`PassContext.unschedulable`).
    ``trial``: a failure is not said, the caller undoes the attempt and decides the pod
    later (a member of a run of preemptors: :mod:`shards.coordinator.wave`)."""
    e = p.e
    pod.attempts += 1
    e.count("attempts")
    framework = p.profiles.framework_for(pod)
    if framework is None:
        if not trial:
            p.unschedulable(pod, no_profile(pod), ())
        return
    directed = e.routed_nodes.get(pod.key) if e.routed_nodes else None
    if directed is not None and not trial:
        place_where_told(p, pod, framework, *directed)
        return
    explain = pod.key == p.explain
    if e.holds and place_in_hold(p, pod, framework):
        return
    verdict = None
    extenders = applicable(p, pod)
    if extenders:
        if ask_if_needed(p, pod, framework, extenders, pod.key):
            return  # parked until every extender answered (an input in the log)
        verdict = verdict_for(p, pod, extenders)
    cache_key = (id(framework), pod.shape_key, pod.spec.namespace if e.quotas else "")
    attempt = None if explain or verdict is not None else p.failed.get(cache_key)
    if attempt is None:
        brief: bool | Callable[[], bool] = False
        if not explain and verdict is None:  # (asked only if the attempt fails)
            brief = functools.partial(preempts_only, p, pod, framework)
        attempt = framework.schedule(pod, e.state, explain=explain, verdict=verdict, brief=brief)
    # a brief failure: every node failed the filters here (Framework.sole_fit)
    failed_at = e.state.journal_end if attempt.brief else None
    if attempt.slot >= 0:
        p.record(pod, attempt)
        if attempt.devices is not None:
            p.devices[pod.key] = attempt.devices
        p.dispatch.commit(p, None, [(pod, attempt.slot, attempt.score)])
        return
    if verdict is not None:
        pass  # this pod's own answers: not for other pods of its shape
    elif not attempt.brief:
        keep_failed(p, pod, framework, cache_key, attempt)
    note = p.unmovable.get(cache_key, "")
    preempts = verdict is None and may_preempt(p, pod, attempt)
    # (preemption does not ask extenders: a pod they judged is not preempted for)
    migrates = (
        verdict is None and cache_key not in p.unmovable and may_migrate(p, pod, framework, attempt)
    )
    no_plan = ""
    if migrates and not (framework.conditional and framework.cluster_wide(pod, e.state)):
        # a shape with no plan has none until a pod leaves or moves (ShardModel.no_plan)
        no_plan = f"{pod.spec.scheduler_name}|{pod.shape_key!r}|{cache_key[2]}"
        e.plan_epoch()
        if no_plan in e.no_plan:
            note = e.no_plan[no_plan]
            migrates = False
    if attempt.status.code != Code.UNSCHEDULABLE_AND_UNRESOLVABLE and (preempts or migrates):
        statement = Statement(e.state, e.quotas)
        cycle = CycleState()
        if not migrates:
            cycle.write(RESCHEDULER, SKIP, True)
        slot = preempt_into(
            p, statement, pod, framework, cycle=cycle, preempts=preempts, failed_at=failed_at
        )
        if slot is not None and attempt.brief and not statement.evicted():
            # placed with nothing evicted, so the failed attempt stays for the pods of
            # its shape: complete it on the state it failed on, then plan again (the
            # same plan: nothing else changed)
            statement.discard()
            attempt = framework.complete(pod, e.state)
            keep_failed(p, pod, framework, cache_key, attempt)
            statement = Statement(e.state, e.quotas)
            cycle = CycleState()
            if not migrates:
                cycle.write(RESCHEDULER, SKIP, True)
            slot = preempt_into(
                p, statement, pod, framework, cycle=cycle, preempts=preempts, failed_at=failed_at
            )
        if slot is not None:
            p.record(pod, attempt)
            p.dispatch.commit(p, statement, [(pod, slot, 0)])
            return
        statement.discard()
        note = str(cycle.read(RESCHEDULER, CHEAPEST, ""))
        if migrates and not (framework.conditional and framework.cluster_wide(pod, e.state)):
            p.unmovable[cache_key] = note
        if migrates and no_plan:
            e.no_plan[no_plan] = note
    if attempt.brief:  # the state is again what the attempt failed on (discarded)
        attempt = framework.complete(pod, e.state)
        keep_failed(p, pod, framework, cache_key, attempt)
    p.record(pod, attempt)
    if trial:
        return
    diagnosis = attempt.diagnosis
    plugins = tuple(diagnosis.plugins) if diagnosis else ()
    if not plugins and attempt.status.plugin:
        plugins = (attempt.status.plugin,)
    message = attempt.status.message()
    if note:
        message = f"{message}; {note}"
    p.unschedulable(pod, message, plugins, diagnosis.rejections() if diagnosis else {})


def keep_failed(
    p: PassContext,
    pod: PodInfo,
    framework: Framework,
    cache_key: tuple[object, ...],
    attempt: Attempt,
) -> None:
    """Keep a failed attempt for the pods of its shape this pass (see the module)."""
    if (
        attempt.diagnosis is not None
        and (attempt.diagnosis.plugins or attempt.status.plugin)
        and not (framework.conditional and framework.cluster_wide(pod, p.e.state))
    ):
        # (not when inter-pod rules applied: they read the pod's labels, not its shape)
        p.failed[cache_key] = attempt


def preempts_only(p: PassContext, pod: PodInfo, framework: Framework) -> bool:
    """Whether a failure of ``pod`` goes to preemption alone, its reasons needed only
    if that fails too: then the attempt may fail briefly (``Framework.schedule``).

    The coordinator's dispatch too: it keeps its view's victims until their shards
    evict them, and a brief failure is not kept for the pods of its shape (they fail
    briefly again, for the changed nodes only, or wait behind the nomination). (The
    rescheduler reads only which plugins rejected nodes, which a brief failure says;
    a plan of moves alone frees nothing, and the caller completes the attempt then.)"""
    e = p.e
    if pod.spec.preemption_policy == "Never" or pod.key in e.delegated:
        return False
    return e.quotas.get(pod.spec.namespace) is not None or e.preemptible_below(pod.priority)


def place_in_hold(p: PassContext, pod: PodInfo, framework: Framework) -> bool:
    """A replacement for a moved pod goes where the room was held for it, if its
    pre-filters and filters allow (the room is let go either way)."""
    e = p.e
    hold = e.take_hold(pod)
    if hold is None:
        return False
    cycle = CycleState()
    if not framework.run_pre_filters(cycle, pod, e.state).ok:
        return False
    if not framework.feasible(cycle, pod, e.state)[hold.slot]:
        return False
    p.dispatch.commit(p, None, [(pod, hold.slot, 0)])
    return True


def may_preempt(p: PassContext, pod: PodInfo, attempt: Attempt) -> bool:
    """Could preemption make room at all (a cheap test before planning)? Never for a
    pod the coordinator handed this shard (the coordinator plans its preemption)."""
    e = p.e
    if pod.spec.preemption_policy == "Never" or pod.key in e.delegated:
        return False
    if attempt.status.plugin == QUOTA_PLUGIN or e.quotas.get(pod.spec.namespace) is not None:
        return True
    return e.preemptible_below(pod.priority)


def may_migrate(p: PassContext, pod: PodInfo, framework: Framework, attempt: Attempt) -> bool:
    """Could the rescheduler move pods for ``pod`` (its profile has it, this engine
    plans moves, the pod is not a gang's, and room on nodes is what it lacks: the
    resource fit filter rejected nodes, no pre-filter such as its quota refused it)? A
    pod the coordinator handed this shard is placed at once or handed back: a plan
    within the shard is "at once"."""
    e = p.e
    diagnosis = attempt.diagnosis
    return (
        e.migrates
        and diagnosis is not None
        and ROOM in diagnosis.plugins
        and not pod.spec.group
        and any(post.name == RESCHEDULER for post in framework.post_filters)
    )


def preempt_into(
    p: PassContext,
    statement: Statement,
    pod: PodInfo,
    framework: Framework,
    exclude_group: str = "",
    *,
    cycle: CycleState | None = None,
    preempts: bool = True,
    failed_at: int | None = None,
) -> int | None:
    """Stage the evictions (or moves) that make room for ``pod`` (the profile's
    post-filters) and its placement; the slot, or None (the caller discards the
    statement). ``preempts``: whether preemption may evict at all (else only the
    rescheduler may act). ``failed_at``: a journal position where the pod's filters
    rejected every node (its pre-filters passing): the attempt after the evictions
    then looks at the nodes changed since (``Framework.sole_fit``), not at all."""
    e = p.e
    if statement.evicted():
        # earlier evictions of this attempt (a gang) may already have made room
        attempt = framework.schedule(pod, e.state)
        if attempt.slot >= 0:
            statement.assume_pod(pod, attempt.slot)
            return attempt.slot
    cycle = cycle if cycle is not None else CycleState()
    cycle.write("", STATEMENT, statement)
    if exclude_group:
        cycle.write(PREEMPTION, EXCLUDE, exclude_group)
    if not preempts:
        cycle.write(PREEMPTION, NO_PREEMPTION, True)
    result = framework.run_post_filters(cycle, pod, e.state)
    if not result.status.ok:
        return None
    placed = cycle.read(RESCHEDULER, PLACED, -1)
    if isinstance(placed, int) and placed >= 0:
        return placed  # the plan placed the pod itself
    changed = e.state.changed_since(failed_at) if failed_at is not None else None
    slot = framework.sole_fit(pod, e.state, changed) if changed is not None else None
    if slot is None:
        slot = framework.schedule(pod, e.state).slot
    if slot < 0:
        return None
    statement.assume_pod(pod, slot)
    return slot
