"""Bounds on what a scenario or configuration may state, and values shown in messages.

Every number read from a scenario ends in a 64-bit place: a numpy ``int64`` column of
the engine's cluster state, a msgpack integer in the log, a JSON number in ``--json``.
A value that passed validation but could not be stored would fail far from its
document, so each is bounded where it enters, and so are the sums that reach a column:

- **Quantities** (canonical integers: millicores, bytes, units): each at most
  :data:`MAX_QUANTITY` = 2**54 (about 1.8e16: 16 PiB of memory, 18 billion cores in
  millicores), and so is a pod's total request and the sum of each resource over all
  the nodes of a scenario. The engine's scorers multiply a column by 100
  (``MAX_NODE_SCORE``) and the coordinator sums a shard's nodes into one: the largest
  product is ``(used + pods * 200Mi + request) * 100`` (used within allocatable; a pod
  without requests counted as 100m and 200Mi), at most ``(2 * 2**54 + 2**24 * 2**28) *
  100 = 900 * 2**52``, below ``2**62``: half of what ``int64`` holds.
- **Objects**: at most :data:`MAX_OBJECTS` = 2**24 per scenario (the ``pods`` term
  above: pods without a memory request count 200Mi each).
- **Times** (``shoal.io/arrive-at``, ``shoal.io/runtime``, time-outs, back-offs): each
  at most :data:`~engine.config.MAX_SECONDS` = 10**8 s (about 3 years), and the latest
  arrival plus every runtime of the scenario at most :data:`MAX_SCENARIO_NANOSECONDS`
  = 2**62 ns (about 146 years): the simulated clock reaches no further than that through
  arrivals and completions, which leaves the other half of ``int64`` nanoseconds to
  back-offs and time-outs.
- **Priorities**: Kubernetes' ``int32`` (``spec.priority``, ``PriorityClass.value``;
  user classes at most 10**9 as the API server requires); ``minMember`` and
  ``min-available`` 1 to 2**31 - 1 (``int32`` in every pod-group convention).
- **Label values** at most 63 characters (Kubernetes' rule): ``Gt``/``Lt`` compare
  them as numbers, which must fit a float.

Values in error messages are shown by :func:`shown`: a ``repr`` cut to about
:data:`SHOWN_CHARS` characters, however large or deeply shared the value is.
"""

from __future__ import annotations

import reprlib
from typing import Any, Final

from engine.config import MAX_SECONDS
from engine.refusals import MAX_QUANTITY
from events.types import SECOND

__all__ = [
    "MAX_LABEL_VALUE",
    "MAX_MIN_MEMBER",
    "MAX_OBJECTS",
    "MAX_PRIORITY",
    "MAX_QUANTITY",
    "MAX_SCENARIO_NANOSECONDS",
    "MAX_SECONDS",
    "MAX_USER_PRIORITY",
    "MIN_PRIORITY",
    "SHOWN_CHARS",
    "cut",
    "shown",
]

# The largest canonical quantity, and the largest sum of a resource over all nodes: the
# engine refuses a record beyond it as no input could have made it (engine/refusals.py).
MAX_OBJECTS: Final = 2**24
"""The most objects (nodes, pods, groups, quotas...) one scenario may hold."""
MAX_SCENARIO_NANOSECONDS: Final = 2**62
"""The latest arrival plus all runtimes of a scenario, in nanoseconds."""
MIN_PRIORITY: Final = -(2**31)
MAX_PRIORITY: Final = 2**31 - 1
MAX_USER_PRIORITY: Final = 1_000_000_000
"""The API server's limit for user-defined priority classes."""
MAX_MIN_MEMBER: Final = 2**31 - 1
MAX_LABEL_VALUE: Final = 63
SHOWN_CHARS: Final = 200
"""About how many characters of a value an error message shows."""
MAX_MESSAGE_CHARS: Final = 600
"""The most characters of a message, and of a location, in one error line."""

assert MAX_SECONDS * SECOND * 4 <= MAX_SCENARIO_NANOSECONDS  # a fixed fact, checked once


class _Short(reprlib.Repr):
    """``reprlib`` with room for a useful value, that never walks a large one."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = 6
        self.maxdict = 6
        self.maxstring = SHOWN_CHARS
        self.maxother = SHOWN_CHARS
        self.maxlong = 40

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 128:  # repr() of a huge int is slow, or refused
            return f"<an integer of {x.bit_length()} bits>"
        return super().repr_int(x, level)


_SHORT: Final = _Short()


def shown(value: Any) -> str:
    """``repr(value)`` cut to about :data:`SHOWN_CHARS` characters, on one line."""
    try:
        text = _SHORT.repr(value)
    except Exception:  # a value that cannot be shown is named by its type
        text = f"<{type(value).__name__}>"
    return cut(text, SHOWN_CHARS + 10)


def cut(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` on one line (control characters escaped) and at most about ``limit``
    characters: the middle is replaced by an ellipsis."""
    if len(text) > limit:
        head = limit * 2 // 3
        text = f"{text[:head]}…{text[len(text) - (limit - head - 1) :]}"
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text
