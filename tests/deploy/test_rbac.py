"""deploy/rbac.yaml grants each component exactly the API calls its code makes.

The calls are read from the code, not from a list kept by hand: every kubernetes-asyncio
API method that ``shards/kube/`` names (called, or handed on, as ingest hands its list
functions to a reflector) is looked up in kubernetes-asyncio's generated client, whose
source holds the HTTP method and path of each; the path and method give the RBAC
attributes the way the API server's request-info resolver does (``GET`` of a
collection is ``list``, and also ``watch`` where the module watches with it (a
``Watch`` stream, or a call with ``watch=True``); ``PUT`` is
``update``; a path segment after the object's name is a subresource). The only hand
kept tables are which modules each component runs (checked against ``shards/serve.py``)
and the calls that the metrics proxy, not shoal, makes.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from tests.deploy.test_manifests import DEPLOY, ROOT, render

Rule = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)
API_CLASSES = [client.CoreV1Api, client.CustomObjectsApi, client.SchedulingV1Api]
API_CLASSES += [client.CoordinationV1Api, client.PolicyV1Api]
VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}

MODULES = {
    "ingest": [
        "shards/kube/ingest.py",
        "shards/kube/reflector.py",
        "shards/kube/groups.py",
        "shards/kube/draingest.py",
        "shards/kube/lease.py",
    ],
    "binder": [
        "shards/kube/binder.py",
        "shards/kube/evicting.py",
        "shards/kube/telling.py",
        "shards/kube/recorder.py",
        "shards/kube/groupstatus.py",
        "shards/kube/drabinder.py",
        "shards/kube/lease.py",
    ],
    "coordinator": ["shards/kube/lease.py"],
    "shard": [],
}
"""What each ``shoal serve --role`` runs that talks to the API server: the reflectors
(ingest), the binder, and the Lease every led role holds (shards/serve.py)."""
NOT_DEPLOYED = {
    "shards/extenders/server.py": {("", "pods/binding", "create")},
}
"""Modules that call the API and that ``deploy/`` does not run, with the calls they make
(the README says which permissions to give them): ``shoal extender`` runs beside a
kube-scheduler, with the kubeconfig it is given, and binds the gangs it holds."""

PROXY_CALLS: set[Rule] = {
    ("authentication.k8s.io", "tokenreviews", "create"),
    ("authorization.k8s.io", "subjectaccessreviews", "create"),
}
"""kube-rbac-proxy, beside every process: who is scraping, and may they GET /metrics."""
SYNTHETIC: dict[str, set[Rule]] = {
    "binder": {("resource.k8s.io", "resourceclaims/binding", "update")},
}
"""Permissions no call names, which the API server checks beside a call's own: from
v1.36 (``DRAResourceClaimGranularStatusAuthorization``) an update of a ResourceClaim's
status that changes ``allocation`` or ``reservedFor`` also needs ``update`` of the
synthetic subresource ``resourceclaims/binding`` (what kube-scheduler is granted)."""


def _method(name: str) -> Any | None:
    for cls in API_CLASSES:
        if name.endswith("_with_http_info"):
            continue
        found = getattr(cls, f"{name}_with_http_info", None)
        if found is not None:
            return found
    return None


def _endpoint(method_name: str) -> tuple[str, str]:
    """(HTTP method, path template) of a generated API method, from its source."""
    source = inspect.getsource(_method(method_name))
    match = re.search(r"call_api\(\s*'([^']+)',\s*'([A-Z]+)'", source)
    assert match, f"no call_api in kubernetes-asyncio's {method_name}"
    return match.group(2), match.group(1)


def rules_of(method: str, path: str, params: dict[str, str], watched: bool) -> set[Rule]:
    """The RBAC attributes of a request, as the API server's request-info resolver
    derives them from its method and path."""
    parts = [params.get(p[1:-1], p) if p.startswith("{") else p for p in path.split("/") if p]
    if parts[0] == "api":
        group, rest = "", parts[2:]
    else:
        assert parts[0] == "apis", path
        group, rest = parts[1], parts[3:]
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]  # namespaced: the namespace is not a resource attribute
    resource, named = rest[0], len(rest) > 1
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    assert "{" not in group + resource, f"{path}: {group}/{resource} not resolved from the call"
    verb = VERBS[method]
    if method == "GET" and not named:
        verb = "list"
    if method == "DELETE" and not named:
        verb = "deletecollection"
    found = {(group, resource, verb)}
    if verb == "list" and watched:
        found.add((group, resource, "watch"))
    return found


def _constant_args(tree: ast.AST, function: str, position: int) -> list[str]:
    """The constant values a module passes to ``function`` at ``position``."""
    return [
        node.args[position].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == function
        and len(node.args) > position
        and isinstance(node.args[position], ast.Constant)
    ]


def watches(source: str) -> bool:
    """A module watches with its list calls: kubernetes-asyncio's Watch, or a raw call
    with watch=True (ingest's reflectors read their watch streams raw)."""
    return (".stream(" in source and "Watch" in source) or any(
        isinstance(node, ast.keyword)
        and node.arg == "watch"
        and isinstance(node.value, ast.Constant)
        and node.value.value is True
        for node in ast.walk(ast.parse(source))
    )


def calls_in(source: str, watched: bool = False) -> set[Rule]:
    """The RBAC attributes of every API method ``source`` names (its list calls also
    watch where ``watched``, or where it watches itself)."""
    tree = ast.parse(source)
    watched = watched or watches(source)
    parents: dict[ast.AST, ast.AST] = {
        child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)
    }
    found: set[Rule] = set()
    for node in ast.walk(tree):
        # a raw call of a path the client has no method for (policy/v1beta1)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "call_api"
            and len(node.args) >= 2
            and all(isinstance(a, ast.Constant) for a in node.args[:2])
        ):
            raw_path, raw_method = (a.value for a in node.args[:2])  # type: ignore[attr-defined]
            found |= rules_of(raw_method, raw_path, {}, watched)
        if not isinstance(node, ast.Attribute) or _method(node.attr) is None:
            continue
        http, path = _endpoint(node.attr)
        names = re.findall(r"\{(\w+)\}", path)
        call = parents.get(node)
        args = call.args if isinstance(call, ast.Call) and call.func is node else []
        choices: list[dict[str, str]] = [{}]
        for i, arg in enumerate(args[: len(names)]):
            if names[i] in ("namespace", "name"):
                continue  # not an RBAC resource attribute (names: checked apart)
            if isinstance(arg, ast.Constant):
                values = [arg.value]
            else:
                # a parameter of the enclosing function: the constants its callers pass
                assert isinstance(arg, ast.Name), ast.dump(arg)
                owner = next(
                    f
                    for f in ast.walk(tree)
                    if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                    and arg.id in [a.arg for a in f.args.args]
                    and any(n is node for n in ast.walk(f))
                )
                position = [a.arg for a in owner.args.args].index(arg.id)
                values = _constant_args(tree, owner.name, position)
                assert values, f"{owner.name}({arg.id}) is never called with a constant"
            choices = [{**c, names[i]: v} for c in choices for v in values]
        for params in choices:
            found |= rules_of(http, path, params, watched)
    return found


