"""Plugins of kube-scheduler, scheduler-plugins and Volcano in a configuration: mapped to
shoal's (:mod:`engine.foreign`), or accepted with a warning naming them; typos refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import parse_config
from engine.engine import Engine
from engine.foreign import EXTENSION_POINTS, KNOWN
from engine.plugins.registry import builtin_registry
from events.errors import InputError
from events.types import SECOND

BASE = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration"}


def config(*profiles: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {**BASE, "profiles": list(profiles) or [{}], **fields}


def refs(*names: str) -> list[dict[str, Any]]:
    return [{"name": n} for n in names]


def framework(raw: dict[str, Any], name: str = "default-scheduler") -> Any:
    return Engine(parse_config(raw)).profiles.frameworks[name]


COSCHEDULING_ARGS = {"name": "Coscheduling", "args": {"permitWaitingTimeSeconds": 10}}


def test_coscheduling_as_scheduler_plugins_publishes_it() -> None:
    """manifests/coscheduling/scheduler-config.yaml: Coscheduling everywhere, and as the
    queue's order in place of every other: shoal's queue (a gang is one unit, by
    priority then arrival) and its Coscheduling pre-filter; nothing to warn about."""
    raw = config(
        {
            "plugins": {
                "multiPoint": {"enabled": refs("Coscheduling")},
                "queueSort": {"enabled": refs("Coscheduling"), "disabled": refs("*")},
            },
            "pluginConfig": [COSCHEDULING_ARGS],
        }
    )
    parsed = parse_config(raw)
    assert parsed.warnings == ()
    assert parsed.reservation_timeout_seconds == 10
    fw = Engine(parsed).profiles.frameworks["default-scheduler"]
    assert [p.name for p in fw.pre_filters] == ["ElasticQuota", "Coscheduling"]


def test_coscheduling_at_every_point_it_had_in_older_releases() -> None:
    """The v1beta1/v1beta2 manifests name Coscheduling at queueSort, preFilter,
    postFilter, permit, reserve (and postBind): shoal's gang pass does the rest."""
    points = ("queueSort", "preFilter", "postFilter", "permit", "reserve", "postBind")
    plugins = {point: {"enabled": refs("Coscheduling")} for point in points}
    plugins["queueSort"]["disabled"] = refs("*")
    raw = config({"plugins": plugins, "pluginConfig": [COSCHEDULING_ARGS]})
    raw["apiVersion"] = "kubescheduler.config.k8s.io/v1beta1"
    parsed = parse_config(raw)
    assert parsed.warnings == ()
    fw = Engine(parsed).profiles.frameworks["default-scheduler"]
    assert [p.name for p in fw.pre_filters] == ["ElasticQuota", "Coscheduling"]
    assert [p.name for p in fw.post_filters] == ["DefaultPreemption", "Rescheduler"]


def test_capacity_scheduling_is_elastic_quota_and_default_preemption() -> None:
    """manifests/capacityscheduling/scheduler-config.yaml: CapacityScheduling through
    multiPoint, and alone at postFilter: ElasticQuota admits, DefaultPreemption (with
    the quota's reclaim) is the only post-filter."""
    fw = framework(
        config(
            {
                "plugins": {
                    "multiPoint": {"enabled": refs("CapacityScheduling")},
                    "postFilter": {"enabled": refs("CapacityScheduling"), "disabled": refs("*")},
                }
            }
        )
    )
    assert "ElasticQuota" in [p.name for p in fw.pre_filters]
    assert [p.name for p in fw.post_filters] == ["DefaultPreemption"]


def test_disabling_capacity_scheduling_disables_what_it_is_in_shoal_only() -> None:
    pre = framework(config({"plugins": {"preFilter": {"disabled": refs("CapacityScheduling")}}}))
    assert [p.name for p in pre.pre_filters] == ["Coscheduling"]
    post = framework(config({"plugins": {"postFilter": {"disabled": refs("CapacityScheduling")}}}))
    assert [p.name for p in post.post_filters] == ["DefaultPreemption", "Rescheduler"]


@pytest.mark.parametrize(
    ("point", "name", "says"),
    [
        ("score", "ImageLocality", "ImageLocality (kube-scheduler) has no effect in shoal: "),
        ("filter", "VolumeBinding", "VolumeBinding (kube-scheduler) has no effect in shoal: "),
        ("queueSort", "QOSSort", "QOSSort (scheduler-plugins) has no effect in shoal: "),
        ("score", "TargetLoadPacking", "TargetLoadPacking (scheduler-plugins) has no effect"),
        ("postFilter", "PreemptionToleration", "PreemptionToleration (scheduler-plugins) is only"),
        ("filter", "gang", "gang (Volcano) has no effect in shoal: a plugin of Volcano's"),
    ],
)
def test_a_plugin_shoal_lacks_is_accepted_and_named_in_a_warning(
    point: str, name: str, says: str
) -> None:
    raw = config({"plugins": {point: {"enabled": refs(name)}}})
    parsed = parse_config(raw)
    Engine(parsed)
    field = f"config.profiles[0].plugins.{point}.enabled[0]: "
    assert any(w.startswith(field + says) for w in parsed.warnings), parsed.warnings


