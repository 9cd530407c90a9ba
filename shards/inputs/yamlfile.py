"""Reading a YAML file of documents without trusting it.

PyYAML's safe loader builds no objects beyond plain data, but it trusts sizes: an alias
is shared, not copied, so 700 bytes of nested aliases ("billion laughs") load at once
and become billions of values to whoever walks them (a validator, ``repr`` in an error
message, the JSON of the log). So, before a document is built into data:

- the file is at most :data:`MAX_FILE_BYTES` and each document at most
  :data:`MAX_DOCUMENT_BYTES` (checked on the bytes, before parsing: a parsed document
  costs about 50 times its size in memory);
- its node graph is measured: an alias that refers to a node containing it (a
  recursive structure) is refused, and aliases may add at most
  :data:`MAX_ALIAS_NODES` values (scalars, lists and mappings, counted as if every
  alias were written out) over the whole file: sharing a labels block between nodes
  is fine, multiplying a file a millionfold is not;
- lists and mappings nest at most :data:`MAX_DEPTH` deep;
- a number of more than :data:`MAX_NUMBER_CHARS` characters, or a date that does not
  exist, is a YAML error at its line (PyYAML raises ``ValueError`` for both).

libyaml's loader (``CSafeLoader``, about ten times faster) where PyYAML has it with libyaml
0.2.5 or later, else the pure-Python one (:data:`LIBYAML`); both are held to the limits
above, checked on the composed node graph before any data is built. libyaml composes
nested collections by C recursion, which is bounded since 0.2.5: libyaml refuses more
than 1,000 nested levels itself (a YAML error at its line), where an older one would
overflow the C stack on a few hundred kilobytes of ``[``. In a file without an alias
(no ``*``) only the depth can exceed a limit, and a lighter walk measures it.

Every refusal is an :class:`~events.errors.InputError` naming the file, the document
and, where YAML knows it, the line and column.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import yaml
from yaml.constructor import ConstructorError, SafeConstructor

try:
    from yaml import CSafeLoader as _CSafeLoader
    from yaml._yaml import get_version as _libyaml_version
except ImportError:  # PyYAML built without libyaml
    _CSafeLoader = None  # type: ignore[assignment,misc]
    _libyaml_version = None  # type: ignore[assignment]

from events.errors import InputError
from shards.inputs.limits import cut

MAX_FILE_BYTES: Final = 256 * 1024 * 1024
MAX_DOCUMENT_BYTES: Final = 16 * 1024 * 1024
MAX_ALIAS_NODES: Final = 1_000_000
MAX_NUMBER_CHARS: Final = 64
MAX_DEPTH: Final = 100
"""Lists and mappings nested deeper than this (a Kubernetes object nests about 10 deep)
are refused: whoever walks the data (JSON of the log among them) recurses."""
_MARKER: Final = re.compile(rb"^(?:---|\.\.\.)(?=[ \t\r\n]|$)", re.MULTILINE)
"""A document marker: a line starting ``---`` or ``...``. YAML allows none inside a
document, so the text between two of them holds at most one document."""


class _Resolved:
    """The tag of a plain scalar from its text, remembered: the resolver tries up to a
    dozen patterns per scalar, and a file of many objects repeats the same keys and
    values (no path resolvers are set, so the tag depends on the text alone)."""

    _tags: dict[tuple[str, tuple[bool, bool]], str]

    def resolve(self, kind: type, value: Any, implicit: Any) -> str:
        if kind is not yaml.ScalarNode or type(value) is not str:
            return super().resolve(kind, value, implicit)  # type: ignore[misc,no-any-return]
        try:
            tags = self._tags
        except AttributeError:
            tags = self._tags = {}
        key = (value, (bool(implicit[0]), bool(implicit[1])))
        tag = tags.get(key)
        if tag is None:
            tag = tags[key] = super().resolve(kind, value, implicit)  # type: ignore[misc]
        return tag


class _Loader(_Resolved, yaml.SafeLoader):
    """The safe loader, with scalar constructors that fail as YAML errors."""


_Loaders = type[yaml.SafeLoader] | type[yaml.CSafeLoader]
_LIBYAML_TOO_DEEP: Final = "exceeded maximum nesting depth"
LIBYAML_NESTING: Final = (0, 2, 5)
"""The first libyaml that bounds nesting (``yaml_set_max_nest_level``, 1,000 levels)."""


def _guarded(
    construct: Callable[[Any, Any], Any], what: str
) -> Callable[[_Loader, yaml.Node], Any]:
    def guarded(loader: _Loader, node: yaml.Node) -> Any:
        text = str(node.value)
        if what == "number" and len(text) > MAX_NUMBER_CHARS:
            raise ConstructorError(
                None, None, f"a number of {len(text)} characters is out of range", node.start_mark
            )
        try:
            return construct(loader, node)
        except (ValueError, OverflowError) as exc:
            raise ConstructorError(
                None, None, f"invalid {what} {cut(text, 60)!r}: {exc}", node.start_mark
            ) from None

    return guarded


def _with_guards(loader: _Loaders) -> None:
    loader.add_constructor(
        "tag:yaml.org,2002:int", _guarded(SafeConstructor.construct_yaml_int, "number")
    )
    loader.add_constructor(
        "tag:yaml.org,2002:float", _guarded(SafeConstructor.construct_yaml_float, "number")
    )
    loader.add_constructor(
        "tag:yaml.org,2002:timestamp", _guarded(SafeConstructor.construct_yaml_timestamp, "date")
    )


_with_guards(_Loader)


def _libyaml_loader() -> type[yaml.CSafeLoader] | None:
    """libyaml's safe loader with the same scalar constructors, where PyYAML has
    libyaml and that libyaml bounds nesting; else None."""
    if _CSafeLoader is None or _libyaml_version is None:
        return None
    if _libyaml_version() < LIBYAML_NESTING:
        return None
    loader = type("_CLoader", (_Resolved, _CSafeLoader), {})
    _with_guards(loader)
    return loader


_CLoader: Final = _libyaml_loader()
LIBYAML: Final = _CLoader is not None
"""Whether :func:`read_documents` reads with libyaml (else with the pure-Python loader)."""


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _measure(root: yaml.Node) -> tuple[int, int]:
    """(values written, values once every alias is expanded) of one document's node
    graph; raises ``ConstructorError`` at an alias that refers to a node containing it.

    Iterative, each node visited once: linear in what was written, whatever it expands to.
    """
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, leaving = stack.pop()
        key = id(node)
        if leaving:
            on_path.discard(key)
            total = 1 + sum(sizes[id(child)] for child in _children(node))
            sizes[key] = min(total, 2**62)
            continue
        if key in sizes:
            continue
        on_path.add(key)
        if len(on_path) > MAX_DEPTH:
            raise ConstructorError(
                None, None, f"nested more than {MAX_DEPTH} deep", node.start_mark
            )
        stack.append((node, True))
        for child in _children(node):
            if id(child) in on_path:
                raise ConstructorError(
                    None,
                    None,
                    "an alias refers to a node that contains it (a recursive structure)",
                    child.start_mark,
                )
            if id(child) not in sizes:
                stack.append((child, False))
    return len(sizes), sizes[id(root)]


def _check_depth(root: yaml.Node) -> None:
    """Raise ``ConstructorError`` where collections nest deeper than :data:`MAX_DEPTH`:
    :func:`_measure` for a document without aliases (a tree), at a third of its cost."""
    stack: list[tuple[yaml.Node, int]] = [(root, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        node, depth = pop()
        value = node.value
        if type(value) is not list:
            continue
        if depth > MAX_DEPTH:
            raise ConstructorError(
                None, None, f"nested more than {MAX_DEPTH} deep", node.start_mark
            )
        if type(node) is yaml.MappingNode:
            for key, item in value:
                if type(key.value) is list:
                    push((key, depth + 1))
                if type(item.value) is list:
                    push((item, depth + 1))
        else:
            for item in value:
                if type(item.value) is list:
                    push((item, depth + 1))


_STR: Final = "tag:yaml.org,2002:str"
_SEQ: Final = "tag:yaml.org,2002:seq"
_MAP: Final = "tag:yaml.org,2002:map"
_PLAIN_SCALARS: Final = frozenset(
    f"tag:yaml.org,2002:{t}" for t in ("int", "float", "bool", "null", "timestamp")
)


class _Unusual(Exception):
    """A node the quick constructor leaves to PyYAML's (merge keys, other tags...)."""


