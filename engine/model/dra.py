"""DRA devices as cards: which device of which claim request a pod's cards are.

Dynamic resource allocation (``resource.k8s.io/v1``) enters the engine as whole cards,
so that everything that counts or chooses cards (the resource fit filter, gangs, quotas
on ``nvidia.com/gpu``, the fragmentation-aware GPU scores) works on it unchanged:

- a node's DRA devices (its ResourceSlices' devices, :attr:`NodeSpec.devices`, in a
  stable order) are its cards, card ``i`` being ``devices[i]``, and its
  ``nvidia.com/gpu`` allocatable is their number (:mod:`shards.inputs.dra` builds
  both);
- a pod's claims (:attr:`PodSpec.claims`, one entry per request) ask for their
  ``count`` summed as whole cards (``nvidia.com/gpu``), and the cards the engine gives
  the pod (``PodBound.devices``, lowest index first) go to the requests in order.

So the log says which device each request got: :func:`claim_results` reads it from a
node spec, a pod spec and the cards of a ``PodBound``; the report and the Kubernetes
binder (which writes it into the claim's ``status.allocation``) both call it.
"""

from __future__ import annotations

from events.types import ClaimRequest, DeviceRef, NodeSpec, PodSpec


class DeviceMismatch(ValueError):
    """The cards of a placement do not name devices of its node (a node that lost
    devices since, or cards fewer than the claims ask)."""


def claim_results(
    pod: PodSpec, node: NodeSpec, cards: tuple[int, ...]
) -> list[tuple[ClaimRequest, DeviceRef]]:
    """Each card of ``pod`` on ``node`` as (the claim request it serves, the device):
    the requests of ``pod.claims`` in order take ``count`` cards each, from ``cards``
    in ascending order. Raises :class:`DeviceMismatch` when ``cards`` are too few or
    name no device of ``node``."""
    ordered = sorted(cards)
    needed = sum(request.count for request in pod.claims)
    if len(ordered) < needed:
        raise DeviceMismatch(f"{pod.key} holds {len(ordered)} cards, its claims ask {needed}")
    out: list[tuple[ClaimRequest, DeviceRef]] = []
    at = 0
    for request in pod.claims:
        for card in ordered[at : at + request.count]:
            if not 0 <= card < len(node.devices):
                raise DeviceMismatch(f"node {node.name} has no DRA device for card {card}")
            out.append((request, node.devices[card]))
        at += request.count
    return out
