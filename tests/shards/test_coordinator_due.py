"""When the coordinator must act next, and what times out, read through the heaps of
what is under way (:mod:`shards.coordinator.due`), are what a pass over every
preparing claim and every nomination gives, whatever claims and nominations were made,
advanced, ended, forgotten or restored, and however time moved."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from events.types import SECOND
from shards.coordinator.coordinator import Coordinator
from shards.coordinator.flights import ABORTING, COMMITTED, PREPARING, Claim
from shards.coordinator.ledger import ISSUE_ALLOWANCE
from tests.shards.coordinator_kit import pinned

STEPS = st.lists(st.tuples(st.integers(0, 8), st.integers(0, 40)), max_size=60)
"""(what: claim, commit, abort, forget, restore, nominate, a victim gone, time passes,
time-outs; which one, or how long)."""


def naive_wakeup(c: Coordinator) -> int | None:
    """:meth:`Coordinator.next_wakeup` as a pass over everything (no flights here)."""
    timeout = c.reservation_timeout
    times = [x.since + timeout for x in c.claims.values() if x.stage == PREPARING]
    times += [since + timeout for since, _ in c.nominated.values()]
    wakeups = [t for t in times if t > c.now]
    view = c.engine.next_wakeup()
    if view is not None:
        wakeups.append(view)
    return min(wakeups) if wakeups else None


@settings(max_examples=80, deadline=None)
@given(STEPS)
def test_wakeups_and_timeouts_through_the_heaps_are_the_pass_over_everything(
    steps: list[tuple[int, int]],
) -> None:
    c = Coordinator(pinned(2))
    tick = c.reservation_timeout // 8
    made = 0
    for what, which in steps:
        claims = list(c.claims.values())
        claim = claims[which % len(claims)] if claims else None
        units = list(c.nominated)
        unit = units[which % len(units)] if units else None
        if what == 0 or (what in (1, 2, 3) and claim is None):
            c.claim(Claim(f"r{made}", f"u{made}", {0: (f"p{made}",)}, c.now, directed=True))
            made += 1
        elif what == 1 and claim is not None and claim.stage == PREPARING:
            claim.advance(COMMITTED)
        elif what == 2 and claim is not None:
            claim.advance(ABORTING)
        elif what == 3 and claim is not None:
            c._forget_claim(claim)
        elif what == 4:
            c.claims = dict(c.claims)  # (as a restore makes them)
            c.nominated = dict(c.nominated)
        elif what == 5 or (what == 6 and unit is None):
            c.nominate(f"n{made}", [f"v{made}"], (made % 2,))
            made += 1
        elif what == 6 and unit is not None:
            for victim in list(c.nominated[unit][1]):
                c._victim_gone(victim)
        elif what == 7:
            c.now += tick * (which % 10)
        elif what == 8:
            c._timeouts()
            timeout = c.reservation_timeout
            stale = [x for x in c.claims.values() if x.stage == PREPARING]
            assert all(x.since + timeout > c.now for x in stale)
            assert all(since + timeout > c.now for since, _ in c.nominated.values())
        assert c.next_wakeup() == naive_wakeup(c)


def test_requests_issued_late_in_a_pass_are_timed_from_when_they_were_issued() -> None:
    """The view's time stands still while a pass runs, and a pass that issues thousands
    of requests (a wave's placements, made in one pass) sends the last of them long
    after it, to shards that take them on one after another: each request a pass
    issues to a shard is timed out ``ISSUE_ALLOWANCE`` later than the one before it to
    that shard (a request to several: the latest), and the next pass counts from its
    own time again. Without it, every claim but the first few would time out here,
    answered or not."""
    c = Coordinator(pinned(2))
    c.now = 10 * SECOND
    c.schedule()  # (a pass: nothing to do, nothing issued yet)
    start = c.now
    sinces = [c.issue((k % 2,)) for k in range(1000)]
    assert sinces == [start + (k // 2) * ISSUE_ALLOWANCE for k in range(1000)]
    assert c.issue((0, 1)) == start + 500 * ISSUE_ALLOWANCE  # (each shard had 500)
    assert c.issue((1,)) == start + 501 * ISSUE_ALLOWANCE
    for k, since in enumerate(sinces):
        c.claim(Claim(f"r{k}", f"u{k}", {k % 2: (f"p{k}",)}, since, directed=True))
    c.now = start + c.reservation_timeout + 249 * ISSUE_ALLOWANCE
    c._timeouts()
    timed_out = [x.rid for x in c.claims.values() if x.stage != PREPARING]
    assert timed_out == [f"r{k}" for k in range(500)]
    c.schedule()  # the next pass issues from its own time
    assert c.issue((1,)) == c.now
    c.nominate("n", ["v"], (0, 1))
    assert c.nominated["n"][0] == c.now + ISSUE_ALLOWANCE


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from([1, 2, 4]),
    st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=3), min_size=1, max_size=300),
    st.integers(0, 400),
)
def test_each_request_is_timed_after_those_sent_its_shards_before_it(
    shards: int, requests: list[list[int]], waited: int
) -> None:
    """At 1, 2 and 4 shards, whatever the parts of the requests a pass sends: a request
    is timed from the pass's time plus the allowance for the most requests the pass
    sent before it to any of its shards, and a claim times out exactly when that time
    plus the reservation time-out has passed."""
    c = Coordinator(pinned(shards))
    c.now = 5 * SECOND
    c.schedule()
    start = c.now
    sent = [0] * shards
    for k, drawn in enumerate(requests):
        parts = sorted({p % shards for p in drawn})
        expected = start + max(sent[s] for s in parts) * ISSUE_ALLOWANCE
        for s in parts:
            sent[s] += 1
        since = c.issue(parts)
        assert since == expected
        c.claim(Claim(f"r{k}", f"u{k}", {s: (f"p{k}-{s}",) for s in parts}, since, directed=True))
    c.now = start + c.reservation_timeout + waited * ISSUE_ALLOWANCE
    c._timeouts()
    timeout = c.reservation_timeout
    for claim in c.claims.values():
        assert (claim.stage == PREPARING) == (claim.since + timeout > c.now)
