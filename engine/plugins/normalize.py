"""Score normalisation helpers, as in kube-scheduler's ``helper.DefaultNormalizeScore``."""

from __future__ import annotations

import numpy as np

from engine.model.state import Bools, Ints

MAX_NODE_SCORE = 100


def default_normalize(scores: Ints | int, feasible: Bools, *, reverse: bool = False) -> Ints | int:
    """Scale feasible scores to 0..100 by their maximum; ``reverse`` flips them.

    With a maximum of 0, every score is 0 (or 100 when reversed). A plain int (the same
    score on every node) stays a plain int.
    """
    if isinstance(scores, int):
        top = scores
    else:
        top = int(np.max(scores, where=feasible, initial=0)) if scores.any() else 0
    if top == 0:
        return MAX_NODE_SCORE if reverse else 0
    if isinstance(scores, int):
        return 0 if reverse else MAX_NODE_SCORE
    out: Ints = MAX_NODE_SCORE * scores // top
    return MAX_NODE_SCORE - out if reverse else out
