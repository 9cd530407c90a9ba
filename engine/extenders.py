"""kube-scheduler HTTP extenders: their configuration (``extenders:`` of a
``KubeSchedulerConfiguration``, or of a legacy ``Policy``), validated from plain data.

What shoal does with each field (the README's "Extenders" section says the same):

- ``urlPrefix``, ``filterVerb``, ``prioritizeVerb``, ``weight``, ``nodeCacheCapable``,
  ``ignorable``, ``httpTimeout``, ``enableHTTPS`` and ``tlsConfig`` (``insecure``,
  ``serverName``, ``caFile``, ``caData``, ``certFile``, ``keyFile``) are honoured;
- ``managedResources`` is honoured for interest (an extender with managed resources is
  asked only about pods that request one of them); ``ignoredByScheduler: true`` is
  refused (the built-in fit would still count the resource);
- ``preemptVerb`` is accepted with a warning: preemption chooses victims without asking
  the extender;
- ``bindVerb`` is refused: shoal's binder binds every pod it places;
- ``profiles`` (a shoal field: the ``schedulerName`` of each profile the extender serves;
  default: every profile, as kube-scheduler does) keeps an extender away from the pods
  of other profiles.

Nothing here does I/O: the shard runtime (``shards/extenders``) makes the calls and
records their answers in the log; the engine reads the answers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from events.errors import InputError

MAX_EXTENDER_PRIORITY: Final = 10
"""The highest score an extender gives a node (``extenderv1.MaxExtenderPriority``)."""
MAX_NODE_SCORE: Final = 100
"""The highest score a plugin gives a node (``framework.MaxNodeScore``)."""
SCALE: Final = MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY
DEFAULT_TIMEOUT_NS: Final = 5_000_000_000
"""kube-scheduler's ``DefaultExtenderTimeout``: 5 s when ``httpTimeout`` is not set."""
MAX_TIMEOUT_NS: Final = 3_600_000_000_000
MAX_WEIGHT: Final = 1_000_000
_FIELDS: Final = {
    "urlPrefix",
    "filterVerb",
    "prioritizeVerb",
    "preemptVerb",
    "bindVerb",
    "weight",
    "enableHTTPS",
    "enableHttps",
    "tlsConfig",
    "httpTimeout",
    "nodeCacheCapable",
    "managedResources",
    "ignorable",
    "profiles",
}
_TLS: Final = {"insecure", "serverName", "caFile", "caData", "certFile", "keyFile"}
_TLS_REFUSED: Final = {"certData", "keyData"}
_DURATION_PART: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_NS: Final = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}


@dataclass(frozen=True, slots=True)
class TLSConfig:
    insecure: bool = False
    server_name: str = ""
    ca_file: str = ""
    ca_data: str = ""
    cert_file: str = ""
    key_file: str = ""


@dataclass(frozen=True, slots=True)
class ExtenderConfig:
    """One extender, as kube-scheduler's ``Extender`` (plus shoal's ``profiles``)."""

    url_prefix: str
    filter_verb: str = ""
    prioritize_verb: str = ""
    preempt_verb: str = ""
    weight: int = 1
    https: bool = False
    tls: TLSConfig | None = None
    timeout_ns: int = DEFAULT_TIMEOUT_NS
    node_cache_capable: bool = False
    managed: tuple[str, ...] = ()
    ignorable: bool = False
    profiles: tuple[str, ...] = ()
    """Scheduler names it serves (empty: all)."""

    @property
    def name(self) -> str:
        """How decisions and ``--explain`` name it (kube-scheduler names it by its URL)."""
        return f"extender {self.url_prefix}"

    def url(self, verb: str) -> str:
        prefix = self.url_prefix.rstrip("/")
        if self.https and prefix.startswith("http://"):
            prefix = "https://" + prefix[len("http://") :]
        elif "://" not in prefix:
            prefix = ("https://" if self.https else "http://") + prefix
        return f"{prefix}/{verb.lstrip('/')}"

    def serves(self, scheduler_name: str) -> bool:
        return not self.profiles or scheduler_name in self.profiles

    def interested(self, requests: dict[str, int]) -> bool:
        """kube-scheduler's ``IsInterested``: no managed resources, or the pod asks for
        one of them."""
        return not self.managed or any(r in requests for r in self.managed)


