"""What a ``shoal`` subcommand is, for packages that add one, and what commands share.

A package adds a subcommand by naming a :class:`Command` in the entry-point group
``shoal.commands`` (:data:`GROUP`) of its distribution; ``shards/cli.py`` discovers them.
The argument types, the ``--snapshot-every`` option, the ``--shards`` check and ``--json``
output are here so that every command, built in or added, reads and writes them alike.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final

import orjson

from engine.model.pools import MAX_SHARDS, Sharding
from events.errors import InputError
from shards.inputs.scenario import ShardingSpec
from shards.worker import SNAPSHOT_EVERY, SNAPSHOT_PER_POD

EXIT_MISMATCH = 1
"""Exit status of ``replay --verify`` that found a difference, or cannot verify."""

GROUP: Final = "shoal.commands"
"""The entry-point group ``shoal`` reads its added subcommands from."""


@dataclass(frozen=True, kw_only=True)
class Command:
    """A subcommand of ``shoal`` that another package provides.

    Its entry point in :data:`GROUP` is named ``name`` and refers to this object.
    """

    name: str
    """The word after ``shoal``; it must not be a built-in command's."""
    help: str
    """One line in ``shoal --help``."""
    add_arguments: Callable[[argparse.ArgumentParser], None]
    """Adds the command's arguments to the parser ``shoal`` made for it; called once per
    parser built, before any command runs."""
    run: Callable[[argparse.Namespace], Coroutine[Any, Any, int]]
    """Runs the command on the parsed arguments in ``shoal``'s event loop and returns the
    exit status. A ``ShoalError`` it raises (``InputError`` for bad arguments) becomes
    one line on stderr and exit status 2, as for the built-in commands."""


def positive(text: str) -> int:
    """An argument type: a whole number, at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative(text: str) -> int:
    """An argument type: a whole number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def sharding_for(shards: int, spec: ShardingSpec | None = None) -> Sharding | None:
    """The sharding ``--shards`` asks for, with the pools and tenants of ``spec`` (``None``
    for one shard without them); ``InputError`` past :data:`~engine.model.pools.MAX_SHARDS`
    or for a pool pinned to a shard that does not exist."""
    if shards > MAX_SHARDS:
        raise InputError(f"at most {MAX_SHARDS} shards, got {shards}", location="--shards")
    if spec is not None:
        return spec.sharding(shards)  # pools and tenants hold at one shard too
    return None if shards == 1 else Sharding(shards=shards)


def snapshot_option(parser: argparse.ArgumentParser) -> None:
    """Adds ``--snapshot-every`` as the service and the load test read it (see
    :func:`snapshots`)."""
    parser.add_argument(
        "--snapshot-every",
        type=non_negative,
        default=None,
        metavar="RECORDS",
        help="shards and the coordinator write their state into the log every RECORDS "
        f"records (0: never); by default every {SNAPSHOT_EVERY:,}, and no more often "
        f"than every {SNAPSHOT_PER_POD} records per pod and node held, so that a large state "
        "costs a bounded share of the time; a restart restores the newest and replays "
        "only what follows",
    )


def snapshots(args: argparse.Namespace) -> tuple[int, int]:
    """Records between snapshots, and the floor per pod held: the defaults, or exactly
    what ``--snapshot-every`` asks for."""
    if args.snapshot_every is None:
        return SNAPSHOT_EVERY, SNAPSHOT_PER_POD
    return int(args.snapshot_every), 0


def emit_json(data: Any) -> None:
    """``--json`` output: one indented JSON object on stdout."""
    sys.stdout.buffer.write(orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")
    sys.stdout.flush()
