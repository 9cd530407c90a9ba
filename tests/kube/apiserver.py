"""An in-repo Kubernetes API server: the slice of the REST API shoal depends on.

The adapter's fast tests run the real kubernetes-asyncio client against this server;
the end-to-end tests also run against a real kube-apiserver v1.37 with etcd when one is
built (``./dev kube build``; see ``tests/kube/realkube.py``), so that this imitation
stays honest. It is faithful to the real server in what shoal depends on:

- list (``GET``) returns the collection's ``resourceVersion``; objects carry theirs;
  ``fieldSelector`` supports ``=``, ``==`` and ``!=`` on ``metadata.name``,
  ``metadata.namespace``, ``spec.nodeName``, ``spec.schedulerName``, ``status.phase``
  and, for Events, ``involvedObject.{kind,name,namespace,uid}``, ``reason``, ``type``;
- watch (``?watch=true``) streams JSON lines (``ADDED``, ``MODIFIED``, ``DELETED``,
  ``BOOKMARK`` with ``allowWatchBookmarks``) from ``resourceVersion``; a version older
  than the retained history gets an ``ERROR`` event with a ``Status`` of code 410
  (``Expired``), as the real server does; ``timeoutSeconds`` ends the stream, after a
  bookmark;
- ``metadata.generateName``, ``uid`` and ``creationTimestamp`` on create;
- ``PATCH`` on an object and on its ``status`` subresource honours the content type:
  ``application/merge-patch+json``, ``application/strategic-merge-patch+json`` (core
  kinds only: 415 for custom resources), ``application/json-patch+json`` (a list of
  operations; an object body is 400 "error decoding patch: json: cannot unmarshal
  object into Go value of type []handlers.jsonPatchOp", v1.37's words), 415 for
  anything else (``tests/kube/patch.py``). A patch of the object keeps its ``status``;
  a patch of ``status`` changes nothing else (so a pod's ``status.nominatedNodeName``
  is written through ``pods/status``);
- ``pods/binding`` (201; 409 if the pod is already bound or being deleted, or is not the
  one whose ``metadata.uid`` the Binding names; 404 if it does not exist). The
  Binding's ``metadata.annotations`` are copied onto the pod with its node, in the same
  write (``BindingREST.setPodHostAndAnnotations``); annotations that are not strings
  are a 400;
- ``pods/eviction`` as v1.37's: a pod that is Pending, finished or already terminating
  is deleted without looking at budgets; otherwise the one PodDisruptionBudget
  (``policy/v1``) whose selector matches it must allow a disruption (its status is
  written by the disruption controller, here by the test: ``observedGeneration`` behind
  ``metadata.generation`` or ``disruptionsAllowed: 0`` is 429 TooManyRequests; two
  budgets are 500); ``disruptionsAllowed`` is then decremented and the pod name put in
  ``disruptedPods``;
- deletion of a pod bound to a node and not finished is graceful, as the real server's:
  it gets ``metadata.deletionTimestamp`` and ``deletionGracePeriodSeconds`` (from
  ``spec.terminationGracePeriodSeconds``, 30 by default, or ``gracePeriodSeconds``)
  and stays until a kubelet deletes it with a grace period of 0: there is no kubelet
  here, so a test plays it (``remove()``), as it must against the real server;
- core/v1 ``events`` as stored by the real server (the ``involvedObject`` namespace
  must be the Event's: 422), patchable like any object (how a repeated Event's
  ``count`` is bumped); and the ``events.k8s.io/v1`` view of the same store, with
  v1.37's validation of what is written through it (``tests/kube/eventsview.py``:
  ``eventTime``, ``action`` and the reporting fields required, the deprecated fields
  unset, only ``series`` changed by a patch), but no watch; tests call it
  ``EventsV1``;
- the ``podgroups/status`` subresource, ``coordination.k8s.io/v1`` Leases with
  optimistic concurrency (409 on a stale ``resourceVersion``), and create, replace and
  delete for the kinds tests need;
- errors are ``Status`` objects with ``reason`` and ``code``;
- discovery of each API group version (``GET /apis/GROUP/VERSION``: the kinds served
  there); Kubernetes' own Workload and PodGroup (``scheduling.k8s.io/v1beta1``), and
  Volcano's, KAI's and Tencent's PodGroups, which tests call ``KubePodGroup``,
  ``VolcanoPodGroup``, ``KaiPodGroup`` and ``TencentPodGroup`` (``PodGroup`` is
  scheduler-plugins'); ``without`` leaves API
  groups out (a CRD not installed, a feature gate off).

Where it is not faithful: no authentication or authorization (any token passes); no
schema validation or defaulting beyond the above (a pod without containers is taken;
``spec`` of a pod may be replaced); strategic merge patch merges lists as a merge patch
does; ``resourceVersion`` is one counter for all kinds; no admission plugins (but
see ``check_namespaces``), no garbage collection, no finalizers.

``check_namespaces`` (off by default, as the tests that predate it create objects in
namespaces they never made): creating a namespaced object in a namespace that has no
``Namespace`` object gets the real server's 404 (``namespaces "X" not found``, from
its NamespaceLifecycle admission); ``default``, ``kube-system``, ``kube-public`` and
``kube-node-lease`` always exist. ``namespace(name)`` creates one, as the real
server's stand-in in ``realkube.py`` does.

Fault injection for tests: ``drop_watches()`` cuts every open watch mid-stream,
``garbage`` answers the next N requests with a body that is not JSON, ``compact()``
forgets the watch history (the next resume gets 410).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime
import json
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.kube import eventsview
from tests.kube.patch import PatchError, apply_patch

JSON = dict[str, Any]


@dataclass(frozen=True)
class Kind:
    group: str  # "" for core
    version: str
    plural: str
    kind: str
    namespaced: bool
    alias: str = ""
    """The name tests give a kind whose ``kind`` another group has too (PodGroup)."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def name(self) -> str:
        """What ``put``, ``get``, ``remove`` and ``all`` call it."""
        return self.alias or self.kind

    @property
    def store(self) -> str:
        """Its objects' key in ``FakeApiServer.objects``."""
        return f"{self.plural}.{self.group}" if self.alias else self.plural

    @property
    def built_in(self) -> bool:
        """Served by kube-apiserver itself, not by a CRD (strategic merge patch works)."""
        return self.group == "" or "." not in self.group or self.group.endswith(".k8s.io")


