"""A pod's inter-pod rules in: ``affinity.podAffinity``, ``affinity.podAntiAffinity`` and
``topologySpreadConstraints`` → the ``PodSpec`` fields the InterPodAffinity and
PodTopologySpread plugins read. Used by the scenario loader and Kubernetes ingest alike.

Validated as the API server validates them (operators, weights 1..100, ``maxSkew`` ≥ 1,
``minDomains`` only with ``DoNotSchedule``, no duplicate ``topologyKey`` and
``whenUnsatisfiable`` pair, the label-key lists only beside a ``labelSelector``), and
resolved once here, as the API server and kube-scheduler resolve them:

- ``matchLabelKeys`` / ``mismatchLabelKeys`` of an affinity term become ``key In
  (value)`` / ``key NotIn (value)`` requirements of its selector, for the keys the pod
  has (the API server merges them at creation); a spread constraint's ``matchLabelKeys``
  become ``key In (value)`` likewise (kube-scheduler merges them);
- a term's namespaces: those listed, plus those its ``namespaceSelector`` selects, or
  the pod's own when it has neither; ``namespaceSelector: {}`` is every namespace.
  Namespaces are not objects here, so a selector is honoured only on the label every
  namespace carries, ``kubernetes.io/metadata.name`` (``matchLabels`` or ``In``); any
  other selector is refused (exit 2), never guessed.

Unknown fields in these structures are refused: a misspelt field would otherwise be a
rule silently not applied.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from events.errors import InputError
from events.types import (
    LabelSelector,
    LabelSelectorRequirement,
    PodAffinityTerm,
    TopologySpreadConstraint,
    WeightedPodAffinityTerm,
)
from shards.inputs.fields import _labels, _list, _map, _str
from shards.inputs.limits import MAX_PRIORITY, shown

NAMESPACE_LABEL: Final = "kubernetes.io/metadata.name"
LABEL_OPERATORS: Final = ("In", "NotIn", "Exists", "DoesNotExist")
REQUIRED: Final = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED: Final = "preferredDuringSchedulingIgnoredDuringExecution"
TERM_FIELDS: Final = frozenset(
    {
        "labelSelector",
        "namespaces",
        "namespaceSelector",
        "topologyKey",
        "matchLabelKeys",
        "mismatchLabelKeys",
    }
)
SPREAD_FIELDS: Final = frozenset(
    {
        "maxSkew",
        "topologyKey",
        "whenUnsatisfiable",
        "labelSelector",
        "minDomains",
        "nodeAffinityPolicy",
        "nodeTaintsPolicy",
        "matchLabelKeys",
    }
)
POLICIES: Final = ("Honor", "Ignore")
WHEN: Final = ("DoNotSchedule", "ScheduleAnyway")


def _known(item: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    for key in item:
        if key not in allowed:
            raise InputError(
                f"unknown field {shown(key)} (known: {', '.join(sorted(allowed))})",
                location=f"{where}.{key}",
            )


def _int(value: Any, where: str, low: int, high: int = MAX_PRIORITY) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InputError(f"must be an integer {low}..{high}, got {shown(value)}", location=where)
    return value


def label_selector(value: Any, where: str) -> LabelSelector | None:
    """A ``metav1.LabelSelector`` (None when absent)."""
    if value is None:
        return None
    item = _map(value, where)
    _known(item, frozenset({"matchLabels", "matchExpressions"}), where)
    exprs = []
    for i, raw in enumerate(_list(item.get("matchExpressions"), f"{where}.matchExpressions")):
        loc = f"{where}.matchExpressions[{i}]"
        req = _map(raw, loc, required=True)
        _known(req, frozenset({"key", "operator", "values"}), loc)
        key = _str(req.get("key"), f"{loc}.key")
        if not key:
            raise InputError("must not be empty", location=f"{loc}.key")
        op = _str(req.get("operator"), f"{loc}.operator")
        if op not in LABEL_OPERATORS:
            raise InputError(
                f"unknown operator {shown(op)} (one of {', '.join(LABEL_OPERATORS)})",
                location=f"{loc}.operator",
            )
        values = tuple(
            _str(v, f"{loc}.values[{j}]")
            for j, v in enumerate(_list(req.get("values"), f"{loc}.values"))
        )
        if op in ("In", "NotIn") and not values:
            raise InputError(f"{op} needs at least one value", location=f"{loc}.values")
        if op in ("Exists", "DoesNotExist") and values:
            raise InputError(f"{op} takes no values", location=f"{loc}.values")
        exprs.append(LabelSelectorRequirement(key=key, operator=op, values=values))
    return LabelSelector(
        match_labels=_labels(item.get("matchLabels"), f"{where}.matchLabels"),
        match_expressions=tuple(exprs),
    )


def _keys(value: Any, where: str) -> tuple[str, ...]:
    keys = tuple(_str(k, f"{where}[{i}]") for i, k in enumerate(_list(value, where)))
    if len(set(keys)) != len(keys):
        raise InputError("duplicate keys", location=where)
    return keys


def _merge(
    selector: LabelSelector, labels: Mapping[str, str], keys: tuple[str, ...], op: str
) -> LabelSelector:
    extra = tuple(
        LabelSelectorRequirement(key=k, operator=op, values=(labels[k],))
        for k in keys
        if k in labels
    )
    if not extra:
        return selector
    return LabelSelector(
        match_labels=selector.match_labels,
        match_expressions=selector.match_expressions + extra,
    )


def _selected_namespaces(value: Any, where: str) -> tuple[tuple[str, ...], bool]:
    """A term's ``namespaceSelector`` → (namespaces it selects, every namespace)."""
    selector = label_selector(value, where)
    assert selector is not None
    if not selector.match_labels and not selector.match_expressions:
        return (), True
    names: set[str] | None = None
    for key, val in selector.match_labels.items():
        if key != NAMESPACE_LABEL:
            raise InputError(
                f"namespace labels are not modelled: only {NAMESPACE_LABEL} can be "
                f"selected on, got {shown(key)}",
                location=f"{where}.matchLabels",
            )
        names = {val} if names is None else names & {val}
    for i, req in enumerate(selector.match_expressions):
        if req.key != NAMESPACE_LABEL or req.operator != "In":
            raise InputError(
                f"namespace labels are not modelled: only {NAMESPACE_LABEL} In (...) "
                f"can be selected on",
                location=f"{where}.matchExpressions[{i}]",
            )
        names = set(req.values) if names is None else names & set(req.values)
    return tuple(sorted(names or ())), False


