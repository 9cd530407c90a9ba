"""The in-repo server's ``events.k8s.io/v1`` view of its ``core/v1`` Event store, as the
real server has one store seen through both APIs (``pkg/apis/events/v1`` conversion):
``note`` is ``message``, ``regarding`` is ``involvedObject``, ``reportingController`` is
``reportingComponent``, ``deprecatedCount``/``deprecatedFirstTimestamp``/
``deprecatedLastTimestamp``/``deprecatedSource`` are ``count``/``firstTimestamp``/
``lastTimestamp``/``source``; ``eventTime``, ``series``, ``action``, ``reason``,
``type``, ``related`` and ``reportingInstance`` are the same in both.

A write through ``events.k8s.io/v1`` is validated as v1.37 validates it
(``pkg/apis/core/validation/events.go``): on create ``eventTime`` is required, ``type``
is Normal or Warning, the deprecated fields must be unset, ``series.count`` is at least
2 with a ``lastObservedTime``; with an ``eventTime`` (either API) ``reportingController``
(a qualified name), ``reportingInstance`` (at most 128 characters), ``action`` and
``reason`` (at most 128) are required, the note at most 1,024 bytes, and ``regarding``
in the Event's namespace. An update (a patch) may change ``series`` only, and metadata:
every other field named above is immutable. A refusal is the server's 422 ``Invalid``.
"""

from __future__ import annotations

import re
from typing import Any

JSON = dict[str, Any]
GROUP_VERSION = "events.k8s.io/v1"
RENAMED = {
    "note": "message",
    "regarding": "involvedObject",
    "reportingController": "reportingComponent",
    "deprecatedCount": "count",
    "deprecatedFirstTimestamp": "firstTimestamp",
    "deprecatedLastTimestamp": "lastTimestamp",
    "deprecatedSource": "source",
}
SAME: tuple[str, ...] = ("metadata", "eventTime", "series", "action", "reason", "type")
SAME += ("related", "reportingInstance")
IMMUTABLE = (
    "involvedObject",
    "reason",
    "message",
    "source",
    "firstTimestamp",
    "lastTimestamp",
    "count",
    "type",
    "eventTime",
    "action",
    "related",
    "reportingComponent",
    "reportingInstance",
)
"""What an ``events.k8s.io/v1`` update may not change (``ValidateEventUpdate``)."""
_QUALIFIED = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


def to_core(event: JSON) -> JSON:
    """An ``events.k8s.io/v1`` Event as the ``core/v1`` store holds it."""
    core: JSON = {"apiVersion": "v1", "kind": "Event"}
    for name, value in event.items():
        if name in RENAMED:
            core[RENAMED[name]] = value
        elif name in SAME:
            core[name] = value
    return core


def from_core(core: JSON) -> JSON:
    """A stored ``core/v1`` Event as ``events.k8s.io/v1`` shows it."""
    back = {v: k for k, v in RENAMED.items()}
    event: JSON = {"apiVersion": GROUP_VERSION, "kind": "Event"}
    for name, value in core.items():
        if name in back:
            event[back[name]] = value
        elif name in SAME:
            event[name] = value
    return event


def legacy_errors(core: JSON, namespace: str) -> list[str]:
    """``legacyValidateEvent`` for an Event with an ``eventTime`` (either API)."""
    if not core.get("eventTime"):
        return []
    errors = []
    involved = (core.get("involvedObject") or {}).get("namespace") or ""
    if involved and involved != namespace:
        errors.append(f"involvedObject.namespace: Invalid value: {involved!r}: does not match")
    controller = core.get("reportingComponent") or ""
    if not controller:
        errors.append("reportingController: Required value")
    elif not _QUALIFIED.match(controller) or len(controller.rsplit("/", 1)[-1]) > 63:
        errors.append(f"reportingController: Invalid value: {controller!r}: not a qualified name")
    instance = core.get("reportingInstance") or ""
    if not instance:
        errors.append("reportingInstance: Required value")
    elif len(instance) > 128:
        errors.append("reportingInstance: Invalid value: can have at most 128 characters")
    for name in ("action", "reason"):
        if not core.get(name):
            errors.append(f"{name}: Required value")
        elif len(core[name]) > 128:
            errors.append(f"{name}: Invalid value: can have at most 128 characters")
    if len((core.get("message") or "").encode()) > 1024:
        errors.append("message: Invalid value: can have at most 1024 characters")
    return errors


def _series_errors(core: JSON) -> list[str]:
    series = core.get("series")
    if series is None:
        return []
    errors = []
    if not isinstance(series.get("count"), int) or series["count"] < 2:
        errors.append("series.count: Invalid value: should be at least 2")
    if not series.get("lastObservedTime"):
        errors.append("series.lastObservedTime: Required value")
    return errors


def create_errors(event: JSON, namespace: str) -> list[str]:
    """Why v1.37 refuses to create ``event`` through ``events.k8s.io/v1`` (none: taken)."""
    core = to_core(event)
    errors = legacy_errors(core, namespace) + _series_errors(core)
    if not core.get("eventTime"):
        errors.append("eventTime: Required value")
    if core.get("type") not in ("Normal", "Warning"):
        errors.append(f"type: Invalid value: has invalid value: {core.get('type')}")
    for name in ("firstTimestamp", "lastTimestamp", "count"):
        if core.get(name):
            errors.append(f"{name}: Invalid value: needs to be unset")
    source = core.get("source") or {}
    if source.get("component") or source.get("host"):
        errors.append("source: Invalid value: needs to be unset")
    return errors


def update_errors(new: JSON, old: JSON, namespace: str) -> list[str]:
    """Why v1.37 refuses to make the stored ``old`` into ``new`` (both ``core/v1``
    form) through ``events.k8s.io/v1``."""
    errors = legacy_errors(new, namespace)
    if new.get("series") != old.get("series"):
        errors += _series_errors(new)
    for name in IMMUTABLE:
        if new.get(name) != old.get(name):
            errors.append(f"{name}: Invalid value: field is immutable")
    return errors
