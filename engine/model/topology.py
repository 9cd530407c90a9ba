"""Network topology: the levels a cluster declares, and the domain each node is in.

A *level* is a way of cutting the nodes into *domains*: by the value of a node label
(``example.com/leaf: leaf-3``: every node with that value is one domain), or by a tier
of Volcano HyperNodes (each HyperNode of the tier is one domain: the nodes its members
name, directly or through the HyperNodes it contains). Levels are kept narrowest first
(index 0: the leaf), so a level's *tier* is its index + 1, as Volcano numbers tiers.

The configuration (``topology`` of a ``KubeSchedulerConfiguration``) lists label levels
broadest first, as Kueue's ``Topology`` does; :func:`parse_topology` turns them round.
A gang names a level by its ``name``, its ``nodeLabel``, a HyperNode ``tierName`` or a
tier number (:meth:`Topology.resolve`).

Domains per slot are coded in order of first appearance by slot, so the codes are a
function of the node events alone; :class:`DomainIndex` keeps them per state until a
node's labels or the node set change (``static_version``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from engine.model.state import ABSENT, ClusterState, Ints
from events.errors import InputError

NO_DOMAIN: Final = -1
_OPERATORS: Final = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass(frozen=True, slots=True)
class Selector:
    """One HyperNode member selector: a name, a regular expression over names, or (for
    nodes) a label selector (``matchLabels`` and ``matchExpressions``)."""

    exact: str = ""
    regex: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    expressions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        if self.exact:
            return name == self.exact
        if self.regex:
            return re.search(self.regex, name) is not None  # Go's MatchString: unanchored
        for key, value in self.labels:
            if labels.get(key) != value:
                return False
        for key, op, values in self.expressions:
            have = labels.get(key)
            if op == "In" and have not in values:
                return False
            if op == "NotIn" and have in values:
                return False
            if op == "Exists" and have is None:
                return False
            if op == "DoesNotExist" and have is not None:
                return False
        return True


@dataclass(frozen=True, slots=True)
class HyperNode:
    name: str
    tier: int
    tier_name: str = ""
    nodes: tuple[Selector, ...] = ()
    """Members of type ``Node``."""
    children: tuple[Selector, ...] = ()
    """Members of type ``HyperNode`` (by name)."""


@dataclass(frozen=True, slots=True)
class Level:
    name: str
    """What gangs call it (``leaf``); a label level without a name is called by its label."""
    label: str = ""
    """The node label whose value is the domain ("" for a HyperNode tier)."""
    tier: int = 0
    """The HyperNode tier (0 for a label level)."""
    tier_name: str = ""


@dataclass(frozen=True)
class Topology:
    levels: tuple[Level, ...] = ()
    """Narrowest first."""
    hypernodes: tuple[HyperNode, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.levels)

    def resolve(self, name: str) -> int | None:
        """The index of the level ``name`` names (a level's name, its node label, a
        HyperNode tier name, or a tier number), or None."""
        for i, level in enumerate(self.levels):
            if name in (level.name, level.label, level.tier_name) and name:
                return i
        if name.isascii() and name.isdigit():
            tier = int(name)
            for i, level in enumerate(self.levels):
                if (level.tier or i + 1) == tier:
                    return i
        return None

    def describe(self) -> str:
        return ", ".join(level.name for level in reversed(self.levels)) or "none"


def _expect(value: Any, kind: type, what: str, where: str) -> Any:
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise InputError(f"must be {what}", location=where)
    return value


def _only(raw: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
    for key in raw:
        if key not in known:
            raise InputError(
                f"unknown field (one of {', '.join(known)})", location=f"{where}.{key}"
            )


def parse_topology(raw: Any, where: str) -> Topology:
    """``topology: {levels: [{nodeLabel, name}], hyperNodes: [{name, tier, tierName,
    members}]}`` → :class:`Topology`. Levels are listed broadest first; a configuration
    declares levels by labels or by HyperNodes, not both."""
    if raw is None:
        return Topology()
    _expect(raw, dict, "a mapping with levels or hyperNodes", where)
    _only(raw, ("levels", "hyperNodes"), where)
    levels_raw = raw.get("levels") or []
    hyper_raw = raw.get("hyperNodes") or []
    _expect(levels_raw, list, "a list of {nodeLabel, name}", f"{where}.levels")
    _expect(hyper_raw, list, "a list of HyperNode specs", f"{where}.hyperNodes")
    if levels_raw and hyper_raw:
        raise InputError("declare levels by node labels or by HyperNodes, not both", location=where)
    if hyper_raw:
        return _hypernode_topology(hyper_raw, f"{where}.hyperNodes")
    levels: list[Level] = []
    seen: set[str] = set()
    for i, item in enumerate(levels_raw):
        loc = f"{where}.levels[{i}]"
        _expect(item, dict, "a mapping with nodeLabel", loc)
        _only(item, ("nodeLabel", "name"), loc)
        label = item.get("nodeLabel")
        if not isinstance(label, str) or not label:
            raise InputError("needs a node label key", location=f"{loc}.nodeLabel")
        name = item.get("name", label)
        if not isinstance(name, str) or not name or name.isdigit():
            raise InputError("must be a name (not a number)", location=f"{loc}.name")
        for taken in {label, name}:
            if taken in seen:
                raise InputError(f"names {taken!r} a second time", location=loc)
            seen.add(taken)
        levels.append(Level(name=name, label=label))
    return Topology(levels=tuple(reversed(levels)))


def _selector(raw: Any, where: str, node: bool) -> Selector:
    _expect(raw, dict, "a mapping with exactMatch, regexMatch or labelMatch", where)
    _only(raw, ("exactMatch", "regexMatch", "labelMatch"), where)
    given = [k for k in ("exactMatch", "regexMatch", "labelMatch") if raw.get(k) is not None]
    if len(given) != 1:
        raise InputError("needs exactly one of exactMatch, regexMatch, labelMatch", location=where)
    kind = given[0]
    body = _expect(raw[kind], dict, "a mapping", f"{where}.{kind}")
    loc = f"{where}.{kind}"
    if kind == "exactMatch":
        _only(body, ("name",), loc)
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise InputError("needs a name", location=f"{loc}.name")
        return Selector(exact=name)
    if kind == "regexMatch":
        _only(body, ("pattern",), loc)
        pattern = body.get("pattern")
        if not isinstance(pattern, str) or not pattern:
            raise InputError("needs a pattern", location=f"{loc}.pattern")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise InputError(
                f"not a regular expression: {exc}", location=f"{loc}.pattern"
            ) from None
        return Selector(regex=pattern)
    if not node:
        raise InputError("labelMatch selects nodes only (type: Node)", location=loc)
    _only(body, ("matchLabels", "matchExpressions"), loc)
    labels = _expect(body.get("matchLabels") or {}, dict, "a mapping", f"{loc}.matchLabels")
    for key, value in labels.items():
        _expect(value, str, "a string", f"{loc}.matchLabels.{key}")
    expressions = []
    raw_exprs = _expect(
        body.get("matchExpressions") or [], list, "a list", f"{loc}.matchExpressions"
    )
    for j, expr in enumerate(raw_exprs):
        eloc = f"{loc}.matchExpressions[{j}]"
        _expect(expr, dict, "a mapping with key, operator, values", eloc)
        _only(expr, ("key", "operator", "values"), eloc)
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if not isinstance(key, str) or not key:
            raise InputError("needs a label key", location=f"{eloc}.key")
        if op not in _OPERATORS:
            raise InputError(f"must be one of {', '.join(_OPERATORS)}", location=f"{eloc}.operator")
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise InputError("must be a list of strings", location=f"{eloc}.values")
        if (op in ("In", "NotIn")) != bool(values):
            raise InputError(
                f"{op} {'needs' if op in ('In', 'NotIn') else 'takes no'} values", location=eloc
            )
        expressions.append((key, str(op), tuple(values)))
    if not labels and not expressions:
        raise InputError("an empty label selector would select every node", location=loc)
    return Selector(labels=tuple(sorted(labels.items())), expressions=tuple(expressions))


def _hypernode_topology(items: list[Any], where: str) -> Topology:
    hypernodes: list[HyperNode] = []
    names: set[str] = set()
    tier_names: dict[int, str] = {}
    for i, item in enumerate(items):
        loc = f"{where}[{i}]"
        _expect(item, dict, "a HyperNode spec with name, tier and members", loc)
        _only(item, ("name", "tier", "tierName", "members"), loc)
        name = item.get("name")
        if not isinstance(name, str) or not name or name in names:
            raise InputError(f"needs a unique name, got {name!r}", location=f"{loc}.name")
        names.add(name)
        tier = item.get("tier")
        if isinstance(tier, str) and tier.isascii() and tier.isdigit():
            tier = int(tier)  # Volcano's first HyperNode API had tier as a string
        if not isinstance(tier, int) or isinstance(tier, bool) or not 1 <= tier <= 64:
            raise InputError(f"must be a tier from 1 to 64, got {tier!r}", location=f"{loc}.tier")
        tier_name = item.get("tierName", "")
        if not isinstance(tier_name, str) or tier_name.isdigit():
            raise InputError("must be a name (not a number)", location=f"{loc}.tierName")
        if tier_name and tier_names.setdefault(tier, tier_name) != tier_name:
            raise InputError(
                f"tier {tier} is already named {tier_names[tier]!r}", location=f"{loc}.tierName"
            )
        members = _expect(item.get("members") or [], list, "a list of members", f"{loc}.members")
        if not members:
            raise InputError("needs at least one member", location=f"{loc}.members")
        nodes: list[Selector] = []
        children: list[Selector] = []
        for j, member in enumerate(members):
            mloc = f"{loc}.members[{j}]"
            _expect(member, dict, "a mapping with type and selector", mloc)
            _only(member, ("type", "selector"), mloc)
            kind = member.get("type")
            if kind not in ("Node", "HyperNode"):
                raise InputError("must be Node or HyperNode", location=f"{mloc}.type")
            selector = _selector(member.get("selector"), f"{mloc}.selector", kind == "Node")
            (nodes if kind == "Node" else children).append(selector)
        hypernodes.append(HyperNode(name, tier, tier_name, tuple(nodes), tuple(children)))
    tiers = sorted({h.tier for h in hypernodes})
    levels = tuple(
        Level(name=tier_names.get(t) or f"tier-{t}", tier=t, tier_name=tier_names.get(t, ""))
        for t in tiers
    )
    return Topology(levels=levels, hypernodes=tuple(hypernodes))


@dataclass
class _Codes:
    per_level: list[Ints]
    names: list[list[str]]


@dataclass
class DomainIndex:
    """Per level, each slot's domain code (``NO_DOMAIN``: none) and the domains' names;
    kept until the node set or a node's labels change."""

    topology: Topology
    _key: tuple[int, int] | None = None
    _state: ClusterState | None = None
    """The state the codes are of (held, so that another state is never mistaken for it)."""
    _codes: _Codes = field(default_factory=lambda: _Codes([], []))

    def __repr__(self) -> str:
        return f"DomainIndex(levels={self.topology.describe()!r})"

    def codes(self, state: ClusterState, level: int) -> Ints:
        return self._refresh(state).per_level[level]

    def names(self, state: ClusterState, level: int) -> list[str]:
        return self._refresh(state).names[level]

    def _refresh(self, state: ClusterState) -> _Codes:
        key = (state.static_version, state.capacity)
        if state is self._state and key == self._key:
            return self._codes
        levels = self.topology.levels
        per_level: list[Ints] = []
        names: list[list[str]] = []
        for level in levels:
            if level.label:
                # the state's own label column: values coded in order of first appearance
                column = state.label_columns.get(level.label)
                values = state.label_values.get(level.label, {})
                codes = np.full(state.capacity, NO_DOMAIN, dtype=np.int64)
                if column is not None:
                    present = state.valid & (column != ABSENT)
                    codes[present] = column[present]
                per_level.append(codes)
                names.append(sorted(values, key=values.__getitem__))
            else:
                per_level.append(np.full(state.capacity, NO_DOMAIN, dtype=np.int64))
                names.append([])
        if self.topology.hypernodes:
            self._hypernode_codes(state, per_level, names)
        self._codes, self._key, self._state = _Codes(per_level, names), key, state
        return self._codes

    def _hypernode_codes(
        self, state: ClusterState, per_level: list[Ints], names: list[list[str]]
    ) -> None:
        """Fill the HyperNode tiers' codes: each node's HyperNode per tier."""
        ancestors = self._ancestors()
        codes: list[dict[str, int]] = [{} for _ in self.topology.levels]
        for slot in range(state.high_water):
            node = state.names[slot]
            if node is None or not state.valid[slot]:
                continue
            found = self._hypernodes_of(node, state.node_labels[slot], ancestors)
            for i, level in enumerate(self.topology.levels):
                domain = found.get(level.tier) if not level.label else None
                if domain is None:
                    continue
                code = codes[i].get(domain)
                if code is None:
                    code = codes[i][domain] = len(names[i])
                    names[i].append(domain)
                per_level[i][slot] = code

    def _ancestors(self) -> dict[str, list[HyperNode]]:
        """HyperNode name → itself and every HyperNode that contains it, nearest first."""
        hypernodes = self.topology.hypernodes
        parents: dict[str, list[HyperNode]] = {h.name: [] for h in hypernodes}
        for parent in hypernodes:
            for child in hypernodes:
                if child is not parent and any(s.matches(child.name, {}) for s in parent.children):
                    parents[child.name].append(parent)
        out: dict[str, list[HyperNode]] = {}
        by_name = {h.name: h for h in hypernodes}
        for name in sorted(parents):
            seen: dict[str, HyperNode] = {name: by_name[name]}
            frontier = [name]
            while frontier:
                nxt = []
                for current in frontier:
                    for parent in sorted(parents[current], key=lambda h: h.name):
                        if parent.name not in seen:
                            seen[parent.name] = parent
                            nxt.append(parent.name)
                frontier = nxt
            out[name] = list(seen.values())
        return out

    def _hypernodes_of(
        self, node: str, labels: Mapping[str, str], ancestors: dict[str, list[HyperNode]]
    ) -> dict[int, str]:
        """Tier → the HyperNode of that tier that holds ``node`` (the first by name)."""
        out: dict[int, str] = {}
        for h in sorted(self.topology.hypernodes, key=lambda h: h.name):
            if any(s.matches(node, labels) for s in h.nodes):
                for holder in ancestors[h.name]:
                    if holder.tier not in out or holder.name < out[holder.tier]:
                        out[holder.tier] = holder.name
        return out
