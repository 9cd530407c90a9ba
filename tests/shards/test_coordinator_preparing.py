"""The claims the coordinator reads at each pass and wake-up as still preparing
(``Ledger.preparing``, kept aside so as not to read every claim) are those of its
claims whose stage is preparing, in the same order, whatever claims were made,
advanced, forgotten, or restored (a new ``claims``)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shards.coordinator.coordinator import Coordinator
from shards.coordinator.flights import ABORTING, COMMITTED, Claim
from tests.shards.coordinator_kit import pinned

STEPS = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 30)), max_size=60)
"""(what: make, commit, abort, forget, restore; which claim)."""


@settings(max_examples=60, deadline=None)
@given(STEPS)
def test_the_claims_kept_as_preparing_are_the_claims_preparing(
    steps: list[tuple[int, int]],
) -> None:
    coordinator = Coordinator(pinned(2))
    made = 0
    for what, which in steps:
        claims = list(coordinator.claims.values())
        claim = claims[which % len(claims)] if claims else None
        if what == 0 or claim is None:
            coordinator.claim(Claim(f"r{made}", f"u{made}", {0: (f"p{made}",)}, 0, directed=True))
            made += 1
        elif what == 1 and claim.stage != ABORTING:
            claim.advance(COMMITTED)
        elif what == 2:
            claim.advance(ABORTING)
        elif what == 3:
            coordinator._forget_claim(claim)
        elif what == 4:
            coordinator.claims = dict(coordinator.claims)  # (as a restore makes it)
        expected = [c for c in coordinator.claims.values() if c.stage.value == "preparing"]
        assert coordinator.preparing() == expected
