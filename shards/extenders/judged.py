"""The pods ``shoal extender`` judged lately, and the nodes it let each go to: its
``/bind`` binds only those, onto those nodes.

kube-scheduler asks an extender that binds to filter (and prioritize) a pod in the same
scheduling cycle as it asks it to bind the pod, so what must be remembered is the last
few seconds' worth of pods: the memory holds at most ``max_pods`` pods and
``max_nodes`` node names in all, the least recently judged forgotten first (a pod
forgotten before its bind is refused, and kube-scheduler tries it again from filter).

A pod's nodes are those the filter verb passed; for a server configured for prioritize
only, the nodes it was asked to score (kube-scheduler's own filters passed them). A
filter judgement is not narrowed by the prioritize that follows it in the same cycle.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

MAX_PODS: Final = 10_000
MAX_NODES: Final = 1_000_000
"""About 50 MB of sets at most (node names are interned: shared between pods)."""


@dataclass(frozen=True)
class Judgement:
    uid: str
    nodes: frozenset[str]
    by_filter: bool


class JudgedPods:
    def __init__(self, max_pods: int = MAX_PODS, max_nodes: int = MAX_NODES) -> None:
        self.max_pods = max_pods
        self.max_nodes = max_nodes
        self._pods: OrderedDict[str, Judgement] = OrderedDict()
        self._nodes = 0
        self.forgotten = 0

    def __repr__(self) -> str:
        return f"JudgedPods(pods={len(self._pods)}, nodes={self._nodes})"

    def __len__(self) -> int:
        return len(self._pods)

    def __contains__(self, key: object) -> bool:
        return key in self._pods

    def stats(self) -> dict[str, int]:
        return {"pods": len(self._pods), "nodes": self._nodes, "forgotten": self.forgotten}

    def filtered(self, key: str, uid: str, passed: Iterable[str]) -> None:
        """The filter verb passed ``passed`` for the pod ``key`` (uid ``uid``)."""
        self._put(key, Judgement(uid, frozenset(map(sys.intern, passed)), by_filter=True))

    def prioritized(self, key: str, uid: str, names: Iterable[str]) -> None:
        """The prioritize verb scored ``names``: remembered unless a filter judged this
        very pod (then that judgement stands)."""
        known = self._pods.get(key)
        if known is not None and known.by_filter and known.uid == uid:
            self._pods.move_to_end(key)
            return
        self._put(key, Judgement(uid, frozenset(map(sys.intern, names)), by_filter=False))

    def check(self, key: str, uid: str, node: str) -> tuple[str, str]:
        """(the judged pod's uid, "") when the pod ``key`` may be bound to ``node``;
        ("", why not) otherwise. An empty ``uid`` matches the judged pod's."""
        known = self._pods.get(key)
        if known is None:
            return "", (
                f"pod {key} was not filtered or prioritized by this extender lately "
                "(it binds only pods it judged)"
            )
        if uid and known.uid and uid != known.uid:
            return "", f"pod {key}: uid {uid} is not the uid {known.uid} this extender judged"
        if node not in known.nodes:
            return "", f"pod {key}: node {node} is not one this extender let it go to"
        return known.uid or uid, ""

    def forget(self, key: str) -> None:
        """The pod is bound: a second bind of it is refused."""
        known = self._pods.pop(key, None)
        if known is not None:
            self._nodes -= len(known.nodes)

    def _put(self, key: str, judgement: Judgement) -> None:
        self.forget(key)
        self._pods[key] = judgement
        self._nodes += len(judgement.nodes)
        while len(self._pods) > 1 and (
            len(self._pods) > self.max_pods or self._nodes > self.max_nodes
        ):
            _, old = self._pods.popitem(last=False)
            self._nodes -= len(old.nodes)
            self.forgotten += 1


__all__ = ["JudgedPods", "Judgement"]
