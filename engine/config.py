"""Scheduler configuration in the shape of ``KubeSchedulerConfiguration``.

Validated from plain data (the YAML is read at the edge). Plugin sets are merged with
the defaults the way kube-scheduler merges them: ``disabled`` removes defaults (``*``
removes all), ``enabled`` re-weights a default in place or appends a new plugin;
``multiPoint`` applies to every extension point the plugin implements.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final

from engine.extenders import ExtenderConfig, parse_extenders
from engine.foreign import (
    EXTENSION_POINTS,
    EXTRA_POINTS,
    SHOAL_POINTS,
    GangArgs,
    gang_args,
    plugin_args,
    resolve,
)
from engine.model.retention import RETENTION_SECONDS
from engine.model.topology import Topology, parse_topology
from events.errors import InputError

API_VERSIONS: Final = (
    "kubescheduler.config.k8s.io/v1",
    "kubescheduler.config.k8s.io/v1beta3",
    "kubescheduler.config.k8s.io/v1beta2",
    "kubescheduler.config.k8s.io/v1beta1",
)
"""The versions kube-scheduler and scheduler-plugins have documented; their profiles
have one shape (v1beta1 and v1beta2 lack ``multiPoint``, which shoal reads anyway)."""
KIND: Final = "KubeSchedulerConfiguration"
DEFAULT_SCHEDULER: Final = "default-scheduler"
MAX_SECONDS: Final = 100_000_000
"""The longest duration (about 3 years) a configuration or scenario field may state:
back-offs here, arrivals, runtimes and time-outs in scenarios. Times are int64
nanoseconds; bounded durations keep every sum of a few of them far inside that."""
MAX_DOCUMENT_NODES: Final = 100_000
"""The most values (mappings, lists and scalars) a configuration document may hold."""
_INT64: Final = (-(2**63), 2**63 - 1)
POINTS: Final = SHOAL_POINTS
"""The extension points shoal runs plugins at; at kube-scheduler's others (preEnqueue,
queueSort, preBind, bind, postBind) shoal does the work itself (:mod:`engine.foreign`)."""

DEFAULT_PLUGINS: Final[dict[str, tuple[tuple[str, int], ...]]] = {
    "preFilter": (("ElasticQuota", 0), ("Coscheduling", 0)),
    "filter": (
        ("NodeUnschedulable", 0),
        ("NodeName", 0),
        ("TaintToleration", 0),
        ("NodeAffinity", 0),
        ("NodePorts", 0),
        ("NodeResourcesFit", 0),
        ("PodTopologySpread", 0),
        ("InterPodAffinity", 0),
    ),
    "postFilter": (("DefaultPreemption", 0), ("Rescheduler", 0)),
    "preScore": (),
    "score": (
        ("TaintToleration", 3),
        ("NodeAffinity", 2),
        ("NodeResourcesFit", 1),
        ("PodTopologySpread", 2),
        ("InterPodAffinity", 2),
        ("NodeResourcesBalancedAllocation", 1),
    ),
    "reserve": (),
    "permit": (),
}
"""kube-scheduler's default plugins and score weights, for the plugins shoal has; with
scheduler-plugins' ElasticQuota (CapacityScheduling's admission) and Coscheduling
(a gang's minResources) before the filters, and DefaultPreemption (with
CapacityScheduling's reclaim) then shoal's Rescheduler (moving running pods to make
room) after them. A profile may disable any of them."""

_TOP_LEVEL: Final = {
    "apiVersion",
    "kind",
    "profiles",
    "parallelism",
    "percentageOfNodesToScore",
    "podInitialBackoffSeconds",
    "podMaxBackoffSeconds",
    "finishedRetentionSeconds",
    "leaderElection",
    "clientConnection",
    "extenders",
    "healthzBindAddress",
    "metricsBindAddress",
    "enableProfiling",
    "enableContentionProfiling",
    "delayCacheUntilActive",
    "topology",
}


@dataclass(frozen=True, slots=True)
class PluginRef:
    name: str
    weight: int = 1


@dataclass(frozen=True)
class ProfileConfig:
    scheduler_name: str = DEFAULT_SCHEDULER
    points: Mapping[str, tuple[PluginRef, ...]] = field(default_factory=dict)
    multi_point: tuple[PluginRef, ...] = ()
    """Plugins enabled through ``multiPoint``: placed at every point they implement
    (the weight is a score plugin's), except where :attr:`multi_point_off` says."""
    multi_point_off: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Point → the names disabled there (``*``: all), which ``multiPoint`` does not
    place there either (kube-scheduler's rule)."""
    args: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    gang: GangArgs = field(default_factory=GangArgs)
    """scheduler-plugins' ``CoschedulingArgs`` of the profile."""
    percentage_of_nodes_to_score: int | None = None
    """``percentageOfNodesToScore`` (the profile's, else the configuration's): None,
    unset, scores every feasible node (shoal's exact default); 0 is kube-scheduler's
    adaptive share; see :func:`engine.framework.sample.nodes_to_find`."""


@dataclass(frozen=True)
class SchedulerConfig:
    profiles: tuple[ProfileConfig, ...]
    initial_backoff_seconds: int = 1
    max_backoff_seconds: int = 10
    retention_seconds: int = RETENTION_SECONDS
    """How long (log time) finished pods and groups are remembered
    (``finishedRetentionSeconds``, a shoal field; see :mod:`engine.model.retention`)."""
    source: Mapping[str, Any] | None = field(default=None, compare=False)
    """The document this was parsed from (recorded in the log for replay)."""
    topology: Topology = field(default_factory=Topology)
    """Network topology levels (``topology``, a shoal field; see
    :mod:`engine.model.topology`)."""
    extenders: tuple[ExtenderConfig, ...] = ()
    """HTTP extenders (:mod:`engine.extenders`), asked by the runtime between passes."""
    warnings: tuple[str, ...] = field(default=(), compare=False)
    """Fields accepted but not acted on, each naming the field."""

    @property
    def reservation_timeout_seconds(self) -> int | None:
        """Coscheduling's ``permitWaitingTimeSeconds`` (the least any profile states):
        the coordinator's reservation time-out (None: the ``ShardingConfiguration``'s)."""
        stated = [
            p.gang.permit_waiting_seconds
            for p in self.profiles
            if p.gang.permit_waiting_seconds is not None
        ]
        return min(stated) if stated else None

    @property
    def group_backoff_seconds(self) -> int:
        """Coscheduling's ``podGroupBackoffSeconds`` (the most any profile states)."""
        return max((p.gang.backoff_seconds for p in self.profiles), default=0)


NOT_ACTED: Final[dict[str, str]] = {
    "parallelism": "not acted on: each shard decides one pass at a time; run more shards "
    "(--shards) to schedule concurrently",
    "leaderElection": "not acted on: shoal elects its leaders with Leases of its own "
    "(shoal serve --namespace, --lease-seconds)",
    "clientConnection": "not acted on: the API client is set on the command line "
    "(--kubeconfig, --kube-qps, --kube-burst)",
    "healthzBindAddress": "not acted on: health and metrics are served on --listen",
    "metricsBindAddress": "not acted on: health and metrics are served on --listen",
    "enableProfiling": "not acted on: shoal serves no profiling endpoints",
    "enableContentionProfiling": "not acted on: shoal serves no profiling endpoints",
    "delayCacheUntilActive": "not acted on: every shoal component keeps its state from "
    "the log, leader or not",
}
"""Top-level fields of ``KubeSchedulerConfiguration`` accepted with a warning: what they
set in kube-scheduler is set elsewhere in shoal, or does not exist there."""
PROFILE_NOT_ACTED: Final[dict[str, str]] = {}
"""The same, for fields of a profile."""


def default_profile(name: str = DEFAULT_SCHEDULER) -> ProfileConfig:
    points = {
        point: tuple(PluginRef(n, w or 1) for n, w in plugins)
        for point, plugins in DEFAULT_PLUGINS.items()
    }
    return ProfileConfig(scheduler_name=name, points=points)


def default_config() -> SchedulerConfig:
    return SchedulerConfig(profiles=(default_profile(),))


def _expect(value: Any, kind: type | tuple[type, ...], what: str, where: str) -> Any:
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise InputError(f"must be {what}", location=where)
    return value


def _plugin_list(raw: Any, where: str) -> list[tuple[str, int]]:
    if raw is None:
        return []
    _expect(raw, list, "a list of {name, weight}", where)
    out = []
    for i, item in enumerate(raw):
        loc = f"{where}[{i}]"
        _expect(item, dict, "a mapping with a name", loc)
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise InputError("needs a plugin name", location=loc)
        weight = item.get("weight", 0)
        if not isinstance(weight, int) or isinstance(weight, bool) or not 0 <= weight <= 100:
            raise InputError(f"weight must be an integer 0..100, got {weight!r}", location=loc)
        out.append((name, weight))
    return out


def _refs(section: Any, point: str, where: str, warnings: list[str]) -> tuple[list[PluginRef], ...]:
    """The (enabled, disabled) plugins of one extension point's section, as shoal's
    (:func:`engine.foreign.resolve`)."""
    loc = f"{where}.{point}"
    _expect(section, dict, "a mapping with enabled/disabled", loc)
    return tuple(
        [
            PluginRef(name, weight)
            for name, weight in resolve(
                _plugin_list(section.get(key), f"{loc}.{key}"),
                point,
                f"{loc}.{key}",
                warnings,
                disabled=key == "disabled",
            )
        ]
        for key in ("enabled", "disabled")
    )


def _merge(
    defaults: tuple[PluginRef, ...], enabled: list[PluginRef], disabled: list[PluginRef]
) -> tuple[PluginRef, ...]:
    off = {ref.name for ref in disabled}
    current = [] if "*" in off else [ref for ref in defaults if ref.name not in off]
    for ref in enabled:
        for i, have in enumerate(current):
            if have.name == ref.name:
                current[i] = PluginRef(ref.name, ref.weight or have.weight)
                break
        else:
            current.append(PluginRef(ref.name, ref.weight or 1))
    return tuple(current)


def parse_profile(raw: Any, where: str, warnings: list[str] | None = None) -> ProfileConfig:
    """One profile; what it names that shoal does not act on is added to ``warnings``."""
    warnings = [] if warnings is None else warnings
    _expect(raw, dict, "a mapping", where)
    unknown = set(raw) - {
        "schedulerName",
        "plugins",
        "pluginConfig",
        "percentageOfNodesToScore",
        *PROFILE_NOT_ACTED,
    }
    if unknown:
        raise InputError(f"unknown field {sorted(unknown)[0]!r}", location=where)
    name = raw.get("schedulerName", DEFAULT_SCHEDULER)
    _expect(name, str, "a string", f"{where}.schedulerName")
    plugins = raw.get("plugins") or {}
    _expect(plugins, dict, "a mapping of extension points", f"{where}.plugins")
    for point in plugins:
        if point != "multiPoint" and point not in EXTENSION_POINTS:
            raise InputError(
                f"unknown extension point {point!r} "
                f"(one of multiPoint, {', '.join(EXTENSION_POINTS)})",
                location=f"{where}.plugins",
            )
    base = {point: default_profile().points[point] for point in POINTS}
    loc = f"{where}.plugins"
    multi_on, multi_off = _refs(plugins.get("multiPoint") or {}, "multiPoint", loc, warnings)
    if multi_off:
        base = {point: _merge(refs, [], multi_off) for point, refs in base.items()}
    points: dict[str, tuple[PluginRef, ...]] = {}
    excluded: dict[str, frozenset[str]] = {}
    for point in POINTS:
        enabled, disabled = _refs(plugins.get(point) or {}, point, loc, warnings)
        points[point] = _merge(base[point], enabled, disabled)
        if disabled:
            excluded[point] = frozenset(ref.name for ref in disabled)
    for point in EXTRA_POINTS:
        enabled, _ = _refs(plugins.get(point) or {}, point, loc, warnings)
        if enabled:
            raise InputError(
                f"plugin {enabled[0].name!r} cannot run at {point}: shoal runs no plugins "
                f"there (its queue order, scheduling gates and binding are its own)",
                location=f"{loc}.{point}.enabled",
            )
    args: dict[str, Mapping[str, Any]] = {}
    gang = GangArgs()
    config = raw.get("pluginConfig") or []
    _expect(config, list, "a list of {name, args}", f"{where}.pluginConfig")
    seen: set[str] = set()
    for i, item in enumerate(config):
        loc = f"{where}.pluginConfig[{i}]"
        _expect(item, dict, "a mapping with name and args", loc)
        pname = item.get("name")
        if not isinstance(pname, str) or not pname:
            raise InputError("needs a plugin name", location=loc)
        if pname in seen:
            raise InputError(f"duplicate pluginConfig for {pname!r}", location=loc)
        seen.add(pname)
        pargs = item.get("args") or {}
        _expect(pargs, dict, "a mapping", f"{loc}.args")
        pargs = {k: v for k, v in pargs.items() if k not in ("apiVersion", "kind")}
        if pname == "Coscheduling":
            gang = gang_args(pargs, f"{loc}.args", warnings, MAX_SECONDS)
            continue
        kept = plugin_args(pname, pargs, f"{loc}.args", warnings)
        if kept is not None:
            args[pname] = kept
    return ProfileConfig(
        scheduler_name=name,
        points=points,
        multi_point=tuple(multi_on),
        multi_point_off=excluded,
        args=args,
        gang=gang,
        percentage_of_nodes_to_score=_percentage(raw, where),
    )


def _percentage(raw: Mapping[str, Any], where: str) -> int | None:
    """``percentageOfNodesToScore`` as kube-scheduler validates it (an integer 0..100;
    0: its adaptive share), or None when the field is absent."""
    value = raw.get("percentageOfNodesToScore")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 100:
        raise InputError(
            f"must be an integer 0..100, got {value!r}",
            location=f"{where}.percentageOfNodesToScore",
        )
    return value


def _plain(raw: Mapping[str, Any], where: str) -> None:
    """The document is recorded in the log as JSON and read back on replay: refuse what
    JSON cannot carry exactly (keys that are not strings, integers beyond 64 bits,
    infinities, dates) wherever it is, even in fields shoal ignores; and a document of
    more than :data:`MAX_DOCUMENT_NODES` values."""
    stack: list[tuple[Any, str]] = [(raw, where)]
    seen = 0
    while stack:
        value, loc = stack.pop()
        seen += 1
        if seen > MAX_DOCUMENT_NODES:
            raise InputError(f"holds more than {MAX_DOCUMENT_NODES} values", location=where)
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise InputError(
                        f"keys must be strings, got a {type(key).__name__}", location=loc
                    )
                stack.append((item, f"{loc}.{key}" if loc else key))
        elif isinstance(value, list):
            stack.extend((item, f"{loc}[{i}]") for i, item in enumerate(value))
        elif isinstance(value, bool) or value is None or isinstance(value, str):
            continue
        elif isinstance(value, int):
            if not _INT64[0] <= value <= _INT64[1]:
                raise InputError("integer out of the 64-bit range", location=loc)
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise InputError("must be a finite number", location=loc)
        else:
            raise InputError(
                f"must be a string, number, boolean, list or mapping, got a {type(value).__name__}",
                location=loc,
            )


def _gang_differences(profiles: tuple[ProfileConfig, ...], where: str) -> list[str]:
    """A warning for each Coscheduling arg that profiles state differently: shoal keeps
    one reservation time-out and one gang back-off for every profile."""
    out = []
    for key, attr, rule in (
        ("permitWaitingTimeSeconds", "permit_waiting_seconds", "the least"),
        ("podGroupBackoffSeconds", "backoff_seconds", "the most"),
    ):
        values = {getattr(p.gang, attr) for p in profiles} - {None}
        if len(values) > 1:
            out.append(
                f"{where}.profiles: Coscheduling's {key} differs between profiles "
                f"({', '.join(map(str, sorted(values)))}); shoal applies {rule} to every gang"
            )
    return out


def parse_config(raw: Any, where: str = "config") -> SchedulerConfig:
    """Validate a ``KubeSchedulerConfiguration`` document (already parsed from YAML)."""
    _expect(raw, dict, "a KubeSchedulerConfiguration mapping", where)
    if raw.get("kind") != KIND:
        raise InputError(f"kind must be {KIND}, got {raw.get('kind')!r}", location=f"{where}.kind")
    if raw.get("apiVersion") not in API_VERSIONS:
        raise InputError(
            f"apiVersion must be one of {', '.join(API_VERSIONS)}, got {raw.get('apiVersion')!r}",
            location=f"{where}.apiVersion",
        )
    unknown = set(raw) - _TOP_LEVEL
    if unknown:
        raise InputError(f"unknown field {sorted(unknown)[0]!r}", location=where)
    _plain(raw, where)
    raw_profiles = raw.get("profiles") or [{}]
    _expect(raw_profiles, list, "a list of profiles", f"{where}.profiles")
    profile_warnings: list[str] = []
    profiles = tuple(
        parse_profile(p, f"{where}.profiles[{i}]", profile_warnings)
        for i, p in enumerate(raw_profiles)
    )
    percentage = _percentage(raw, where)
    if percentage is not None:  # a profile's own value wins (kube-scheduler's rule)
        profiles = tuple(
            p
            if p.percentage_of_nodes_to_score is not None
            else replace(p, percentage_of_nodes_to_score=percentage)
            for p in profiles
        )
    profile_warnings += _gang_differences(profiles, where)
    seen: set[str] = set()
    for i, profile in enumerate(profiles):
        if profile.scheduler_name in seen:
            raise InputError(
                f"duplicate schedulerName {profile.scheduler_name!r}",
                location=f"{where}.profiles[{i}].schedulerName",
            )
        seen.add(profile.scheduler_name)
    initial = raw.get("podInitialBackoffSeconds", 1)
    maximum = raw.get("podMaxBackoffSeconds", 10)
    for key, value in (("podInitialBackoffSeconds", initial), ("podMaxBackoffSeconds", maximum)):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_SECONDS:
            raise InputError(
                f"must be a non-negative integer, at most {MAX_SECONDS} (seconds)",
                location=f"{where}.{key}",
            )
    retention = raw.get("finishedRetentionSeconds", RETENTION_SECONDS)
    if (
        not isinstance(retention, int)
        or isinstance(retention, bool)
        or not 1 <= retention <= MAX_SECONDS
    ):
        raise InputError(
            f"must be a positive integer, at most {MAX_SECONDS} (seconds)",
            location=f"{where}.finishedRetentionSeconds",
        )
    if maximum < initial:
        raise InputError(
            "must not be less than podInitialBackoffSeconds",
            location=f"{where}.podMaxBackoffSeconds",
        )
    extenders, warnings = parse_extenders(
        raw.get("extenders"),
        f"{where}.extenders" if where else "extenders",
        tuple(p.scheduler_name for p in profiles),
    )
    prefix = f"{where}." if where else ""
    warnings = (
        *(f"{prefix}{key}: {why}" for key, why in NOT_ACTED.items() if key in raw),
        *(
            f"{prefix}profiles[{i}].{key}: {why}"
            for i, profile in enumerate(raw_profiles)
            if isinstance(profile, dict)
            for key, why in PROFILE_NOT_ACTED.items()
            if key in profile
        ),
        *(w.removeprefix(".") for w in profile_warnings),
        *warnings,
    )
    return SchedulerConfig(
        profiles,
        initial,
        maximum,
        retention,
        source=raw,
        topology=parse_topology(raw.get("topology"), f"{where}.topology"),
        extenders=extenders,
        warnings=warnings,
    )