def _construct_tree(loader: Any, root: yaml.Node) -> Any:
    """The data of a document without aliases (a tree), as the loader's constructor
    builds it, in one iterative pass that also checks :data:`MAX_DEPTH`; about twice as
    fast as ``construct_document``. Raises :class:`_Unusual` for anything but plain
    mappings, sequences and the core scalar tags (then the caller uses the loader's)."""
    constructors = loader.yaml_constructors

    def scalar(node: yaml.Node) -> Any:
        tag = node.tag
        if tag == _STR:
            return node.value
        if tag in _PLAIN_SCALARS and type(node) is yaml.ScalarNode:
            return constructors[tag](loader, node)
        raise _Unusual

    def container(node: yaml.Node) -> Any:
        if node.tag == _MAP and type(node) is yaml.MappingNode:
            return {}
        if node.tag == _SEQ and type(node) is yaml.SequenceNode:
            return []
        raise _Unusual

    if type(root) is yaml.ScalarNode:
        return scalar(root)
    data = container(root)
    stack: list[tuple[yaml.Node, Any, int]] = [(root, data, 1)]
    while stack:
        node, target, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ConstructorError(
                None, None, f"nested more than {MAX_DEPTH} deep", node.start_mark
            )
        if type(target) is dict:
            for key_node, value_node in node.value:
                if type(key_node) is not yaml.ScalarNode:
                    raise _Unusual  # PyYAML's error for an unhashable key
                key = scalar(key_node)
                if type(value_node) is yaml.ScalarNode:
                    target[key] = scalar(value_node)
                else:
                    child = target[key] = container(value_node)
                    stack.append((value_node, child, depth + 1))
        else:
            for item in node.value:
                if type(item) is yaml.ScalarNode:
                    target.append(scalar(item))
                else:
                    child = container(item)
                    target.append(child)
                    stack.append((item, child, depth + 1))
    return data


