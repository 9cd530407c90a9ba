"""Reading pod groups, elastic quotas and dependencies, and every way they can be wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from events.errors import InputError
from shards.inputs.groups import pod_group
from shards.inputs.scenario import load_scenario
from tests.shards.test_batch import group, pod


def test_dependency_cycle_is_an_input_error(tmp_path: Path) -> None:
    text = pod("a", annotations="shoal.io/depends-on: c") + pod(
        "b", annotations="shoal.io/depends-on: a"
    )
    text += pod("c", annotations="shoal.io/depends-on: b")
    path = tmp_path / "cycle.yaml"
    path.write_text(text)
    with pytest.raises(
        InputError, match="dependency cycle: default/a -> default/c -> default/b -> default/a"
    ):
        load_scenario([str(path)])


def test_member_depending_on_its_own_group_is_a_cycle(tmp_path: Path) -> None:
    text = group("g", 1) + pod(
        "m", labels="scheduling.x-k8s.io/pod-group: g", annotations="shoal.io/depends-on: g"
    )
    path = tmp_path / "cycle.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match="dependency cycle"):
        load_scenario([str(path)])


def test_elastic_quota_bad_input(tmp_path: Path) -> None:
    bad = """
apiVersion: scheduling.x-k8s.io/v1alpha1
kind: ElasticQuota
metadata: {name: q, namespace: t}
spec: {min: {cpu: "8"}, max: {cpu: "4"}}
"""
    path = tmp_path / "q.yaml"
    path.write_text(bad)
    with pytest.raises(
        InputError,
        match=r"document 1 \(ElasticQuota q\): spec.min.cpu: min of cpu is above its max",
    ):
        load_scenario([str(path)])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (group("g", 0), "spec.minMember: must be a positive integer, got 0"),
        (group("g", -2), "must be a positive integer"),
        (group("g", 2, spec=", scheduleTimeoutSeconds: soon"), "spec.scheduleTimeoutSeconds"),
        (group("g", 1) + group("g", 1), "duplicate pod group 'default/g'"),
        (
            pod(
                "p",
                labels="pod-group.scheduling.sigs.k8s.io/name: g, pod-group.scheduling.sigs.k8s.io/min-available: '0'",
            ),
            "must be a positive integer",
        ),
        (
            pod(
                "p",
                labels="scheduling.x-k8s.io/pod-group: a",
                annotations="scheduling.k8s.io/group-name: b",
            ),
            "names different pod groups",
        ),
        (pod("p", annotations="shoal.io/depends-on: 'a,,b'"), "comma-separated"),
        (pod("p", annotations="shoal.io/depends-on: other/x"), "same namespace"),
        (pod("p", annotations='shoal.io/fails: "maybe"'), 'must be "true" or "false"'),
        (
            "apiVersion: batch.scheduler.tencent.com/v1\nkind: PodGroup\nmetadata: {name: t}\nspec: {minMember: 2, maxScheduleTime: forever}\n",
            "duration",
        ),
        (
            "apiVersion: scheduling.volcano.sh/v1beta1\nkind: PodGroup\nmetadata: {name: v}\nspec: {minMember: 2, priorityClassName: nope}\n",
            "unknown priority class 'nope'",
        ),
    ],
)
def test_batch_bad_input(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_scenario([str(path)])
    assert message in str(info.value)
    assert str(path) in str(info.value)


def test_a_pod_group_keeps_its_object_uid_and_refuses_one_that_is_not_a_string() -> None:
    """The uid tells a PodGroup created again under its name from the one before."""
    obj = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "metadata": {"name": "job", "namespace": "ml", "uid": "6c1f"},
        "spec": {"minMember": 2},
    }
    assert pod_group(obj, {}).uid == "6c1f"
    assert pod_group({**obj, "metadata": {"name": "job"}}, {}).uid == ""
    with pytest.raises(InputError, match=r"metadata\.uid"):
        pod_group({**obj, "metadata": {"name": "job", "uid": 7}}, {})
