"""What the in-repo API server answers, through the real client: the same answers the
real kube-apiserver gives (these were the differences that hid bugs)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from shards.kube.recorder import AS_MERGE_PATCH
from tests.kube.apiserver import FakeApiServer
from tests.kube.patch import json_patch, merge_patch
from tests.kube.test_ingest import pod

GROUP = ("scheduling.x-k8s.io", "v1alpha1")


def _group(apiserver: FakeApiServer) -> None:
    apiserver.put(
        "PodGroup",
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "metadata": {"name": "g", "namespace": "default"},
            "spec": {"minMember": 2},
        },
    )


@pytest.mark.real_kube
async def test_a_dict_sent_as_json_patch_is_refused_as_the_real_server_does(
    apiserver: FakeApiServer, api: Any
) -> None:
    """The client sends a dict to a custom resource's status as a JSON Patch unless told
    otherwise; the real server answers 400, and so does this one."""
    _group(apiserver)
    custom = client.CustomObjectsApi(api)
    with pytest.raises(ApiException) as refused:
        await custom.patch_namespaced_custom_object_status(
            *GROUP, "default", "podgroups", "g", {"status": {"phase": "Running"}}
        )
    assert refused.value.status == 400
    assert json.loads(refused.value.body)["message"] == (
        "error decoding patch: json: cannot unmarshal object into Go value of type "
        "[]handlers.jsonPatchOp"
    )
    await custom.patch_namespaced_custom_object_status(
        *GROUP, "default", "podgroups", "g", {"status": {"phase": "Running"}}, **AS_MERGE_PATCH
    )
    await custom.patch_namespaced_custom_object_status(
        *GROUP,
        "default",
        "podgroups",
        "g",
        [{"op": "add", "path": "/status/scheduled", "value": 2}],
    )
    found = apiserver.get("PodGroup", "g", "default")
    assert found["status"] == {"phase": "Running", "scheduled": 2}
    assert found["spec"] == {"minMember": 2}  # a status patch changes nothing else


@pytest.mark.real_kube
async def test_strategic_merge_patch_is_for_core_kinds_only(
    apiserver: FakeApiServer, api: Any
) -> None:
    _group(apiserver)
    apiserver.put("Pod", pod("p"))
    core = client.CoreV1Api(api)
    await core.patch_namespaced_pod_status(
        "p", "default", {"status": {"nominatedNodeName": "n1"}}
    )  # a dict to a core kind goes as a strategic merge patch
    patched = apiserver.get("Pod", "p", "default")["status"]
    assert patched["phase"] == "Pending" and patched["nominatedNodeName"] == "n1"
    custom = client.CustomObjectsApi(api)
    with pytest.raises(ApiException) as refused:
        await custom.patch_namespaced_custom_object_status(
            *GROUP,
            "default",
            "podgroups",
            "g",
            {"status": {}},
            _content_type="application/strategic-merge-patch+json",
        )
    assert refused.value.status == 415


@pytest.mark.real_kube
async def test_evicting_a_running_pod_honours_its_disruption_budget(
    apiserver: FakeApiServer, api: Any
) -> None:
    running = pod("db-0", node_name="n1", labels={"app": "db"})
    running["status"] = {"phase": "Running"}
    apiserver.put("Pod", running)
    apiserver.put(
        "PodDisruptionBudget",
        {
            "metadata": {"name": "db", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "db"}}, "minAvailable": 1},
        },
    )  # no disruption controller has looked at it yet
    core = client.CoreV1Api(api)
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name="db-0", namespace="default"))
    with pytest.raises(ApiException) as refused:
        await core.create_namespaced_pod_eviction("db-0", "default", body)
    assert refused.value.status == 429
    budget = apiserver.get("PodDisruptionBudget", "db", "default")
    budget["status"] = {"observedGeneration": 1, "disruptionsAllowed": 0, "desiredHealthy": 1}
    apiserver.put("PodDisruptionBudget", budget)
    with pytest.raises(ApiException) as refused:
        await core.create_namespaced_pod_eviction("db-0", "default", body)
    assert refused.value.status == 429
    budget["status"]["disruptionsAllowed"] = 1
    apiserver.put("PodDisruptionBudget", budget)
    await core.create_namespaced_pod_eviction("db-0", "default", body)
    evicted = apiserver.get("Pod", "db-0", "default")
    assert evicted["metadata"]["deletionTimestamp"]  # terminating, not gone: no kubelet here
    assert (
        apiserver.get("PodDisruptionBudget", "db", "default")["status"]["disruptionsAllowed"] == 0
    )


@pytest.mark.real_kube
async def test_an_event_must_be_in_its_objects_namespace(
    apiserver: FakeApiServer, api: Any
) -> None:
    core = client.CoreV1Api(api)
    event = client.CoreV1Event(
        metadata=client.V1ObjectMeta(name="e", namespace="default"),
        involved_object=client.V1ObjectReference(kind="Pod", name="p", namespace="other"),
        reason="FailedScheduling",
        message="no",
    )
    with pytest.raises(ApiException) as refused:
        await core.create_namespaced_event("default", event)
    assert refused.value.status == 422


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=3),
    lambda inner: st.dictionaries(st.sampled_from("abc"), inner, max_size=3),
    max_leaves=8,
)


@given(_json, st.dictionaries(st.sampled_from("abc"), _json, max_size=3))
def test_merge_patch_sets_what_it_names_and_keeps_the_rest(target: Any, patch: Any) -> None:
    result = merge_patch(target, patch)
    for key, value in patch.items():
        if value is None:
            assert key not in result
        elif not isinstance(value, dict):
            assert result[key] == value
    if isinstance(target, dict):
        for key, value in target.items():
            if key not in patch:
                assert result[key] == value


@given(st.dictionaries(st.sampled_from("abc"), _json, max_size=3), st.sampled_from("abcd"), _json)
def test_json_patch_add_then_remove_gives_the_document_back(
    target: dict[str, Any], key: str, value: Any
) -> None:
    if key in target:
        return
    added = json_patch(target, [{"op": "add", "path": f"/{key}", "value": value}])
    assert added[key] == value
    assert json_patch(added, [{"op": "remove", "path": f"/{key}"}]) == target
