"""Hostile scenario files: each is refused with exit status 2 and one short line naming
file and document, never a traceback, a hang or a flood of output.

The fuzzers at the end keep the general rule: whatever the structure of a document,
loading it either succeeds or raises :class:`InputError` on one line.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from events.errors import InputError
from shards.cli import main
from shards.inputs.scenario import KINDS, load_config, load_scenario
from shards.inputs.yamlfile import MAX_ALIAS_NODES, MAX_DOCUMENT_BYTES

LONGEST_LINE = 1500
"""An error line is at most about this long, however long the values in it."""


def simulate(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, str]:
    try:
        code = main(["simulate", str(path), "--quiet"])
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def refused(capsys: pytest.CaptureFixture[str], path: Path, text: str) -> str:
    """The one line ``shoal simulate`` prints for ``text``, which must be an input error."""
    path.write_text(text)
    code, err = simulate(capsys, path)
    assert code == 2, err
    assert err.startswith(f"shoal: error: {path}: ") and err.count("\n") == 1, err[:2000]
    assert len(err) < LONGEST_LINE, err[:2000]
    assert "Traceback" not in err
    return err


LAUGHS = "\n".join(
    [
        "apiVersion: v1",
        "kind: Pod",
        "metadata:",
        '  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
        *(
            f"  {x}: &{x} [{', '.join([f'*{p}'] * 9)}]"
            for p, x in zip("abcdefgh", "bcdefghi", strict=True)
        ),
        "  name: *i",
        "spec: {containers: [{name: c}]}",
        "",
    ]
)


def test_billion_laughs_is_refused_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert len(LAUGHS) < 700
    err = refused(capsys, tmp_path / "laughs.yaml", LAUGHS)
    assert f"document 1: aliases expand the file by more than {MAX_ALIAS_NODES} values" in err


def test_many_aliases_to_one_large_block_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A few hundred kB of aliases, each to the same 2,000-value list: written once,
    expanded tens of millions of times by whoever walks it."""
    block = "[" + ", ".join(str(i) for i in range(2000)) + "]"
    text = (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n"
        f"  x: &big {block}\n  containers:\n"
        + "".join(f"  - {{name: c{i}, args: *big}}\n" for i in range(12_000))
    )
    assert 300_000 < len(text) < 400_000
    assert "aliases expand the file" in refused(capsys, tmp_path / "shared.yaml", text)


def test_sharing_a_block_between_objects_is_fine(tmp_path: Path) -> None:
    items = "".join(
        f"- {{apiVersion: v1, kind: Node, metadata: {{name: n{i}, labels: *labels}}, "
        "status: {allocatable: {cpu: '4'}}}\n"
        for i in range(2000)
    )
    path = tmp_path / "list.yaml"
    path.write_text(
        "apiVersion: v1\nkind: List\nshared: &labels {zone: a, rack: r1, pool: p}\n"
        f"items:\n{items}"
    )
    scenario = load_scenario([str(path)])
    assert scenario.nodes == 2000


def test_a_recursive_alias_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(
        capsys,
        tmp_path / "loop.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: &m {name: p, labels: *m}\n"
        "spec: {containers: [{name: c}]}\n",
    )
    assert "document 1: malformed YAML: line 3" in err and "recursive" in err


@pytest.mark.parametrize("depth", [150, 200_000])
def test_deep_nesting_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], depth: int
) -> None:
    """Deeper than any Kubernetes object; deep enough to overflow a recursive walker (the
    JSON of a configuration in the log) or, in libyaml's C composer, the process."""
    text = f"apiVersion: v1\nkind: Pod\nmetadata: {{name: p, x: {'[' * depth}{']' * depth}}}\n"
    err = refused(capsys, tmp_path / "deep.yaml", text)
    assert "document 1: " in err and ("nested more than 100 deep" in err or "too deeply" in err)


def test_a_kind_that_is_not_a_string(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = refused(
        capsys, tmp_path / "kind.yaml", "apiVersion: v1\nkind: [Pod]\nmetadata: {name: p}\n"
    )
    assert "document 1 (['Pod'] p): not a Kubernetes object: needs an apiVersion" in err


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"
            "spec: {containers: [{name: c, resources: {requests: {cpu: 100P}}}]}\n",
            "(Pod p): spec.containers[0].resources.requests.cpu: quantity '100P' of cpu is "
            "out of range",
        ),
        (
            "apiVersion: v1\nkind: Node\nmetadata: {name: n}\nstatus: {allocatable: {cpu: 4e18}}\n",
            "(Node n): status.allocatable.cpu: quantity '4e18' of cpu is out of range",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"
            "spec: {priority: 100000000000000000000000, containers: [{name: c}]}\n",
            "(Pod p): spec.priority: must be an integer from -2147483648 to 2147483647",
        ),
        (
            "apiVersion: scheduling.x-k8s.io/v1alpha1\nkind: PodGroup\nmetadata: {name: g}\n"
            "spec: {minMember: 18446744073709551616}\n",
            "(PodGroup g): spec.minMember: must be a positive integer",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p, annotations: "
            "{shoal.io/arrive-at: '1e300'}}\nspec: {containers: [{name: c}]}\n",
            '(Pod p): metadata.annotations["shoal.io/arrive-at"]: must be at most 100000000 '
            "seconds",
        ),
        (
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {priority: 1"
            + "0" * 5000
            + ", containers: [{name: c}]}\n",
            "document 1: malformed YAML: line 4, column 18: a number of 5001 characters",
        ),
        (
            "apiVersion: v1\nkind: Node\nmetadata: {name: n, labels: {born: 2024-13-45}}\n"
            "status: {allocatable: {cpu: '1'}}\n",
            "document 1: malformed YAML: line 3, column 36: invalid date '2024-13-45'",
        ),
    ],
    ids=["cpu-100P", "node-4e18", "priority", "minMember", "arrive-at", "long-number", "date"],
)
def test_values_that_cannot_be_held_are_refused_where_they_are_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, where: str
) -> None:
    assert where in refused(capsys, tmp_path / "s.yaml", text)


