"""``shoal extender --config FILE --listen HOST:PORT``: shoal as a kube-scheduler
extender, for a cluster that keeps the stock kube-scheduler.

Verbs (POST, ``k8s.io/kube-scheduler/extender/v1`` JSON): ``/filter``
(``ExtenderArgs`` → ``ExtenderFilterResult``), ``/prioritize`` (→ ``HostPriorityList``,
0..10) and ``/bind`` (``ExtenderBindingArgs`` → ``ExtenderBindingResult``). Configure
kube-scheduler with::

    extenders:
    - urlPrefix: http://127.0.0.1:PORT
      filterVerb: filter
      prioritizeVerb: prioritize
      bindVerb: bind
      weight: 1
      nodeCacheCapable: false   # shoal learns the nodes from the requests

``bind`` holds a gang's members until the whole gang can be bound: a member's bind
answers once ``minMember`` of its group have asked to be bound (all are then bound, in
the order they asked), or with an ``Error`` after ``--gang-wait`` seconds (kube-scheduler
then unreserves the pod and tries again). Bindings are made through the API server
(``--kubeconfig``/``--host``); without either, they are only recorded (a dry run, for
tests). Shoal sees the room a node has left through the bindings it makes: make it the
binder (``bindVerb``) of the pods it judges. It does not watch the cluster (yet): a pod
that finishes or is deleted still counts on its node until the server restarts.

Bad requests (not JSON, wrong types, missing fields, over ``--max-body`` bytes) get a
4xx with a one-line reason; an unexpected failure is a 500, logged; the server goes on.
Every fact and answer goes to the server's log (``--log PATH``, a file log), which
``shoal extender --verify PATH`` checks by deriving every answer again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
from aiohttp import web

from engine.config import SchedulerConfig
from events.errors import InputError
from events.log import EventLog
from shards.extenders.core import ExtenderCore
from shards.extenders.wire import WireError, get, node_names

logger = logging.getLogger(__name__)

MAX_BODY: Final = 64 << 20
GANG_WAIT: Final = 30.0

Binder = Callable[[str, str, str, str], Awaitable[str]]
"""(namespace, name, uid, node) → "" once bound, else why not."""


async def record_only(namespace: str, name: str, uid: str, node: str) -> str:
    return ""


@dataclass
class _Waiting:
    key: str
    namespace: str
    name: str
    uid: str
    node: str
    done: asyncio.Future[str] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class ExtenderServer:
    def __init__(
        self,
        core: ExtenderCore,
        log: EventLog,
        *,
        binder: Binder = record_only,
        gang_wait: float = GANG_WAIT,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.core = core
        self.log = log
        self.binder = binder
        self.gang_wait = gang_wait
        self.clock = clock
        self._lock = asyncio.Lock()
        self._gangs: dict[str, dict[str, _Waiting]] = {}
        self.counters = {"filter": 0, "prioritize": 0, "bind": 0, "bad_request": 0, "error": 0}

    def __repr__(self) -> str:
        return f"ExtenderServer({self.counters})"

    def app(self, max_body: int = MAX_BODY) -> web.Application:
        app = web.Application(client_max_size=max_body)
        app.router.add_post("/filter", self._guard(self._filter))
        app.router.add_post("/prioritize", self._guard(self._prioritize))
        app.router.add_post("/bind", self._guard(self._bind))
        app.router.add_get("/healthz", self._healthz)
        return app

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    def _guard(
        self, handler: Callable[[Any], Awaitable[Any]]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            verb = request.path.strip("/")
            try:
                raw = await request.read()
                try:
                    body = orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    raise WireError(f"not JSON: {exc}") from None
                if not isinstance(body, dict):
                    raise WireError("must be a JSON object")
                result = await handler(body)
            except web.HTTPException:
                self.counters["bad_request"] += 1
                raise
            except (WireError, InputError, ValueError) as exc:
                self.counters["bad_request"] += 1
                return web.Response(status=400, text=f"{verb}: {str(exc)[:1000]}\n")
            except Exception:
                self.counters["error"] += 1
                logger.exception("extender request failed verb=%s", verb)
                return web.Response(status=500, text=f"{verb}: internal error\n")
            self.counters[verb] += 1
            return web.Response(body=orjson.dumps(result), content_type="application/json")

        return handle

    def _args(self, body: dict[str, Any]) -> tuple[Any, list[str], bool]:
        """The pod and the node names of an ``ExtenderArgs`` (nodes learnt on the way);
        whether they came as whole nodes."""
        pod = get(body, "Pod")
        if not isinstance(pod, dict):
            raise WireError("Pod must be a v1.Pod object")
        nodes = get(body, "Nodes")
        if nodes is not None:
            items = get(nodes, "items") if isinstance(nodes, dict) else None
            if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
                raise WireError("Nodes must be a v1.NodeList with items")
            return pod, [], True
        names = node_names(body)
        if names is None:
            raise WireError("needs Nodes or NodeNames")
        return pod, names, False

    async def _append(self) -> None:
        records = self.core.take()
        if records:
            await self.log.append(records)

    async def _filter(self, body: dict[str, Any]) -> dict[str, Any]:
        pod, names, whole = self._args(body)
        async with self._lock:
            now = self.clock()
            try:
                if whole:
                    items = get(get(body, "Nodes"), "items")
                    names = self.core.learn_nodes(items, now)
                spec = self.core.learn_pod(pod, now)
                answer = self.core.filter(spec, names, now)
            finally:
                await self._append()
        result: dict[str, Any] = {
            "FailedNodes": answer.failed,
            "FailedAndUnresolvableNodes": answer.unresolvable,
            "Error": "",
        }
        if whole:
            keep = set(answer.passed)
            items = get(get(body, "Nodes"), "items")
            result["Nodes"] = {"items": [i for i in items if get(i, "metadata")["name"] in keep]}
            result["NodeNames"] = None
        else:
            result["Nodes"] = None
            result["NodeNames"] = answer.passed
        return result

    async def _prioritize(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        pod, names, whole = self._args(body)
        async with self._lock:
            now = self.clock()
            try:
                if whole:
                    names = self.core.learn_nodes(get(get(body, "Nodes"), "items"), now)
                spec = self.core.learn_pod(pod, now)
                scores = self.core.prioritize(spec, names, now)
            finally:
                await self._append()
        return [{"Host": n, "Score": s} for n, s in scores.items()]

    async def _bind(self, body: dict[str, Any]) -> dict[str, Any]:
        fields = {k: get(body, k) for k in ("PodName", "PodNamespace", "PodUID", "Node")}
        for key in ("PodName", "PodNamespace", "Node"):
            if not isinstance(fields[key], str) or not fields[key]:
                raise WireError(f"{key} must be a non-empty string")
        uid = fields["PodUID"] if isinstance(fields["PodUID"], str) else ""
        key = f"{fields['PodNamespace']}/{fields['PodName']}"
        waiting = _Waiting(key, fields["PodNamespace"], fields["PodName"], uid, fields["Node"])
        group, need = self.core.gang_of(key)
        if not group or need <= 1:
            return {"Error": await self._bind_now([waiting])}
        members = self._gangs.setdefault(group, {})
        members[key] = waiting
        if len(members) >= need:
            del self._gangs[group]
            error = await self._bind_now(list(members.values()))
            return {"Error": error}
        try:
            return {"Error": await asyncio.wait_for(asyncio.shield(waiting.done), self.gang_wait)}
        except TimeoutError:
            if self._gangs.get(group, {}).get(key) is waiting:
                del self._gangs[group][key]
            return {
                "Error": f"gang {group}: {len(members)} of minMember {need} members ready to bind "
                f"within {self.gang_wait:g}s"
            }

    async def _bind_now(self, members: list[_Waiting]) -> str:
        """Bind ``members`` in the order they asked; each waiter gets its own result."""
        mine = ""
        for i, m in enumerate(members):
            error = await self.binder(m.namespace, m.name, m.uid, m.node)
            if not error:
                async with self._lock:
                    self.core.bound(m.key, m.node, self.clock())
                    await self._append()
            if i == len(members) - 1:
                mine = error
            elif not m.done.done():
                m.done.set_result(error)
        return mine


def kube_binder(core_api: Any) -> Binder:
    """Bindings through the API server (a ``CoreV1Api`` of kubernetes-asyncio)."""
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.exceptions import ApiException

    async def bind(namespace: str, name: str, uid: str, node: str) -> str:
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name=name, namespace=namespace, uid=uid or None),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=node),
        )
        try:
            await core_api.create_namespaced_pod_binding(
                name, namespace, body, _preload_content=False
            )
        except ApiException as exc:
            return f"binding {namespace}/{name} to {node}: {exc.status} {exc.reason}"
        return ""

    return bind


__all__ = ["ExtenderServer", "SchedulerConfig", "kube_binder", "record_only"]
