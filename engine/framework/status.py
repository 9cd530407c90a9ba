"""Expected outcomes of a plugin: a value, not an exception."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class Code(IntEnum):
    SUCCESS = 0
    ERROR = 1
    UNSCHEDULABLE = 2
    """Rejected, but preemption or a cluster change may help."""
    UNSCHEDULABLE_AND_UNRESOLVABLE = 3
    """Rejected, and preemption cannot help (selector, taint, node name)."""
    WAIT = 4
    SKIP = 5


@dataclass(frozen=True, slots=True)
class Status:
    """A plugin's verdict; ``plugin`` is stamped by the framework on rejection."""

    code: Code = Code.SUCCESS
    reasons: tuple[str, ...] = ()
    plugin: str = ""

    @property
    def ok(self) -> bool:
        return self.code in (Code.SUCCESS, Code.SKIP)

    @property
    def rejected(self) -> bool:
        return self.code in (Code.UNSCHEDULABLE, Code.UNSCHEDULABLE_AND_UNRESOLVABLE)

    def message(self) -> str:
        return "; ".join(self.reasons) or self.code.name.lower()

    def with_plugin(self, plugin: str) -> Status:
        return Status(self.code, self.reasons, self.plugin or plugin)


SUCCESS = Status()


def unschedulable(*reasons: str, unresolvable: bool = False) -> Status:
    code = Code.UNSCHEDULABLE_AND_UNRESOLVABLE if unresolvable else Code.UNSCHEDULABLE
    return Status(code, reasons)


def error(*reasons: str) -> Status:
    return Status(Code.ERROR, reasons)
