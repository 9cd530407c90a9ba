"""Reading YAML with libyaml where present, under the same limits as the pure-Python
loader; and progress of long steps on stderr, quiet for small inputs."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from events.errors import InputError

try:
    from yaml._yaml import get_version as libyaml_version
except ImportError:  # PyYAML without libyaml
    libyaml_version = None  # type: ignore[assignment]
from shards.cli import main
from shards.inputs import progress as progress_module
from shards.inputs.progress import ProgressLines
from shards.inputs.scenario import load_scenario
from shards.inputs.yamlfile import LIBYAML, LIBYAML_NESTING, MAX_DEPTH, read_documents


def _read(path: Path, *, pure: bool) -> list[tuple[int, Any]] | str:
    """The documents, or the error line."""
    try:
        return list(read_documents(str(path), pure=pure))
    except InputError as exc:
        return str(exc)


def test_libyaml_is_used_where_pyyaml_has_a_bounded_one() -> None:
    if getattr(yaml, "__with_libyaml__", False) and libyaml_version is not None:
        assert (libyaml_version() >= LIBYAML_NESTING) == LIBYAML
    else:
        assert not LIBYAML


HOSTILE = {
    "deep flow": "a: " + "[" * 150 + "]" * 150 + "\n",
    "deeper than libyaml's own bound": "a: " + "[" * 5000 + "]" * 5000 + "\n",
    "deep block": "".join(" " * i + "k:\n" for i in range(MAX_DEPTH + 5)) + " " * 200 + "v\n",
    "deep with an alias": "x: &x 1\ny: *x\nz: " + "[" * 150 + "]" * 150 + "\n",
    "recursive alias": "a: &a [*a]\n",
    "long number": "a: " + "9" * 70 + "\n",
    "no such date": "a: 2024-02-31\n",
    "malformed": "a: [\n",
    "laughs": "a: &a [1,1,1,1,1,1,1,1,1,1]\n"
    + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(7)
    ),
}


@pytest.mark.skipif(not LIBYAML, reason="PyYAML without a bounded libyaml")
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_libyaml_refuses_what_the_pure_loader_refuses(tmp_path: Path, name: str) -> None:
    path = tmp_path / "h.yaml"
    path.write_text(HOSTILE[name])
    fast, pure = _read(path, pure=False), _read(path, pure=True)
    assert isinstance(fast, str) and isinstance(pure, str), (fast, pure)
    assert fast.split(":")[:2] == pure.split(":")[:2]  # file and document
    # the same refusal (libyaml words a malformed document its own way)
    same = "malformed YAML: line 2" if name == "malformed" else pure.rsplit(": ", 1)[-1]
    assert same in fast and same in pure, (fast, pure)


SCALARS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.booleans(),
    st.none(),
    st.text(max_size=20),
    st.dates(),
)
DATA = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=40, deadline=None)
@given(docs=st.lists(DATA, min_size=1, max_size=3), flow=st.booleans(), shared=st.booleans())
def test_both_loaders_read_what_pyyaml_reads(
    tmp_path_factory: pytest.TempPathFactory, docs: list[Any], flow: bool, shared: bool
) -> None:
    """libyaml's and the pure-Python loader, each with shoal's quick constructor for
    documents without aliases, give the data PyYAML's own safe loader gives."""
    path = tmp_path_factory.mktemp("y") / "d.yaml"
    text = yaml.safe_dump_all(docs, default_flow_style=flow)
    if shared:  # an alias somewhere: the constructor of PyYAML's loader is used
        text = "a: &x 1\nb: *x\n---\n" + text
    path.write_text(text)
    expected = list(enumerate(yaml.safe_load_all(text), 1))
    assert _read(path, pure=True) == expected
    if LIBYAML:
        assert _read(path, pure=False) == expected


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_short_step_prints_nothing_and_a_long_one_prints_rarely() -> None:
    clock, out = Clock(), io.StringIO()
    lines = ProgressLines(out, clock=clock, quiet_seconds=2, every_seconds=2)
    for done in range(1, 101):  # a quick step: a hundred calls within a second
        clock.now += 0.01
        lines("reading a.yaml", done, 100)
    assert out.getvalue() == ""
    for done in range(1, 1001):  # a long one: 10 s, told 1,000 times
        clock.now += 0.01
        lines("checking objects", done, 1000, "objects")
    text = out.getvalue().splitlines()
    assert 4 <= len(text) <= 6, text  # at 2 s, then every 2 s, and the end
    assert text[0].startswith("shoal: checking objects: ")
    assert text[-1].startswith("shoal: checking objects: 1,000/1,000 (100%) objects, done in")


def test_loading_tells_each_step(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "apiVersion: v1\nkind: Node\nmetadata: {name: n}\nstatus: {allocatable: {cpu: '1'}}\n"
        "---\napiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c}]}\n"
    )
    seen: list[tuple[str, int, int]] = []

    def told(step: str, done: int, total: int, detail: str = "") -> None:
        seen.append((step, done, total))

    load_scenario([str(path)], told)
    size = len(path.read_text())
    assert seen[-1] == ("checking objects", 2, 2)
    assert (f"reading {path}", size, size) in seen


def test_progress_goes_to_stderr_also_with_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Made due at once here; in use, a step must last two seconds to be shown."""
    monkeypatch.setattr(progress_module, "QUIET_SECONDS", 0.0)
    monkeypatch.setattr(progress_module, "EVERY_SECONDS", 0.0)
    path = tmp_path / "s.yaml"
    path.write_text(
        "apiVersion: v1\nkind: Node\nmetadata: {name: n}\nstatus: {allocatable: {cpu: '1'}}\n"
        "---\napiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c}]}\n"
    )
    assert main(["simulate", str(path), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["summary"]["bound"] == 1
    steps = {line.split(":")[1].strip() for line in err.splitlines()}
    assert {f"reading {path}".split(":")[0], "checking objects", "simulating"} <= steps, err
    assert main(["simulate", str(path), "--json", "--quiet"]) == 0
    assert capsys.readouterr().err == ""