def needed(component: str) -> set[Rule]:
    """The calls of a component's modules; a list call also watches where any of them
    watches (ingest's reflectors watch with the list calls ingest hands them)."""
    sources = [(ROOT / module).read_text() for module in MODULES[component]]
    watched = any(watches(source) for source in sources)
    return {rule for source in sources for rule in calls_in(source, watched)}


def granted(docs: list[dict[str, Any]], account: str) -> tuple[set[Rule], list[dict[str, Any]]]:
    """What the ServiceAccount ``account`` is granted, and the rules that grant it."""
    roles = {
        (d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in ("Role", "ClusterRole")
    }
    rules: list[dict[str, Any]] = []
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if any(s["kind"] == "ServiceAccount" and s["name"] == account for s in binding["subjects"]):
            ref = binding["roleRef"]
            rules.extend(roles[(ref["kind"], ref["name"])]["rules"])
    return _expand(rules), rules


def _expand(rules: Iterable[dict[str, Any]]) -> set[Rule]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule["verbs"]
    }


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    return render(DEPLOY)


def _workloads(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """component → pod spec."""
    return {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d["spec"]["template"]["spec"]
        for d in docs
        if d["kind"] in ("Deployment", "StatefulSet")
    }


@pytest.mark.parametrize("component", sorted(MODULES))
def test_each_component_is_granted_exactly_the_calls_its_code_makes(
    docs: list[dict[str, Any]], component: str
) -> None:
    account = _workloads(docs)[component]["serviceAccountName"]
    assert account == f"shoal-{component}", "one ServiceAccount per component"
    have, rules = granted(docs, account)
    want = needed(component) | PROXY_CALLS | SYNTHETIC.get(component, set())
    assert have == want, f"{component}: missing {want - have}, not needed {have - want}"
    for rule in rules:
        assert "nonResourceURLs" not in rule, f"{component}: {rule}"
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule.get(key, []), f"{component}: a wildcard in {rule}"


def test_the_calls_read_from_the_code_are_the_ones_expected() -> None:
    """What the derivation finds today, spelt out: a reader sees what each component
    is allowed, and a change in the code shows up here as well as in the grants."""
    lease = {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")}
    watched = {
        (g, r, v)
        for g, r in [
            ("", "nodes"),
            ("", "pods"),
            ("scheduling.k8s.io", "priorityclasses"),
            ("scheduling.x-k8s.io", "podgroups"),
            ("scheduling.k8s.io", "podgroups"),
            ("scheduling.volcano.sh", "podgroups"),
            ("scheduling.run.ai", "podgroups"),
            ("batch.scheduler.tencent.com", "podgroups"),
            ("scheduling.x-k8s.io", "elasticquotas"),
            ("policy", "poddisruptionbudgets"),
            ("resource.k8s.io", "resourceslices"),
            ("resource.k8s.io", "deviceclasses"),
            ("resource.k8s.io", "resourceclaims"),
        ]
        for v in ("list", "watch")
    }
    assert needed("ingest") == watched | lease
    assert needed("binder") == lease | {
        ("", "pods", "get"),
        ("", "pods/binding", "create"),
        ("", "pods/eviction", "create"),
        ("", "events", "create"),
        ("", "events", "patch"),
        ("events.k8s.io", "events", "create"),
        ("events.k8s.io", "events", "patch"),
        ("", "pods/status", "patch"),
        ("scheduling.x-k8s.io", "podgroups/status", "patch"),
        ("scheduling.k8s.io", "podgroups", "get"),
        ("scheduling.k8s.io", "podgroups/status", "patch"),
        ("resource.k8s.io", "resourceclaims", "get"),
        ("resource.k8s.io", "deviceclasses", "get"),
        ("resource.k8s.io", "resourceclaims/status", "update"),
    }
    assert needed("coordinator") == lease
    assert needed("shard") == set()


def test_the_derivation_sees_a_new_call() -> None:
    source = """
from kubernetes_asyncio import client
async def f(api, name, ns):
    core = client.CoreV1Api(api)
    await core.delete_namespaced_pod(name, ns)
    await core.patch_node_status(name, {})
    await client.CustomObjectsApi(api).list_namespaced_custom_object("g.io", "v1", ns, "things")
"""
    assert calls_in(source) == {
        ("", "pods", "delete"),
        ("", "nodes/status", "patch"),
        ("g.io", "things", "list"),
    }


def test_every_module_that_calls_the_api_belongs_to_a_component() -> None:
    listed = {m for modules in MODULES.values() for m in modules}
    for path in sorted((ROOT / "shards").rglob("*.py")):
        module = str(path.relative_to(ROOT))
        if module not in listed:
            assert calls_in(path.read_text()) == NOT_DEPLOYED.get(module, set()), (
                f"{module} calls the API: give it a component"
            )


def _strings(node: ast.AST) -> set[str]:
    return {
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def _guards(tree: ast.AST, function: str) -> list[set[str]]:
    """For each call of ``function``: the role names in the conditions and loops
    around it (an ``if`` on a set of roles, a ``for role in (...)``)."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == function
        ):
            names: set[str] = set()
            up: ast.AST | None = node
            while up is not None:
                if isinstance(up, ast.If):
                    names |= _strings(up.test)
                elif isinstance(up, ast.For):
                    names |= _strings(up.iter)
                up = parents.get(up)
            found.append(names & {"ingest", "binder", "coordinator", "shard", "all"})
    return found


def test_the_roles_that_call_the_api_are_the_ones_serve_gives_a_client() -> None:
    """serve.py creates an API client, and a Lease named shoal-ROLE, for ingest, binder
    and coordinator only: a shard never gets one."""
    tree = ast.parse((ROOT / "shards" / "serve.py").read_text())
    clients, electors = _guards(tree, "api_client"), _guards(tree, "LeaderElector")
    assert clients and electors, "serve.py no longer calls api_client/LeaderElector"
    for roles in clients + electors:
        assert roles == {"ingest", "binder", "coordinator"}, roles
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "LeaderElector":
            name = next(k.value for k in node.keywords if k.arg == "name")
            assert isinstance(name, ast.JoinedStr), "the Lease name is shoal-ROLE"
            assert ast.unparse(name) == "f'shoal-{role}'"
    assert {c for c, modules in MODULES.items() if modules} == {"ingest", "binder", "coordinator"}


@pytest.mark.parametrize("component", ["ingest", "binder", "coordinator"])
def test_a_component_reads_and_renews_only_its_own_lease(
    docs: list[dict[str, Any]], component: str
) -> None:
    _, rules = granted(docs, f"shoal-{component}")
    for rule in rules:
        if "leases" in rule.get("resources", []):
            if set(rule["verbs"]) & {"get", "update", "patch", "delete"}:
                assert rule.get("resourceNames") == [f"shoal-{component}"], rule
            else:
                # create cannot be limited by name: the object does not exist yet
                assert rule["verbs"] == ["create"], rule
    roles = [d for d in docs if d["kind"] == "Role"]
    assert all(r["metadata"]["name"].endswith("-lease") for r in roles), "leases only"


@pytest.mark.parametrize("component", sorted(MODULES))
def test_no_component_may_rewrite_a_pod(docs: list[dict[str, Any]], component: str) -> None:
    """A grant to patch or update pods would let its holder change a running pod's
    image in any namespace: the binder's GPU cards travel on the Binding instead."""
    have, _ = granted(docs, f"shoal-{component}")
    for verb in ("patch", "update", "delete", "deletecollection"):
        assert ("", "pods", verb) not in have, f"{component} may {verb} pods"


def test_a_shard_has_no_token_and_no_api_access(docs: list[dict[str, Any]]) -> None:
    account = next(
        d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "shoal-shard"
    )
    assert account["automountServiceAccountToken"] is False
    pod = _workloads(docs)["shard"]
    assert pod["automountServiceAccountToken"] is False
    shoal = next(c for c in pod["containers"] if c["name"] == "shoal")
    token_volumes = {
        v["name"]
        for v in pod.get("volumes", [])
        if any("serviceAccountToken" in s for s in v.get("projected", {}).get("sources", []))
    }
    assert not {m["name"] for m in shoal.get("volumeMounts", [])} & token_volumes
    have, _ = granted(docs, "shoal-shard")
    assert have == PROXY_CALLS, "only its metrics proxy's reviews"


def test_the_scrape_permission_is_not_held_by_shoal(docs: list[dict[str, Any]]) -> None:
    reader = next(d for d in docs if d["metadata"]["name"] == "shoal-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    for binding in docs:
        if binding["kind"].endswith("Binding"):
            assert binding["roleRef"]["name"] != "shoal-metrics-reader"


def test_the_kube_modules_exist() -> None:
    for modules in MODULES.values():
        for module in modules:
            assert Path(ROOT / module).is_file(), module
