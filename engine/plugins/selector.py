"""Vectorised node-selector matching: labels as integer codes, one comparison per term.

Semantics follow Kubernetes' ``nodeaffinity`` helpers: terms are ORed, requirements in a
term ANDed; an empty term matches nothing; ``NotIn`` and ``DoesNotExist`` match nodes
without the label; ``Gt``/``Lt`` compare integer label values (a node whose value is not
an integer does not match).
"""

from __future__ import annotations

import numpy as np

from engine.model.state import Bools, ClusterState
from events.types import NodeSelectorRequirement, NodeSelectorTerm


def match_labels(state: ClusterState, selector: dict[str, str]) -> Bools:
    """Nodes whose labels contain every ``key=value`` of ``selector``."""
    mask = state.valid.copy()
    for key, value in selector.items():
        code = state.label_code(key, value)
        if code is None:
            return np.zeros(state.capacity, dtype=np.bool_)
        mask &= state.label_columns[key] == code
    return mask


def match_requirement(state: ClusterState, req: NodeSelectorRequirement) -> Bools:
    col = state.label_columns.get(req.key)
    op = req.operator
    if op in ("In", "NotIn"):
        if col is None:
            hit = np.zeros(state.capacity, dtype=np.bool_)
        else:
            codes = [c for v in req.values if (c := state.label_code(req.key, v)) is not None]
            hit = np.isin(col, codes) if codes else np.zeros(state.capacity, dtype=np.bool_)
        return hit if op == "In" else np.logical_not(hit)
    if op in ("Exists", "DoesNotExist"):
        present = col >= 0 if col is not None else np.zeros(state.capacity, dtype=np.bool_)
        return present if op == "Exists" else np.logical_not(present)
    if op in ("Gt", "Lt"):
        bound = int(req.values[0])
        numbers = state.label_numeric(req.key)
        with np.errstate(invalid="ignore"):
            return numbers > bound if op == "Gt" else numbers < bound
    raise ValueError(f"unknown node selector operator {op!r}")  # validated at ingest


def match_field(state: ClusterState, req: NodeSelectorRequirement) -> Bools:
    """``matchFields``: only ``metadata.name`` with In/NotIn exists in Kubernetes."""
    hit = np.zeros(state.capacity, dtype=np.bool_)
    for value in req.values:
        slot = state.index.get(value)
        if slot is not None:
            hit[slot] = True
    return hit if req.operator == "In" else np.logical_not(hit)


def match_term(state: ClusterState, term: NodeSelectorTerm) -> Bools:
    if not term.match_expressions and not term.match_fields:
        return np.zeros(state.capacity, dtype=np.bool_)
    mask = state.valid.copy()
    for req in term.match_expressions:
        mask &= match_requirement(state, req)
    for req in term.match_fields:
        mask &= match_field(state, req)
    return mask


def match_terms(state: ClusterState, terms: tuple[NodeSelectorTerm, ...]) -> Bools:
    mask = np.zeros(state.capacity, dtype=np.bool_)
    for term in terms:
        mask |= match_term(state, term)
    return mask
