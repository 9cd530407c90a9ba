"""The explicit registry: plugin name → factory (the built-in plugins are listed in one
place, :func:`engine.plugins.registry.builtin_registry`).

A factory takes the plugin's ``args`` (from ``pluginConfig``), the location to name in
errors and the engine's :class:`~engine.framework.handle.Handle` (what a plugin may read
of the state beyond the pod and the nodes). Out-of-tree plugins are added with
:meth:`Registry.register`; nothing registers itself through an import side effect.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from engine.framework.best import BestIndex
from engine.framework.handle import Handle
from engine.framework.interfaces import Plugin
from engine.model.state import Bools, ClusterState, Ints, Request
from events.errors import InputError

PluginFactory = Callable[[Mapping[str, Any], str, Handle], Plugin]


class Kernel(Protocol):
    """A compiled stand-in for a profile's resource plugins when a pod shape's cached
    verdicts are refreshed on a few changed nodes; exactly the plugins' results."""

    def worth(self, changed: int, scalar_limit: int) -> bool:
        """Whether refreshing ``changed`` nodes is worth the kernel's call."""
        ...

    def params(self, request: Request, state: ClusterState) -> Any:
        """The kernel's arguments for ``request`` (None: it does not stand in for it)."""
        ...

    def run(
        self,
        slots: list[int] | Ints,
        static: Bools,
        state: ClusterState,
        params: Any,
        feasible: Bools,
        local: Ints,
        masked: Ints,
        index: BestIndex | None = None,
    ) -> bool:
        """Refresh ``feasible``, ``local`` and ``masked`` at ``slots``; False (nothing
        done) if the kernel cannot run here. ``index``: a best-node index over
        ``masked`` that follows these writes (:meth:`BestIndex.follows`), kept in step
        as they are made."""
        ...


KernelFactory = Callable[[list[Any], list[tuple[Any, int]]], Kernel | None]
"""A profile's dynamic filters and (local score, weight) pairs → its kernel, or None."""


class Registry:
    """Plugin name → factory, and what builds a profile's compiled kernel."""

    def __init__(
        self,
        factories: Mapping[str, PluginFactory] | None = None,
        kernel: KernelFactory | None = None,
    ) -> None:
        self._factories: dict[str, PluginFactory] = dict(factories or {})
        self.kernel = kernel

    def __repr__(self) -> str:
        return f"Registry({sorted(self._factories)})"

    def __contains__(self, name: object) -> bool:
        return name in self._factories

    def names(self) -> list[str]:
        return sorted(self._factories)

    def register(self, name: str, factory: PluginFactory) -> None:
        if name in self._factories:
            raise ValueError(f"plugin {name!r} is already registered")
        self._factories[name] = factory

    def create(self, name: str, args: Mapping[str, Any], where: str, handle: Handle) -> Plugin:
        factory = self._factories.get(name)
        if factory is None:
            raise InputError(
                f"unknown plugin {name!r} (known: {', '.join(self.names())})", location=where
            )
        return factory(args, where, handle)