KINDS = [
    Kind("", "v1", "nodes", "Node", False),
    Kind("", "v1", "namespaces", "Namespace", False),
    Kind("", "v1", "pods", "Pod", True),
    Kind("", "v1", "events", "Event", True),
    Kind("events.k8s.io", "v1", "events", "Event", True, "EventsV1"),
    Kind("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False),
    Kind("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup", True),
    Kind("scheduling.x-k8s.io", "v1alpha1", "elasticquotas", "ElasticQuota", True),
    Kind("coordination.k8s.io", "v1", "leases", "Lease", True),
    Kind("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True),
    Kind("scheduling.k8s.io", "v1beta1", "podgroups", "PodGroup", True, "KubePodGroup"),
    Kind("scheduling.k8s.io", "v1beta1", "workloads", "Workload", True),
    Kind("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup", True, "VolcanoPodGroup"),
    Kind("scheduling.run.ai", "v2alpha2", "podgroups", "PodGroup", True, "KaiPodGroup"),
    Kind("batch.scheduler.tencent.com", "v1", "podgroups", "PodGroup", True, "TencentPodGroup"),
]
FIELDS: dict[str, Callable[[JSON], str]] = {
    "metadata.name": lambda o: o.get("metadata", {}).get("name", ""),
    "metadata.namespace": lambda o: o.get("metadata", {}).get("namespace", ""),
    "spec.nodeName": lambda o: (o.get("spec") or {}).get("nodeName") or "",
    "spec.schedulerName": lambda o: (o.get("spec") or {}).get("schedulerName") or "",
    "status.phase": lambda o: (o.get("status") or {}).get("phase") or "",
    "involvedObject.kind": lambda o: (o.get("involvedObject") or {}).get("kind") or "",
    "involvedObject.name": lambda o: (o.get("involvedObject") or {}).get("name") or "",
    "involvedObject.namespace": lambda o: (o.get("involvedObject") or {}).get("namespace") or "",
    "involvedObject.uid": lambda o: (o.get("involvedObject") or {}).get("uid") or "",
    "reason": lambda o: o.get("reason") or "",
    "type": lambda o: o.get("type") or "",
}
DEFAULT_GRACE_SECONDS = 30
"""A pod's ``spec.terminationGracePeriodSeconds`` when it names none (the API default)."""


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


BUILT_IN_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})


