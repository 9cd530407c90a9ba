"""``extenders:`` of a ``KubeSchedulerConfiguration`` and of a legacy ``Policy``: every
field honoured, warned about or refused, naming the field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.config import parse_config
from engine.extenders import DEFAULT_TIMEOUT_NS, parse_duration, policy_to_config
from events.errors import InputError

ROOT = Path(__file__).resolve().parents[2]


def doc(*extenders: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "extenders": list(extenders),
        **top,
    }


def test_every_supported_field_is_read() -> None:
    config = parse_config(
        doc(
            {
                "urlPrefix": "https://ext.example:8443/scheduler",
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "weight": 5,
                "enableHTTPS": True,
                "tlsConfig": {"insecure": True, "serverName": "ext"},
                "httpTimeout": "1m30s",
                "nodeCacheCapable": True,
                "managedResources": [{"name": "example.com/foo", "ignoredByScheduler": False}],
                "ignorable": True,
            }
        )
    )
    (ext,) = config.extenders
    assert ext.url("filter") == "https://ext.example:8443/scheduler/filter"
    assert ext.weight == 5
    assert ext.timeout_ns == 90 * 10**9
    assert ext.node_cache_capable and ext.ignorable and ext.https
    assert ext.tls is not None and ext.tls.insecure and ext.tls.server_name == "ext"
    assert ext.managed == ("example.com/foo",)
    assert ext.interested({"example.com/foo": 1})
    assert not ext.interested({"cpu": 1000})
    assert config.warnings == ()


@pytest.mark.parametrize(
    ("fields", "where", "words"),
    [
        ({"bindVerb": "bind"}, "extenders[0].bindVerb", "not supported"),
        (
            {"managedResources": [{"name": "x", "ignoredByScheduler": True}]},
            "extenders[0].managedResources[0].ignoredByScheduler",
            "not supported",
        ),
        ({"weight": 0, "prioritizeVerb": "p"}, "extenders[0].weight", "positive"),
        ({"prioritizeVerb": "p"}, "extenders[0].weight", "must be set"),
        ({"weight": "3"}, "extenders[0].weight", "positive"),
        ({"httpTimeout": "soon"}, "extenders[0].httpTimeout", "duration"),
        ({"ignorable": "yes"}, "extenders[0].ignorable", "true or false"),
        ({"filterVerb": 3}, "extenders[0].filterVerb", "string"),
        ({"urlPrefix": ""}, "extenders[0].urlPrefix", "urlPrefix"),
        ({"tlsConfig": {"certData": "AAAA"}}, "extenders[0].tlsConfig.certData", "certFile"),
        ({"tlsConfig": {"cipher": "x"}}, "extenders[0].tlsConfig", "unknown field"),
        ({"filterverb": "f"}, "extenders[0]", "unknown field"),
        ({"profiles": ["nobody"]}, "extenders[0].profiles", "no profile"),
    ],
)
def test_what_cannot_be_honoured_is_refused_naming_the_field(
    fields: dict[str, Any], where: str, words: str
) -> None:
    entry = {"urlPrefix": "http://127.0.0.1:1", "filterVerb": "filter", **fields}
    with pytest.raises(InputError) as info:
        parse_config(doc(entry), "")
    assert info.value.location == where
    assert words in info.value.message


def test_preempt_verb_is_accepted_with_a_warning() -> None:
    config = parse_config(
        doc({"urlPrefix": "http://x", "filterVerb": "f", "preemptVerb": "preempt"}), ""
    )
    assert len(config.extenders) == 1
    (warning,) = config.warnings
    assert warning.startswith("extenders[0].preemptVerb:")


def test_duplicate_url_prefixes_are_refused() -> None:
    entry = {"urlPrefix": "http://x", "filterVerb": "f"}
    with pytest.raises(InputError, match="duplicate urlPrefix"):
        parse_config(doc(entry, entry), "")


def go_duration(ns: int) -> str:
    """How Go's ``time.Duration.String`` writes ``ns`` (``1h2m3.5s``, ``1.5ms``)."""
    if ns == 0:
        return "0s"
    if ns < 1_000_000_000:
        for unit, scale in (("ms", 10**6), ("µs", 10**3), ("ns", 1)):
            if ns >= scale:
                whole, rest = divmod(ns, scale)
                digits = len(str(scale)) - 1
                fraction = f"{rest:0{digits}d}".rstrip("0") if digits else ""
                return f"{whole}.{fraction}{unit}" if fraction else f"{whole}{unit}"
    h, rest = divmod(ns, 3600 * 10**9)
    m, rest = divmod(rest, 60 * 10**9)
    s, frac = divmod(rest, 10**9)
    fraction = f"{frac:09d}".rstrip("0")
    text = f"{s}.{fraction}s" if fraction else f"{s}s"
    if h:
        return f"{h}h{m}m{text}"
    return f"{m}m{text}" if m else text


