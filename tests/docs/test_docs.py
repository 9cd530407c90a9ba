"""The documentation (README.md, docs/*.md) holds only blocks that parse, shoal command
lines that shoal accepts, paths that exist and links that resolve; and the checks catch a
bad sample of each."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from shards.cli import build_parser
from tests.docs.blocks import (
    ROOT,
    check_json,
    check_links,
    check_page,
    check_paths,
    check_scenario,
    check_shell,
    check_yaml,
    code_blocks,
    dev_commands,
    exact,
    shell_commands,
    slugify,
)

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    return exact(build_parser())


@pytest.fixture(scope="module")
def dev() -> set[str]:
    return dev_commands(ROOT / "dev")


def test_the_pages_are_there() -> None:
    names = {p.name for p in PAGES}
    assert {"README.md", "index.md", "getting-started.md", "deploy.md", "debugging.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_page(page: Path, parser: argparse.ArgumentParser, dev: set[str]) -> None:
    assert check_page(page, parser, dev) == []


def test_readme_is_a_front_page() -> None:
    """The README stays short: the rest lives in docs/."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


def test_every_docs_page_is_in_the_site() -> None:
    """A page missing from mkdocs.yml's nav is not reachable from the site."""
    nav = (ROOT / "mkdocs.yml").read_text()
    missing = [p.name for p in PAGES[1:] if p.name not in nav]
    assert missing == []


# ---------------------------------------------------------------- the checks themselves


def test_dev_commands_are_read_from_the_script(dev: set[str]) -> None:
    assert {"setup", "demo", "test", "lint", "docs", "kube"} <= dev


def test_a_fence_under_a_list_item_is_a_block() -> None:
    page = "- a step:\n\n  ```yaml\n  a: 1\n  b: [2\n  ```\n\n```json\n{}\n```\n"
    blocks = code_blocks(page)
    assert [(b.lang, b.line) for b in blocks] == [("yaml", 3), ("json", 8)]
    assert check_yaml(blocks[0].text) != []


def test_bad_yaml_and_json_are_caught() -> None:
    assert check_yaml("a: 1\n---\nb: 2\n") == []
    assert check_yaml("a: 1\n---\nb: [2\n") != []
    assert check_json('{"a": 1}') == []
    assert check_json('{"a": 1,}') != []


def test_scenario_blocks_are_read_as_shoal_reads_them() -> None:
    group = "apiVersion: scheduling.x-k8s.io/v1alpha1\nkind: PodGroup\nmetadata: {{name: g}}\nspec: {{minMember: {}}}\n"
    assert check_scenario(group.format(2)) == []
    assert check_scenario(group.format(0)) != []  # minMember must be at least 1
    # not a scenario (a kustomization, a fragment): left to the YAML check
    assert (
        check_scenario("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n") == []
    )
    assert check_scenario("topology:\n  levels: []\n") == []


def test_shell_lines_are_split_into_commands() -> None:
    text = (
        "FOO=1 shoal simulate a.yaml \\\n    --shards 2   # a comment\n"
        "./dev kube up /tmp/rk; shoal serve --role all &\n"
        "shoal replay 'kafka://h:1?topic=t&partitions=3' --verify && echo ok\n"
    )
    assert shell_commands(text) == [
        ["FOO=1", "shoal", "simulate", "a.yaml", "--shards", "2"],
        ["./dev", "kube", "up", "/tmp/rk"],
        ["shoal", "serve", "--role", "all"],
        ["shoal", "replay", "kafka://h:1?topic=t&partitions=3", "--verify"],
        ["echo", "ok"],
    ]


@pytest.mark.parametrize(
    "line",
    [
        "shoal simulat examples/quickstart.yaml",  # no such subcommand
        "shoal simulate examples/quickstart.yaml --shard 2",  # no such option
        ".venv/bin/shoal replay run.events --verify --until",  # an option without its value
        "shoal loadtest fragmentation --policy all --bogus",
        "shoal serve --role everything",  # not one of the choices
        "shoal kafka create --bus kafka://h:9092",
        "./dev build",
    ],
)
def test_bad_command_lines_are_caught(
    line: str, parser: argparse.ArgumentParser, dev: set[str]
) -> None:
    assert check_shell(line, parser, dev) != []


@pytest.mark.parametrize(
    "line",
    [
        "shoal simulate examples/quickstart.yaml --shards 2 --log run.events",
        "SHOAL_NO_JIT=1 .venv/bin/shoal replay run.events --explain default/a --json",
        "shoal loadtest kube --kubeconfig k --scheduler-name shoal --proc shoal=$!",
        "shoal kafka init --bus 'kafka://h:9092?topic=t' --partitions 3",
        "docker build -t shoal:0.1.0 .",
        "./dev kube up /tmp/kube",
    ],
)
def test_good_command_lines_pass(line: str, parser: argparse.ArgumentParser, dev: set[str]) -> None:
    assert check_shell(line, parser, dev) == []


def test_missing_paths_are_caught(tmp_path: Path) -> None:
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "a.yaml").write_text("")
    text = "Run `examples/a.yaml`, then examples/b.yaml; not ../shared/examples/c.yaml."
    assert check_paths(text, tmp_path) == [
        "examples/b.yaml: no such file or folder in the repository"
    ]


def test_broken_links_and_anchors_are_caught(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "deploy.md").write_text(
        "# Deploy\n\n## 1. Build the `image`\n\n## JSON {#json-output}\n"
    )
    page = tmp_path / "README.md"
    text = (
        "[a](docs/deploy.md) [b](docs/deploy.md#1-build-the-image) "
        "[c](docs/deploy.md#json-output) [d](https://example.com/x)\n"
        "```md\n[not a link](nowhere.md)\n```\n"
        "[e](docs/missing.md) [f](docs/deploy.md#no-such-heading)\n"
    )
    page.write_text(text)
    assert check_links(text, page) == [
        "link docs/missing.md: no file docs/missing.md",
        "link docs/deploy.md#no-such-heading: docs/deploy.md has no heading #no-such-heading",
    ]


def test_a_bad_page_fails_whole(
    tmp_path: Path, parser: argparse.ArgumentParser, dev: set[str]
) -> None:
    page = tmp_path / "bad.md"
    page.write_text(
        "# Bad\n\n```yaml\nkind: [Pod\n```\n\n```sh\nshoal simulate x.yaml --nope\n```\n"
        "\nSee `examples/nothing.yaml` and [here](#nowhere).\n"
    )
    problems = check_page(page, parser, dev, root=tmp_path)
    assert len(problems) == 4, problems


def test_slugs_are_mkdocs_slugs() -> None:
    assert slugify("The log server (`tcp://`)") == "the-log-server-tcp"
    assert slugify("Server side: `shoal extender`") == "server-side-shoal-extender"
    assert slugify("5. Point pods at shoal") == "5-point-pods-at-shoal"
    assert slugify("Long runs (`--churn`)") == "long-runs-churn"
