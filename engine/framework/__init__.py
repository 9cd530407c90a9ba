"""The plugin framework, after kube-scheduler's scheduling framework.

One Protocol per extension point (``interfaces``), a ``Status`` result (``status``),
per-attempt ``CycleState`` (``cycle``), an explicit registry (``registry``) and the
runtime that runs a profile's plugins over all nodes at once (``runtime``).
"""