def _term(value: Any, where: str, namespace: str, labels: Mapping[str, str]) -> PodAffinityTerm:
    item = _map(value, where, required=True)
    _known(item, TERM_FIELDS, where)
    topology_key = _str(item.get("topologyKey"), f"{where}.topologyKey")
    if not topology_key:
        raise InputError("must not be empty", location=f"{where}.topologyKey")
    selector = label_selector(item.get("labelSelector"), f"{where}.labelSelector")
    match_keys = _keys(item.get("matchLabelKeys"), f"{where}.matchLabelKeys")
    mismatch_keys = _keys(item.get("mismatchLabelKeys"), f"{where}.mismatchLabelKeys")
    if (match_keys or mismatch_keys) and selector is None:
        field = "matchLabelKeys" if match_keys else "mismatchLabelKeys"
        raise InputError("needs a labelSelector", location=f"{where}.{field}")
    both = set(match_keys) & set(mismatch_keys)
    if both:
        raise InputError(
            f"{sorted(both)} also in mismatchLabelKeys", location=f"{where}.matchLabelKeys"
        )
    if selector is not None:
        used = set(selector.match_labels) | {r.key for r in selector.match_expressions}
        clash = used & (set(match_keys) | set(mismatch_keys))
        if clash:
            raise InputError(
                f"{sorted(clash)} already in labelSelector", location=f"{where}.labelSelector"
            )
        selector = _merge(selector, labels, match_keys, "In")
        selector = _merge(selector, labels, mismatch_keys, "NotIn")
    names = _keys(item.get("namespaces"), f"{where}.namespaces")
    everywhere = False
    raw_selector = item.get("namespaceSelector")
    if raw_selector is not None:
        selected, everywhere = _selected_namespaces(raw_selector, f"{where}.namespaceSelector")
        names = tuple(sorted(set(names) | set(selected)))
    elif not names:
        names = (namespace,)
    return PodAffinityTerm(
        topology_key=topology_key,
        selector=selector,
        namespaces=() if everywhere else tuple(sorted(set(names))),
        all_namespaces=everywhere,
    )


def _rules(
    value: Any, where: str, namespace: str, labels: Mapping[str, str]
) -> tuple[tuple[PodAffinityTerm, ...], tuple[WeightedPodAffinityTerm, ...]]:
    item = _map(value, where)
    _known(item, frozenset({REQUIRED, PREFERRED}), where)
    loc = f"{where}.{REQUIRED}"
    required = tuple(
        _term(raw, f"{loc}[{i}]", namespace, labels)
        for i, raw in enumerate(_list(item.get(REQUIRED), loc))
    )
    preferred = []
    loc = f"{where}.{PREFERRED}"
    for i, raw in enumerate(_list(item.get(PREFERRED), loc)):
        entry = _map(raw, f"{loc}[{i}]", required=True)
        _known(entry, frozenset({"weight", "podAffinityTerm"}), f"{loc}[{i}]")
        weight = _int(entry.get("weight"), f"{loc}[{i}].weight", 1, 100)
        term = _term(entry.get("podAffinityTerm"), f"{loc}[{i}].podAffinityTerm", namespace, labels)
        preferred.append(WeightedPodAffinityTerm(weight=weight, term=term))
    return required, tuple(preferred)