def _bool(raw: dict[str, Any], key: str, where: str) -> bool:
    value = raw.get(key, False)
    if not isinstance(value, bool):
        raise InputError("must be true or false", location=f"{where}.{key}")
    return value


def _str(raw: dict[str, Any], key: str, where: str) -> str:
    value = raw.get(key, "")
    if not isinstance(value, str):
        raise InputError("must be a string", location=f"{where}.{key}")
    return value


def parse_duration(value: Any, where: str) -> int:
    """``httpTimeout``: a Go duration string (``"5s"``, ``"1m30s"``, ``"500ms"``) as in a
    ``KubeSchedulerConfiguration``, or integer nanoseconds as in a legacy ``Policy``."""
    text = value.strip() if isinstance(value, str) else None
    if isinstance(value, int) and not isinstance(value, bool):
        ns = value
    elif text and len(text) <= 64 and _DURATION_PART.sub("", text) == "":
        ns = 0
        for number, unit in _DURATION_PART.findall(text):
            whole, _, fraction = number.partition(".")
            scale = _UNIT_NS[unit]
            ns += int(whole or 0) * scale + int(fraction or 0) * scale // 10 ** len(fraction)
    elif text == "0":
        ns = 0
    else:
        raise InputError(
            f"must be a duration such as '5s' or '500ms' (or nanoseconds), got {value!r}",
            location=where,
        )
    if not 0 <= ns <= MAX_TIMEOUT_NS:
        raise InputError("must be between 0 and 1h", location=where)
    return ns or DEFAULT_TIMEOUT_NS


def _tls(raw: Any, where: str) -> TLSConfig | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InputError("must be a mapping", location=where)
    for key in sorted(raw):
        if key in _TLS_REFUSED and raw[key]:
            raise InputError(
                f"{key} is not supported; name a file with {key[:-4]}File instead",
                location=f"{where}.{key}",
            )
        if key not in _TLS | _TLS_REFUSED:
            raise InputError(f"unknown field {key!r}", location=where)
    return TLSConfig(
        insecure=_bool(raw, "insecure", where),
        server_name=_str(raw, "serverName", where),
        ca_file=_str(raw, "caFile", where),
        ca_data=_str(raw, "caData", where),
        cert_file=_str(raw, "certFile", where),
        key_file=_str(raw, "keyFile", where),
    )


