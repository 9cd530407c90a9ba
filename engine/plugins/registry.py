"""Every built-in plugin, listed in one place, and the compiled kernel that stands in
for the resource plugins (:mod:`engine.plugins.kernels`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from engine.framework.handle import Handle
from engine.framework.interfaces import Plugin
from engine.framework.registry import PluginFactory, Registry
from engine.plugins.coscheduling import Coscheduling
from engine.plugins.fit import NodeResourcesBalancedAllocation, NodeResourcesFit
from engine.plugins.gpu.baselines import (
    GpuBestFit,
    GpuClustering,
    GpuDotProduct,
    GpuMMinusN,
    GpuPacking,
    GpuRandom,
)
from engine.plugins.gpu.fgd import GpuFragmentation
from engine.plugins.gpu.shoal import ShoalGpu
from engine.plugins.interpod_affinity import InterPodAffinity
from engine.plugins.kernels import ResourceKernel
from engine.plugins.node_affinity import NodeAffinity
from engine.plugins.node_name import NodeName
from engine.plugins.node_ports import NodePorts
from engine.plugins.preemption import DefaultPreemption
from engine.plugins.quota import ElasticQuota
from engine.plugins.rescheduler import Rescheduler
from engine.plugins.taints import TaintToleration
from engine.plugins.topology_spread import PodTopologySpread
from engine.plugins.unschedulable import NodeUnschedulable
from events.errors import InputError


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


def _args_handle(cls: Callable[[Mapping[str, Any], str, Handle], Plugin]) -> PluginFactory:
    def factory(args: Mapping[str, Any], where: str, handle: Handle) -> Plugin:
        return cls(args, where, handle)

    return factory


def builtin_registry() -> Registry:
    return Registry(
        {
            "NodeName": _no_args(NodeName),
            "NodeUnschedulable": _no_args(NodeUnschedulable),
            "TaintToleration": _no_args(TaintToleration),
            "NodeAffinity": _no_args(NodeAffinity),
            "NodePorts": _no_args(NodePorts),
            "InterPodAffinity": _args_handle(InterPodAffinity),
            "PodTopologySpread": _args_handle(PodTopologySpread),
            "NodeResourcesFit": _args(NodeResourcesFit),
            "NodeResourcesBalancedAllocation": _args(NodeResourcesBalancedAllocation),
            "ElasticQuota": _handle(ElasticQuota),
            "Coscheduling": _handle(Coscheduling),
            "DefaultPreemption": _handle(DefaultPreemption),
            "GpuBestFit": _args(GpuBestFit),
            "GpuDotProduct": _args(GpuDotProduct),
            "GpuPacking": _args(GpuPacking),
            "GpuClustering": _args(GpuClustering),
            "GpuRandom": _args(GpuRandom),
            "GpuMMinusN": _args(GpuMMinusN),
            "GpuFragmentation": _args_handle(GpuFragmentation),
            "ShoalGpu": _args_handle(ShoalGpu),
            "Rescheduler": Rescheduler.create,
        },
        kernel=ResourceKernel.for_plugins,
    )
