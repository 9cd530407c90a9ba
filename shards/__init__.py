"""The scheduler as a program: the shards' and the coordinator's workers, the
command line, simulation, replay and the Kubernetes adapter. This package is the edge
where the environment is read: ``SHOAL_NO_JIT`` switches the engine's compiled kernel
off, here, before any engine is built (numba itself reads ``NUMBA_CACHE_DIR``)."""

import os

from engine.plugins import kernels

kernels.configure(jit=not os.environ.get("SHOAL_NO_JIT"))
