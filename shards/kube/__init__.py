"""The Kubernetes adapter: ingest (list and watch → events), binder (decisions → the
Binding and Eviction APIs, Events, PodGroup status) and leader election (Leases).

Everything here is I/O at the edge; it turns the cluster into events and events into
API calls, and translates the client's exceptions into shoal's (``KubeError``).
"""
