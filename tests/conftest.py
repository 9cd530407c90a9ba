from __future__ import annotations

import gc
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka.conn import AIOKafkaConnection
from hypothesis import HealthCheck, settings

from tests import broker, xdist_groups

# The suite's profiles draw a fixed set of examples per test (derandomize): a run passes
# or fails the same way every time, on any machine. The search for new cases is the
# "big" profile's (HYPOTHESIS_PROFILE=big) and the slow chaos search's (-m slow); a case
# they find is kept as an @example, or as an expected failure until it is fixed.
settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(  # the suite's: it must stay under 10 minutes on 2 cores
    "dev",
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "big", max_examples=400, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
)


GROUPS = {
    "rbac_apiserver": "realkube-rbac",
    "real_apiserver": "realkube",
    "kafka": "kafka",
}
"""Tests that use one of these session fixtures run in one worker under pytest-xdist
(``./dev test``: ``-n 2 --dist loadgroup``, tests/xdist_groups.py): each is a server
whose state its tests share (a real control plane is emptied between tests, the broker
is stopped and started again by some), started then once, not in every worker."""
TAKEN = {
    ("apiserver", "real"): "real_apiserver",  # tests/kube/conftest.py
    ("make_log", "kafka"): "kafka",  # tests/events/test_log_contract.py
    ("bus", "kafka"): "kafka",  # tests/kube/test_serve_fencing.py
}
"""The cases whose fixture takes one of those servers by ``getfixturevalue`` (it is then
not among the test's fixture names): (parameter, value) → the fixture."""
MODULES = {"tests/deploy/test_server.py": "realkube-deploy"}
"""Modules whose module-scoped fixture is a server of its own: kept in one worker."""


def group_of(item: pytest.Item) -> str | None:
    """The worker group of ``item``: that of the first server it uses (GROUPS, TAKEN)."""
    module = item.nodeid.partition("::")[0]
    if module in MODULES:
        return MODULES[module]
    names = set(getattr(item, "fixturenames", ()))
    callspec = getattr(item, "callspec", None)
    for param, value in callspec.params.items() if callspec is not None else ():
        if isinstance(value, str) and (param, value) in TAKEN:
            names.add(TAKEN[param, value])
    return next((group for fixture, group in GROUPS.items() if fixture in names), None)


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(xdist_groups.Plugin(group_of), "shoal-xdist-groups")


def kafka_missing() -> str | None:
    """Why the Kafka tests cannot run (they are then skipped), or None; with
    ``SHOAL_REAL_KAFKA=1`` (CI) a missing broker fails them instead."""
    reason = broker.missing()
    if reason is not None and os.environ.get("SHOAL_REAL_KAFKA") == "1":
        pytest.fail(f"SHOAL_REAL_KAFKA=1 but {reason}")
    return reason


@pytest.fixture(autouse=True)
def _connections_a_kafka_test_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """The same as :func:`_connections_a_dying_broker_left`, after each test of the
    broker: under pytest-xdist the Kafka tests share a worker with others, and a
    connection a killed broker left would otherwise be collected in the middle of one of
    those, whose run its socket's warnings would then fail."""
    yield
    if group_of(request.node) == "kafka" and any(
        isinstance(o, AIOKafkaConnection) for o in gc.get_objects()
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()


@pytest.fixture(scope="session", autouse=True)
def _connections_a_dying_broker_left() -> Iterator[None]:
    """aiokafka can leave a connection to a broker killed under it unclosed
    (tests/kube/test_broker_outage.py; seen only on a loaded machine), and it may live
    on until the session ends, where its socket's warnings would fail the run. At the
    end, if such connections are still there, they are collected with their warnings
    ignored; any other leak still fails the run."""
    yield
    if any(isinstance(o, AIOKafkaConnection) for o in gc.get_objects()):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()


@pytest.fixture(scope="session")
def kafka() -> Iterator[broker.KafkaBroker]:
    """Apache Kafka 4 for the whole session (started on first use, stopped at the end);
    each test uses topics of its own. A test may stop and start it again (same port,
    same log); it must leave it running."""
    reason = kafka_missing()
    if reason is not None:
        pytest.skip(reason)
    with tempfile.TemporaryDirectory(prefix="shoal-kafka-") as directory:
        server = broker.KafkaBroker(Path(directory))
        server.start()
        try:
            yield server
        finally:
            server.stop(grace=2)  # its log is thrown away: no need to wait for a clean exit


@pytest.fixture
def kafka_bootstrap(kafka: broker.KafkaBroker) -> str:
    """The session broker's address, serving."""
    if kafka.proc is None:  # a test that stopped it failed before starting it again
        kafka.start()
    return kafka.bootstrap
