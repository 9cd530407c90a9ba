"""Two shoal plugins from seed 001 (a scheduler extension for GPU and Slurm-on-Kubernetes
jobs), published under the entry-point group ``shoal.plugins``:

- ``NetworkSpeed`` (:mod:`.network`): prefer nodes with the fastest measured network,
  and optionally refuse those below a minimum. The measurement is a node annotation
  that a prober writes to the Kubernetes Node (it arrives in shoal's log with the node);
  the plugin itself never probes anything.
- ``LeafPod`` (:mod:`.leaf`): place a gang in the leaf switch ("leaf pod") with the
  fewest free nodes that still holds it, so that it stays in one leaf and leaves the
  big leaves whole for big gangs.
"""
