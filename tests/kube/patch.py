"""The three patch formats of the Kubernetes API, as the in-repo API server applies them.

- ``application/merge-patch+json``: RFC 7386 (an object merged in; ``null`` deletes).
- ``application/strategic-merge-patch+json``: core kinds only (the API server answers
  415 for custom resources). Applied here as a merge patch: the lists that carry a patch
  merge key in the real server (containers, conditions, tolerations...) are replaced
  whole rather than merged by key. Nothing shoal sends depends on the difference.
- ``application/json-patch+json``: RFC 6902, a *list* of operations (``add``,
  ``remove``, ``replace``, ``move``, ``copy``, ``test``). An object body is refused with
  400, in the real server's words.
"""

from __future__ import annotations

import copy
from typing import Any

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class PatchError(Exception):
    """A patch that cannot be applied: ``code`` is the HTTP status the server answers."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: ``patch`` merged into ``target`` (neither is modified)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(422, "Invalid", f"json patch path {path!r} does not start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> tuple[Any, str]:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise PatchError(422, "Invalid", f"json patch: path {path!r} does not exist")
    return node, parts[-1]


def _get(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    parent, last = _parent(doc, parts, path)
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise PatchError(422, "Invalid", f"json patch: path {path!r} does not exist")


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        raise PatchError(422, "Invalid", "json patch: cannot remove the whole document")
    parent, last = _parent(doc, parts, path)
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise PatchError(422, "Invalid", f"json patch: remove of missing path {path!r}")


def _add(doc: Any, path: str, value: Any, *, replace: bool) -> Any:
    parts = _pointer(path)
    if not parts:
        return copy.deepcopy(value)
    parent, last = _parent(doc, parts, path)
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise PatchError(422, "Invalid", f"json patch: replace of missing path {path!r}")
        parent[last] = copy.deepcopy(value)
    elif isinstance(parent, list):
        if last == "-" and not replace:
            parent.append(copy.deepcopy(value))
        elif last.isdigit() and int(last) <= len(parent) - (1 if replace else 0):
            if replace:
                parent[int(last)] = copy.deepcopy(value)
            else:
                parent.insert(int(last), copy.deepcopy(value))
        else:
            raise PatchError(422, "Invalid", f"json patch: index out of range in {path!r}")
    else:
        raise PatchError(422, "Invalid", f"json patch: path {path!r} does not exist")
    return doc


def json_patch(target: Any, patch: Any) -> Any:
    """RFC 6902: the operations of ``patch`` applied in order to a copy of ``target``."""
    if isinstance(patch, dict):
        raise PatchError(
            400,
            "BadRequest",
            "error decoding patch: json: cannot unmarshal object into Go value of type "
            "[]handlers.jsonPatchOp",
        )
    if not isinstance(patch, list):
        raise PatchError(400, "BadRequest", "json patch: the body is not a list of operations")
    doc = copy.deepcopy(target)
    for op in patch:
        if not isinstance(op, dict) or not isinstance(op.get("path"), str):
            raise PatchError(400, "BadRequest", f"json patch: bad operation {op!r}")
        kind, path = op.get("op"), op["path"]
        if kind in ("add", "replace"):
            if "value" not in op:
                raise PatchError(422, "Invalid", f"json patch: {kind} needs a value")
            doc = _add(doc, path, op["value"], replace=kind == "replace")
        elif kind == "remove":
            _remove(doc, path)
        elif kind in ("move", "copy"):
            source = op.get("from")
            if not isinstance(source, str):
                raise PatchError(422, "Invalid", f"json patch: {kind} needs from")
            value = _remove(doc, source) if kind == "move" else copy.deepcopy(_get(doc, source))
            doc = _add(doc, path, value, replace=False)
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise PatchError(422, "Invalid", f"json patch: test failed at {path!r}")
        else:
            raise PatchError(400, "BadRequest", f"json patch: unknown operation {kind!r}")
    return doc


def apply_patch(content_type: str, target: Any, patch: Any, *, core: bool) -> Any:
    """``patch`` applied to ``target`` in the format ``content_type`` names, or
    :class:`PatchError` with the status the API server answers."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media == MERGE or (media == STRATEGIC and core):
        if not isinstance(patch, dict):
            raise PatchError(400, "BadRequest", "a merge patch must be a JSON object")
        return merge_patch(target, patch)
    if media == JSON_PATCH:
        return json_patch(target, patch)
    raise PatchError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted media types include: "
        f"{JSON_PATCH}, {MERGE}" + (f", {STRATEGIC}" if core else ""),
    )
