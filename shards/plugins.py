"""User plugins: classes other packages publish in the entry-point group ``shoal.plugins``.

A distribution names each plugin class under the name configurations use::

    [project.entry-points."shoal.plugins"]
    NetworkSpeed = "shoal_example_plugins.network:NetworkSpeed"

Loading them is I/O (reading installed metadata, importing modules), so it happens here,
at the edge: the command line, ``serve``, ``worker`` and replay build a
:class:`~engine.framework.registry.Registry` (the built-ins and the user plugins a
configuration names) and hand it to the engine, which stays pure. A configuration that
names a plugin no installed package publishes is bad input (exit 2, naming it). A
published name that is a built-in's is never loaded: the built-in wins.

The plugins a run used are recorded in its ``SchedulerConfigured`` record (name,
distribution, version), so that ``replay --verify`` loads the same ones and refuses, in
one line with exit status 2, to verify with one missing or of another version.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Final

from engine.config import SchedulerConfig, parse_config
from engine.framework.registry import Registry
from engine.framework.userplugins import plugin_factory
from engine.plugins.registry import builtin_registry
from events.errors import InputError, cause
from events.log import quarantined_in
from events.types import Envelope, PluginUsed, SchedulerConfigured

GROUP: Final = "shoal.plugins"


@dataclass(frozen=True)
class Plugins:
    """A registry with the user plugins loaded, and what to record of them."""

    registry: Registry
    used: tuple[PluginUsed, ...] = ()


def named_in(config: SchedulerConfig | None) -> list[str]:
    """Every plugin name ``config`` mentions (points, ``multiPoint``, ``pluginConfig``)."""
    if config is None:
        return []
    names: dict[str, None] = {}
    for profile in config.profiles:
        for refs in profile.points.values():
            names.update((ref.name, None) for ref in refs)
        names.update((ref.name, None) for ref in profile.multi_point)
        names.update((name, None) for name in profile.args)
    return list(names)


def _field_naming(source: Mapping[str, Any] | None, name: str) -> str:
    """Where in the configuration document ``name`` first appears (for errors)."""
    profiles = source.get("profiles") if source else None
    if not isinstance(profiles, list):
        return ""
    for i, profile in enumerate(profiles):
        if not isinstance(profile, dict):
            continue
        plugins = profile.get("plugins")
        for point, section in (plugins or {}).items() if isinstance(plugins, dict) else ():
            for key in ("enabled", "disabled"):
                refs = section.get(key) if isinstance(section, dict) else None
                for j, ref in enumerate(refs if isinstance(refs, list) else ()):
                    if isinstance(ref, dict) and ref.get("name") == name:
                        return f"profiles[{i}].plugins.{point}.{key}[{j}].name"
        config = profile.get("pluginConfig")
        for j, item in enumerate(config if isinstance(config, list) else ()):
            if isinstance(item, dict) and item.get("name") == name:
                return f"profiles[{i}].pluginConfig[{j}].name"
    return ""


def published() -> dict[str, EntryPoint]:
    """The installed entry points of the group, by plugin name."""
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def load(names: Iterable[str], where: Mapping[str, str] | None = None) -> Plugins:
    """The built-ins and the installed user plugins among ``names`` (built-in names are
    skipped). A name no package publishes, or one whose class does not load, is an
    :class:`InputError` located at ``where[name]``."""
    registry = builtin_registry()
    wanted = sorted({n for n in names if n not in registry})
    if not wanted:
        return Plugins(registry)
    found = published()
    used: list[PluginUsed] = []
    for name in wanted:
        location = (where or {}).get(name, "")
        entry = found.get(name)
        if entry is None:
            raise InputError(
                f"unknown plugin {name!r}: neither built in nor published by an installed "
                f"package (entry-point group {GROUP}; built in: {', '.join(registry.names())})",
                location=location,
            )
        try:
            cls = entry.load()
        except Exception as exc:
            raise InputError(
                f"plugin {name!r} ({entry.value}) does not load: {cause(exc)}", location=location
            ) from None
        if not isinstance(cls, type):
            raise InputError(
                f"plugin {name!r}: entry point {entry.value} is not a class", location=location
            )
        registry.register(name, plugin_factory(cls, name))
        dist = entry.dist
        used.append(
            PluginUsed(
                name=name,
                distribution=dist.name if dist is not None else "",
                version=dist.version if dist is not None else "",
            )
        )
    return Plugins(registry, tuple(used))


def for_config(config: SchedulerConfig | None) -> Plugins:
    """The plugins ``config`` names; errors name the field of its document."""
    names = named_in(config)
    source = config.source if config is not None else None
    return load(names, {name: _field_naming(source, name) for name in names})


def for_records(records: Iterable[Envelope], config: SchedulerConfig | None = None) -> Plugins:
    """The plugins ``config`` and every configuration recorded in ``records`` (one
    partition) name (a service restarted with another configuration records it again),
    less those the run quarantined (:meth:`~engine.engine.Engine.unrunnable`: it had
    not loaded a plugin they name); the fold of replay refuses those again."""
    records = list(records)
    skipped = quarantined_in(records)
    names = named_in(config)
    for env in records:
        event = env.event
        if isinstance(event, SchedulerConfigured) and env.offset not in skipped:
            names.extend(p.name for p in event.plugins)
            if event.config:
                try:
                    names.extend(named_in(parse_config(json.loads(event.config), "recorded")))
                except (ValueError, InputError):
                    continue  # replay reports it (``recorded_config``)
    return load(names)


def installed() -> Plugins:
    """Every user plugin installed: for a component that learns its configuration from
    the log (the coordinator of ``shoal worker``)."""
    return load(published())


def recorded_in(records: Iterable[Envelope]) -> tuple[PluginUsed, ...]:
    """The user plugins the first ``SchedulerConfigured`` of ``records`` (one
    partition) lists that the run did not quarantine."""
    records = list(records)
    skipped = quarantined_in(records)
    for env in records:
        if isinstance(env.event, SchedulerConfigured) and env.offset not in skipped:
            return env.event.plugins
    return ()


def for_replay(
    inputs: Iterable[Envelope], config: SchedulerConfig | None, *, verify: bool
) -> tuple[Plugins, list[str]]:
    """The plugins to replay a run with (those it recorded in ``inputs``, the partition
    its configuration is in, and those ``config`` names), and how the installed ones
    differ from those it recorded. With ``verify`` a difference is an
    :class:`InputError` (exit 2): the decisions could differ for that reason alone."""
    inputs = list(inputs)
    differ = differences(recorded_in(inputs))
    if differ and verify:
        raise InputError(f"cannot verify: {differ[0]}", location="replay --verify")
    return for_records(inputs, config), differ


def differences(recorded: Iterable[PluginUsed]) -> list[str]:
    """How the plugins installed here differ from those a run ``recorded`` (one line
    each: missing, or from another distribution or version)."""
    found = published()
    out = []
    for want in recorded:
        entry = found.get(want.name)
        dist = entry.dist if entry is not None else None
        used = f"{want.distribution} {want.version}"
        if entry is None:
            out.append(f"the run used plugin {want.name!r} from {used}, which is not installed")
        elif dist is None or (dist.name, dist.version) != (want.distribution, want.version):
            here = f"{dist.name} {dist.version}" if dist is not None else entry.value
            out.append(f"the run used plugin {want.name!r} from {used}; installed: {here}")
    return out
