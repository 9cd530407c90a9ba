"""``shoal extender --config FILE --listen HOST:PORT``: shoal as a kube-scheduler
extender, for a cluster that keeps the stock kube-scheduler.

Verbs (POST, ``k8s.io/kube-scheduler/extender/v1`` JSON): ``/filter``
(``ExtenderArgs`` → ``ExtenderFilterResult``), ``/prioritize`` (→ ``HostPriorityList``,
0..10) and ``/bind`` (``ExtenderBindingArgs`` → ``ExtenderBindingResult``). Configure
kube-scheduler with::

    extenders:
    - urlPrefix: https://shoal-extender.example:8888
      filterVerb: filter
      prioritizeVerb: prioritize
      bindVerb: bind
      weight: 1
      enableHTTPS: true
      tlsConfig: {caFile: ..., certFile: ..., keyFile: ...}  # --tls-cert, --client-ca
      nodeCacheCapable: false   # shoal learns the nodes from the requests

Who may call it: :mod:`shards.extenders.access` (client certificates, a bearer token, or
a loopback address only). ``/healthz`` answers anyone.

``bind`` binds only a pod this server filtered (or prioritized) lately, onto a node it
let the pod go to (:mod:`shards.extenders.judged`); anything else is answered with an
``Error``. It holds a gang's members until the whole gang can be bound: a member's bind
answers once ``minMember`` of its group have asked to be bound (all are then bound, in
the order they asked), or with an ``Error`` after ``--gang-wait`` seconds (kube-scheduler
then unreserves the pod and tries again). Bindings are made through the API server
(``--kubeconfig``/``--host``); without either, they are only recorded (a dry run, for
tests). Shoal sees the room a node has left through the bindings it makes: make it the
binder (``bindVerb``) of the pods it judges. It does not watch the cluster (yet): a pod
that finishes or is deleted still counts on its node until the server restarts.

Bad requests (not JSON, wrong types, missing fields) get a 4xx with a one-line reason; a
body over ``--max-body`` bytes a 413, before it is read when its length is declared; an
unexpected failure is a 500, logged; the server goes on. A client that hangs up before
its request is read is one line at INFO. Requests are parsed and judged in a thread of
their own, one at a time (the decisions are ordered, for the log), so a large request
does not hold up the event loop: ``/healthz`` and the binds waiting on the API server
go on meanwhile. Every fact and answer goes to the server's log (``--log PATH``, a file
log), which ``shoal extender --verify PATH`` checks by deriving every answer again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import aiohttp
import orjson
from aiohttp import web

from engine.config import SchedulerConfig
from events.errors import InputError
from events.log import EventLog
from shards.extenders.access import Access
from shards.extenders.core import ExtenderCore
from shards.extenders.judged import JudgedPods
from shards.extenders.wire import WireError, get, node_names

logger = logging.getLogger(__name__)

MAX_BODY: Final = 16 << 20
"""The largest request read: ~8,000 whole nodes (kube-scheduler sends every node that
passed its own filters when ``nodeCacheCapable`` is false); a request parses to some 25
times its size in memory."""
GANG_WAIT: Final = 30.0

T = TypeVar("T")

Binder = Callable[[str, str, str, str], Awaitable[str]]
"""(namespace, name, uid, node) → "" once bound, else why not."""


async def record_only(namespace: str, name: str, uid: str, node: str) -> str:
    return ""


class _HungUp(Exception):
    """The client went away before its request was read."""


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
        access: Access | None = None,
        max_body: int = MAX_BODY,
        judged: JudgedPods | None = None,
    ) -> None:
        self.core = core
        self.log = log
        self.binder = binder
        self.gang_wait = gang_wait
        self.clock = clock
        self.access = access or Access()
        self.max_body = max_body
        self.judged = judged or JudgedPods()
        self._lock = asyncio.Lock()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="extender-judge")
        """Where requests are parsed and judged, in the order they took the lock."""
        self._running: set[asyncio.Task[Any]] = set()
        self._gangs: dict[str, dict[str, _Waiting]] = {}
        self.counters = {
            "filter": 0,
            "prioritize": 0,
            "bind": 0,
            "bind_refused": 0,
            "bad_request": 0,
            "too_large": 0,
            "unauthorized": 0,
            "hung_up": 0,
            "error": 0,
        }

    def __repr__(self) -> str:
        return f"ExtenderServer({self.counters}, {self.judged!r})"

    def stats(self) -> dict[str, int]:
        return {**self.counters, **{f"judged_{k}": v for k, v in self.judged.stats().items()}}

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body)
        app.router.add_post("/filter", self._guard(self._filter))
        app.router.add_post("/prioritize", self._guard(self._prioritize))
        app.router.add_post("/bind", self._guard(self._bind))
        app.router.add_get("/healthz", self._healthz)
        return app

    async def close(self) -> None:
        """Let the judging under way finish (its records reach the log); stop the thread."""
        while self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        self._thread.shutdown(wait=True)

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    # ------------------------------------------------------------------ requests

    def _guard(
        self, handler: Callable[[bytes], Awaitable[bytes]]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            verb = request.path.strip("/")
            transport = request.transport
            peer = transport.get_extra_info("peercert") if transport is not None else None
            if not self.access.allows(request.headers.get("Authorization"), peer):
                self.counters["unauthorized"] += 1
                headers = {"WWW-Authenticate": "Bearer"} if self.access.token else None
                response = web.Response(
                    status=401,
                    text=f"{verb}: a client certificate or a bearer token is needed\n",
                    headers=headers,
                )
                response.force_close()  # its body is not read
                return response
            try:
                raw = await self._body(request)
                body = await handler(raw)
            except _HungUp as exc:
                self.counters["hung_up"] += 1
                logger.info("extender client hung up verb=%s error=%s", verb, exc)
                return web.Response(status=400, text=f"{verb}: request not read\n")
            except web.HTTPRequestEntityTooLarge:
                return self._too_large(verb)
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
            return web.Response(body=body, content_type="application/json")

        return handle

    async def _body(self, request: web.Request) -> bytes:
        """The request's body: refused before it is read when it declares more than
        ``max_body`` bytes (aiohttp stops one that did not declare it at the limit)."""
        length = request.content_length
        if length is not None and length > self.max_body:
            raise web.HTTPRequestEntityTooLarge(max_size=self.max_body, actual_size=length)
        try:
            return await request.read()
        except (aiohttp.ClientPayloadError, ConnectionError, asyncio.IncompleteReadError) as exc:
            raise _HungUp(f"{type(exc).__name__}: {exc}") from None

    def _too_large(self, verb: str) -> web.Response:
        self.counters["too_large"] += 1
        response = web.Response(
            status=413, text=f"{verb}: a request is at most {self.max_body} bytes (--max-body)\n"
        )
        response.force_close()  # what is left of the body is not read
        return response

    async def _judging(self, work: Callable[[], T]) -> T:
        """``work`` (which may touch the core) in the judging thread, under the lock,
        then the records it made appended to the log. It runs to its end and its
        records are appended even when the request is given up meanwhile."""
        task = asyncio.ensure_future(self._judge(work))
        self._running.add(task)
        task.add_done_callback(self._finished)
        return await asyncio.shield(task)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._running.discard(task)
        if not task.cancelled():
            task.exception()  # its request (if still there) says what it was

    async def _judge(self, work: Callable[[], T]) -> T:
        async with self._lock:
            try:
                return await asyncio.get_running_loop().run_in_executor(self._thread, work)
            finally:
                records = self.core.take()
                if records:
                    await self.log.append(records)

    # ------------------------------------------------------------------ verbs

    async def _filter(self, raw: bytes) -> bytes:
        return await self._judging(lambda: self._filter_now(raw))

    async def _prioritize(self, raw: bytes) -> bytes:
        return await self._judging(lambda: self._prioritize_now(raw))

    def _filter_now(self, raw: bytes) -> bytes:
        """In the judging thread."""
        body = _parse(raw)
        pod, names, whole = _args(body)
        now = self.clock()
        if whole:
            names = self.core.learn_nodes(get(get(body, "Nodes"), "items"), now)
        spec = self.core.learn_pod(pod, now)
        answer = self.core.filter(spec, names, now)
        self.judged.filtered(spec.key, spec.uid, answer.passed)
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
        return orjson.dumps(result)

    def _prioritize_now(self, raw: bytes) -> bytes:
        """In the judging thread."""
        body = _parse(raw)
        pod, names, whole = _args(body)
        now = self.clock()
        if whole:
            names = self.core.learn_nodes(get(get(body, "Nodes"), "items"), now)
        spec = self.core.learn_pod(pod, now)
        scores = self.core.prioritize(spec, names, now)
        self.judged.prioritized(spec.key, spec.uid, names)
        return orjson.dumps([{"Host": n, "Score": s} for n, s in scores.items()])

    def _binding_now(self, raw: bytes) -> tuple[tuple[str, str, str, str] | None, str, str, int]:
        """In the judging thread: the binding asked for (namespace, name, uid, node),
        or why it is refused; the pod's group and its minMember."""
        body = _parse(raw)
        fields = {k: get(body, k) for k in ("PodName", "PodNamespace", "PodUID", "Node")}
        for key in ("PodName", "PodNamespace", "Node"):
            if not isinstance(fields[key], str) or not fields[key]:
                raise WireError(f"{key} must be a non-empty string")
        uid = fields["PodUID"] if isinstance(fields["PodUID"], str) else ""
        key = f"{fields['PodNamespace']}/{fields['PodName']}"
        uid, refused = self.judged.check(key, uid, fields["Node"])
        if refused:
            return None, refused, "", 1
        group, need = self.core.gang_of(key)
        return (fields["PodNamespace"], fields["PodName"], uid, fields["Node"]), "", group, need

    async def _bind(self, raw: bytes) -> bytes:
        return orjson.dumps({"Error": await self._bind_one(raw)})

    async def _bind_one(self, raw: bytes) -> str:
        asked, refused, group, need = await self._judging(lambda: self._binding_now(raw))
        if asked is None:
            self.counters["bind_refused"] += 1
            logger.info("bind refused: %s", refused)
            return refused
        namespace, name, uid, node = asked
        waiting = _Waiting(f"{namespace}/{name}", namespace, name, uid, node)
        if not group or need <= 1:
            return await self._bind_now([waiting])
        members = self._gangs.setdefault(group, {})
        members[waiting.key] = waiting
        if len(members) >= need:
            del self._gangs[group]
            return await self._bind_now(list(members.values()))
        try:
            return await asyncio.wait_for(asyncio.shield(waiting.done), self.gang_wait)
        except TimeoutError:
            if self._gangs.get(group, {}).get(waiting.key) is waiting:
                del self._gangs[group][waiting.key]
            return (
                f"gang {group}: {len(members)} of minMember {need} members ready to bind "
                f"within {self.gang_wait:g}s"
            )

    async def _bind_now(self, members: list[_Waiting]) -> str:
        """Bind ``members`` in the order they asked; each waiter gets its own result."""
        mine = ""
        for i, m in enumerate(members):
            error = await self.binder(m.namespace, m.name, m.uid, m.node)
            if not error:
                await self._judging(functools.partial(self._bound_now, m))
            if i == len(members) - 1:
                mine = error
            elif not m.done.done():
                m.done.set_result(error)
        return mine

    def _bound_now(self, m: _Waiting) -> None:
        """In the judging thread."""
        self.core.bound(m.key, m.node, self.clock())
        self.judged.forget(m.key)


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise WireError("must be a JSON object")
    return body


def _args(body: dict[str, Any]) -> tuple[Any, list[str], bool]:
    """The pod and the node names of an ``ExtenderArgs``; whether they came as whole
    nodes (then the names are learnt from them)."""
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
