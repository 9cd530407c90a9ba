"""The pod-group dialects ingest watches live besides scheduler-plugins'
(``shards.kube.ingest``).

Watched, where the server serves them (each its own reflector in ingest):

- Kubernetes' own ``scheduling.k8s.io`` PodGroup: ``v1beta1`` (v1.37, with the
  ``GenericWorkload`` feature gate and the API version enabled), else ``v1alpha2``
  (v1.36). Its ``spec.schedulingPolicy`` (``gang: {minCount}`` or ``basic``) is the
  gang; pods join by ``spec.schedulingGroup.podGroupName``. Workloads are not watched:
  a Workload holds only the templates a controller copies into PodGroups, and pods
  join PodGroups.
- Volcano's ``scheduling.volcano.sh/v1beta1`` PodGroup, KAI's
  ``scheduling.run.ai/v2alpha2`` PodGroup and Tencent batch-scheduler's
  ``batch.scheduler.tencent.com/v1`` PodGroup, where their CRDs are installed.

The older coscheduling labels (no object) are read from the pods themselves
(``shards.kube.ingest``).

A dialect the server does not serve is told once at INFO and looked for again every
``recheck_seconds`` (quietly), so that installing its CRD later needs no restart; its
reflector counts as listed meanwhile (nothing to list). Each becomes the same
``PodGroupSubmitted`` as a scheduler-plugins PodGroup (``shards.inputs.groups``), so the
engine treats every dialect alike.

The status shoal writes on Kubernetes' PodGroups: ``shards.kube.groupstatus``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp
import orjson
from kubernetes_asyncio import client
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from shards.kube.client import KubeError, checked
from shards.kube.reflector import Reflector

log = logging.getLogger(__name__)

JSON = dict[str, Any]


@dataclass(frozen=True)
class Dialect:
    """One pod-group kind watched live: its API group, the versions asked in order."""

    source: str
    """As ``GroupSpec.source`` says it (``shards.inputs.groups.GROUP_KINDS``)."""
    group: str
    versions: tuple[str, ...]
    plural: str = "podgroups"

    @property
    def reflector(self) -> str:
        """The reflector's name (its counters' prefix in ``KubeIngest.stats``)."""
        return f"podgroups.{self.source}"


KUBERNETES: Final = Dialect("kubernetes", "scheduling.k8s.io", ("v1beta1", "v1alpha2"))
DIALECTS: Final = (
    KUBERNETES,
    Dialect("volcano", "scheduling.volcano.sh", ("v1beta1",)),
    Dialect("kai", "scheduling.run.ai", ("v2alpha2",)),
    Dialect("tencent", "batch.scheduler.tencent.com", ("v1",)),
)


async def served_version(api: ApiClient, dialect: Dialect) -> str | None:
    """The first of ``dialect``'s versions whose discovery lists its resource, or None.
    An API error other than 404 is raised (the caller retries)."""
    for version in dialect.versions:
        response = await api.call_api(
            f"/apis/{dialect.group}/{version}",
            "GET",
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _preload_content=False,
        )
        if response.status == 404:
            response.release()
            continue
        body = await (await checked(response)).read()
        try:
            names = {r.get("name") for r in orjson.loads(body).get("resources") or []}
        except (orjson.JSONDecodeError, AttributeError):
            raise KubeError(f"/apis/{dialect.group}/{version}: not an APIResourceList") from None
        if dialect.plural in names:
            return version
    return None


@dataclass
class GroupReflector(Reflector):
    """A reflector of one dialect that starts once the server serves it."""

    api: ApiClient | None = None
    dialect: Dialect = KUBERNETES
    recheck_seconds: float = 60.0
    version: str = ""
    """The version listed and watched ("" until it is served)."""
    told: bool = field(default=False)

    async def run(self, stop: asyncio.Event) -> None:
        backoff = self.initial_backoff
        while not stop.is_set():
            assert self.api is not None
            try:
                version = await served_version(self.api, self.dialect)
            except ApiException as exc:
                backoff = await self._back_off(f"API error {exc.status}", backoff, stop)
                continue
            except (aiohttp.ClientError, TimeoutError, KubeError, ValueError, OSError) as exc:
                backoff = await self._back_off(f"{type(exc).__name__}: {exc}", backoff, stop)
                continue
            if version is not None:
                self.version = version
                log.info(
                    "watching pod groups kind=%s/%s/%s",
                    self.dialect.group,
                    version,
                    self.dialect.plural,
                )
                await super().run(stop)
                return
            if not self.told:
                self.told = True
                log.info(
                    "pod groups not served, not watched (looked for again every %ds) kind=%s %s",
                    self.recheck_seconds,
                    self.dialect.group,
                    "/".join(self.dialect.versions),
                )
            self.synced.set()  # nothing to list
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.recheck_seconds)


def _list_call(api: ApiClient, group: str, version: str) -> Callable[..., Awaitable[Any]]:
    custom = client.CustomObjectsApi(api)

    async def call(**kwargs: Any) -> Any:
        return await custom.list_cluster_custom_object(group, version, "podgroups", **kwargs)

    return call


def _list_calls(api: ApiClient) -> dict[tuple[str, str], Callable[..., Awaitable[Any]]]:
    """The list (and watch) call of each dialect's versions (spelt out: deploy/'s RBAC
    test reads the calls from the code)."""
    return {
        ("scheduling.k8s.io", "v1beta1"): _list_call(api, "scheduling.k8s.io", "v1beta1"),
        ("scheduling.k8s.io", "v1alpha2"): _list_call(api, "scheduling.k8s.io", "v1alpha2"),
        ("scheduling.volcano.sh", "v1beta1"): _list_call(api, "scheduling.volcano.sh", "v1beta1"),
        ("scheduling.run.ai", "v2alpha2"): _list_call(api, "scheduling.run.ai", "v2alpha2"),
        ("batch.scheduler.tencent.com", "v1"): _list_call(api, "batch.scheduler.tencent.com", "v1"),
    }


def group_reflector(
    api: ApiClient,
    dialect: Dialect,
    on_event: Callable[[str, JSON], Awaitable[None]],
    on_relist: Callable[[list[JSON]], Awaitable[None]],
    **options: Any,
) -> GroupReflector:
    """A reflector of ``dialect``'s PodGroups in every namespace (its version found when
    it starts)."""
    calls = _list_calls(api)
    reflector: GroupReflector

    async def call(**kwargs: Any) -> Any:
        return await calls[(dialect.group, reflector.version)](**kwargs)

    reflector = GroupReflector(
        dialect.reflector, call, on_event, on_relist, api=api, dialect=dialect, **options
    )
    return reflector
