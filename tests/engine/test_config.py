from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.config import MAX_SECONDS, PluginRef, default_config, parse_config
from engine.engine import Engine
from engine.framework.runtime import Framework
from engine.plugins.registry import builtin_registry
from events.errors import InputError

BASE = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration"}


def config(**fields: Any) -> dict[str, Any]:
    return {**BASE, **fields}


def test_defaults() -> None:
    profile = default_config().profiles[0]
    assert profile.scheduler_name == "default-scheduler"
    assert [r.name for r in profile.points["filter"]][-3:] == [
        "NodeResourcesFit",
        "PodTopologySpread",
        "InterPodAffinity",
    ]
    assert PluginRef("PodTopologySpread", 2) in profile.points["score"]
    assert PluginRef("InterPodAffinity", 2) in profile.points["score"]
    assert PluginRef("TaintToleration", 3) in profile.points["score"]


def test_disable_and_reweight_like_kube_scheduler() -> None:
    cfg = parse_config(
        config(
            profiles=[
                {
                    "schedulerName": "packer",
                    "plugins": {
                        "score": {
                            "disabled": [{"name": "NodeResourcesBalancedAllocation"}],
                            "enabled": [{"name": "NodeResourcesFit", "weight": 5}],
                        }
                    },
                    "pluginConfig": [
                        {
                            "name": "NodeResourcesFit",
                            "args": {"scoringStrategy": {"type": "MostAllocated"}},
                        }
                    ],
                },
                {"schedulerName": "spreader"},
            ]
        )
    )
    packer = cfg.profiles[0]
    assert [(r.name, r.weight) for r in packer.points["score"]] == [
        ("TaintToleration", 3),
        ("NodeAffinity", 2),
        ("NodeResourcesFit", 5),
        ("PodTopologySpread", 2),
        ("InterPodAffinity", 2),
    ]
    engine = Engine(cfg)
    assert set(engine.profiles.frameworks) == {"packer", "spreader"}
    assert (
        engine.profiles.frameworks["packer"].plugins["NodeResourcesFit"].strategy == "MostAllocated"
    )  # type: ignore[attr-defined]


def test_disable_everything_then_enable() -> None:
    cfg = parse_config(
        config(
            profiles=[
                {
                    "plugins": {
                        "score": {
                            "disabled": [{"name": "*"}],
                            "enabled": [{"name": "NodeAffinity"}],
                        }
                    }
                }
            ]
        )
    )
    assert [r.name for r in cfg.profiles[0].points["score"]] == ["NodeAffinity"]


def test_multipoint_enables_where_implemented() -> None:
    cfg = parse_config(
        config(
            profiles=[
                {
                    "plugins": {
                        "multiPoint": {
                            "disabled": [{"name": "*"}],
                            "enabled": [{"name": "TaintToleration"}],
                        }
                    }
                }
            ]
        )
    )
    framework = Framework(cfg.profiles[0], builtin_registry(), Engine())
    assert [f.name for f in framework.filters] == ["TaintToleration"]
    assert [s.plugin.name for s in framework.scores] == ["TaintToleration"]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"kind": "Nope"}, "kind must be"),
        ({**BASE, "apiVersion": "v9"}, "apiVersion"),
        (config(profiles="x"), "list of profiles"),
        (
            config(profiles=[{"schedulerName": "a"}, {"schedulerName": "a"}]),
            "duplicate schedulerName",
        ),
        (config(profiles=[{"bogus": 1}]), "unknown field 'bogus'"),
        (config(unknownTop=1), "unknown field 'unknownTop'"),
        (config(profiles=[{"plugins": {"sideways": {}}}]), "unknown extension point"),
        (config(profiles=[{"plugins": {"score": {"enabled": [{"weight": 1}]}}}]), "plugin name"),
        (
            config(profiles=[{"plugins": {"score": {"enabled": [{"name": "X", "weight": 101}]}}}]),
            "weight",
        ),
        (
            config(profiles=[{"pluginConfig": [{"name": "A"}, {"name": "A"}]}]),
            "duplicate pluginConfig",
        ),
        (config(podInitialBackoffSeconds=5, podMaxBackoffSeconds=2), "podInitialBackoffSeconds"),
        (config(podMaxBackoffSeconds=-1), "non-negative"),
        (config(podMaxBackoffSeconds=MAX_SECONDS + 1), f"at most {MAX_SECONDS}"),
        (config(podInitialBackoffSeconds=10**12), r"config\.podInitialBackoffSeconds: .*at most"),
        ("not a mapping", "KubeSchedulerConfiguration mapping"),
        # recorded in the log as JSON and parsed again on replay: only plain JSON data
        (config(parallelism=2**64), r"config\.parallelism: integer out of the 64-bit range"),
        (
            config(profiles=[{"pluginConfig": [{"name": "A", "args": {"x": [1, -(2**63) - 1]}}]}]),
            r"config\.profiles\[0\]\.pluginConfig\[0\]\.args\.x\[1\]: integer out",
        ),
        (
            config(percentageOfNodesToScore=float("inf")),
            "percentageOfNodesToScore: must be a finite number",
        ),
        (config(clientConnection={1: "a"}), "config.clientConnection: keys must be strings"),
        (config(leaderElection={"since": datetime.date(2024, 1, 1)}), "got a date"),
        (config(extenders=[[[]] * 60_000, [[]] * 60_000]), "more than 100000 values"),
    ],
)
def test_bad_config(raw: Any, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_config(raw)


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        (
            {"plugins": {"filter": {"enabled": [{"name": "NoSuchPlugin"}]}}},
            "unknown plugin 'NoSuchPlugin'",
        ),
        (
            {"plugins": {"filter": {"enabled": [{"name": "NodeResourcesBalancedAllocation"}]}}},
            "does not implement the filter",
        ),
        ({"pluginConfig": [{"name": "Ghost", "args": {}}]}, "unknown plugin 'Ghost'"),
        ({"pluginConfig": [{"name": "NodeName", "args": {"x": 1}}]}, "takes no args"),
        (
            {
                "pluginConfig": [
                    {"name": "NodeResourcesFit", "args": {"scoringStrategy": {"type": "Z"}}}
                ]
            },
            "unknown type",
        ),
    ],
)
def test_bad_plugins_fail_when_the_engine_is_built(profile: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message):
        Engine(parse_config(config(profiles=[profile])))


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(
    initial=st.integers(0, MAX_SECONDS),
    extra=st.integers(0, MAX_SECONDS),
    ignored=JSON_VALUES,
)
def test_a_configuration_within_bounds_is_recorded_and_read_back_the_same(
    initial: int, extra: int, ignored: Any
) -> None:
    """What parses survives the log's JSON: replay parses the same configuration."""
    maximum = min(initial + extra, MAX_SECONDS)
    raw = config(
        podInitialBackoffSeconds=initial, podMaxBackoffSeconds=maximum, leaderElection=ignored
    )
    parsed = parse_config(raw)
    again = parse_config(json.loads(json.dumps(parsed.source, sort_keys=True)))
    assert again == parsed
    assert (again.initial_backoff_seconds, again.max_backoff_seconds) == (initial, maximum)


@given(
    key=st.sampled_from(["podInitialBackoffSeconds", "podMaxBackoffSeconds"]),
    value=st.integers(MAX_SECONDS + 1, 2**200) | st.integers(-(2**200), -1),
)
def test_back_offs_beyond_the_bound_are_refused(key: str, value: int) -> None:
    with pytest.raises(InputError, match=f"config.{key}: "):
        parse_config(config(**{key: value}))