def status(
    code: int,
    reason: str,
    message: str,
    causes: list[JSON] | None = None,
    details: JSON | None = None,
) -> web.Response:
    body: JSON = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if causes or details:
        body["details"] = {**(details or {}), **({"causes": causes} if causes else {})}
    return web.json_response(body, status=code)


def created() -> web.Response:
    """The ``Status`` the API answers a successful subresource POST with."""
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
    return web.json_response(body, status=201)


def _selector(raw: str | None) -> Callable[[JSON], bool]:
    if not raw:
        return lambda _: True
    tests: list[tuple[str, str, bool]] = []
    for part in raw.split(","):
        negate = "!=" in part
        field, value = part.split("!=" if negate else ("==" if "==" in part else "="), 1)
        if field not in FIELDS:
            raise ValueError(f"field label not supported: {field}")
        tests.append((field, value, negate))
    return lambda obj: all((FIELDS[f](obj) == v) != n for f, v, n in tests)


@dataclass
class _Watch:
    kind: Kind
    namespace: str | None
    match: Callable[[JSON], bool]
    queue: asyncio.Queue[tuple[str, JSON] | None]


class FakeApiServer:
    """Serve the slice above on 127.0.0.1 and a free port (``url`` once started)."""

    def __init__(
        self,
        *,
        history: int = 10_000,
        budget_version: str = "v1",
        without: Collection[str] = (),
    ) -> None:
        self.budget_version = budget_version
        """The one version PodDisruptionBudgets are served at (v1.25 and later: ``v1``;
        before v1.21: ``v1beta1``)."""
        self.kinds = [
            dataclasses.replace(k, version=budget_version)
            if k.plural == "poddisruptionbudgets"
            else k
            for k in KINDS
            if k.group not in without
        ]
        """The kinds served: all but those of the API groups ``without`` names (a CRD
        not installed, a feature gate off)."""
        self.objects: dict[str, dict[tuple[str, str], JSON]] = {k.store: {} for k in KINDS}
        self.rv = 1
        self._history: deque[tuple[int, Kind, str, JSON]] = deque(maxlen=history)
        self._oldest = 1
        self._watches: list[_Watch] = []
        self.garbage = 0
        self.binding_seconds = 0.0
        """How long a binding takes to answer (a real server: a few milliseconds, an
        etcd write); bindings in flight at once are counted in ``bindings_at_once``."""
        self.bindings_in_flight = 0
        self.bindings_at_once = 0
        self.held_bindings: dict[str, int] = {}
        """Pod name → bindings that must be done before its own is answered (at most
        30 s): a slow answer."""
        self.bound_order: list[str] = []
        """Pods in the order their bindings were answered."""
        self.requests: list[tuple[str, str]] = []
        self.check_namespaces = False
        """Refuse to create objects in a namespace that does not exist (see above)."""
        self._runner: web.AppRunner | None = None
        self.url = ""

    def __repr__(self) -> str:
        return f"FakeApiServer({self.url!r}, rv={self.rv})"

    # ------------------------------------------------------------------ lifecycle

    async def start(self, port: int = 0) -> str:
        """Serve on ``port`` (0: a free one); returns the URL."""
        app = web.Application(middlewares=[self._middleware])
        for kind in self.kinds:
            base = (
                f"/api/{kind.version}" if not kind.group else f"/apis/{kind.group}/{kind.version}"
            )
            app.router.add_route("GET", f"{base}/{kind.plural}", self._handler(kind, "list"))
            if kind.namespaced:
                ns = f"{base}/namespaces/{{namespace}}/{kind.plural}"
                app.router.add_route("GET", ns, self._handler(kind, "list"))
                app.router.add_route("POST", ns, self._handler(kind, "create"))
                item = f"{ns}/{{name}}"
            else:
                app.router.add_route("POST", f"{base}/{kind.plural}", self._handler(kind, "create"))
                item = f"{base}/{kind.plural}/{{name}}"
            app.router.add_route("GET", item, self._handler(kind, "get"))
            app.router.add_route("PUT", item, self._handler(kind, "replace"))
            app.router.add_route("DELETE", item, self._handler(kind, "delete"))
            app.router.add_route("PATCH", item, self._handler(kind, "patch"))
            app.router.add_route("PATCH", f"{item}/status", self._handler(kind, "status"))
        for group_version in {k.api_version for k in self.kinds if k.group}:
            app.router.add_route("GET", f"/apis/{group_version}", self._discovery(group_version))
        pods = "/api/v1/namespaces/{namespace}/pods/{name}"
        app.router.add_route("POST", f"{pods}/binding", self._binding)
        app.router.add_route("POST", f"{pods}/eviction", self._eviction)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        self.drop_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ------------------------------------------------------------------ faults

    def drop_watches(self) -> None:
        """Cut every open watch stream (the client sees the connection end)."""
        for watch in self._watches:
            watch.queue.put_nowait(None)
        self._watches.clear()

    def compact(self) -> None:
        """Forget the history: resuming from an older version now gets 410."""
        self._history.clear()
        self._oldest = self.rv

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append((request.method, request.path))
        if self.garbage > 0:
            self.garbage -= 1
            return web.Response(
                text="<html>upstream hiccup</html>", content_type="application/json"
            )
        response: web.StreamResponse = await handler(request)
        return response

    # ------------------------------------------------------------------ storage

    def _key(self, kind: Kind, namespace: str | None, name: str) -> tuple[str, str]:
        return (namespace or "" if kind.namespaced else "", name)

    def _record(self, kind: Kind, event: str, obj: JSON) -> None:
        self._history.append((self.rv, kind, event, copy.deepcopy(obj)))
        if len(self._history) == self._history.maxlen:
            self._oldest = self._history[0][0]
        for watch in list(self._watches):
            if watch.kind is kind and self._visible(watch, obj):
                watch.queue.put_nowait((event, copy.deepcopy(obj)))

    @staticmethod
    def _visible(watch: _Watch, obj: JSON) -> bool:
        if watch.namespace is not None and obj["metadata"].get("namespace") != watch.namespace:
            return False
        return watch.match(obj)

    def put(self, kind_name: str, obj: JSON) -> JSON:
        """Create or replace an object directly (for tests); returns the stored copy."""
        kind = next(k for k in self.kinds if k.name == kind_name)
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if kind.namespaced:
            meta.setdefault("namespace", "default")
        key = self._key(kind, meta.get("namespace"), meta["name"])
        existed = key in self.objects[kind.store]
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        meta.setdefault("uid", f"uid-{kind.plural}-{meta['name']}-{self.rv}")
        meta.setdefault("creationTimestamp", _now())
        meta.setdefault("generation", 1)
        obj.setdefault("apiVersion", kind.api_version)
        obj.setdefault("kind", kind.kind)
        self.objects[kind.store][key] = obj
        self._record(kind, "MODIFIED" if existed else "ADDED", obj)
        return copy.deepcopy(obj)

    def remove(self, kind_name: str, name: str, namespace: str | None = None) -> JSON | None:
        kind = next(k for k in self.kinds if k.name == kind_name)
        obj = self.objects[kind.store].pop(self._key(kind, namespace, name), None)
        if obj is not None:
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self._record(kind, "DELETED", obj)
        return obj

    def namespace(self, name: str) -> None:
        """Create namespace ``name`` unless it exists."""
        if self.get("Namespace", name) is None:
            self.put("Namespace", {"metadata": {"name": name}})

    def get(self, kind_name: str, name: str, namespace: str | None = None) -> JSON | None:
        if kind_name == "EventsV1":  # a view of the core/v1 store
            found = self.get("Event", name, namespace)
            return eventsview.from_core(found) if found is not None else None
        kind = next(k for k in self.kinds if k.name == kind_name)
        obj = self.objects[kind.store].get(self._key(kind, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def all(self, kind_name: str) -> list[JSON]:
        if kind_name == "EventsV1":  # a view of the core/v1 store
            return [eventsview.from_core(e) for e in self.all("Event")]
        kind = next(k for k in self.kinds if k.name == kind_name)
        return [copy.deepcopy(o) for o in self.objects[kind.store].values()]

    # ------------------------------------------------------------------ handlers

    def _discovery(self, group_version: str) -> Callable[[web.Request], Any]:
        """``GET /apis/GROUP/VERSION``: the ``APIResourceList`` of the kinds served there."""
        served = [k for k in self.kinds if k.api_version == group_version]

        async def handle(request: web.Request) -> web.Response:
            resources = [
                {"name": k.plural, "kind": k.kind, "namespaced": k.namespaced} for k in served
            ]
            return web.json_response(
                {
                    "kind": "APIResourceList",
                    "apiVersion": "v1",
                    "groupVersion": group_version,
                    "resources": resources,
                }
            )

        return handle

    def _handler(self, kind: Kind, verb: str) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.StreamResponse:
            namespace = request.match_info.get("namespace")
            name = request.match_info.get("name", "")
            if kind.name == "EventsV1":
                return await self._events_v1(request, verb, namespace, name)
            if verb == "list":
                if request.query.get("watch", "").lower() in ("true", "1"):
                    return await self._watch(request, kind, namespace)
                return self._list(request, kind, namespace)
            if verb == "get":
                obj = self.objects[kind.store].get(self._key(kind, namespace, name))
                if obj is None:
                    return status(404, "NotFound", f'{kind.plural} "{name}" not found')
                return web.json_response(obj)
            try:
                body = await request.json() if request.can_read_body else {}
            except json.JSONDecodeError:
                return status(400, "BadRequest", "the body is not JSON")
            if verb in ("patch", "status"):
                return self._patch(kind, verb, namespace, name, request.content_type, body)
            if verb == "delete":
                grace = request.query.get("gracePeriodSeconds")
                if grace is None and isinstance(body, dict):
                    grace = body.get("gracePeriodSeconds")
                return self._delete(kind, namespace, name, None if grace is None else int(grace))
            if not isinstance(body, dict):
                return status(400, "BadRequest", "the body is not a JSON object")
            return self._write(kind, verb, namespace, name, body)

        return handle

    async def _events_v1(
        self, request: web.Request, verb: str, namespace: str | None, name: str
    ) -> web.StreamResponse:
        """``events.k8s.io/v1``: the core/v1 Event store seen through it, and written
        through it with v1.37's validation (``tests/kube/eventsview.py``)."""
        store = self.objects["events"]
        if verb == "list":
            if request.query.get("watch", "").lower() in ("true", "1"):
                return status(405, "MethodNotAllowed", "watch of events.k8s.io: not served here")
            items = [
                eventsview.from_core(o)
                for o in store.values()
                if namespace is None or o["metadata"].get("namespace") == namespace
            ]
            return web.json_response(
                {
                    "kind": "EventList",
                    "apiVersion": eventsview.GROUP_VERSION,
                    "metadata": {"resourceVersion": str(self.rv)},
                    "items": items,
                }
            )
        current = store.get(("" if namespace is None else namespace, name))
        if verb == "get":
            if current is None:
                return status(404, "NotFound", f'events.events.k8s.io "{name}" not found')
            return web.json_response(eventsview.from_core(current))
        if verb == "delete":
            gone = self.remove("Event", name, namespace)
            if gone is None:
                return status(404, "NotFound", f'events.events.k8s.io "{name}" not found')
            return web.json_response(eventsview.from_core(gone))
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return status(400, "BadRequest", "the body is not JSON")
        if verb == "create":
            meta = {**(body.get("metadata") or {}), "namespace": namespace}
            meta.pop("uid", None)
            if not meta.get("name"):
                return status(422, "Invalid", "metadata.name: Required value")
            errors = eventsview.create_errors(body, namespace or "")
            if errors:
                return status(
                    422,
                    "Invalid",
                    f'Event.events.k8s.io "{meta["name"]}" is invalid: ' + "; ".join(errors),
                )
            if (namespace, meta["name"]) in store:
                return status(
                    409, "AlreadyExists", f'events.events.k8s.io "{meta["name"]}" already exists'
                )
            core = {**eventsview.to_core(body), "metadata": meta}
            return web.json_response(eventsview.from_core(self.put("Event", core)), status=201)
        if verb != "patch":
            return status(405, "MethodNotAllowed", f"{verb} is not supported here")
        if current is None:
            return status(404, "NotFound", f'events.events.k8s.io "{name}" not found')
        try:
            patched = apply_patch(
                request.content_type, eventsview.from_core(current), body, core=True
            )
        except PatchError as exc:
            return status(exc.code, exc.reason, exc.message)
        core = eventsview.to_core(patched)
        core["metadata"] = {
            **(patched.get("metadata") or {}),
            **{
                k: v
                for k, v in current["metadata"].items()
                if k in ("name", "namespace", "uid", "creationTimestamp")
            },
        }
        errors = eventsview.update_errors(core, current, namespace or "")
        if errors:
            return status(
                422, "Invalid", f'Event.events.k8s.io "{name}" is invalid: ' + "; ".join(errors)
            )
        return web.json_response(eventsview.from_core(self.put("Event", core)))

    def _list(self, request: web.Request, kind: Kind, namespace: str | None) -> web.Response:
        try:
            match = _selector(request.query.get("fieldSelector"))
        except ValueError as exc:
            return status(400, "BadRequest", str(exc))
        items = [
            o
            for o in self.objects[kind.store].values()
            if (namespace is None or o["metadata"].get("namespace") == namespace) and match(o)
        ]
        return web.json_response(
            {
                "kind": f"{kind.kind}List",
                "apiVersion": kind.api_version,
                "metadata": {"resourceVersion": str(self.rv)},
                "items": items,
            }
        )

    def _namespace_exists(self, name: str) -> bool:
        return name in BUILT_IN_NAMESPACES or ("", name) in self.objects["namespaces"]

    def _write(
        self, kind: Kind, verb: str, namespace: str | None, name: str, body: JSON
    ) -> web.Response:
        store = self.objects[kind.store]
        if verb == "create":
            meta = body.get("metadata") or {}
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = f"{meta['generateName']}{self.rv + 1:x}"
            if not meta.get("name"):
                return status(422, "Invalid", "metadata.name: Required value")
            if kind.namespaced:
                meta["namespace"] = namespace
                if self.check_namespaces and not self._namespace_exists(namespace or ""):
                    return status(
                        404,
                        "NotFound",
                        f'namespaces "{namespace}" not found',
                        details={"name": namespace, "kind": "namespaces"},
                    )
            if kind.kind == "Event":
                involved = (body.get("involvedObject") or {}).get("namespace")
                if involved and involved != namespace:
                    return status(
                        422,
                        "Invalid",
                        f'Event "{meta["name"]}" is invalid: involvedObject.namespace: '
                        f"Invalid value: {involved!r}: does not match event.namespace",
                    )
                errors = eventsview.legacy_errors(body, namespace or "")
                if errors:
                    why = "; ".join(errors)
                    return status(422, "Invalid", f'Event "{meta["name"]}" is invalid: {why}')
            meta.pop("uid", None)  # the server's to give
            if self._key(kind, namespace, meta["name"]) in store:
                return status(
                    409, "AlreadyExists", f'{kind.plural} "{meta["name"]}" already exists'
                )
            body["metadata"] = meta
            return web.json_response(self.put(kind.name, body), status=201)
        key = self._key(kind, namespace, name)
        current = store.get(key)
        if current is None:
            return status(404, "NotFound", f'{kind.plural} "{name}" not found')
        if verb == "replace":
            stated = (body.get("metadata") or {}).get("resourceVersion")
            if stated and stated != current["metadata"]["resourceVersion"]:
                return status(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {kind.plural} "{name}": '
                    "the object has been modified; please apply your changes to the latest version",
                )
            body.setdefault("metadata", {})["uid"] = current["metadata"].get("uid")
            return web.json_response(self.put(kind.name, body))
        return status(405, "MethodNotAllowed", f"{verb} is not supported")

    def _patch(
        self,
        kind: Kind,
        verb: str,
        namespace: str | None,
        name: str,
        content_type: str,
        body: Any,
    ) -> web.Response:
        """PATCH of the object (``verb == "patch"``: its status is kept) or of its status
        subresource (only the status changes)."""
        current = self.objects[kind.store].get(self._key(kind, namespace, name))
        if current is None:
            return status(404, "NotFound", f'{kind.plural} "{name}" not found')
        try:
            patched = apply_patch(content_type, current, body, core=kind.built_in)
        except PatchError as exc:
            return status(exc.code, exc.reason, exc.message)
        if not isinstance(patched, dict):
            return status(422, "Invalid", "the patched object is not an object")
        if verb == "status":
            result = copy.deepcopy(current)
            result["status"] = patched.get("status") or {}
        else:
            result = patched
            result["metadata"] = {**(patched.get("metadata") or {})}
            for field in ("name", "namespace", "uid", "creationTimestamp"):
                if field in current["metadata"]:
                    result["metadata"][field] = current["metadata"][field]
                else:
                    result["metadata"].pop(field, None)
            if kind.kind in ("Pod", "Node", "PodGroup", "ElasticQuota"):
                result["status"] = copy.deepcopy(current.get("status") or {})
        return web.json_response(self.put(kind.name, result))

    def _delete(
        self, kind: Kind, namespace: str | None, name: str, grace: int | None
    ) -> web.Response:
        """Delete an object; a pod bound to a node and not finished gracefully (it gets a
        ``deletionTimestamp`` and stays until deleted with a grace period of 0)."""
        current = self.objects[kind.store].get(self._key(kind, namespace, name))
        if current is None:
            return status(404, "NotFound", f'{kind.plural} "{name}" not found')
        if kind.kind == "Pod":
            spec = current.get("spec") or {}
            if grace is None:
                grace = spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
            phase = (current.get("status") or {}).get("phase")
            if spec.get("nodeName") and phase not in ("Succeeded", "Failed") and grace:
                meta = current["metadata"]
                if meta.get("deletionTimestamp"):
                    return web.json_response(copy.deepcopy(current))
                terminating = copy.deepcopy(current)
                when = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=grace)
                terminating["metadata"]["deletionTimestamp"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
                terminating["metadata"]["deletionGracePeriodSeconds"] = grace
                return web.json_response(self.put("Pod", terminating))
        return web.json_response(self.remove(kind.name, name, namespace))

    async def _watch(
        self, request: web.Request, kind: Kind, namespace: str | None
    ) -> web.StreamResponse:
        try:
            match = _selector(request.query.get("fieldSelector"))
        except ValueError as exc:
            return status(400, "BadRequest", str(exc))
        timeout = float(request.query.get("timeoutSeconds") or 1800)
        bookmarks = request.query.get("allowWatchBookmarks", "").lower() in ("true", "1")
        since = request.query.get("resourceVersion") or "0"
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        watch = _Watch(kind, namespace, match, asyncio.Queue())

        async def send(event: str, obj: JSON) -> None:
            line = json.dumps({"type": event, "object": obj}) + "\n"
            await response.write(line.encode())

        if since == "0":
            for obj in list(self.objects[kind.store].values()):
                if self._visible(watch, obj):
                    await send("ADDED", obj)
        else:
            start = int(since)
            if start < self._oldest - 1 or start > self.rv:
                await send(
                    "ERROR",
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Failure",
                        "message": f"too old resource version: {start} ({self._oldest})",
                        "reason": "Expired",
                        "code": 410,
                    },
                )
                return response
            for rv, k, event, obj in list(self._history):
                if k is kind and rv > start and self._visible(watch, obj):
                    await send(event, obj)
        self._watches.append(watch)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    if bookmarks:
                        await send(
                            "BOOKMARK",
                            {
                                "kind": kind.kind,
                                "apiVersion": kind.api_version,
                                "metadata": {"resourceVersion": str(self.rv)},
                            },
                        )
                    break
                try:
                    item = await asyncio.wait_for(watch.queue.get(), left)
                except TimeoutError:
                    continue
                if item is None:  # dropped: end the stream without a clean close
                    if request.transport is not None:
                        request.transport.close()
                    return response
                await send(*item)
        finally:
            if watch in self._watches:
                self._watches.remove(watch)
        return response

    async def _binding(self, request: web.Request) -> web.Response:
        self.bindings_in_flight += 1
        self.bindings_at_once = max(self.bindings_at_once, self.bindings_in_flight)
        try:
            if self.binding_seconds:
                await asyncio.sleep(self.binding_seconds)
            name = request.match_info["name"]
            if name in self.held_bindings:  # a slow answer: until others are bound
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 30
                while len(self.bound_order) < self.held_bindings[name] and loop.time() < deadline:
                    await asyncio.sleep(0.01)
            response = await self._bind(request)
            if response.status == 201:
                self.bound_order.append(name)
            return response
        finally:
            self.bindings_in_flight -= 1

    async def _bind(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        pod = self.objects["pods"].get((namespace, name))
        if pod is None:
            return status(404, "NotFound", f'pods "{name}" not found')
        try:
            body = await request.json()
            target = body["target"]["name"]
            wanted_uid = (body.get("metadata") or {}).get("uid")
            annotations = (body.get("metadata") or {}).get("annotations") or {}
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            return status(400, "BadRequest", "a Binding needs target.name")
        if not isinstance(annotations, dict) or not all(
            isinstance(v, str) for v in annotations.values()
        ):
            return status(400, "BadRequest", "metadata.annotations of a Binding must be strings")
        uid = pod["metadata"].get("uid")
        if wanted_uid and wanted_uid != uid:
            return status(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods/binding "{name}": Precondition failed: '
                f"UID in precondition: {wanted_uid}, UID in object meta: {uid}",
            )
        if pod["metadata"].get("deletionTimestamp"):
            return status(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is being '
                "deleted, cannot be assigned to a host",
            )
        bound = (pod.get("spec") or {}).get("nodeName")
        if bound:
            return status(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is already '
                f'assigned to node "{bound}"',
            )
        pod = copy.deepcopy(pod)
        pod.setdefault("spec", {})["nodeName"] = target
        if annotations:
            pod["metadata"]["annotations"] = {
                **(pod["metadata"].get("annotations") or {}),
                **annotations,
            }
        self.put("Pod", pod)
        return created()

    async def _eviction(self, request: web.Request) -> web.Response:
        """``pods/eviction`` as v1.37's ``EvictionREST.Create`` (see the module's doc)."""
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        try:
            body = await request.json()
            named = (body.get("metadata") or {}).get("name")
        except (json.JSONDecodeError, AttributeError):
            return status(400, "BadRequest", "an Eviction needs metadata.name")
        if named != name:
            return status(400, "BadRequest", "name in URL does not match name in Eviction object")
        pod = self.objects["pods"].get((namespace, name))
        if pod is None:
            return status(404, "NotFound", f'pods "{name}" not found')
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        if phase in ("Pending", "Succeeded", "Failed") or pod["metadata"].get("deletionTimestamp"):
            self._delete(_POD, namespace, name, None)
            return created()
        labels = pod["metadata"].get("labels") or {}
        budgets = [
            b
            for (ns, _), b in self.objects["poddisruptionbudgets"].items()
            if ns == namespace and _selects((b.get("spec") or {}).get("selector"), labels)
        ]
        if len(budgets) > 1:
            return status(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, which the eviction "
                "subresource does not support.",
            )
        if budgets:
            refusal = self._take_disruption(budgets[0], pod)
            if refusal is not None:
                return refusal
        self._delete(_POD, namespace, name, None)
        return created()

    def _take_disruption(self, budget: JSON, pod: JSON) -> web.Response | None:
        """Check and decrement ``budget`` for evicting ``pod``, or the 429 that refuses."""
        budget_name = budget["metadata"]["name"]
        state = budget.get("status") or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (pod.get("status") or {}).get("conditions") or []
        )
        desired = int(state.get("desiredHealthy") or 0)
        if not ready and int(state.get("currentHealthy") or 0) >= desired > 0:
            return None
        message = "Cannot evict pod as it would violate the pod's disruption budget."
        if int(state.get("observedGeneration") or 0) < int(budget["metadata"].get("generation", 1)):
            why = f"The disruption budget {budget_name} is still being processed by the server."
            return status(
                429, "TooManyRequests", message, [{"type": "DisruptionBudget", "message": why}]
            )
        allowed = int(state.get("disruptionsAllowed") or 0)
        if allowed < 0:
            return status(403, "Forbidden", "pdb disruptions allowed is negative")
        if allowed == 0:
            why = (
                f"The disruption budget {budget_name} needs {desired} healthy pods and has "
                f"{int(state.get('currentHealthy') or 0)} currently"
            )
            return status(
                429, "TooManyRequests", message, [{"type": "DisruptionBudget", "message": why}]
            )
        budget = copy.deepcopy(budget)
        state = budget.setdefault("status", {})
        state["disruptionsAllowed"] = allowed - 1
        state.setdefault("disruptedPods", {})[pod["metadata"]["name"]] = _now()
        self.put("PodDisruptionBudget", budget)
        return None


_POD = next(k for k in KINDS if k.kind == "Pod")


def _selects(selector: Any, labels: dict[str, str]) -> bool:
    """A label selector (``matchLabels`` and ``matchExpressions``) matches ``labels``."""
    if not isinstance(selector, dict):
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True
