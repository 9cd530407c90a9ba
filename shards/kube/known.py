"""What the binder learns from the log's inputs for the decisions that follow
(``shards.kube.binder``): each live pod's uid (a Binding names it, so that a decision
made for a pod never binds another that took its name), its GPU request and its group,
each group's convention, and each GPU node's cards.
"""

from __future__ import annotations

import logging

from engine.model.devices import GpuRequest, node_cards
from engine.model.pods import pod_gpu
from events.types import (
    Event,
    NodeAdded,
    NodeRemoved,
    NodeUpdated,
    PodAdopted,
    PodBound,
    PodDeleted,
    PodFailed,
    PodGroupSubmitted,
    PodRouted,
    PodSpec,
    PodSubmitted,
    PodSucceeded,
    ReservationRequested,
)
from shards.kube.devices import device_annotations

log = logging.getLogger(__name__)


class Known:
    """The binder's memory of the inputs (see the module's docstring)."""

    def __init__(self) -> None:
        self.uids: dict[str, str] = {}
        """Live pods → their uid, from the records that brought them."""
        self.gpus: dict[str, GpuRequest] = {}
        """Live pods that ask for GPU cards → what they ask (their convention)."""
        self.group_of: dict[str, str] = {}
        """Each pod that joins a group → its group."""
        self.group_sources: dict[str, str] = {}
        """Each group → the convention that declared it."""
        self.gpu_nodes: dict[str, tuple[int, dict[str, str]]] = {}
        """GPU nodes seen in the log → one card's memory in MiB and their annotations."""

    def __repr__(self) -> str:
        return f"Known(pods={len(self.uids)}, groups={len(self.group_sources)})"

    def learn(self, event: Event) -> str | None:
        """Keep what later decisions need from ``event`` (a record that is not a
        decision); the pod it says is gone (deleted or finished), if any."""
        match event:
            case PodGroupSubmitted(group=spec):
                self.group_sources[spec.key] = spec.source
            case PodSubmitted(pod=spec) | PodRouted(pod=spec):
                self.learn_pod(spec)
            case PodAdopted(placement=placement):
                self.learn_pod(placement.pod)
            case ReservationRequested(pods=specs):
                for spec in specs:
                    self.learn_pod(spec)
            case NodeAdded(node=node) | NodeUpdated(node=node):
                count, mib = node_cards(node.allocatable, node.labels)
                if count > 0 or node.name in self.gpu_nodes:
                    self.gpu_nodes[node.name] = (mib, dict(node.annotations))
            case NodeRemoved(name=name):
                self.gpu_nodes.pop(name, None)
            case PodDeleted(pod=key) | PodSucceeded(pod=key) | PodFailed(pod=key):
                self.uids.pop(key, None)
                self.gpus.pop(key, None)
                self.group_of.pop(key, None)
                return key
            case _:
                pass
        return None

    def learn_pod(self, spec: PodSpec) -> None:
        if spec.uid:
            self.uids[spec.key] = spec.uid
        if spec.group:
            self.group_of[spec.key] = spec.group
        gpu = pod_gpu(spec)
        if gpu is not None:
            self.gpus[spec.key] = gpu

    def device_annotations(self, event: PodBound) -> dict[str, str] | None:
        """The annotations that tell the pod's device plugin its cards (None: no cards)."""
        gpu = self.gpus.get(event.pod)
        if gpu is None or not event.devices:
            return None
        mib, annotations = self.gpu_nodes.get(event.node, (0, {}))
        cards, warning = device_annotations(gpu, event.devices, event.node, mib, annotations)
        if warning:
            log.warning("pod=%s %s", event.pod, warning)
        return cards