def test_args_shoal_does_not_take_are_warned_about_not_refused() -> None:
    raw = config(
        {
            "pluginConfig": [
                {
                    "name": "DefaultPreemption",
                    "args": {"minCandidateNodesPercentage": 10, "minCandidateNodesAbsolute": 100},
                },
                {"name": "VolumeBinding", "args": {"bindTimeoutSeconds": 600}},
                {"name": "NodeAffinity", "args": {"addedAffinity": {}}},
            ]
        }
    )
    parsed = parse_config(raw)
    Engine(parsed)
    fields = [w.split(": ", 1)[0] for w in parsed.warnings]
    assert fields == [
        "config.profiles[0].pluginConfig[0].args.minCandidateNodesPercentage",
        "config.profiles[0].pluginConfig[0].args.minCandidateNodesAbsolute",
        "config.profiles[0].pluginConfig[1].args",
        "config.profiles[0].pluginConfig[2].args.addedAffinity",
    ]


def test_coscheduling_args_are_honoured() -> None:
    raw = config(
        {
            "pluginConfig": [
                {
                    "name": "Coscheduling",
                    "args": {"permitWaitingTimeSeconds": 5, "podGroupBackoffSeconds": 7},
                }
            ]
        }
    )
    parsed = parse_config(raw)
    assert (parsed.reservation_timeout_seconds, parsed.group_backoff_seconds) == (5, 7)
    assert Engine(parsed).queue.group_backoff == 7 * SECOND
    again = parse_config(json.loads(json.dumps(parsed.source)))
    assert again == parsed  # replay reads the recorded document the same


def test_profiles_that_differ_on_coscheduling_args_share_the_strictest() -> None:
    def profile(name: str, wait: int, backoff: int) -> dict[str, Any]:
        args = {"permitWaitingTimeSeconds": wait, "podGroupBackoffSeconds": backoff}
        return {"schedulerName": name, "pluginConfig": [{"name": "Coscheduling", "args": args}]}

    parsed = parse_config(config(profile("a", 20, 1), profile("b", 10, 5)))
    assert (parsed.reservation_timeout_seconds, parsed.group_backoff_seconds) == (10, 5)
    assert sum("differs between profiles" in w for w in parsed.warnings) == 2


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        (
            {"pluginConfig": [{"name": "Coscheduling", "args": {"permitWaitingTime": 10}}]},
            r"pluginConfig\[0\]\.args: unknown Coscheduling arg 'permitWaitingTime'",
        ),
        (
            {"pluginConfig": [{"name": "Coscheduling", "args": {"permitWaitingTimeSeconds": 0}}]},
            r"args\.permitWaitingTimeSeconds: must be an integer from 1",
        ),
        (
            {"pluginConfig": [{"name": "Coscheduling", "args": {"podGroupBackoffSeconds": "5"}}]},
            r"args\.podGroupBackoffSeconds: must be an integer",
        ),
        (
            {"plugins": {"queueSort": {"enabled": refs("MyQueueSort")}}},
            r"plugins\.queueSort\.enabled: plugin 'MyQueueSort' cannot run at queueSort",
        ),
        (
            {"plugins": {"bind": {"enabled": refs("NodeResourcesFit")}}},
            r"plugins\.bind\.enabled: plugin 'NodeResourcesFit' cannot run at bind",
        ),
    ],
)
def test_what_no_project_has_is_still_refused(profile: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_config(config(profile))


def test_a_typo_in_a_plugin_name_is_still_refused() -> None:
    raw = config({"plugins": {"score": {"enabled": refs("ImageLocallity")}}})
    with pytest.raises(InputError, match="unknown plugin 'ImageLocallity'"):
        Engine(parse_config(raw))


def test_a_multipoint_weight_is_the_score_weight() -> None:
    raw = config({"plugins": {"multiPoint": {"enabled": [{"name": "GpuPacking", "weight": 4}]}}})
    fw = framework(raw)
    assert ("GpuPacking", 4) in [(s.plugin.name, s.weight) for s in fw.scores]


@pytest.mark.parametrize("disabled", ["GpuPacking", "*"])
def test_a_point_that_disables_a_multipoint_plugin_does_not_run_it(disabled: str) -> None:
    """kube-scheduler's rule (the NodeResourceTopologyMatch manifest relies on it):
    ``multiPoint`` places a plugin at each point it implements, but where that point
    disables it, by name or with ``*``."""
    raw = config(
        {
            "plugins": {
                "multiPoint": {"enabled": refs("GpuPacking")},
                "score": {"disabled": refs(disabled)},
            }
        }
    )
    assert "GpuPacking" not in [s.plugin.name for s in framework(raw).scores]


SECTIONS = st.lists(
    st.tuples(
        st.sampled_from(("multiPoint", *EXTENSION_POINTS)),
        st.sampled_from(("enabled", "disabled")),
        st.sampled_from(sorted(KNOWN)),
        st.integers(0, 100),
    ),
    max_size=8,
)


@settings(max_examples=40, deadline=None)
@given(sections=SECTIONS)
def test_any_use_of_known_plugins_is_accepted_and_warned_where_it_does_nothing(
    sections: list[tuple[str, str, str, int]],
) -> None:
    plugins: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for point, key, name, weight in sections:
        plugins.setdefault(point, {}).setdefault(key, []).append({"name": name, "weight": weight})
    parsed = parse_config(config({"plugins": plugins}))
    Engine(parsed)  # builds: every plugin left is shoal's
    registry = builtin_registry()
    profile = parsed.profiles[0]
    assert all(r.name in registry for refs_ in profile.points.values() for r in refs_)
    for point, section in plugins.items():
        for j, ref in enumerate(section.get("enabled", [])):
            known = KNOWN[ref["name"]]
            acts = bool(known.at) if point == "multiPoint" else point in known.at
            if not acts:
                field = f"config.profiles[0].plugins.{point}.enabled[{j}]: {ref['name']} "
                assert any(w.startswith(field) for w in parsed.warnings), (field, parsed.warnings)
