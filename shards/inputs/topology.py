"""Network topology as users already declare it, and gangs' constraints on it.

Levels (see :mod:`engine.model.topology`) come from the configuration's ``topology``
section, or from these objects in a scenario, which become that section:

- Kueue: ``kueue.x-k8s.io/v1alpha1`` or ``v1beta1`` ``Topology`` (``spec.levels[].
  nodeLabel``, broadest first); one per scenario.
- Volcano: ``topology.volcano.sh/v1alpha1 HyperNode`` (``spec.tier``, ``tierName``,
  ``members[]`` of ``type`` Node or HyperNode, each selected by ``exactMatch``,
  ``regexMatch`` or, for nodes, ``labelMatch``).

They are read before the run starts (the levels are part of the recorded
configuration), so ``shoal.io/arrive-at`` on them is refused.

A gang's constraint (:func:`group_topology`), on a PodGroup of any convention:

- annotations ``shoal.io/topology-required`` / ``shoal.io/topology-preferred`` and
  Kueue's ``kueue.x-k8s.io/podset-required-topology`` / ``podset-preferred-topology``
  (a level's name or node label);
- Volcano's ``spec.networkTopology`` (``mode`` ``hard``: required, ``soft``: preferred;
  ``highestTierAllowed``, default 1, or ``highestTierName``);
- Kubernetes' ``spec.schedulingConstraints.topology[0].key`` (required);
- KAI's ``spec.topologyConstraint`` (``requiredTopologyLevel``,
  ``preferredTopologyLevel``; ``topology`` names the Topology object).

Two conventions that state different levels for one group are refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from engine.config import API_VERSIONS, KIND, SchedulerConfig, parse_config
from events.errors import InputError
from shards.inputs.limits import shown
from shards.inputs.objects import _map, _name, _string_map

REQUIRED: Final = "shoal.io/topology-required"
PREFERRED: Final = "shoal.io/topology-preferred"
KUEUE_REQUIRED: Final = "kueue.x-k8s.io/podset-required-topology"
KUEUE_PREFERRED: Final = "kueue.x-k8s.io/podset-preferred-topology"
KUEUE_VERSIONS: Final = ("kueue.x-k8s.io/v1alpha1", "kueue.x-k8s.io/v1beta1")
VOLCANO_VERSION: Final = "topology.volcano.sh/v1alpha1"
ARRIVE_AT: Final = "shoal.io/arrive-at"


def is_topology_object(obj: Mapping[str, Any]) -> bool:
    kind, version = obj.get("kind"), obj.get("apiVersion")
    return (kind == "Topology" and version in KUEUE_VERSIONS) or (
        kind == "HyperNode" and version == VOLCANO_VERSION
    )


class TopologyObjects:
    """The Kueue ``Topology`` and Volcano ``HyperNode`` objects of a scenario, as the
    configuration's ``topology`` section."""

    def __init__(self) -> None:
        self.levels: list[dict[str, str]] | None = None
        self.topology_name = ""
        self.hypernodes: list[dict[str, Any]] = []

    def __repr__(self) -> str:
        return f"TopologyObjects(levels={self.levels}, hypernodes={len(self.hypernodes)})"

    def __bool__(self) -> bool:
        return self.levels is not None or bool(self.hypernodes)

    def add(self, obj: Mapping[str, Any]) -> None:
        meta = _map(obj.get("metadata"), "metadata", required=True)
        name = _name(meta, "metadata")
        annotations = _string_map(meta.get("annotations"), "metadata.annotations")
        if ARRIVE_AT in annotations:
            raise InputError(
                "topology is read before the run starts; it cannot arrive later",
                location=f'metadata.annotations["{ARRIVE_AT}"]',
            )
        spec = _map(obj.get("spec"), "spec", required=True)
        if obj["kind"] == "Topology":
            if self.levels is not None:
                raise InputError(
                    f"a second Topology (first: {shown(self.topology_name)}): shoal has one",
                    location="metadata.name",
                )
            for key in spec:
                if key != "levels":
                    raise InputError("unknown field (levels)", location=f"spec.{key}")
            raw = spec.get("levels")
            if not isinstance(raw, list) or not raw:
                raise InputError("must be a list of {nodeLabel}", location="spec.levels")
            levels = []
            for i, level in enumerate(raw):
                item = _map(level, f"spec.levels[{i}]", required=True)
                for key in item:
                    if key != "nodeLabel":
                        raise InputError(
                            "unknown field (nodeLabel)", location=f"spec.levels[{i}].{key}"
                        )
                label = item.get("nodeLabel")
                if not isinstance(label, str) or not label:
                    raise InputError("needs a node label", location=f"spec.levels[{i}].nodeLabel")
                levels.append({"nodeLabel": label})
            self.levels, self.topology_name = levels, name
        else:
            for key in spec:
                if key not in ("tier", "tierName", "members"):
                    raise InputError(
                        "unknown field (tier, tierName, members)", location=f"spec.{key}"
                    )
            self.hypernodes.append({"name": name, **spec})
        # checked now, so an error names this document
        parse_config(self.configuration({}), "")

    def section(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.levels is not None:
            out["levels"] = self.levels
        if self.hypernodes:
            out["hyperNodes"] = self.hypernodes
        return out

    def configuration(self, base: Mapping[str, Any]) -> dict[str, Any]:
        """``base`` (a configuration document; empty: the defaults) with these objects
        as its ``topology``."""
        doc: dict[str, Any] = dict(base) if base else {"apiVersion": API_VERSIONS[0], "kind": KIND}
        doc["topology"] = self.section()
        return doc


def with_topology(
    config: SchedulerConfig | None, objects: TopologyObjects
) -> SchedulerConfig | None:
    """The configuration a run uses, with the scenario's topology objects as its levels.
    A configuration that declares levels of its own as well is refused."""
    if not objects:
        return config
    source = config.source if config is not None else None
    if config is not None and source is None:
        source = {}
    if source and source.get("topology"):
        raise InputError(
            "the configuration declares topology and the scenario has Topology or "
            "HyperNode objects: declare it once",
            location="topology",
        )
    return parse_config(objects.configuration(source or {}), "")


def _level(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise InputError(f"must name a topology level, got {shown(value)}", location=where)
    return value


def group_topology(obj: Mapping[str, Any], source: str) -> tuple[str, str]:
    """(required, preferred) topology levels of a PodGroup, as written ("" for none)."""
    meta = _map(obj.get("metadata"), "metadata", required=True)
    spec = _map(obj.get("spec"), "spec")
    annotations = _string_map(meta.get("annotations"), "metadata.annotations")
    found: dict[str, dict[str, str]] = {"required": {}, "preferred": {}}
    for kind, key in (
        ("required", REQUIRED),
        ("preferred", PREFERRED),
        ("required", KUEUE_REQUIRED),
        ("preferred", KUEUE_PREFERRED),
    ):
        if key in annotations:
            where = f'metadata.annotations["{key}"]'
            found[kind][where] = _level(annotations[key], where)
    if source == "volcano" and spec.get("networkTopology") is not None:
        where = "spec.networkTopology"
        body = _map(spec["networkTopology"], where)
        for key in body:
            if key not in ("mode", "highestTierAllowed", "highestTierName"):
                raise InputError(
                    "unknown field (mode, highestTierAllowed, highestTierName)",
                    location=f"{where}.{key}",
                )
        mode = body.get("mode", "hard")
        if mode not in ("hard", "soft"):
            raise InputError(f"must be hard or soft, got {shown(mode)}", location=f"{where}.mode")
        if body.get("highestTierAllowed") is not None and body.get("highestTierName"):
            raise InputError(
                "highestTierAllowed and highestTierName cannot both be set", location=where
            )
        tier = body.get("highestTierAllowed", 1)
        if body.get("highestTierName"):
            level = _level(body["highestTierName"], f"{where}.highestTierName")
        elif isinstance(tier, int) and not isinstance(tier, bool) and 1 <= tier <= 64:
            level = str(tier)
        else:
            raise InputError(
                f"must be a tier from 1 to 64, got {shown(tier)}",
                location=f"{where}.highestTierAllowed",
            )
        found["required" if mode == "hard" else "preferred"][where] = level
    if source == "kubernetes" and spec.get("schedulingConstraints") is not None:
        where = "spec.schedulingConstraints"
        body = _map(spec["schedulingConstraints"], where)
        for key in body:
            if key != "topology":
                raise InputError("unknown field (topology)", location=f"{where}.{key}")
        terms = body.get("topology") or []
        if not isinstance(terms, list) or len(terms) > 1:
            raise InputError("must be a list of at most one {key}", location=f"{where}.topology")
        for term in terms:
            item = _map(term, f"{where}.topology[0]", required=True)
            for key in item:
                if key != "key":
                    raise InputError("unknown field (key)", location=f"{where}.topology[0].{key}")
            found["required"][f"{where}.topology[0].key"] = _level(
                item.get("key"), f"{where}.topology[0].key"
            )
    if source == "kai" and spec.get("topologyConstraint") is not None:
        where = "spec.topologyConstraint"
        body = _map(spec["topologyConstraint"], where)
        for key in body:
            if key not in ("topology", "requiredTopologyLevel", "preferredTopologyLevel"):
                raise InputError(
                    "unknown field (topology, requiredTopologyLevel, preferredTopologyLevel)",
                    location=f"{where}.{key}",
                )
        for kind, key in (
            ("required", "requiredTopologyLevel"),
            ("preferred", "preferredTopologyLevel"),
        ):
            if body.get(key):
                found[kind][f"{where}.{key}"] = _level(body[key], f"{where}.{key}")
    out = []
    for kind in ("required", "preferred"):
        values = found[kind]
        if len(set(values.values())) > 1:
            raise InputError(
                f"names different {kind} topology levels: "
                + ", ".join(f"{k}={v}" for k, v in values.items()),
                location="metadata",
            )
        out.append(next(iter(values.values()), ""))
    return out[0], out[1]


def topology_fields(obj: Mapping[str, Any]) -> list[str]:
    """Where a PodGroup states its topology constraint (to name in an error)."""
    meta = _map(obj.get("metadata"), "metadata", required=True)
    annotations = _string_map(meta.get("annotations"), "metadata.annotations")
    out = [
        f'metadata.annotations["{key}"]'
        for key in (REQUIRED, PREFERRED, KUEUE_REQUIRED, KUEUE_PREFERRED)
        if key in annotations
    ]
    spec = _map(obj.get("spec"), "spec")
    out += [
        f"spec.{key}"
        for key in ("networkTopology", "schedulingConstraints", "topologyConstraint")
        if spec.get(key) is not None
    ]
    return out


def pod_warnings(annotations: Mapping[str, str]) -> list[tuple[str, str]]:
    """(field, message) for a topology annotation on a pod: a gang's constraint is read
    on its PodGroup (Kueue writes these on pod templates; shoal has no pod sets)."""
    return [
        (f'metadata.annotations["{key}"]', "not acted on: set it on the pod's PodGroup")
        for key in (REQUIRED, PREFERRED, KUEUE_REQUIRED, KUEUE_PREFERRED)
        if key in annotations
    ]
