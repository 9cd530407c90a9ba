"""The explicit registry: every built-in plugin, listed in one place.

A factory takes the plugin's ``args`` (from ``pluginConfig``), the location to name in
errors and the engine's :class:`~engine.framework.handle.Handle` (what a plugin may read
of the state beyond the pod and the nodes). Out-of-tree plugins are added with
:meth:`Registry.register`; nothing registers itself through an import side effect.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from engine.framework.handle import Handle
from engine.framework.interfaces import Plugin
from engine.plugins.coscheduling import Coscheduling
from engine.plugins.fit import NodeResourcesBalancedAllocation, NodeResourcesFit
from engine.plugins.node_affinity import NodeAffinity
from engine.plugins.node_name import NodeName
from engine.plugins.preemption import DefaultPreemption
from engine.plugins.quota import ElasticQuota
from engine.plugins.taints import TaintToleration
from engine.plugins.unschedulable import NodeUnschedulable
from events.errors import InputError

PluginFactory = Callable[[Mapping[str, Any], str, Handle], Plugin]


def _no_args(cls: Callable[[], Plugin]) -> PluginFactory:
    def factory(args: Mapping[str, Any], where: str, handle: Handle) -> Plugin:
        if args:
            raise InputError(f"takes no args, got {sorted(args)}", location=where)
        return cls()

    return factory


def _args(cls: Callable[[Mapping[str, Any], str], Plugin]) -> PluginFactory:
    def factory(args: Mapping[str, Any], where: str, handle: Handle) -> Plugin:
        return cls(args, where)

    return factory


def _handle(cls: Callable[[Handle], Plugin]) -> PluginFactory:
    def factory(args: Mapping[str, Any], where: str, handle: Handle) -> Plugin:
        if args:
            raise InputError(f"takes no args, got {sorted(args)}", location=where)
        return cls(handle)

    return factory


class Registry:
    """Plugin name → factory."""

    def __init__(self, factories: Mapping[str, PluginFactory] | None = None) -> None:
        self._factories: dict[str, PluginFactory] = dict(factories or {})

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


def builtin_registry() -> Registry:
    return Registry(
        {
            "NodeName": _no_args(NodeName),
            "NodeUnschedulable": _no_args(NodeUnschedulable),
            "TaintToleration": _no_args(TaintToleration),
            "NodeAffinity": _no_args(NodeAffinity),
            "NodeResourcesFit": _args(NodeResourcesFit),
            "NodeResourcesBalancedAllocation": _args(NodeResourcesBalancedAllocation),
            "ElasticQuota": _handle(ElasticQuota),
            "Coscheduling": _handle(Coscheduling),
            "DefaultPreemption": _handle(DefaultPreemption),
        }
    )