def parse_extender(raw: Any, where: str, warnings: list[str]) -> ExtenderConfig:
    """One entry of ``extenders:``; what is accepted but not acted on goes to
    ``warnings`` (each naming the field)."""
    if not isinstance(raw, dict):
        raise InputError("must be a mapping", location=where)
    unknown = set(raw) - _FIELDS
    if unknown:
        raise InputError(f"unknown field {sorted(unknown)[0]!r}", location=where)
    url = _str(raw, "urlPrefix", where)
    if not url:
        raise InputError("needs a urlPrefix", location=f"{where}.urlPrefix")
    filter_verb = _str(raw, "filterVerb", where)
    prioritize_verb = _str(raw, "prioritizeVerb", where)
    preempt_verb = _str(raw, "preemptVerb", where)
    if _str(raw, "bindVerb", where):
        raise InputError(
            "bindVerb is not supported: shoal's binder binds every pod it places "
            "(shoal extender serves bind for kube-scheduler)",
            location=f"{where}.bindVerb",
        )
    if preempt_verb:
        warnings.append(
            f"{where}.preemptVerb: not called; preemption chooses its victims without "
            "asking the extender"
        )
    weight = raw.get("weight", 1 if not prioritize_verb else None)
    if prioritize_verb and weight is None:
        raise InputError("must be set with prioritizeVerb", location=f"{where}.weight")
    if not isinstance(weight, int) or isinstance(weight, bool) or not 0 < weight <= MAX_WEIGHT:
        raise InputError(
            f"must be a positive integer, at most {MAX_WEIGHT}", location=f"{where}.weight"
        )
    https = _bool(raw, "enableHTTPS", where) or _bool(raw, "enableHttps", where)
    timeout = parse_duration(raw.get("httpTimeout", 0), f"{where}.httpTimeout")
    managed: list[str] = []
    resources = raw.get("managedResources") or []
    if not isinstance(resources, list):
        raise InputError("must be a list", location=f"{where}.managedResources")
    for i, item in enumerate(resources):
        loc = f"{where}.managedResources[{i}]"
        if not isinstance(item, dict) or set(item) - {"name", "ignoredByScheduler"}:
            raise InputError("must be a mapping of name and ignoredByScheduler", location=loc)
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise InputError("needs a resource name", location=f"{loc}.name")
        if _bool(item, "ignoredByScheduler", loc):
            raise InputError(
                "ignoredByScheduler: true is not supported (shoal's fit still counts the resource)",
                location=f"{loc}.ignoredByScheduler",
            )
        managed.append(name)
    profiles = raw.get("profiles") or []
    if not isinstance(profiles, list) or not all(isinstance(p, str) and p for p in profiles):
        raise InputError("must be a list of schedulerNames", location=f"{where}.profiles")
    if not filter_verb and not prioritize_verb:
        warnings.append(f"{where}: neither filterVerb nor prioritizeVerb: never called")
    return ExtenderConfig(
        url_prefix=url,
        filter_verb=filter_verb,
        prioritize_verb=prioritize_verb,
        preempt_verb=preempt_verb,
        weight=weight,
        https=https,
        tls=_tls(raw.get("tlsConfig"), f"{where}.tlsConfig"),
        timeout_ns=timeout,
        node_cache_capable=_bool(raw, "nodeCacheCapable", where),
        managed=tuple(managed),
        ignorable=_bool(raw, "ignorable", where),
        profiles=tuple(profiles),
    )


def parse_extenders(
    raw: Any, where: str, profiles: tuple[str, ...]
) -> tuple[tuple[ExtenderConfig, ...], tuple[str, ...]]:
    """The ``extenders`` list and the warnings it earns."""
    if raw is None:
        return (), ()
    if not isinstance(raw, list):
        raise InputError("must be a list of extenders", location=where)
    warnings: list[str] = []
    out = tuple(parse_extender(item, f"{where}[{i}]", warnings) for i, item in enumerate(raw))
    seen: set[str] = set()
    for i, ext in enumerate(out):
        if ext.url_prefix in seen:
            raise InputError(
                f"duplicate urlPrefix {ext.url_prefix!r}", location=f"{where}[{i}].urlPrefix"
            )
        seen.add(ext.url_prefix)
        for name in ext.profiles:
            if name not in profiles:
                raise InputError(
                    f"no profile has schedulerName {name!r}", location=f"{where}[{i}].profiles"
                )
    return out, tuple(warnings)


POLICY_FIELDS: Final = {"kind", "apiVersion", "extenders"}
POLICY_WARNED: Final = {
    "predicates",
    "priorities",
    "hardPodAffinitySymmetricWeight",
    "alwaysCheckAllPredicates",
}


def policy_to_config(raw: dict[str, Any], where: str) -> tuple[dict[str, Any], list[str]]:
    """A legacy ``Policy`` (kube-scheduler before v1.23) as the
    ``KubeSchedulerConfiguration`` it stands for: the default profile and its
    extenders; and a warning for each legacy field not acted on (predicates and
    priorities: the default profile's plugins run instead)."""
    warnings = []
    for key in sorted(raw):
        if key in POLICY_WARNED:
            warnings.append(
                f"{where}.{key}: legacy Policy {key} are not acted on; the default "
                "profile's plugins run (enable plugins in a KubeSchedulerConfiguration)"
            )
        elif key not in POLICY_FIELDS:
            raise InputError(f"unknown or unsupported Policy field {key!r}", location=where)
    converted = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "extenders": raw.get("extenders") or [],
    }
    return converted, warnings
