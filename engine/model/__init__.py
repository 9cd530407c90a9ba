"""The engine's data layer: what a shard knows (cluster columns, pods, queue, quotas,
groups, reservations) and the operations that keep it consistent. No decisions here:
the fold (``engine.fold``) and the pass steps (``engine.passes``) sit above it."""
