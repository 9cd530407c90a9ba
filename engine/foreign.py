"""Plugins of kube-scheduler, scheduler-plugins and Volcano by name: what each is in shoal.

A ``KubeSchedulerConfiguration`` written for kube-scheduler or for scheduler-plugins'
scheduler names their plugins, at extension points shoal has (preFilter ... permit) and
at some it has no plugins for (preEnqueue, queueSort, preBind, bind, postBind). shoal
accepts every such configuration: each plugin it knows by name is

- *mapped*: at each extension point, the shoal plugin that does its work there
  (scheduler-plugins' CapacityScheduling is ``ElasticQuota`` at preFilter and
  ``DefaultPreemption`` at postFilter), or nothing where shoal does that work without a
  plugin (:data:`BUILT_IN`: Coscheduling's queue order and Permit are shoal's queue,
  which holds a gang as one unit, and its gang pass, which places a gang in one staged
  step);
- or *without effect*: accepted, and a warning says why, naming the plugin.

A mapped plugin used somewhere it does nothing in shoal is warned about too. A name that
is in none of these projects (nor a built-in, nor an installed user plugin) is still an
error: it is a typo. The table is data; :func:`engine.config.parse_profile` applies it.

Decision: a name here is resolved here even if an installed package publishes a user
plugin of that name, as a built-in's name is (the built-in wins): a configuration means
the same on every machine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from events.errors import InputError

BUILT_IN: Final = ""
"""In :attr:`Known.at`: shoal does this itself, with no plugin to enable."""

EXTENSION_POINTS: Final = (
    "preEnqueue",
    "queueSort",
    "preFilter",
    "filter",
    "postFilter",
    "preScore",
    "score",
    "reserve",
    "permit",
    "preBind",
    "bind",
    "postBind",
)
"""kube-scheduler's extension points (``KubeSchedulerConfiguration`` v1), less
``multiPoint``."""
SHOAL_POINTS: Final = (
    "preFilter",
    "filter",
    "postFilter",
    "preScore",
    "score",
    "reserve",
    "permit",
)
"""Those at which shoal runs plugins."""


@dataclass(frozen=True, slots=True)
class Known:
    """A plugin of another project, and what it is in shoal."""

    project: str
    at: Mapping[str, str] = field(default_factory=dict)
    """Extension point → the shoal plugin that does this plugin's work there
    (:data:`BUILT_IN`: shoal does it without one). Elsewhere it has no effect."""
    why: str = ""
    """Why it has no effect (where :attr:`at` has no entry), or, for a mapped plugin,
    what of it shoal does not do."""
    owns: tuple[str, ...] = ()
    """The shoal plugins that are this one: disabling it disables them (disabling a
    plugin shoal maps to one of its defaults it does not own changes nothing)."""

    @property
    def plugins(self) -> tuple[str, ...]:
        """The shoal plugins it maps to (for ``multiPoint``), in the order of the points."""
        return tuple(
            dict.fromkeys(self.at[p] for p in EXTENSION_POINTS if self.at.get(p, BUILT_IN))
        )


def _everywhere(**at: str) -> dict[str, str]:
    return {point: at.get(point, BUILT_IN) for point in EXTENSION_POINTS}


KUBE: Final = "kube-scheduler"
SP: Final = "scheduler-plugins"
VOLCANO: Final = "Volcano"

_VOLUMES: Final = (
    "shoal does not model volumes (PersistentVolumeClaims, their binding, zones and "
    "CSI attach limits); a pod is placed by its other requests"
)
_REMOVED: Final = "removed from kube-scheduler; "
_LOAD: Final = (
    "it scores nodes by their measured load (a metrics provider), which shoal does not "
    "read; shoal scores by requests (NodeResourcesFit's scoringStrategy)"
)
_VOLCANO: Final = (
    "a plugin of Volcano's own configuration (volcano-scheduler.conf), not of a "
    "KubeSchedulerConfiguration; "
)

KNOWN: Final[Mapping[str, Known]] = {
    # kube-scheduler's own (pkg/scheduler/framework/plugins), current and removed
    "PrioritySort": Known(KUBE, {"queueSort": BUILT_IN}),
    "SchedulingGates": Known(KUBE, {"preEnqueue": BUILT_IN}),
    "DefaultBinder": Known(KUBE, {"bind": BUILT_IN}),
    "GangScheduling": Known(KUBE, _everywhere()),
    "ImageLocality": Known(
        KUBE, why="shoal does not know which images a node holds, so no node is preferred for it"
    ),
    "VolumeBinding": Known(KUBE, why=_VOLUMES),
    "VolumeRestrictions": Known(KUBE, why=_VOLUMES),
    "VolumeZone": Known(KUBE, why=_VOLUMES),
    "NodeVolumeLimits": Known(KUBE, why=_VOLUMES),
    "EBSLimits": Known(KUBE, why=_VOLUMES),
    "GCEPDLimits": Known(KUBE, why=_VOLUMES),
    "AzureDiskLimits": Known(KUBE, why=_VOLUMES),
    "CinderLimits": Known(KUBE, why=_VOLUMES),
    "DynamicResources": Known(
        KUBE,
        why="resource claims (dynamic resource allocation) are not modelled; GPUs requested "
        "as an extended resource (nvidia.com/gpu) are placed by shoal's GPU plugins",
    ),
    "NodeDeclaredFeatures": Known(KUBE, why="shoal does not read nodes' declared features"),
    "SelectorSpread": Known(
        KUBE,
        why=_REMOVED + "PodTopologySpread's system default constraints spread the pods of "
        "one Service or controller",
    ),
    "ServiceAffinity": Known(KUBE, why=_REMOVED + "use node affinity"),
    "NodeLabel": Known(KUBE, why=_REMOVED + "use node affinity"),
    "NodePreferAvoidPods": Known(KUBE, why=_REMOVED + "use taints"),
    "NodeResourcesLeastAllocated": Known(
        KUBE, why=_REMOVED + "NodeResourcesFit's scoringStrategy LeastAllocated does this"
    ),
    "NodeResourcesMostAllocated": Known(
        KUBE, why=_REMOVED + "NodeResourcesFit's scoringStrategy MostAllocated does this"
    ),
    "RequestedToCapacityRatio": Known(
        KUBE, why=_REMOVED + "NodeResourcesFit's scoringStrategy RequestedToCapacityRatio does this"
    ),
    "NodeResourceLimits": Known(KUBE, why=_REMOVED + "pods are placed by their requests"),
    # scheduler-plugins (kubernetes-sigs/scheduler-plugins, cmd/scheduler/main.go)
    "Coscheduling": Known(
        SP,
        {
            "preEnqueue": BUILT_IN,
            "queueSort": BUILT_IN,
            "preFilter": "Coscheduling",
            "postFilter": BUILT_IN,
            "reserve": BUILT_IN,
            "permit": BUILT_IN,
            "postBind": BUILT_IN,
        },
        owns=("Coscheduling",),
    ),
    "CapacityScheduling": Known(
        SP,
        {"preFilter": "ElasticQuota", "postFilter": "DefaultPreemption", "reserve": BUILT_IN},
        owns=("ElasticQuota",),
    ),
    "PreemptionToleration": Known(
        SP,
        {"postFilter": "DefaultPreemption"},
        why="shoal preempts as DefaultPreemption does: a PriorityClass's "
        "preemption-toleration annotations do not protect its pods",
    ),
    "CrossNodePreemption": Known(
        SP,
        {"postFilter": "DefaultPreemption"},
        why="shoal preempts as DefaultPreemption does (a pod's victims on one node; a gang's "
        "across the nodes it needs)",
    ),
    "QOSSort": Known(
        SP, why="shoal's queue orders by priority, then arrival, not by QoS class within a priority"
    ),
    "NodeResourcesAllocatable": Known(
        SP,
        why="shoal does not score by nodes' allocatable size; NodeResourcesFit's "
        "scoringStrategy scores by what pods request",
    ),
    "TargetLoadPacking": Known(SP, why=_LOAD),
    "LoadVariationRiskBalancing": Known(SP, why=_LOAD),
    "LowRiskOverCommitment": Known(SP, why=_LOAD),
    "Peaks": Known(SP, why=_LOAD),
    "NetworkOverhead": Known(
        SP,
        why="AppGroup and NetworkTopology objects are not read; shoal places gangs by "
        "network topology with its own `topology` levels",
    ),
    "TopologicalSort": Known(
        SP, why="AppGroup objects are not read; shoal's queue orders by priority, then arrival"
    ),
    "NodeResourceTopologyMatch": Known(
        SP, why="NodeResourceTopology objects (NUMA zones) are not read"
    ),
    "SySched": Known(SP, why="seccomp profiles are not read"),
    "PodState": Known(SP, why="shoal does not prefer nodes by their terminating pods"),
    "NodeMetadata": Known(SP, why="shoal does not score nodes by labels or annotations"),
    # Volcano (volcano-sh/volcano, pkg/scheduler/plugins), as volcano-scheduler.conf names them
    **{
        name: Known(VOLCANO, why=_VOLCANO + equivalent)
        for name, equivalent in {
            "gang": "shoal's Coscheduling and gang pass do this",
            "priority": "shoal's queue orders by priority",
            "conformance": "shoal never preempts kube-system's critical pods by priority alone",
            "drf": "shoal's queues share borrowed capacity by dominant resource share",
            "predicates": "shoal's filters (NodeResourcesFit, NodeAffinity, ...) do this",
            "nodeorder": "shoal's score plugins do this",
            "binpack": "NodeResourcesFit's scoringStrategy MostAllocated does this",
            "proportion": "ElasticQuota (CapacityScheduling) does this",
            "capacity": "ElasticQuota (CapacityScheduling) does this",
            "overcommit": "shoal admits by requests",
            "sla": "a pod group's scheduleTimeoutSeconds does this",
            "tdm": "shoal has no time-division multiplexing",
            "numaaware": "NUMA zones are not read",
            "task-topology": "shoal's topology levels place gangs",
            "network-topology-aware": "shoal's topology levels place gangs",
            "rescheduling": "shoal's Rescheduler does this",
            "extender": "KubeSchedulerConfiguration's extenders do this",
            "usage": "shoal scores by requests, not measured usage",
            "cdp": "shoal has no cooldown protection",
            "deviceshare": "shoal's GPU plugins do this",
            "resource-strategy-fit": "NodeResourcesFit's scoringStrategy does this",
            "pdb": "shoal's preemption respects PodDisruptionBudgets",
            "nodegroup": "ShardingConfiguration's pools and tenants do this",
            "resourcequota": "ElasticQuota (CapacityScheduling) does this",
        }.items()
    },
}
"""Every plugin name known from kube-scheduler, scheduler-plugins and Volcano whose work
is not all done by a shoal plugin of the same name (shoal's built-ins keep
kube-scheduler's names: NodeResourcesFit, TaintToleration, DefaultPreemption...).
Coscheduling is here and a built-in: shoal's plugin is its preFilter, the rest is the
queue's and the gang pass's."""


def describe(name: str, known: Known) -> str:
    """``name`` as warnings name it: the plugin and its project."""
    return f"{name} ({known.project})"


EXTRA_POINTS: Final = tuple(p for p in EXTENSION_POINTS if p not in SHOAL_POINTS)
"""kube-scheduler's extension points at which shoal runs no plugins: their work is
shoal's own (queue order, scheduling gates, binding), or not done (see :data:`KNOWN`)."""


@dataclass(frozen=True, slots=True)
class GangArgs:
    """scheduler-plugins' ``CoschedulingArgs`` (``pluginConfig`` of Coscheduling), as
    shoal honours them."""

    permit_waiting_seconds: int | None = None
    """``permitWaitingTimeSeconds``: the longest a gang's placed members may hold
    capacity waiting for the rest. A gang on one shard is placed in one staged step (no
    member waits); a reservation across shards (the coordinator's) expires after this
    long if not committed: it replaces the ``ShardingConfiguration``'s
    ``reservationTimeoutSeconds``."""
    backoff_seconds: int = 0
    """``podGroupBackoffSeconds``: a gang that found no place is not tried again for at
    least this long (its pods' own back-off may be longer)."""


def resolve(
    refs: list[tuple[str, int]],
    point: str,
    where: str,
    warnings: list[str],
    *,
    disabled: bool = False,
) -> list[tuple[str, int]]:
    """``refs`` (name, weight) at ``point`` (or ``multiPoint``), as shoal's plugins: a
    known plugin of another project becomes the shoal plugin that does its work there, or
    nothing (with a warning where it has no effect); other names are kept. ``where``:
    the list's location (its items are ``where[i]``)."""
    out: list[tuple[str, int]] = []
    for i, (name, weight) in enumerate(refs):
        known = KNOWN.get(name)
        if known is None:
            out.append((name, weight))
            continue
        loc = f"{where}[{i}]"
        if disabled:
            out.extend(
                (owned, 0)
                for owned in known.owns
                if point == "multiPoint" or known.at.get(point) == owned
            )
            continue
        if point == "multiPoint":
            targets = known.plugins
            acts = bool(known.at)
        else:
            target = known.at.get(point)
            targets = (target,) if target else ()
            acts = target is not None
        out.extend((target, weight) for target in targets)
        if not acts:
            why = known.why or f"shoal does not do its {point} work"
            warnings.append(f"{loc}: {describe(name, known)} has no effect in shoal: {why}")
        elif known.why:
            warnings.append(f"{loc}: {describe(name, known)} is only in part in shoal: {known.why}")
    return out


BUILTIN_ARGS_NOT_ACTED: Final[Mapping[tuple[str, str], str]] = {
    ("DefaultPreemption", "minCandidateNodesPercentage"): "not acted on: shoal's preemption "
    "considers every node (vectorised), not a sample of candidates",
    ("DefaultPreemption", "minCandidateNodesAbsolute"): "not acted on: shoal's preemption "
    "considers every node (vectorised), not a sample of candidates",
    ("NodeAffinity", "addedAffinity"): "not acted on: the profile's pods are not held to it; "
    "state the node affinity on the pods (or a tenant's pools in a ShardingConfiguration)",
    ("NodeResourcesFit", "ignoredResources"): "not acted on: every resource a pod requests "
    "is counted",
    ("NodeResourcesFit", "ignoredResourceGroups"): "not acted on: every resource a pod "
    "requests is counted",
}
"""Args of kube-scheduler's plugins that shoal's plugins of the same name do not take:
accepted with a warning, and not handed to the plugin."""

_GANG_NOT_ACTED: Final[Mapping[str, str]] = {
    "podGroupGCIntervalSeconds": "not acted on: finished pod groups are forgotten after "
    "finishedRetentionSeconds",
    "podGroupExpirationTimeSeconds": "not acted on: a pod group's scheduleTimeoutSeconds "
    "ends a gang that cannot be placed",
    "deniedPGExpirationTimeSeconds": "not acted on: a gang that found no place waits "
    "podGroupBackoffSeconds, then for a change that may help",
    "kubeConfigPath": "not acted on: the API client is set on the command line (--kubeconfig)",
    "kubeMaster": "not acted on: the API client is set on the command line (--kubeconfig)",
}


def _seconds(args: Mapping[str, Any], key: str, where: str, low: int, high: int) -> int | None:
    value = args.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InputError(f"must be an integer from {low} to {high} (seconds)", location=where)
    return value


def gang_args(
    args: Mapping[str, Any], where: str, warnings: list[str], max_seconds: int
) -> GangArgs:
    """scheduler-plugins' ``CoschedulingArgs``: honoured, warned about (older fields), or
    refused (a field it does not have, as its strict decoding does)."""
    honoured = ("permitWaitingTimeSeconds", "podGroupBackoffSeconds")
    for key in args:
        if key in _GANG_NOT_ACTED:
            warnings.append(f"{where}.{key}: {_GANG_NOT_ACTED[key]}")
        elif key not in honoured:
            known = ", ".join((*honoured, *_GANG_NOT_ACTED))
            raise InputError(f"unknown Coscheduling arg {key!r} (one of {known})", location=where)
    wait = _seconds(args, honoured[0], f"{where}.{honoured[0]}", 1, max_seconds)
    backoff = _seconds(args, honoured[1], f"{where}.{honoured[1]}", 0, max_seconds)
    return GangArgs(permit_waiting_seconds=wait, backoff_seconds=backoff or 0)


def plugin_args(
    name: str, args: Mapping[str, Any], where: str, warnings: list[str]
) -> Mapping[str, Any] | None:
    """The ``pluginConfig`` args of ``name`` that shoal's plugin of that name takes
    (None: no shoal plugin takes them; Coscheduling's are :func:`gang_args`)."""
    known = KNOWN.get(name)
    if known is not None:
        if args:
            does = ", ".join(known.plugins) or ("shoal itself" if known.at else "")
            why = f"in shoal, {does} does its work" if does else "it has no effect in shoal"
            warnings.append(
                f"{where}: not acted on: {describe(name, known)} takes no args here ({why})"
            )
        return None
    kept = dict(args)
    for key in args:
        unused = BUILTIN_ARGS_NOT_ACTED.get((name, key))
        if unused is not None:
            warnings.append(f"{where}.{key}: {unused}")
            del kept[key]
    return kept