@given(st.integers(0, 3600 * 10**9))
def test_durations_read_as_go_writes_them(ns: int) -> None:
    assert parse_duration(go_duration(ns), "t") == (ns or DEFAULT_TIMEOUT_NS)
    assert parse_duration(ns, "t") == (ns or DEFAULT_TIMEOUT_NS)


@pytest.mark.parametrize("text", ["", "5", "s", "1x", "-1s", "1.2.3s", "5s junk"])
def test_other_durations_are_refused(text: str) -> None:
    with pytest.raises(InputError, match="duration"):
        parse_duration(text, "t")


SEED_POLICY = {
    "kind": "Policy",
    "apiVersion": "v1",
    "predicates": [{"name": "PodFitsHostPorts"}, {"name": "PodFitsResources"}],
    "priorities": [{"name": "LeastRequestedPriority", "weight": 1}],
    "extenders": [
        {
            "urlPrefix": "http://localhost:8888/",
            "filterVerb": "predicates",
            "prioritizeVerb": "priorities/zero_score",
            "preemptVerb": "preemption",
            "bindVerb": "",
            "weight": 1,
            "enableHttps": False,
            "nodeCacheCapable": False,
            "httpTimeout": 30000000000,
        }
    ],
    "hardPodAffinitySymmetricWeight": 10,
}


def test_a_legacy_policy_gives_its_extenders_and_warns_of_the_rest() -> None:
    converted, warnings = policy_to_config(SEED_POLICY, "")
    config = parse_config(converted, "")
    (ext,) = config.extenders
    assert ext.url("predicates") == "http://localhost:8888/predicates"
    assert ext.timeout_ns == 30 * 10**9
    assert sorted(w.split(":")[0] for w in warnings) == [
        ".hardPodAffinitySymmetricWeight",
        ".predicates",
        ".priorities",
    ]
    assert any("preemptVerb" in w for w in config.warnings)


def test_the_command_line_reads_a_policy_file_and_refuses_bind_verb(tmp_path: Path) -> None:
    cluster = tmp_path / "c.yaml"
    cluster.write_text(
        "apiVersion: v1\nkind: Node\nmetadata: {name: n}\n"
        "status: {allocatable: {cpu: '1', memory: 1Gi}}\n"
    )
    policy = tmp_path / "policy.json"
    bad = {**SEED_POLICY, "extenders": [{**SEED_POLICY["extenders"][0], "bindVerb": "bind"}]}  # type: ignore[index]
    policy.write_text(json.dumps(bad))
    proc = subprocess.run(
        [sys.executable, "-m", "shards.cli", "simulate", str(cluster), "--config", str(policy)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "extenders[0].bindVerb" in lines[0]
    policy.write_text(json.dumps(SEED_POLICY))
    proc = subprocess.run(
        [sys.executable, "-m", "shards.cli", "simulate", str(cluster), "--config", str(policy)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "predicates" in proc.stderr and "preemptVerb" in proc.stderr
