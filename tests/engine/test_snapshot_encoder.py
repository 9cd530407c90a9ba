"""The snapshot encoder's rules for state objects, written down node by node: which
attributes an object contributes and in what order (the bytes of equal states must be
equal, so the order is part of the format), and that the cyclic collector it pauses
while it works is running again afterwards, whatever happened."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from dataclasses import dataclass

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.snapshot import Allowed, decode_tree, encode_tree, encode_trees


@dataclass(slots=True)
class _Base:
    a: int
    b: tuple[int, ...] = ()


class _Child(_Base):
    """No ``__slots__`` of its own: instances get a ``__dict__`` besides the slots."""


class _Loose:
    def __init__(self) -> None:
        self.x = 1
        self.hidden = "derived"


@pytest.fixture
def collecting() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        if not was:
            gc.disable()


def _state(value: object, allowed: Allowed) -> list[object]:
    tree = decode_tree(encode_tree({}, [("v", value)], allowed))
    node: list[object] = tree["state"][0][1]
    return node


def test_dict_attributes_come_first_then_slots_along_the_mro() -> None:
    child = _Child(1, (2, 3))
    child.extra = "e"  # type: ignore[attr-defined]
    node = _state(child, Allowed.of(_Child))
    assert node == ["O", "_Child", [["extra", "e"], ["a", 1], ["b", ["T", [2, 3]]]]]


def test_unset_slots_and_derived_attributes_are_left_out() -> None:
    base = _Base.__new__(_Base)
    base.a = 7  # b never set
    assert _state(base, Allowed.of(_Base)) == ["O", "_Base", [["a", 7]]]
    loose = Allowed({"_Loose": _Loose}, derived={_Loose: frozenset({"hidden"})})
    assert _state(_Loose(), loose) == ["O", "_Loose", [["x", 1]]]


def test_an_object_met_twice_is_written_once_and_referred_to() -> None:
    shared = _Base(5)
    node = _state([shared, shared], Allowed.of(_Base))
    assert node == ["L", [["O", "_Base", [["a", 5], ["b", ["T", []]]]], ["R", 1]]]


def test_a_class_not_allowed_is_refused() -> None:
    with pytest.raises(TypeError, match="not a snapshot class"):
        encode_tree({}, [("v", _Loose())], Allowed.of(_Base))


def test_a_struct_named_like_an_allowed_class_is_not_an_object() -> None:
    class _Base(msgspec.Struct):  # same name as an allowed class, but a struct
        a: int

    with pytest.raises(TypeError, match="not a snapshot struct"):
        encode_tree({}, [("v", _Base(a=1))], Allowed({"_Base": _Base}))


@pytest.mark.usefixtures("collecting")
def test_the_collector_runs_again_after_a_snapshot_even_a_refused_one() -> None:
    encode_tree({}, [("v", _Base(1))], Allowed.of(_Base))
    assert gc.isenabled()
    with pytest.raises(TypeError):
        encode_tree({}, [("v", _Loose())], Allowed.of(_Base))
    assert gc.isenabled()


@pytest.mark.usefixtures("collecting")
def test_a_paused_collector_stays_paused() -> None:
    gc.disable()
    encode_tree({}, [("v", _Base(1))], Allowed.of(_Base))
    assert not gc.isenabled()


def test_a_constant_is_a_value_each_time_and_a_writable_array_is_shared() -> None:
    """A read-only array (the delta pods of one shape share) is written in full wherever
    it stands, so equal states give equal bytes however their constants came to be
    shared; a writable one is written once and referred to, so that it stays shared."""
    constant = np.arange(3, dtype=np.int64)
    constant.flags.writeable = False
    writable = np.arange(2, dtype=np.int32)
    node = _state([constant, constant, writable, writable], Allowed.of())
    value = ["C", constant.dtype.str, [3], constant.tobytes()]
    assert node == [
        "L",
        [value, value, ["N", writable.dtype.str, [2], writable.tobytes()], ["R", 1]],
    ]


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(st.text(max_size=3), st.recursive(st.integers(-9, 9), st.lists)), max_size=4
    ),
    st.lists(st.tuples(st.text(max_size=3), st.lists(st.integers(-9, 9))), max_size=3),
)
def test_state_encoded_once_gives_the_bytes_of_two_encodings(
    state: list[tuple[str, object]], more: list[tuple[str, object]]
) -> None:
    # a shared object, met in the state and again after it, is referred to the same way
    shared = [1, 2]
    state = [*state, ("shared", shared)]
    more = [*more, ("again", shared)]
    allowed = Allowed({})
    alone, both = encode_trees(lambda raw: {"digest": len(raw)}, state, more, allowed)
    assert alone == encode_tree({}, state, allowed)
    assert both == encode_tree({"digest": len(alone)}, [*state, *more], allowed)