@pytest.mark.parametrize(
    "text",
    [
        "apiVersion: v1\nkind: " + "x" * 10_000_000 + "\n",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: '" + "a/" * 500_000 + "'}\n",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c}], "
        "priority: '" + "9" * 1_000_000 + "'}\n",
        'apiVersion: v1\nkind: Node\nmetadata:\n  name: n\n  labels:\n    ? "'
        + "k\\n" * 100_000
        + '"\n    : [1]\nstatus: {allocatable: {cpu: "1"}}\n',
    ],
    ids=["kind", "name", "priority", "label-key"],
)
def test_error_lines_are_short_however_long_the_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    err = refused(capsys, tmp_path / "long.yaml", text)
    assert "…" in err or "..." in err


def test_a_document_larger_than_the_limit_is_refused_before_parsing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = "# " + "x" * 1000 + "\n"
    text = "apiVersion: v1\nkind: Node\n---\n" + line * (MAX_DOCUMENT_BYTES // len(line) + 1)
    err = refused(capsys, tmp_path / "big.yaml", text)
    assert f"the document from line 3 is larger than {MAX_DOCUMENT_BYTES} bytes" in err


def test_a_gang_that_depends_on_its_own_member_is_a_cycle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(
        capsys,
        tmp_path / "self.yaml",
        "apiVersion: scheduling.x-k8s.io/v1alpha1\nkind: PodGroup\n"
        "metadata: {name: g, annotations: {shoal.io/depends-on: worker}}\nspec: {minMember: 1}\n"
        "---\napiVersion: v1\nkind: Pod\n"
        "metadata: {name: worker, labels: {scheduling.x-k8s.io/pod-group: g}}\n"
        "spec: {containers: [{name: c}]}\n",
    )
    assert (
        'document 1 (PodGroup g): metadata.annotations["shoal.io/depends-on"]: dependency cycle: '
        "default/worker -> default/worker (default/worker waits for what its pod group "
        "default/g depends on)"
    ) in err


def test_a_configuration_must_be_plain_data(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"
        "profiles: [{pluginConfig: [{name: NodeAffinity, args: {since: 2024-01-01}}]}]\n"
    )
    with pytest.raises(InputError, match=r"profiles\[0\]\.pluginConfig\[0\]\.args\.since: must be"):
        load_config(str(path))


# --------------------------------------------------------------------------- fuzzers

WORDS = [
    "apiVersion", "kind", "metadata", "name", "namespace", "labels", "annotations", "spec",
    "status", "allocatable", "capacity", "containers", "initContainers", "resources",
    "requests", "limits", "cpu", "memory", "pods", "nvidia.com/gpu", "priority",
    "priorityClassName", "minMember", "minResources", "scheduleTimeoutSeconds",
    "maxScheduleTime", "queue", "min", "max", "items", "value", "globalDefault", "profiles",
    "plugins", "pluginConfig", "schedulerName", "taints", "tolerations", "affinity",
    "nodeSelector", "overhead", "nodeName", "shoal.io/arrive-at", "shoal.io/runtime",
    "shoal.io/depends-on", "shoal.io/fails", "pools", "tenants", "shard", "pool", "effect",
    "key", "operator", "values", "weight", "unschedulable", "podMaxBackoffSeconds",
    "scheduling.x-k8s.io/pod-group", "pod-group.scheduling.sigs.k8s.io/min-available",
    "pod-group.scheduling.sigs.k8s.io/name", "uid", "args", "enabled", "disabled", "score",
    "nodeAffinity", "preemptionPolicy", "reservationTimeoutSeconds",
]  # fmt: skip
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["1", "500m", "4Gi", "-1", "1e300", "nan", "Pod", "g", "p", "a,b"]),
    st.dates(),
)
KEYS = st.one_of(st.sampled_from(WORDS), st.text(max_size=8), st.integers(-3, 3))
TREES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(KEYS, inner, max_size=5)),
    max_leaves=25,
)
VERSIONS = sorted({version for version, _ in KINDS})
KIND_NAMES = sorted({kind for _, kind in KINDS})


