"""The status shoal writes on Kubernetes' own PodGroups (``scheduling.k8s.io``), as
kube-scheduler does: the condition ``PodGroupInitiallyScheduled`` (``True``, reason
``Scheduled``, once the gang is placed; ``False``, reason ``Unschedulable``, while it
cannot be, its message the engine's answer for the gang (why, and what to do, as its
members' ``FailedScheduling`` Events say; the engine's reason where there is none); a
``True`` is never taken back, as
kube-scheduler's is not), and ``DisruptionTarget`` (reason ``PreemptionByScheduler``)
when its members are preempted (:func:`conditions_after`). The binder writes it.

Volcano's, KAI's and Tencent's PodGroup status is their own schedulers' and
controllers' (phases, queue admission): shoal leaves it alone. scheduler-plugins'
PodGroup status has no message field (phase and counts only: the binder writes those).
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from events.types import PodGroupStatusChanged
from shards.kube.groups import KUBERNETES
from shards.kube.recorder import AS_MERGE_PATCH

JSON = dict[str, Any]
INITIALLY_SCHEDULED: Final = "PodGroupInitiallyScheduled"
DISRUPTION_TARGET: Final = "DisruptionTarget"
PREEMPTED_BY: Final = "preempted by "
"""How the engine's group reason starts when its members were preempted."""


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def wanted_conditions(event: PodGroupStatusChanged, answer: str = "") -> list[JSON]:
    """The conditions kube-scheduler would set for what ``event`` says (none yet for a
    group not tried: pending without a reason); ``answer``, the engine's answer for the
    gang, is the message of ``Unschedulable`` (``event.reason`` without one)."""
    out: list[JSON] = []
    if event.phase in ("Scheduled", "Succeeded"):
        out.append(
            {
                "type": INITIALLY_SCHEDULED,
                "status": "True",
                "reason": "Scheduled",
                "message": f"{event.scheduled} pods scheduled",
            }
        )
    elif event.reason and not event.reason.startswith(PREEMPTED_BY):
        out.append(
            {
                "type": INITIALLY_SCHEDULED,
                "status": "False",
                "reason": "Unschedulable",
                "message": (answer or event.reason)[:32768],
            }
        )
    if event.reason.startswith(PREEMPTED_BY):
        out.append(
            {
                "type": DISRUPTION_TARGET,
                "status": "True",
                "reason": "PreemptionByScheduler",
                "message": f"{event.reason[:32000]} (shoal)",
            }
        )
    return out


def conditions_after(
    current: Mapping[str, Any],
    event: PodGroupStatusChanged,
    now: str | None = None,
    answer: str = "",
) -> list[JSON] | None:
    """The PodGroup's ``status.conditions`` once ``event`` is told (as apimachinery's
    ``SetStatusCondition``: ``lastTransitionTime`` moves only when the status does), or
    None when nothing changes. ``PodGroupInitiallyScheduled`` once ``True`` stays so."""
    status = current.get("status") or {}
    conditions: list[JSON] = [dict(c) for c in status.get("conditions") or []]
    generation = (current.get("metadata") or {}).get("generation") or 0
    changed = False
    for told in wanted_conditions(event, answer):
        wanted = {**told, "observedGeneration": generation}
        found = next((c for c in conditions if c.get("type") == wanted["type"]), None)
        if found is None:
            conditions.append({**wanted, "lastTransitionTime": now or _now()})
            changed = True
            continue
        if (
            wanted["type"] == INITIALLY_SCHEDULED
            and found.get("status") == "True"
            and wanted["status"] != "True"
        ):
            continue
        if found.get("status") != wanted["status"]:
            found["lastTransitionTime"] = now or _now()
        for key, value in wanted.items():
            if found.get(key) != value:
                found[key] = value
                changed = True
    return conditions if changed else None


async def _read(custom: client.CustomObjectsApi, version: str, namespace: str, name: str) -> Any:
    return await custom.get_namespaced_custom_object(
        "scheduling.k8s.io", version, namespace, "podgroups", name
    )


async def _write(
    custom: client.CustomObjectsApi, version: str, namespace: str, name: str, body: JSON
) -> Any:
    return await custom.patch_namespaced_custom_object_status(
        "scheduling.k8s.io", version, namespace, "podgroups", name, body, **AS_MERGE_PATCH
    )


VERSIONS: Final[dict[str, tuple[Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]]]] = {
    "v1beta1": (
        lambda c, ns, n: _read(c, "v1beta1", ns, n),
        lambda c, ns, n, b: _write(c, "v1beta1", ns, n, b),
    ),
    "v1alpha2": (
        lambda c, ns, n: _read(c, "v1alpha2", ns, n),
        lambda c, ns, n, b: _write(c, "v1alpha2", ns, n, b),
    ),
}
"""Read and write a PodGroup at each version (spelt out: deploy/'s RBAC test reads the
calls from the code)."""


class KubernetesGroupStatus:
    """Writes the conditions above on Kubernetes' PodGroups (the version served is found
    by trying each in turn: the first that does not answer 404 is kept)."""

    def __init__(self, api: ApiClient, retry: Callable[..., Awaitable[Any]]) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.retry = retry
        self.versions = KUBERNETES.versions

    async def write(self, event: PodGroupStatusChanged, answer: str = "") -> bool:
        """Write what ``event`` says on its PodGroup (``answer``: the engine's answer
        for the gang, see :func:`wanted_conditions`); False when nothing changed. A
        PodGroup that is gone raises the 404."""
        namespace, _, name = event.group.partition("/")
        for version in self.versions:
            read, write = VERSIONS[version]
            try:
                current = await self.retry(lambda read=read: read(self.custom, namespace, name))
            except ApiException as exc:
                if exc.status == 404 and version != self.versions[-1]:
                    continue
                raise
            self.versions = (version, *(v for v in self.versions if v != version))
            conditions = conditions_after(current, event, answer=answer)
            if conditions is None:
                return False
            # the whole list, as read with this one changed: a condition another writer
            # owns (DisruptionTarget from a controller) is kept
            body = {"status": {"conditions": conditions}}
            await self.retry(
                lambda write=write, body=body: write(self.custom, namespace, name, body)
            )
            return True
        return False
