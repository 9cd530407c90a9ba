"""Where the binder writes a pod's GPU cards, so that the device plugin gives it those.

The engine decides the cards (``PodBound.devices``: indices on the node, in the order
the node's device plugin lists them); the binder puts the assignment on the Binding's
own annotations, which the API server copies onto the pod as it binds it, in the form
the pod's convention's device plugin reads, and always with shoal's own:

- ``shoal.io/gpu-devices: "0,3"``: the card indices, for any tooling (and for the
  NVIDIA device plugin's users, who read it to set ``NVIDIA_VISIBLE_DEVICES``);
- Koordinator (``koordinator.sh/gpu-*`` requests): ``scheduling.koordinator.sh/device-allocated``,
  ``{"gpu": [{"minor": 0, "resources": {"koordinator.sh/gpu-core": "50",
  "koordinator.sh/gpu-memory-ratio": "50", "koordinator.sh/gpu-memory": "16Gi"}}]}``
  (memory only when the node states its cards' memory);
- HAMi (``nvidia.com/gpucores``/``gpumem`` requests): ``hami.io/vgpu-node``,
  ``hami.io/vgpu-devices-to-allocate`` and ``hami.io/vgpu-devices-allocated``
  (``UUID,NVIDIA,MiB,cores:`` per card, ``;`` after the container), and
  ``hami.io/bind-phase: allocating``. The UUIDs come from the node's
  ``hami.io/node-nvidia-register`` annotation (HAMi's device plugin writes it, cards in
  index order); a node without it gets ``GPU-<index>`` and a warning in the log, since
  HAMi's plugin would not find such a card. The whole assignment goes to the pod's first
  container (HAMi splits per container; shoal sums a pod's requests).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final

from engine.model.devices import HAMI, KOORDINATOR, WHOLE, GpuRequest

SHOAL_DEVICES: Final = "shoal.io/gpu-devices"
KOORD_ALLOCATED: Final = "scheduling.koordinator.sh/device-allocated"
HAMI_NODE: Final = "hami.io/vgpu-node"
HAMI_TO_ALLOCATE: Final = "hami.io/vgpu-devices-to-allocate"
HAMI_ALLOCATED: Final = "hami.io/vgpu-devices-allocated"
HAMI_PHASE: Final = "hami.io/bind-phase"
HAMI_REGISTER: Final = "hami.io/node-nvidia-register"


def hami_uuids(node_annotations: Mapping[str, str]) -> list[str]:
    """The card UUIDs of HAMi's node registration, in index order (empty if absent)."""
    text = node_annotations.get(HAMI_REGISTER, "")
    if text.startswith("["):  # newer HAMi writes JSON: [{"id": "GPU-...", ...}, ...]
        try:
            cards = json.loads(text)
        except ValueError:
            return []
        return [str(c.get("id", "")) for c in cards if isinstance(c, dict)]
    return [entry.split(",")[0] for entry in text.split(":") if entry.strip()]


def _memory_mib(gpu: GpuRequest, card_mib: int) -> int:
    if gpu.need.memory_mib:
        return gpu.need.memory_mib
    return card_mib * gpu.need.memory // WHOLE


def device_annotations(
    gpu: GpuRequest,
    devices: tuple[int, ...],
    node: str,
    card_mib: int = 0,
    node_annotations: Mapping[str, str] | None = None,
) -> tuple[dict[str, str], str | None]:
    """The annotations for a pod holding ``devices`` of ``node``, and a
    warning when the convention's device plugin cannot be told exactly."""
    out = {SHOAL_DEVICES: ",".join(map(str, devices))}
    warning = None
    if gpu.convention == KOORDINATOR:
        entries = []
        for card in devices:
            resources = {
                "koordinator.sh/gpu-core": str(gpu.need.milli // 10),
                "koordinator.sh/gpu-memory-ratio": str(gpu.memory_on(card_mib) // 10),
            }
            memory = _memory_mib(gpu, card_mib)
            if memory:
                resources["koordinator.sh/gpu-memory"] = f"{memory}Mi"
            entries.append({"minor": card, "resources": resources})
        out[KOORD_ALLOCATED] = json.dumps({"gpu": entries}, separators=(",", ":"))
    elif gpu.convention == HAMI:
        uuids = hami_uuids(node_annotations or {})
        if any(card >= len(uuids) for card in devices):
            warning = (
                f"node {node} has no {HAMI_REGISTER} annotation naming card(s) "
                f"{list(devices)}: HAMi's device plugin may not find them"
            )
        memory = _memory_mib(gpu, card_mib)
        cores = gpu.need.milli // 10
        cards = "".join(
            f"{uuids[c] if c < len(uuids) else f'GPU-{c}'},NVIDIA,{memory},{cores}:"
            for c in devices
        )
        out[HAMI_NODE] = node
        out[HAMI_TO_ALLOCATE] = out[HAMI_ALLOCATED] = cards + ";"
        out[HAMI_PHASE] = "allocating"
    return out, warning


def cards_of(annotations: Mapping[str, object]) -> tuple[int, ...]:
    """The card indices a bound pod's annotations name: shoal's, else Koordinator's
    minors; () when neither is there or readable (HAMi names UUIDs: the engine then
    charges the cards with the most room)."""
    text = annotations.get(SHOAL_DEVICES)
    if isinstance(text, str) and text:
        parts = text.split(",")
        if all(p.strip().isdigit() and int(p) < 1024 for p in parts) and len(parts) <= 64:
            return tuple(sorted({int(p) for p in parts}))
        return ()
    raw = annotations.get(KOORD_ALLOCATED)
    if isinstance(raw, str) and len(raw) < 65536:
        try:
            cards = json.loads(raw).get("gpu", [])
            minors = {int(c["minor"]) for c in cards}
        except (ValueError, TypeError, KeyError, AttributeError):
            return ()
        if all(0 <= m < 1024 for m in minors) and len(minors) <= 64:
            return tuple(sorted(minors))
    return ()
