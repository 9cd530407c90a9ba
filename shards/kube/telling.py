"""What the binder tells people about pods not bound (``shards.kube.binder``): why a pod
is pending (a ``FailedScheduling`` Event and its ``PodScheduled`` condition), and each
pod group's status (scheduler-plugins PodGroups' ``status``, the conditions of
Kubernetes' own PodGroups). All of it is informational: a write that fails is logged,
and nothing waits for it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from events.types import Envelope, PodGroupStatusChanged, PodUnschedulable
from shards.kube.apicall import Unavailable, raw, split_key
from shards.kube.groups import KUBERNETES
from shards.kube.groupstatus import KubernetesGroupStatus
from shards.kube.recorder import AS_MERGE_PATCH, EventRecorder, PodScheduledWriter

log = logging.getLogger(__name__)

MESSAGE_LIMIT: Final = 1024
"""The most of a message an Event carries (the API server's limit)."""
Retry = Callable[..., Awaitable[Any]]


def unschedulable_message(event: PodUnschedulable) -> str:
    """A ``FailedScheduling`` Event's message: the engine's answer (why, and what to do),
    then kube-scheduler's count of nodes by reason; the reason alone without an answer."""
    if event.answer is None:
        return event.reason
    return f"{event.answer.text()} ({event.reason})"[:MESSAGE_LIMIT]


def coordinators_judgement(env: Envelope) -> bool:
    """A pod the coordinator found no room for (several shards: gangs, and pods no
    shard could place, are its to judge), not a shard's record relayed."""
    event = env.event
    return isinstance(event, PodUnschedulable) and env.producer == "router" and event.shard < 0


def coordinators_group_status(env: Envelope) -> bool:
    """A group's status as the coordinator's view reports it (several shards: the shards
    place a gang's members under parts of their own, and only the view knows the
    group whole)."""
    event = env.event
    return isinstance(event, PodGroupStatusChanged) and env.producer == "router" and event.shard < 0


class Teller:
    """Writes what the binder tells (see the module's docstring), counting what it
    wrote in ``counters`` (the binder's: ``events``, ``conditions``, ``group_status``)."""

    def __init__(
        self,
        api: ApiClient,
        core: client.CoreV1Api,
        retry: Retry,
        *,
        clock: Callable[[], int],
        counters: dict[str, int],
    ) -> None:
        self.retry = retry
        self.counters = counters
        self.custom = client.CustomObjectsApi(api)
        self.recorder = EventRecorder(api, retry, clock=clock)
        self.conditions = PodScheduledWriter(core, retry, clock=clock)
        self.kubernetes_groups = KubernetesGroupStatus(api, retry)
        self.group_answers: dict[str, str] = {}
        """Each group's latest answer (the text of its members' ``PodUnschedulable``):
        the message of a Kubernetes PodGroup's ``Unschedulable`` condition."""

    def __repr__(self) -> str:
        return f"Teller(groups_answered={len(self.group_answers)})"

    def forget(self, key: str) -> None:
        """``key`` was bound or is gone: what it was told is not bumped again."""
        self.recorder.forget(key)
        self.conditions.forget(key)

    async def warn(self, key: str, uid: str, reason: str, message: str) -> None:
        try:
            if await self.recorder.warn(key, uid, reason, message):
                self.counters["events"] += 1
        except ApiException as exc:
            log.warning("event not written pod=%s status=%s", key, exc.status)

    async def unschedulable(self, event: PodUnschedulable, uid: str, group: str | None) -> None:
        """Tell pod ``event.pod`` (of ``uid``, in ``group`` if any) why it is pending: a
        ``FailedScheduling`` Event, and its ``PodScheduled`` condition (written when its
        message changes)."""
        message = unschedulable_message(event)
        key = event.pod
        if group and event.answer is not None:
            self.group_answers[group] = event.answer.text()
        try:
            if await self.recorder.warn(key, uid, "FailedScheduling", message):
                self.counters["events"] += 1
        except (ApiException, Unavailable) as exc:
            log.warning("event not written pod=%s error=%s", key, exc)
        try:
            if await self.conditions.unschedulable(key, message):
                self.counters["conditions"] += 1
        except (ApiException, Unavailable) as exc:
            # informational, as the Event (a pod gone meanwhile answers 404)
            log.warning("condition not written pod=%s error=%s", key, exc)

    async def group_status(self, event: PodGroupStatusChanged, source: str | None) -> None:
        """Write ``event`` where the group's convention (``source``) keeps its status."""
        answer = self.group_answers.get(event.group, "")
        if event.phase != "Pending":
            self.group_answers.pop(event.group, None)
        if source == KUBERNETES.source:
            try:
                if await self.kubernetes_groups.write(event, answer):
                    self.counters["group_status"] += 1
            except ApiException as exc:
                if exc.status != 404:
                    log.warning(
                        "group status not written group=%s status=%s", event.group, exc.status
                    )
            return
        if source != "scheduler-plugins":
            return
        namespace, name = split_key(event.group)
        status: dict[str, Any] = {"phase": event.phase, "scheduled": event.scheduled}
        try:
            await self.retry(
                lambda: raw(
                    self.custom.patch_namespaced_custom_object_status(
                        "scheduling.x-k8s.io",
                        "v1alpha1",
                        namespace,
                        "podgroups",
                        name,
                        {"status": status},
                        **AS_MERGE_PATCH,
                        _preload_content=False,
                    )
                )
            )
            self.counters["group_status"] += 1
        except ApiException as exc:
            if exc.status != 404:
                log.warning("group status not written group=%s status=%s", event.group, exc.status)
