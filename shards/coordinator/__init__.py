"""The coordinator of several shards: a fold of the control partition that decides on
its view of every shard with the engine's own rules (``coordinator``, ``dispatch``),
hands each shard what it certainly places as one scheduler would (``handover``,
``batches``), and runs the two-phase reservations of gangs across shards
(``flights``); pools and routing (``routing``, ``choice``) and its snapshots
(``snapshot``) beside it."""