def _check_document_sizes(data: bytes, path: str) -> None:
    start = line = 0
    for match in [*_MARKER.finditer(data), None]:
        end = len(data) if match is None else match.start()
        if end - start > MAX_DOCUMENT_BYTES:
            raise InputError(
                f"the document from line {line + 1} is larger than {MAX_DOCUMENT_BYTES} bytes "
                "(split it: a v1 List into its items)",
                location=path,
            )
        if match is not None:
            line += data.count(b"\n", start, end)
            start = end


def read_documents(
    path: str, *, progress: Callable[[int, int], None] | None = None, pure: bool = False
) -> Iterator[tuple[int, Any]]:
    """Each document of the YAML file ``path`` as plain data, with its number (from 1;
    empty documents are counted and yield ``None``). ``progress(done, total)`` is told,
    after each document, how many of the file's characters are read. ``pure``: with the
    pure-Python loader even where libyaml is present (tests compare the two)."""
    try:
        if Path(path).stat().st_size > MAX_FILE_BYTES:
            raise InputError(f"file is larger than {MAX_FILE_BYTES} bytes", location=path)
        data = Path(path).read_bytes()
        _check_document_sizes(data, path)
        text = data.decode("utf-8")
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", location=path) from None
    except UnicodeDecodeError:
        raise InputError("not UTF-8 text", location=path) from None
    aliases = b"*" in data
    del data
    loader: yaml.SafeLoader | yaml.CSafeLoader = (
        _Loader(text) if pure or _CLoader is None else _CLoader(text)
    )
    number = 0  # documents read; an error is in the next one
    added = 0
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                break
            if aliases:
                written, expanded = _measure(node)
                added += expanded - written
                if added > MAX_ALIAS_NODES:
                    raise InputError(
                        f"aliases expand the file by more than {MAX_ALIAS_NODES} values",
                        location=f"{path}: document {number + 1}",
                    )
            else:
                try:
                    document = _construct_tree(loader, node)
                except _Unusual:
                    _check_depth(node)
                    document = loader.construct_document(node)
                number += 1
                if progress is not None:
                    progress(node.end_mark.index, len(text))
                yield number, document
                continue
            document = loader.construct_document(node)
            number += 1
            if progress is not None:
                progress(node.end_mark.index, len(text))
            yield number, document
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if problem == _LIBYAML_TOO_DEEP:  # libyaml's own bound, as ours is worded
            raise InputError(
                f"{where}nested more than {MAX_DEPTH} deep",
                location=f"{path}: document {number + 1}",
            ) from None
        raise InputError(
            f"malformed YAML: {where}{cut(str(problem), 200)}",
            location=f"{path}: document {number + 1}",
        ) from None
    except RecursionError:
        raise InputError(
            f"nested more than {MAX_DEPTH} deep", location=f"{path}: document {number + 1}"
        ) from None
    finally:
        loader.dispose()
