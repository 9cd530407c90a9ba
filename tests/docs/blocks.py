"""Checks of the documentation's code blocks, links and paths (README.md and docs/).

Each function takes text (a page, a block) and returns a list of problems, each a line
naming what is wrong; an empty list means the text is sound. The tests run them over
every page, and over bad samples to show that they catch what they should.

- ``yaml`` blocks parse as multi-document YAML, ``json`` blocks as JSON, ``toml`` as
  TOML, ``python`` blocks compile; a ``yaml`` block whose documents are all kinds a
  scenario holds (Nodes, Pods, PodGroups, a ``KubeSchedulerConfiguration``...) is read
  by shoal's scenario loader, as ``shoal simulate`` reads it;
- in ``sh`` blocks, every ``shoal`` command line (``shoal``, ``.venv/bin/shoal``, after
  any ``VAR=value``) is accepted by shoal's own argument parser: a real subcommand with
  real options; ``./dev`` names one of its commands;
- every repository path the text names (``examples/...``, ``deploy/...``,
  ``engine/...``) exists;
- every relative link names a file that exists and, with ``#anchor``, a heading of it.

mkdocs (``./dev docs``) checks the site's links and anchors too; these run in the test
suite, need no mkdocs, and cover README.md, which is not part of the site.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shlex
import tempfile
import tomllib
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import yaml

from events.errors import ShoalError
from shards.inputs.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<lang>[\w+-]*)[^\n]*$")
REPO_DIRS = (
    "events",
    "engine",
    "shards",
    "loadtest",
    "tests",
    "deploy",
    "examples",
    "tools",
    "docs",
)
REPO_PATH = re.compile(r"(?<![\w./~:-])((?:" + "|".join(REPO_DIRS) + r")/[\w./-]*)")
LINK = re.compile(r"(?<!\!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")
SHELL_SEPARATORS = {"&&", "||", ";", "|", "&", ";;"}
DEV_COMMANDS = re.compile(r"^  ([a-z]+)\)", re.MULTILINE)


@dataclass(frozen=True)
class Block:
    """A fenced code block: its language, its text (dedented) and its first line."""

    lang: str
    text: str
    line: int


def code_blocks(markdown: str) -> list[Block]:
    """The fenced blocks of a page, fences indented under list items included."""
    blocks: list[Block] = []
    lines = markdown.split("\n")
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            stripped = lines[j].strip()
            if stripped.startswith(fence) and set(stripped) == {fence[0]}:
                break
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        blocks.append(Block(opening["lang"].lower(), "\n".join(body), i + 1))
        i = j + 1
    return blocks


def prose(markdown: str) -> str:
    """The page without its fenced blocks (links are not links inside them)."""
    kept: list[str] = []
    fence: str | None = None
    for line in markdown.split("\n"):
        opening = FENCE.match(line)
        if fence is None and opening is not None:
            fence = opening["fence"]
            kept.append("")
            continue
        if fence is not None:
            if line.strip().startswith(fence) and set(line.strip()) == {fence[0]}:
                fence = None
            kept.append("")
            continue
        kept.append(line)
    return "\n".join(kept)


# ---------------------------------------------------------------- data blocks


def check_yaml(text: str) -> list[str]:
    try:
        list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        return [f"YAML does not parse: {' '.join(str(exc).split())}"]
    return []


SCENARIO_KINDS = {
    "Node",
    "Pod",
    "List",
    "PriorityClass",
    "KubeSchedulerConfiguration",
    "ShardingConfiguration",
    "PodGroup",
    "ElasticQuota",
    "Workload",
    "PodDisruptionBudget",
    "Deployment",
    "ReplicaSet",
    "StatefulSet",
    "DaemonSet",
    "Job",
    "Topology",
    "HyperNode",
}


def check_scenario(text: str) -> list[str]:
    """A block of scenario kinds only is read as ``shoal simulate`` reads a file (any
    other block, a kustomization or a fragment, is left to ``check_yaml``)."""
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError:
        return []  # check_yaml says so
    if not documents or not all(
        isinstance(d, dict) and "apiVersion" in d and d.get("kind") in SCENARIO_KINDS
        for d in documents
    ):
        return []
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "block.yaml"
        path.write_text(text)
        try:
            load_scenario([str(path)])
        except ShoalError as exc:
            return [f"shoal refuses it as a scenario: {exc}".replace(str(path), "block")]
    return []


def check_json(text: str) -> list[str]:
    try:
        json.loads(text)
    except ValueError as exc:
        return [f"JSON does not parse: {exc}"]
    return []


def check_toml(text: str) -> list[str]:
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return [f"TOML does not parse: {exc}"]
    return []


def check_python(text: str) -> list[str]:
    try:
        compile(text, "<block>", "exec")
    except SyntaxError as exc:
        return [f"Python does not compile: {exc}"]
    return []


# ---------------------------------------------------------------- shell blocks


def shell_commands(text: str) -> list[list[str]]:
    """The simple commands of a shell block: continuation lines joined, comments
    dropped, split at ``&&``, ``;``, ``|``, ``&``; each a list of words."""
    joined = re.sub(r"\\\n", " ", text)
    commands: list[list[str]] = []
    for line in joined.split("\n"):
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        current: list[str] = []
        for word in lexer:
            if word in SHELL_SEPARATORS:
                if current:
                    commands.append(current)
                current = []
            else:
                current.append(word)
        if current:
            commands.append(current)
    return commands


def _without_assignments(words: list[str]) -> list[str]:
    i = 0
    while i < len(words) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[i]):
        i += 1
    return words[i:]


def check_shell(text: str, parser: argparse.ArgumentParser, dev_commands: set[str]) -> list[str]:
    problems: list[str] = []
    for command in shell_commands(text):
        words = _without_assignments(command)
        if not words:
            continue
        program, args = words[0], words[1:]
        if program == "shoal" or program.endswith("/bin/shoal"):
            why = parse_error(parser, args)
            if why is not None:
                problems.append(f"`{shlex.join(words)}`: {why}")
        elif program == "./dev" and (not args or args[0] not in dev_commands):
            problems.append(f"`{shlex.join(words)}`: ./dev has no such command")
    return problems


def exact(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The parser, and every subcommand's, refusing abbreviated options (``--shard`` for
    ``--shards``): the documentation spells options out."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                exact(sub)
    return parser


def parse_error(parser: argparse.ArgumentParser, args: list[str]) -> str | None:
    """What shoal's parser says of these arguments (None: it accepts them)."""
    if "-h" in args or "--help" in args:
        return None
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(args)
        except SystemExit as exc:
            if exc.code:
                lines = err.getvalue().strip().splitlines()
                return lines[-1] if lines else f"exit {exc.code}"
    return None