@st.composite
def documents(draw: st.DrawFn) -> Any:
    """A Kubernetes-shaped document: known or random apiVersion and kind (strings or
    not), and random structures where a scenario reads metadata, spec and the rest."""
    version, kind = draw(
        st.one_of(
            st.sampled_from(sorted(KINDS)),
            st.tuples(st.sampled_from(VERSIONS) | TREES, st.sampled_from(KIND_NAMES) | TREES),
        )
    )
    doc: dict[Any, Any] = {"apiVersion": version, "kind": kind}
    meta = draw(st.dictionaries(st.sampled_from(WORDS), TREES, max_size=4))
    if draw(st.booleans()):
        meta["name"] = draw(st.sampled_from(["p", "q", "g", "n"]))
    doc["metadata"] = draw(st.one_of(st.just(meta), TREES))
    for key in draw(st.lists(st.sampled_from(WORDS), max_size=4, unique=True)):
        doc[key] = draw(TREES)
    return doc


TEMPLATES = [
    {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n", "labels": {"zone": "a"}},
     "status": {"allocatable": {"cpu": "4", "memory": "8Gi"}},
     "spec": {"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]}},
    {"apiVersion": "v1", "kind": "Pod",
     "metadata": {"name": "p", "labels": {"scheduling.x-k8s.io/pod-group": "g"},
                  "annotations": {"shoal.io/arrive-at": "1", "shoal.io/runtime": "5"}},
     "spec": {"priority": 5, "containers": [{"name": "c", "resources": {
         "requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}}}],
         "tolerations": [{"operator": "Exists"}], "nodeSelector": {"zone": "a"}}},
    {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
     "metadata": {"name": "g", "annotations": {"shoal.io/depends-on": "q"}},
     "spec": {"minMember": 1, "minResources": {"cpu": "1"}, "scheduleTimeoutSeconds": 30}},
    {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "ElasticQuota",
     "metadata": {"name": "q", "namespace": "default"},
     "spec": {"min": {"cpu": "1"}, "max": {"cpu": "2"}}},
    {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "hi"},
     "value": 100},
    {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
     "profiles": [{"schedulerName": "default-scheduler", "plugins": {"score": {
         "enabled": [{"name": "NodeAffinity", "weight": 2}]}}}],
     "podMaxBackoffSeconds": 10},
    {"apiVersion": "shoal.io/v1alpha1", "kind": "ShardingConfiguration",
     "pools": [{"name": "a", "shard": 0, "nodeSelector": {"zone": "a"}}],
     "tenants": [{"namespace": "t", "pools": ["a"]}]},
    {"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "q"},
         "spec": {"containers": [{"name": "c"}]}}]},
]  # fmt: skip


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out.extend(_paths(item, (*prefix, key)))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out.extend(_paths(item, (*prefix, i)))
    return out


@st.composite
def mutated(draw: st.DrawFn) -> Any:
    """A valid document with one place replaced by a random structure, or removed."""
    doc = yaml.safe_load(yaml.safe_dump(draw(st.sampled_from(TEMPLATES))))
    path = draw(st.sampled_from(_paths(doc)[1:]))
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    if isinstance(parent, dict) and draw(st.booleans()) and len(path) > 1:
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(TREES)
    return doc


def _load(docs: list[Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.yaml"
        path.write_text(yaml.safe_dump_all(docs))
        try:
            load_scenario([str(path)])
        except InputError as exc:
            text = str(exc)
            assert text.startswith(f"{path}: document ") and "\n" not in text
            assert len(text) < LONGEST_LINE


@given(docs=st.lists(st.one_of(documents(), mutated()), min_size=1, max_size=3))
def test_any_document_loads_or_is_one_clear_error(docs: list[Any]) -> None:
    _load(docs)


@given(
    text=st.lists(
        st.sampled_from([*"ab1 :-[]{},&*!|>'\"#\n\t.eE+%@`?~", "---\n", "<<: ", "&a ", "*a"]),
        max_size=60,
    ).map("".join)
)
def test_any_text_loads_or_is_one_clear_error(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.yaml"
        path.write_text(text)
        try:
            load_scenario([str(path)])
        except InputError as exc:
            assert "\n" not in str(exc) and len(str(exc)) < LONGEST_LINE


@settings(max_examples=15)
@given(docs=st.lists(mutated(), min_size=1, max_size=3))
def test_the_command_line_runs_or_exits_2_with_one_line(docs: list[Any]) -> None:
    """Through ``shoal simulate``: what loads runs to the end (exit 0), what does not is
    exit 2 and one line; nothing else."""
    import contextlib
    import io

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.yaml"
        path.write_text(yaml.safe_dump_all(docs))
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(["simulate", str(path), "--quiet"])
            except SystemExit as exc:
                code = int(exc.code or 0)
    assert code in (0, 2), err.getvalue()
    if code == 2:
        assert err.getvalue().count("\n") == 1 and len(err.getvalue()) < LONGEST_LINE
