"""A scheduling pass, step by step, above the data layer (``engine.model``): settle
what waits, attempt pods (``pods``) and gangs (``gangs``), hold and release reservation
parts (``reservations``), and hand decisions to a :class:`~engine.passes.dispatch.Dispatch`
(the engine's own nodes, or the coordinator's view of every shard)."""
