"""Reading DRA objects (``resource.k8s.io/v1``) field by field, and their CEL selectors.

What is read and what is refused, and why, is the scope written in :mod:`shards.inputs.dra`;
this module reads one object at a time and raises :class:`InputError` naming the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from events.errors import InputError
from events.types import DeviceRef
from shards.inputs.fields import _list, _map, _str
from shards.inputs.limits import shown

VERSION: Final = "resource.k8s.io/v1"
KINDS: Final = frozenset(
    (VERSION, kind)
    for kind in ("DeviceClass", "ResourceSlice", "ResourceClaim", "ResourceClaimTemplate")
)
DRIVER_LABEL: Final = "dra.shoal.io/driver"
DEVICES_LABEL: Final = "dra.shoal.io/devices"
"""A node label: how many DRA devices the node has (for ``allocationMode: All``)."""
ALL: Final = 0
"""``RequestSpec.count`` of an ``allocationMode: All`` request."""
ATTRIBUTE_PREFIX: Final = "dra.shoal.io/"
MAX_COUNT: Final = 64

_STRING = r'"((?:[^"\\]|\\.)*)"|\'((?:[^\'\\]|\\.)*)\''
_DRIVER = re.compile(rf"^device\.driver\s*==\s*(?:{_STRING})$")
_ATTRIBUTE = re.compile(
    rf"^device\.attributes\[\s*(?:{_STRING})\s*\]"
    rf"(?:\.([A-Za-z_][A-Za-z0-9_]*)|\[\s*(?:{_STRING})\s*\])"
    rf"\s*==\s*(?:{_STRING}|(-?[0-9]+)|(true|false))$"
)


class ClaimPending(Exception):
    """A pod's claim, its template's claim or its device class is not known yet (in
    ``serve``: the pod waits for it)."""


@dataclass(frozen=True, slots=True)
class Selection:
    """What CEL selectors ask of a device: its driver, and attribute values."""

    driver: str = ""
    attributes: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class RequestSpec:
    name: str
    device_class: str
    count: int
    selection: Selection


@dataclass(frozen=True, slots=True)
class ClaimSpec:
    name: str
    namespace: str
    uid: str
    requests: tuple[RequestSpec, ...]
    reserved_for: tuple[str, ...] = ()
    """The uids of the pods the claim is reserved for (``status.reservedFor``)."""
    allocated: tuple[DeviceRef, ...] = ()
    """The devices of its allocation (``status.allocation.devices.results``)."""


@dataclass(frozen=True, slots=True)
class SliceSpec:
    name: str
    driver: str
    pool: str
    generation: int
    node: str
    devices: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]
    """(device name, its attributes as (qualified name, typed value)), in slice order."""


def _unquote(text: str) -> str:
    try:
        value = json.loads(f'"{text}"')
    except ValueError:
        value = text
    return str(value)


def parse_selectors(value: Any, where: str) -> Selection:
    """CEL ``selectors`` → a :class:`Selection`; the forms of the module docstring only."""
    driver = ""
    attributes: dict[str, str] = {}
    for i, entry in enumerate(_list(value, where)):
        at = f"{where}[{i}]"
        cel = _map(_map(entry, at).get("cel"), f"{at}.cel", required=True)
        expression = _str(cel.get("expression"), f"{at}.cel.expression")
        for term in _split_and(expression):
            found = _DRIVER.match(term)
            if found:
                named = _unquote(found.group(1) or found.group(2) or "")
                if driver and named != driver:
                    raise InputError(
                        f"selects two drivers ({driver}, {named}): no device matches",
                        location=f"{at}.cel.expression",
                    )
                driver = named
                continue
            found = _ATTRIBUTE.match(term)
            if found is None:
                raise InputError(
                    f"CEL selector {shown(term)} is not one shoal evaluates (it reads "
                    'device.driver == "x" and device.attributes["domain"].name == value, '
                    "joined by &&)",
                    location=f"{at}.cel.expression",
                )
            groups = found.groups()
            domain = _unquote(groups[0] or groups[1] or "")
            name = groups[2] or _unquote(groups[3] or groups[4] or "")
            if groups[5] is not None or groups[6] is not None:
                typed = "s:" + _unquote(groups[5] or groups[6] or "")
            elif groups[7] is not None:
                typed = f"i:{int(groups[7])}"
            else:
                typed = f"b:{groups[8]}"
            key = f"{domain}/{name}"
            if attributes.get(key, typed) != typed:
                raise InputError(
                    f"asks {key} to be both {attributes[key]} and {typed}",
                    location=f"{at}.cel.expression",
                )
            attributes[key] = typed
    return Selection(driver, tuple(sorted(attributes.items())))


def _split_and(expression: str) -> list[str]:
    """The terms of ``a && b && c`` (outside string literals), stripped."""
    terms, current, quote, escaped = [], [], "", False
    i = 0
    while i < len(expression):
        char = expression[i]
        if quote:
            current.append(char)
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
            current.append(char)
        elif expression.startswith("&&", i):
            terms.append("".join(current).strip())
            current = []
            i += 1
        else:
            current.append(char)
        i += 1
    terms.append("".join(current).strip())
    return [t[1:-1].strip() if t.startswith("(") and t.endswith(")") else t for t in terms]


def merge(first: Selection, second: Selection, where: str) -> Selection:
    if first.driver and second.driver and first.driver != second.driver:
        raise InputError(
            f"selects driver {second.driver}, its class selects {first.driver}: no device matches",
            location=where,
        )
    attributes = dict(first.attributes)
    for key, value in second.attributes:
        if attributes.get(key, value) != value:
            raise InputError(
                f"asks {key} to be {value}, its class asks {attributes[key]}", location=where
            )
        attributes[key] = value
    return Selection(first.driver or second.driver, tuple(sorted(attributes.items())))


def _meta(obj: Mapping[str, Any], *, namespaced: bool) -> tuple[str, str, str]:
    meta = _map(obj.get("metadata"), "metadata", required=True)
    name = _str(meta.get("name"), "metadata.name")
    if not name or "/" in name:
        raise InputError(f"invalid name {shown(name)}", location="metadata.name")
    namespace = str(meta.get("namespace") or "default") if namespaced else ""
    return name, namespace, str(meta.get("uid") or "")


def device_class(obj: Mapping[str, Any]) -> tuple[str, Selection]:
    """A ``DeviceClass`` → its name and what it selects (one driver, required)."""
    name, _, _ = _meta(obj, namespaced=False)
    spec = _map(obj.get("spec"), "spec")
    selection = parse_selectors(spec.get("selectors"), "spec.selectors")
    if not selection.driver:
        raise InputError(
            'shoal needs a DeviceClass to select one driver (device.driver == "x")',
            location="spec.selectors",
        )
    if spec.get("extendedResourceName") is not None:
        raise InputError(
            "extended resources backed by DRA are not supported",
            location="spec.extendedResourceName",
        )
    return name, selection


_REFUSED_SLICE: Final = ("nodeSelector", "allNodes", "perDeviceNodeSelection", "sharedCounters")
_REFUSED_DEVICE: Final = (
    "consumesCounters",
    "taints",
    "bindsToNode",
    "bindingConditions",
    "bindingFailureConditions",
    "allowMultipleAllocations",
    "nodeName",
    "nodeSelector",
    "allNodes",
)


def _typed(value: Any, where: str) -> str:
    attribute = _map(value, where)
    for kind, tag in (("string", "s"), ("int", "i"), ("bool", "b"), ("version", "v")):
        if kind in attribute:
            raw = attribute[kind]
            if kind == "bool":
                return f"b:{'true' if raw else 'false'}"
            return f"{tag}:{raw}"
    return "?:" + json.dumps(attribute, sort_keys=True)  # a list value: matches no equality


def resource_slice(obj: Mapping[str, Any]) -> SliceSpec:
    """A ``ResourceSlice`` of one node → its devices; refused where out of scope."""
    name, _, _ = _meta(obj, namespaced=False)
    spec = _map(obj.get("spec"), "spec", required=True)
    for key in _REFUSED_SLICE:
        if spec.get(key) not in (None, False, []):
            raise InputError(
                "shoal reads slices of one node's devices (spec.nodeName) only",
                location=f"spec.{key}",
            )
    driver = _str(spec.get("driver"), "spec.driver")
    pool = _map(spec.get("pool"), "spec.pool", required=True)
    node = _str(spec.get("nodeName"), "spec.nodeName")
    generation = pool.get("generation", 0)
    if not isinstance(generation, int) or isinstance(generation, bool):
        raise InputError("must be an integer", location="spec.pool.generation")
    devices = []
    for i, raw in enumerate(_list(spec.get("devices"), "spec.devices")):
        at = f"spec.devices[{i}]"
        device = _map(raw, at)
        for key in _REFUSED_DEVICE:
            if device.get(key) not in (None, False, []):
                raise InputError("not supported by shoal's DRA allocation", location=f"{at}.{key}")
        attributes = []
        for key, value in _map(device.get("attributes"), f"{at}.attributes").items():
            qualified = key if "/" in key else f"{driver}/{key}"
            attributes.append((qualified, _typed(value, f"{at}.attributes.{key}")))
        devices.append((_str(device.get("name"), f"{at}.name"), tuple(sorted(attributes))))
    pool_name = _str(pool.get("name"), "spec.pool.name")
    return SliceSpec(name, driver, pool_name, generation, node, tuple(devices))


_REFUSED_REQUEST: Final = ("adminAccess", "tolerations", "capacity", "derivedAttributes")
_FIELDS: Final = {
    "devices": ("requests", "constraints", "config"),
    "request": ("name", "exactly", "firstAvailable"),
    "exactly": ("deviceClassName", "selectors", "allocationMode", "count", *_REFUSED_REQUEST),
}


def _known(value: Mapping[str, Any], what: str, where: str) -> None:
    """Refuse a field the API does not have here (a mis-indented ``selectors`` would
    otherwise be dropped, and the claim given any device)."""
    for key in value:
        if key not in _FIELDS[what]:
            raise InputError(
                f"unknown field (known: {', '.join(_FIELDS[what])})", location=f"{where}.{key}"
            )


def claim_requests(spec_value: Any, where: str) -> tuple[RequestSpec, ...]:
    """A ResourceClaim's ``spec`` → its requests (the scope of the module docstring)."""
    spec = _map(spec_value, where, required=True)
    devices = _map(spec.get("devices"), f"{where}.devices", required=True)
    _known(devices, "devices", f"{where}.devices")
    for key in ("constraints",):
        if devices.get(key):
            raise InputError("not supported by shoal", location=f"{where}.devices.{key}")
    out = []
    for i, raw in enumerate(_list(devices.get("requests"), f"{where}.devices.requests")):
        at = f"{where}.devices.requests[{i}]"
        request = _map(raw, at)
        _known(request, "request", at)
        name = _str(request.get("name"), f"{at}.name")
        if request.get("firstAvailable") is not None:
            raise InputError("not supported by shoal", location=f"{at}.firstAvailable")
        exactly = _map(request.get("exactly"), f"{at}.exactly", required=True)
        _known(exactly, "exactly", f"{at}.exactly")
        for key in _REFUSED_REQUEST:
            if exactly.get(key) not in (None, False, []):
                raise InputError("not supported by shoal", location=f"{at}.exactly.{key}")
        mode = exactly.get("allocationMode", "ExactCount")
        if mode not in ("ExactCount", "All"):
            raise InputError(
                f"allocationMode {shown(mode)}: ExactCount or All",
                location=f"{at}.exactly.allocationMode",
            )
        count = exactly.get("count", 1 if mode == "ExactCount" else None)
        if mode == "All":
            if count is not None:
                raise InputError(
                    "only with allocationMode ExactCount", location=f"{at}.exactly.count"
                )
            count = ALL
        elif not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_COUNT:
            raise InputError(f"must be 1..{MAX_COUNT}", location=f"{at}.exactly.count")
        out.append(
            RequestSpec(
                name,
                _str(exactly.get("deviceClassName"), f"{at}.exactly.deviceClassName"),
                count,
                parse_selectors(exactly.get("selectors"), f"{at}.exactly.selectors"),
            )
        )
    if not out:
        raise InputError("no requests", location=f"{where}.devices.requests")
    return tuple(out)


def resource_claim(obj: Mapping[str, Any]) -> ClaimSpec:
    name, namespace, uid = _meta(obj, namespaced=True)
    requests = claim_requests(obj.get("spec"), "spec")
    status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
    reserved = tuple(
        str(r.get("uid") or "")
        for r in (status or {}).get("reservedFor") or ()
        if isinstance(r, Mapping)
    )
    allocation = (status or {}).get("allocation")
    results = (
        ((allocation or {}).get("devices") or {}).get("results")
        if isinstance(allocation, Mapping)
        else ()
    )
    allocated = tuple(
        DeviceRef(driver=str(r.get("driver")), pool=str(r.get("pool")), device=str(r.get("device")))
        for r in results or ()
        if isinstance(r, Mapping)
    )
    return ClaimSpec(name, namespace, uid, requests, reserved, allocated)


def claim_template(obj: Mapping[str, Any]) -> tuple[str, str, tuple[RequestSpec, ...]]:
    name, namespace, _ = _meta(obj, namespaced=True)
    spec = _map(obj.get("spec"), "spec", required=True)
    return name, namespace, claim_requests(spec.get("spec"), "spec.spec")
