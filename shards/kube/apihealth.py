"""What the Kubernetes API server last did for this process: for ``/readyz`` and the log.

The Lease loops (``shards.kube.lease``) report each round here: the server answered
usefully (:meth:`ApiHealth.ok`), or a failure of some kind (:meth:`ApiHealth.failed`:
unreachable, the Lease's namespace missing, forbidden, another status). A process is
fit to serve while no loop is failing and the server answered within the last
``within`` seconds (:meth:`ApiHealth.problem`).

Logging, so that a failure that repeats every few seconds is one line, not one per
retry: a kind of failure is logged once, at ERROR with its cause and what to do, when
the first loop meets it; once no loop has it any more, ``recovered`` is logged once at
INFO. The same kind met again after that is logged again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class ApiHealth:
    """Failures by source (a Lease's name), the kinds logged and not yet recovered, and
    when the server last answered. Reporting costs a dictionary update; nothing here
    does I/O but the log."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.answered_at: float | None = None
        """When the server last answered anything at all (an error status included)."""
        self.failures: dict[str, tuple[str, str]] = {}
        """Source → (kind, message) of its last round, while that round failed."""
        self.logged: dict[str, str] = {}
        """Kinds logged at ERROR and not yet recovered → the message logged."""

    def __repr__(self) -> str:
        return f"ApiHealth(failing={sorted(self.failures)}, logged={sorted(self.logged)})"

    def stats(self) -> dict[str, object]:
        return {
            "answered_at": self.answered_at,
            "failures": dict(self.failures),
            "logged": sorted(self.logged),
        }

    def ok(self, source: str) -> None:
        """``source``'s round got a usable answer (whatever it meant for leadership)."""
        self.answered_at = self.clock()
        self.failures.pop(source, None)
        self._recovered()

    def failed(self, source: str, kind: str, message: str, *, answered: bool) -> None:
        """``source``'s round failed; ``answered``: the server did answer (a status)."""
        if answered:
            self.answered_at = self.clock()
        self.failures[source] = (kind, message)
        if kind not in self.logged:
            self.logged[kind] = message
            log.error("%s kind=%s", message, kind)
        self._recovered()

    def problem(self, within: float) -> str | None:
        """Why this process cannot count on the API server now, or None: a failing
        source (the first by name), no answer yet, or none for over ``within`` s."""
        if self.failures:
            _, message = self.failures[min(self.failures)]
            return message
        if self.answered_at is None:
            return "the API server has not answered yet"
        if self.clock() - self.answered_at > within:
            return f"the API server has not answered for over {within:g}s"
        return None

    def _recovered(self) -> None:
        held = {kind for kind, _ in self.failures.values()}
        for kind in sorted(set(self.logged) - held):
            del self.logged[kind]
            log.info("recovered kind=%s", kind)
