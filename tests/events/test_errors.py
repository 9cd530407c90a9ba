"""What an error says in a log line: its cause, never an empty text or a group's name."""

from __future__ import annotations

import pytest

from events.errors import InputError, LogError, cause


@pytest.mark.parametrize(
    ("exc", "said"),
    [
        (TimeoutError(), "TimeoutError"),
        (LogError("kafka read failed: boom"), "kafka read failed: boom"),
        (InputError("bad", location="--bus"), "--bus: bad"),
        (ConnectionRefusedError(111, "Connection refused"), "ConnectionRefusedError: [Errno 111]"),
        (
            ExceptionGroup("unhandled errors in a TaskGroup", [LogError("a"), ValueError("b")]),
            "a; ValueError: b",
        ),
        (
            ExceptionGroup("g", [ExceptionGroup("inner", [KeyError("k")])]),
            "KeyError: 'k'",
        ),
        (
            ExceptionGroup("g", [LogError(str(i)) for i in range(5)]),
            "0; 1; 2; and 2 more",
        ),
    ],
)
def test_the_cause_is_named(exc: BaseException, said: str) -> None:
    assert said in cause(exc)
    assert "TaskGroup" not in cause(exc)
