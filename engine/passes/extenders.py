"""HTTP extenders in a pass: ask (recorded, sent by the runtime), or use the answers.

kube-scheduler calls its extenders in the scheduling cycle, after the filters, on the
nodes that passed them. A pass cannot wait for the network, so a pod's attempt is split
in two: the first attempt finds the nodes that pass the profile's filters and, if there
are any, records an ask (:mod:`engine.model.extenders`) and parks the pod; once every
extender has answered (the answers are inputs in the log), the next attempt filters and
scores with the answers on the nodes as they are then (a node the extenders were not
asked about does not pass a filter extender; it is asked about at the next attempt).

Per extender, as kube-scheduler: an extender is asked only about the pods it is
interested in (``managedResources``) of the profiles it serves; a filter answer keeps
the nodes it returned and names why the others failed (``FailedNodes``, or
``FailedAndUnresolvableNodes``: preemption will not help there); a prioritize answer adds
``score * weight * (MaxNodeScore / MaxExtenderPriority)`` to each node's total (scores
clipped to 0..10); an extender that failed (time-out, error, malformed answer) is
skipped if ``ignorable`` and fails the attempt otherwise (the pod waits for a change in
the cluster and asks again). A prioritize failure is skipped, as in kube-scheduler.
"""

from __future__ import annotations

import numpy as np

from engine.config import DEFAULT_SCHEDULER
from engine.extenders import MAX_EXTENDER_PRIORITY, SCALE, ExtenderConfig
from engine.framework.results import Attempt, Verdict
from engine.framework.runtime import EXTENDER, Framework
from engine.framework.status import Code, Status
from engine.model.extenders import Ask
from engine.model.pods import PodInfo
from engine.model.state import ClusterState
from engine.passes.context import PassContext


def applicable(p: PassContext, pod: PodInfo) -> tuple[ExtenderConfig, ...]:
    """The extenders ``pod``'s attempts must ask (its profile's, interested in it)."""
    extenders = p.profiles.config.extenders
    if not extenders:
        return ()
    name = pod.spec.scheduler_name or DEFAULT_SCHEDULER
    return tuple(
        x
        for x in extenders
        if (x.filter_verb or x.prioritize_verb)
        and x.serves(name)
        and x.interested(pod.spec.requests)
    )


def _node_names(p: PassContext, framework: Framework, pod: PodInfo) -> tuple[str, ...] | None:
    """The names of the nodes ``pod`` passes the filters on (None: none); pods of one
    shape get the same tuple within a pass until a node changes."""
    state = p.e.state
    key = (id(framework), pod.shape_key, state.journal_end)
    cache = p.extender_nodes
    if key in cache:
        return cache[key]
    mask = framework.candidates(pod, state)
    names: tuple[str, ...] | None = None
    if mask is not None:
        slots = np.flatnonzero(mask[: state.high_water])
        if slots.size:
            all_names = state.names
            names = tuple(all_names[s] or "" for s in slots.tolist())
    cache[key] = names
    return names


def ask_if_needed(
    p: PassContext,
    pod: PodInfo,
    framework: Framework,
    extenders: tuple[ExtenderConfig, ...],
    unit: str,
) -> bool:
    """Whether ``pod`` waits for extenders (asked now or before). No node passing the
    filters: nothing to ask (kube-scheduler does not call extenders then); the attempt
    goes on and fails as it would."""
    book = p.e.extenders
    if pod.key in book.ready:
        return False
    if pod.key in book.waiting:
        return True
    nodes = _node_names(p, framework, pod)
    if nodes is None:
        return False
    names = tuple(x.url_prefix for x in extenders)
    book.ask(pod.key, unit, names, nodes)
    p.e.count("extender_asks")
    reason = f"waiting for the answer of {', '.join(x.name for x in extenders)}"
    # (a record of the pass: replay re-runs the passes that left one, so it asks alike)
    p.e.said.pop(pod.key, None)
    p.say([pod.key], reason)
    if pod.key == p.explain:
        p.record(pod, Attempt(-1, Status(Code.WAIT, (f"{reason} ({len(nodes)} nodes asked)",))))
    return True


def verdict_for(
    p: PassContext, pod: PodInfo, extenders: tuple[ExtenderConfig, ...]
) -> Verdict | None:
    """The verdict of the answers recorded for ``pod`` (used once), or None."""
    ask = p.e.extenders.ready.pop(pod.key, None)
    if ask is None:
        return None
    # pods asked about together share their answers (the same records): one verdict
    key = (
        tuple(id(ask.answers.get(x.url_prefix)) for x in extenders),
        tuple(x.url_prefix for x in extenders),
        p.e.state.static_version,
    )
    verdict = p.extender_verdicts.get(key)
    if verdict is None:
        verdict = p.extender_verdicts[key] = build_verdict(ask, extenders, p.e.state)
    return verdict


def _slots(names: tuple[str, ...] | list[str], index: dict[str, int]) -> list[int]:
    get = index.get
    return [slot for slot in map(get, names) if slot is not None]


def build_verdict(ask: Ask, extenders: tuple[ExtenderConfig, ...], state: ClusterState) -> Verdict:
    """What ``ask``'s answers say, over the nodes as they are in ``state`` (the answers
    are the runtime's records: only the nodes it sent are named in them)."""
    verdict = Verdict()
    index = state.index
    unresolvable = True
    for ext in extenders:
        answer = ask.answers.get(ext.url_prefix)
        if answer is None:
            continue
        name = EXTENDER + ext.url_prefix
        if answer.error:
            if ext.filter_verb and not ext.ignorable:
                verdict.error = f"{ext.name}: {answer.error}"
                verdict.plugin = name
                return verdict
            continue  # ignorable, or only prioritize (kube-scheduler skips it)
        if ext.filter_verb and answer.passed is not None:
            mask = np.zeros(state.capacity, dtype=np.bool_)
            mask[_slots(answer.passed, index)] = True
            verdict.mask = mask if verdict.mask is None else verdict.mask & mask
            reasons: dict[str, int] = {}
            fallback = f"rejected by {ext.name}"
            for why in answer.failed.values():
                reasons[why or fallback] = reasons.get(why or fallback, 0) + 1
            for why in answer.unresolvable.values():
                reasons[why or fallback] = reasons.get(why or fallback, 0) + 1
            if answer.failed:
                unresolvable = False
            named = len(answer.passed) + len(answer.failed) + len(answer.unresolvable)
            if named < len(answer.nodes):
                reasons[f"not returned by {ext.name}"] = len(answer.nodes) - named
                unresolvable = False
            if reasons:
                verdict.rejections[name] = reasons
        if ext.prioritize_verb and answer.scores:
            hosts = list(answer.scores)
            get = index.get
            slots = [get(h) for h in hosts]
            keep = [i for i, slot in enumerate(slots) if slot is not None]
            values = np.fromiter(answer.scores.values(), dtype=np.int64, count=len(hosts))
            scores = np.zeros(state.capacity, dtype=np.int64)
            clipped = np.clip(values[keep], 0, MAX_EXTENDER_PRIORITY)
            scores[[s for s in slots if s is not None]] = clipped * ext.weight * SCALE
            verdict.scores = scores if verdict.scores is None else verdict.scores + scores
    verdict.unresolvable = unresolvable and bool(verdict.rejections)
    return verdict
