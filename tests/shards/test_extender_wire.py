"""The extender wire format: kube-scheduler's JSON both ways, and answers of any shape
turned into a failure (``WireError``), never another exception."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from engine.config import parse_config
from engine.engine import Engine
from events.types import Envelope
from shards.extenders.wire import (
    NodeListCache,
    NodeRenderer,
    WireError,
    args_bytes,
    filter_result,
    pod_json,
    priority_list,
)
from tests.builders import make_node, make_pod

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=25,
)
FIELDS = st.sampled_from(
    [
        "Nodes",
        "NodeNames",
        "FailedNodes",
        "FailedAndUnresolvableNodes",
        "Error",
        "nodenames",
        "items",
    ]
)


@given(JSON | st.dictionaries(FIELDS, JSON, max_size=5))
def test_any_filter_answer_is_read_or_refused_as_malformed(doc: Any) -> None:
    try:
        passed, failed, unresolvable, error = filter_result(doc)
    except WireError:
        return
    assert all(isinstance(n, str) for n in passed)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in failed.items())
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in unresolvable.items())
    assert isinstance(error, str)


@given(JSON | st.lists(st.dictionaries(st.sampled_from(["Host", "Score", "host"]), JSON)))
def test_any_priority_answer_is_read_or_refused_as_malformed(doc: Any) -> None:
    try:
        scores = priority_list(doc)
    except WireError:
        return
    assert all(isinstance(h, str) and type(s) is int for h, s in scores.items())


def test_keys_are_matched_as_go_matches_them() -> None:
    passed, failed, _, error = filter_result(
        {"nodenames": ["a"], "failednodes": {"b": "full"}, "error": ""}
    )
    assert (passed, failed, error) == (["a"], {"b": "full"}, "")
    assert priority_list([{"host": "a", "score": 3}]) == {"a": 3}


def test_args_are_kube_schedulers_extender_args() -> None:
    engine = Engine(
        parse_config(
            {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration"}
        )
    )
    node = make_node("n1").cpu(4).memory("8Gi").label("zone", "a").taint("gpu").added()
    engine.apply(Envelope(event=node))
    spec = (
        make_pod("p")
        .cpu("1500m")
        .memory("1Gi")
        .tolerate("gpu")
        .require("zone", "In", "a", "b")
        .prefer(5, "disk", "Exists")
        .spec()
    )
    pod = orjson.dumps(pod_json(spec))
    whole = orjson.loads(
        args_bytes(pod, ("n1",), NodeListCache(NodeRenderer()).items(engine.state, ("n1",)))
    )
    assert whole["Pod"]["metadata"] == {"name": "p", "namespace": "default"}
    assert whole["Pod"]["spec"]["containers"][0]["resources"]["requests"] == {
        "cpu": "1500m",
        "memory": "1Gi",
    }
    assert whole["Pod"]["spec"]["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert whole["Pod"]["spec"]["affinity"] == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}
                ]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 5,
                    "preference": {"matchExpressions": [{"key": "disk", "operator": "Exists"}]},
                }
            ],
        }
    }
    (item,) = whole["Nodes"]["items"]
    assert item["metadata"]["labels"]["zone"] == "a"
    assert item["spec"]["taints"] == [{"key": "gpu", "effect": "NoSchedule"}]
    assert item["status"]["allocatable"]["cpu"] == "4"
    names = orjson.loads(args_bytes(pod, ("n1",), None))
    assert names == {"Pod": whole["Pod"], "Nodes": None, "NodeNames": ["n1"]}