def pod_affinity(
    spec: Mapping[str, Any], namespace: str, labels: Mapping[str, str]
) -> dict[str, Any]:
    """The ``PodSpec`` fields of a pod's ``affinity.podAffinity`` and
    ``affinity.podAntiAffinity`` (only those set)."""
    affinity = _map(spec.get("affinity"), "spec.affinity")
    _known(affinity, frozenset({"nodeAffinity", "podAffinity", "podAntiAffinity"}), "spec.affinity")
    out: dict[str, Any] = {}
    required, preferred = _rules(
        affinity.get("podAffinity"), "spec.affinity.podAffinity", namespace, labels
    )
    if required:
        out["pod_affinity"] = required
    if preferred:
        out["pod_affinity_preferred"] = preferred
    required, preferred = _rules(
        affinity.get("podAntiAffinity"), "spec.affinity.podAntiAffinity", namespace, labels
    )
    if required:
        out["pod_anti_affinity"] = required
    if preferred:
        out["pod_anti_affinity_preferred"] = preferred
    return out


def spread_constraints(
    spec: Mapping[str, Any], labels: Mapping[str, str]
) -> tuple[TopologySpreadConstraint, ...]:
    """A pod's ``topologySpreadConstraints``."""
    where = "spec.topologySpreadConstraints"
    out: list[TopologySpreadConstraint] = []
    for i, raw in enumerate(_list(spec.get("topologySpreadConstraints"), where)):
        loc = f"{where}[{i}]"
        item = _map(raw, loc, required=True)
        _known(item, SPREAD_FIELDS, loc)
        max_skew = _int(item.get("maxSkew"), f"{loc}.maxSkew", 1)
        key = _str(item.get("topologyKey"), f"{loc}.topologyKey")
        if not key:
            raise InputError("must not be empty", location=f"{loc}.topologyKey")
        when = _str(item.get("whenUnsatisfiable"), f"{loc}.whenUnsatisfiable")
        if when not in WHEN:
            raise InputError(
                f"must be DoNotSchedule or ScheduleAnyway, got {shown(when)}",
                location=f"{loc}.whenUnsatisfiable",
            )
        min_domains = 1
        if item.get("minDomains") is not None:
            min_domains = _int(item.get("minDomains"), f"{loc}.minDomains", 1)
            if when != "DoNotSchedule":
                raise InputError(
                    "only with whenUnsatisfiable: DoNotSchedule", location=f"{loc}.minDomains"
                )
        policies = {}
        for field in ("nodeAffinityPolicy", "nodeTaintsPolicy"):
            value = item.get(field)
            if value is not None and value not in POLICIES:
                raise InputError(
                    f"must be Honor or Ignore, got {shown(value)}", location=f"{loc}.{field}"
                )
            policies[field] = value
        selector = label_selector(item.get("labelSelector"), f"{loc}.labelSelector")
        match_keys = _keys(item.get("matchLabelKeys"), f"{loc}.matchLabelKeys")
        if match_keys:
            if selector is None:
                raise InputError("needs a labelSelector", location=f"{loc}.matchLabelKeys")
            used = set(selector.match_labels) | {r.key for r in selector.match_expressions}
            if used & set(match_keys):
                raise InputError(
                    f"{sorted(used & set(match_keys))} already in labelSelector",
                    location=f"{loc}.matchLabelKeys",
                )
            selector = _merge(selector, labels, match_keys, "In")
        if any(c.topology_key == key and c.when_unsatisfiable == when for c in out):
            raise InputError(
                f"duplicate topologyKey {shown(key)} with whenUnsatisfiable {when}",
                location=f"{loc}.topologyKey",
            )
        out.append(
            TopologySpreadConstraint(
                max_skew=max_skew,
                topology_key=key,
                when_unsatisfiable=when,
                selector=selector,
                min_domains=min_domains,
                node_affinity_policy=policies["nodeAffinityPolicy"] or "Honor",
                node_taints_policy=policies["nodeTaintsPolicy"] or "Ignore",
            )
        )
    return tuple(out)
