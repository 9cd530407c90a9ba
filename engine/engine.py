"""The engine of one shard: a pure fold of events plus scheduling passes.

``apply(envelope)`` folds any event (inputs and decisions alike; decisions are applied
idempotently, so replaying its own output changes nothing). ``schedule()`` runs one pass
at the time of the latest event (:mod:`engine.passes`): it settles what waits (groups
short of members, dependencies, timeouts), drains the queue, and returns the decisions
as events for the caller to append. No clock, no I/O, no randomness: the same events
give the same decisions.

Layers, each importing only those below it: the data layer (:mod:`engine.model`: what a
shard knows), the framework and its plugins (:mod:`engine.framework`,
:mod:`engine.plugins`), the fold (:mod:`engine.fold`), the pass steps
(:mod:`engine.passes`), and this facade, which ties a configuration's profiles to the
data and runs the fold and the passes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from engine.config import SchedulerConfig, default_config, parse_config
from engine.fold import HANDLERS
from engine.framework.profiles import Profiles
from engine.framework.registry import Registry
from engine.framework.runtime import Framework
from engine.model.bulk import submit_all
from engine.model.pods import PodInfo
from engine.model.pools import Pools, Sharding
from engine.model.reservations import HELD, STAGING
from engine.model.shard import ShardModel
from engine.passes.dispatch import Dispatch, Local
from engine.passes.explain import Explanation
from engine.passes.run import SchedulingPass
from engine.plugins.registry import builtin_registry
from engine.refusals import CHECKED, MAX_TIME, refusal, refused
from events.errors import InputError
from events.types import (
    SECOND,
    Envelope,
    Event,
    PodRouted,
    PodSpec,
    PodSubmitted,
    SchedulerConfigured,
    ShardingConfigured,
)


class Engine(ShardModel):
    """Scheduling state and logic of one shard (or of the coordinator's view of all)."""

    def __init__(
        self,
        config: SchedulerConfig | None = None,
        *,
        shard: int = 0,
        registry: Registry | None = None,
        dispatch: Dispatch | None = None,
    ) -> None:
        config = config or default_config()
        super().__init__(
            shard=shard,
            initial_backoff_seconds=config.initial_backoff_seconds,
            max_backoff_seconds=config.max_backoff_seconds,
            retention_seconds=config.retention_seconds,
        )
        self.config = config
        self.queue.group_backoff = config.group_backoff_seconds * SECOND
        self._registry = registry or builtin_registry()
        self.profiles = Profiles(config, self._registry, self)
        self.hints = self.profiles
        self.dispatch: Dispatch = dispatch or Local()
        self.explain: str | None = None
        self.explanations: list[Explanation] = []
        self.unfolded: list[tuple[int, str]] = []
        """Records the fold skipped (:mod:`engine.refusals`), as (offset, reason), until
        the component that runs the engine takes them (and records them in the log)."""

    def __repr__(self) -> str:
        return f"Engine(shard={self.shard}, now={self.now}, {self.state!r}, {self.queue!r})"

    def stats(self) -> dict[str, int]:
        return {
            **self.counters,
            **self.queue.stats(),
            **self.state.stats(),
            "groups": len(self.groups),
            "finished_kept": len(self.outcomes),
            "deadlines": len(self.deadlines),
        }

    @property
    def registry(self) -> Registry:
        """The plugins this engine's profiles are built from (a copy of the engine,
        :func:`engine.snapshot.restore`, needs the same)."""
        return self._registry

    def framework_for(self, pod: PodInfo) -> Framework | None:
        return self.profiles.framework_for(pod)

    # ------------------------------------------------------------------ fold

    def apply(self, envelope: Envelope, *, checked: bool = False) -> None:
        """Fold one event. Idempotent for decisions and duplicate submissions. A record
        no column can hold (:func:`engine.refusals.refusal`) changes nothing, not even
        the time; it is added to ``unfolded``. So is a recorded configuration that
        cannot be run here (:meth:`unrunnable`). ``checked``: the caller has found
        :func:`engine.refusals.refused` None for it already (the coordinator, which
        checks every control record before it forwards it)."""
        event = envelope.event
        if (
            not checked
            and (type(event) in CHECKED or not 0 <= envelope.time <= MAX_TIME)
            and (reason := refused(envelope))
        ):
            self.unfolded.append((envelope.offset, reason))
            return
        if type(event) is SchedulerConfigured and (reason := self.unrunnable(event)):
            self.unfolded.append((envelope.offset, reason))
            return
        self.counters["events"] += 1
        if envelope.time > self.now:
            self.now = envelope.time
            if self.retired.order:
                self.forget_finished()  # in the fold: replay folds every record too
        if envelope.causation > self.seen and envelope.producer == "router":
            self.seen = envelope.causation
        self.apply_decision(envelope.event)

    def apply_submitted(self, envelopes: Sequence[Envelope]) -> None:
        """:meth:`apply` (``checked``) for each of ``envelopes``, records the caller has
        checked already and none later than ``now``: the submissions of pods among them
        folded in bulk (:func:`engine.model.bulk.submit_all`, the state the one-by-one
        fold leaves), any other record one by one, in its place."""
        specs: list[PodSpec] = []
        now = self.now
        fenced = self.pools.fenced if self.pools.exclusive else None
        for envelope in envelopes:
            event = envelope.event
            if (
                type(event) is PodSubmitted
                and envelope.time <= now
                and envelope.producer != "router"
                and not self.next_runs
            ):
                specs.append(event.pod if fenced is None else fenced(event.pod))
                continue
            if specs:
                self.counters["events"] += len(specs)
                submit_all(self, specs)
                specs = []
            self.apply(envelope, checked=True)
            now = self.now
            fenced = self.pools.fenced if self.pools.exclusive else None
        if specs:
            self.counters["events"] += len(specs)
            submit_all(self, specs)

    def apply_handed(self, envelopes: Sequence[Envelope]) -> None:
        """:meth:`apply` for each of ``envelopes`` (a shard's new records), in order, the
        pods the coordinator hands over in a row (``PodRouted``, new here, no later than
        ``now``) folded in bulk: each is noted as handed over with its decision, and
        they are submitted together (:func:`engine.model.bulk.submit_all`), the state
        the one-by-one fold leaves. What a shard process saves per pod handed over is
        the derivation of its facts (once per template, not per pod).

        Exact because nothing the one-by-one fold does for a hand-over reads what the
        others change: its checks (the pod's quantities, its time, whether it is new
        here) are made per record, as :meth:`apply` makes them; a pod told twice, or
        one named like a pod that finished, goes through :meth:`apply` in its place."""
        specs: list[PodSpec] = []
        taking: set[str] = set()
        pods = self.pods
        outcomes = self.outcomes
        for envelope in envelopes:
            event = envelope.event
            if (
                type(event) is PodRouted
                and 0 <= envelope.time <= self.now
                and not self.next_runs
                and (key := event.pod.key) not in pods
                and key not in outcomes
                and key not in taking
                and refusal(event) is None
            ):
                self.counters["events"] += 1
                if envelope.causation > self.seen and envelope.producer == "router":
                    self.seen = envelope.causation
                self.delegate(event)
                specs.append(event.pod)
                taking.add(key)
                continue
            if specs:
                submit_all(self, specs)
                specs = []
                taking.clear()
            self.apply(envelope)
        if specs:
            submit_all(self, specs)

    def apply_decision(self, event: Event) -> None:
        """Fold a decision the current pass has just made (as its replay will)."""
        handler = HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)
            if self.next_runs:
                self.start_next_runs()
        elif isinstance(event, SchedulerConfigured):
            self.configured(event)
        elif isinstance(event, ShardingConfigured):
            self.sharded(event)

    def unrunnable(self, event: SchedulerConfigured) -> str | None:
        """Why the configuration ``event`` records cannot be run with this engine's
        registry (it or its list of plugins used names a plugin the registry lacks, or
        it gives one arguments it refuses), or None. Such a record is refused like one
        no column can hold: the component that runs the engine quarantines it, and
        replay, whose registry holds the plugins of the configurations the run did not
        quarantine, refuses it too."""
        for used in event.plugins:
            if used.name not in self._registry:
                return f"recorded configuration names plugin {used.name!r}, which is not loaded"
        if not event.config:
            return None
        try:
            config = parse_config(json.loads(event.config), "recorded configuration")
        except (ValueError, InputError):
            return None  # skipped by ``configured`` (replay reports it)
        if config == self.config:
            return None
        try:
            Profiles(config, self._registry, self)
        except InputError as exc:
            return f"recorded configuration cannot be run: {exc}"
        return None

    def configured(self, event: SchedulerConfigured) -> None:
        """A configuration recorded in the log (a service restarted with a new one):
        profiles and back-off follow it; the cluster state stays. One naming a plugin
        the registry lacks raises an :class:`InputError` naming it (the component that
        runs the engine loads the plugins the log's configurations name); :meth:`apply`
        refuses such a record before it gets here."""
        if not event.config:
            config = default_config()
        else:
            try:
                config = parse_config(json.loads(event.config), "recorded configuration")
            except (ValueError, InputError):
                return  # replay reports it (``recorded_config``); the fold keeps going
        if config == self.config:
            return
        self.config = config
        self.profiles = self.hints = Profiles(config, self._registry, self)
        self.queue.initial_backoff = config.initial_backoff_seconds * SECOND
        self.queue.max_backoff = config.max_backoff_seconds * SECOND
        self.queue.group_backoff = config.group_backoff_seconds * SECOND
        self.retired.window = config.retention_seconds * SECOND

    def sharded(self, event: ShardingConfigured) -> None:
        """The pool rules and tenants of the run: they hold on every shard, one
        included (nodes are labelled with their pool, pods fenced to their pools)."""
        try:
            sharding = Sharding.from_json(event.config)
        except (ValueError, KeyError, TypeError):
            return  # replay reports it (``sharding_of``); the fold keeps going
        self.pools = Pools.of(sharding)

    # ------------------------------------------------------------------ decide

    def next_wakeup(self) -> int | None:
        """Simulated time at which a pass would do something new without new events."""
        times = [t for t in (self.queue.next_wakeup(),) if t is not None]
        for res in self.reservations.values():
            if res.state in (STAGING, HELD):
                times.append(max(res.expires_at, self.now))
        deadline = self.next_deadline()
        if deadline is not None:
            times.append(deadline)
        expiry = self.next_hold_expiry()
        if expiry is not None:
            times.append(max(expiry, self.now))
        return min(times) if times else None

    def schedule(self) -> list[Event]:
        """Run one pass at ``self.now``; return the decisions (already applied)."""
        return SchedulingPass(
            self, self.profiles, self.dispatch, self.explain, self.explanations
        ).run()
