"""The profiles of a configuration, each a :class:`Framework`, chosen by ``schedulerName``.

A pod that names no scheduler is the default scheduler's (``default-scheduler``), as
the API server sets it: a configuration without a profile of that name does not
schedule it, exactly as ``shoal serve`` would not see it.
"""

from __future__ import annotations

from engine.config import DEFAULT_SCHEDULER, SchedulerConfig
from engine.framework.handle import Handle
from engine.framework.registry import Registry
from engine.framework.runtime import Framework
from engine.model.changes import ClusterEvent
from engine.model.pods import PodInfo
from engine.model.state import ClusterState
from engine.model.topology import DomainIndex


class Profiles:
    """Frameworks by scheduler name; the hints the data layer asks for."""

    def __init__(self, config: SchedulerConfig, registry: Registry, handle: Handle) -> None:
        self.config = config
        self.frameworks = {
            p.scheduler_name: Framework(p, registry, handle) for p in config.profiles
        }
        self.topology = DomainIndex(config.topology)
        """Each node's domain at every topology level (gangs place by it)."""

    def __repr__(self) -> str:
        return f"Profiles({sorted(self.frameworks)})"

    def framework_for(self, pod: PodInfo) -> Framework | None:
        return self.frameworks.get(pod.spec.scheduler_name or DEFAULT_SCHEDULER)

    def learn_shapes(self) -> bool:
        """Whether a plugin of some profile learns its workload from the engine's pod
        shapes (a GPU policy given no target workload)."""
        return any(
            getattr(plugin, "learns_shapes", False)
            for framework in self.frameworks.values()
            for plugin in framework.plugins.values()
        )

    def events_for(self, pod: PodInfo, plugins: tuple[str, ...]) -> frozenset[ClusterEvent]:
        """Events that may help ``pod``, which ``plugins`` rejected (none without a
        profile: nothing will)."""
        framework = self.framework_for(pod)
        if framework is None:
            return frozenset()
        return framework.events_for(plugins)

    def worth_retrying(
        self,
        pod: PodInfo,
        plugins: tuple[str, ...],
        event: ClusterEvent,
        slot: int,
        state: ClusterState,
    ) -> bool:
        framework = self.framework_for(pod)
        return framework is not None and framework.worth_retrying(pod, plugins, event, slot, state)

    def room_decides(
        self, pod: PodInfo, plugins: tuple[str, ...], slot: int, state: ClusterState
    ) -> bool | None:
        framework = self.framework_for(pod)
        return None if framework is None else framework.room_decides(pod, plugins, slot, state)
