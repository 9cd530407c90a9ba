"""Keeping the tests of one shared server in one pytest-xdist worker (``./dev test``
runs the suite with ``-n 2 --dist loadgroup``).

xdist's own ``loadgroup`` reads ``xdist_group`` marks by appending ``@group`` to each
marked test's node id in the worker; pytest 9.2 keeps node ids where that no longer
takes (pytest-xdist issue 1386: every test is then scheduled on its own, silently). So
the groups travel here by a file instead: each worker writes the group of every test
that has one (:func:`group_of`, given by ``tests/conftest.py``) once it has collected,
and the controller's scheduler, which gets only node ids and starts scheduling once
every worker has collected, reads it. A test without a group is a unit of its own, as
with ``loadgroup``.

The units are handed out longest first, by the durations of the last runs (kept in
pytest's cache, ``shoal/durations``); without them, the groups first (as ``loadgroup``
does: by their number of tests). A long test started last would otherwise keep one
worker busy while the other has nothing left to do.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

FILE = "SHOAL_XDIST_GROUPS"
"""The variable naming the file: set by the controller before it starts the workers
(they inherit it)."""
DURATIONS = "shoal/durations"
"""The cache key of each test's duration (setup, call and teardown) in the last runs."""


class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]  # (xdist has no types)
    """``loadgroup`` with the groups from the file the workers wrote."""

    def __init__(self, config: pytest.Config, log: Any, path: Path) -> None:
        super().__init__(config, log)
        self._path = path
        self._groups: dict[str, str] | None = None
        cache = getattr(config, "cache", None)
        self._durations: dict[str, float] = cache.get(DURATIONS, {}) if cache else {}
        self._ordered = False

    def _assign_work_unit(self, node: Any) -> None:
        if not self._ordered:  # the first call: the queue is complete
            self._ordered = True
            units = sorted(
                self.workqueue.items(),
                key=lambda unit: (
                    -sum(self._durations.get(nodeid, 0.0) for nodeid in unit[1]),
                    -len(unit[1]),
                ),
            )
            self.workqueue.clear()
            self.workqueue.update(units)
        super()._assign_work_unit(node)

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:
            self._groups = json.loads(self._path.read_text()) if self._path.exists() else {}
        return self._groups.get(nodeid, nodeid)


class Plugin:
    """Registered by ``tests/conftest.py`` when xdist is there."""

    def __init__(self, group_of: Callable[[pytest.Item], str | None]) -> None:
        self.group_of = group_of
        self.directory: str | None = None
        self.durations: defaultdict[str, float] = defaultdict(float)
        self.records = False

    def pytest_configure(self, config: pytest.Config) -> None:
        controller = not hasattr(config, "workerinput")
        self.records = controller  # (a run in one process too: the next may have two)
        if controller and config.getoption("dist", "no") == "loadgroup":
            self.directory = tempfile.mkdtemp(prefix="shoal-xdist-")
            os.environ[FILE] = str(Path(self.directory) / "groups.json")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.records:
            self.durations[report.nodeid] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        cache = getattr(session.config, "cache", None)
        if cache is None or not self.durations:
            return
        durations = cache.get(DURATIONS, {})
        durations.update({k: round(v, 2) for k, v in self.durations.items()})
        cache.set(DURATIONS, durations)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.directory is not None:
            os.environ.pop(FILE, None)
            shutil.rmtree(self.directory, ignore_errors=True)

    @pytest.hookimpl(trylast=True)  # after deselection
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        path = os.environ.get(FILE)
        if path is None or not hasattr(config, "workerinput"):
            return
        groups = {item.nodeid: g for item in items if (g := self.group_of(item)) is not None}
        partial = Path(f"{path}.{config.workerinput['workerid']}")
        partial.write_text(json.dumps(groups))
        partial.replace(path)  # whole: every worker collects the same tests

    @pytest.hookimpl(tryfirst=True)  # before xdist's own
    def pytest_xdist_make_scheduler(
        self, config: pytest.Config, log: Any
    ) -> GroupScheduling | None:
        if self.directory is None:
            return None  # another --dist: xdist's own
        return GroupScheduling(config, log, Path(os.environ[FILE]))
