"""What ``--explain`` keeps of each attempt of one pod."""

from __future__ import annotations

from dataclasses import dataclass

from engine.framework.results import Diagnosis
from engine.framework.status import Status


@dataclass(frozen=True, slots=True)
class Explanation:
    """One attempt of the pod under ``--explain``."""

    time: int
    attempt: int
    node: str | None
    status: Status
    diagnosis: Diagnosis | None