def dev_commands(dev_script: Path) -> set[str]:
    """The commands of the ``./dev`` script: the patterns of its top-level ``case``."""
    return set(DEV_COMMANDS.findall(dev_script.read_text()))


# ---------------------------------------------------------------- paths and links


def check_paths(text: str, root: Path) -> list[str]:
    problems: list[str] = []
    for match in REPO_PATH.finditer(text):
        path = match.group(1).rstrip(".,:;")
        if any(c in path for c in "<>*") or not path:
            continue
        if not (root / path).exists():
            problems.append(f"{path}: no such file or folder in the repository")
    return sorted(set(problems))


def slugify(text: str) -> str:
    """The anchor Python-Markdown's toc extension (and so mkdocs) gives a heading."""
    text = re.sub(r"`([^`]*)`", r"\1", text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(markdown: str) -> set[str]:
    found: set[str] = set()
    for line in prose(markdown).split("\n"):
        heading = HEADING.match(line)
        if heading is None:
            continue
        title = heading.group(2)
        explicit = re.search(r"\{[^}]*#([\w-]+)[^}]*\}\s*$", title)
        if explicit:
            found.add(explicit.group(1))
        else:
            found.add(slugify(title))
    return found


def check_links(markdown: str, page: Path) -> list[str]:
    problems: list[str] = []
    for match in LINK.finditer(prose(markdown)):
        target = match.group(1) or match.group(2)
        if re.match(r"[a-z]+:", target) or target.startswith("/"):
            continue  # a URL (http:, mailto:) or an absolute path: not checked here
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            problems.append(f"link {target}: no file {path}")
            continue
        if anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            problems.append(f"link {target}: {path or page.name} has no heading #{anchor}")
    return problems


# ---------------------------------------------------------------- a page


def check_page(
    page: Path, parser: argparse.ArgumentParser, dev: set[str], root: Path = ROOT
) -> list[str]:
    """Every problem of one page, each prefixed with the page and line."""
    text = page.read_text()
    name = page.relative_to(root) if page.is_relative_to(root) else page
    problems = [f"{name}: {p}" for p in check_links(text, page)]
    problems += [f"{name}: {p}" for p in check_paths(text, root)]
    checks = {
        "yaml": lambda text: check_yaml(text) + check_scenario(text),
        "yml": lambda text: check_yaml(text) + check_scenario(text),
        "json": check_json,
        "toml": check_toml,
        "python": check_python,
    }
    for block in code_blocks(text):
        if block.lang in checks:
            found = checks[block.lang](block.text)
        elif block.lang in ("sh", "bash", "shell", "console"):
            found = check_shell(block.text, parser, dev)
        else:
            found = []
        problems += [f"{name}:{block.line}: {p}" for p in found]
    return problems
