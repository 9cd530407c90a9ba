"""Kubernetes objects in: everything that parses what users write into event specs.

Resource quantities (``quantity.py``), Nodes, Pods and PriorityClasses (``objects.py``),
PodGroups, ElasticQuotas and dependency annotations (``groups.py``), Kueue's queues
(``kueue.py``), workload objects (``workloads.py``, ``controllers.py``, ``volcano.py``),
the kinds skipped or refused (``kinds.py``) and scenario files (``scenario.py``, read
through ``yamlfile.py``, which bounds what YAML may cost, with progress of long steps
from ``progress.py``). The
bounds on every number, and why, are in ``limits.py``; sums over a scenario in
``totals.py``. Both the scenario loader and the Kubernetes adapter (``shards/kube/``)
read objects through these modules, so the rules are the same on both paths.
"""
