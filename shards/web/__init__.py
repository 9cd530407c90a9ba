"""The live view: a read-only web page of a run's nodes, GPU cards, queue, gangs,
quotas and decisions (``shoal serve``, ``shoal replay LOG --serve``)."""
