"""FailedScheduling Events as kube-scheduler writes them: ``events.k8s.io/v1`` through
client-go's event broadcaster (one Event per pod and reason, repeats counted in its
``series``, its note the first one's), and ``core/v1`` on a server that does not serve
``events.k8s.io/v1`` (one Event, its ``count``, ``lastTimestamp`` and message raised).
Both rate-limited per pod: a burst, then the rest counted into the next write."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from events.memory import MemoryLog
from events.types import Envelope, PodSpec, PodSubmitted, PodUnschedulable
from shards.kube.binder import KubeBinder
from shards.kube.client import api_client
from shards.kube.recorder import AS_MERGE_PATCH, NOTE_LIMIT, micro_time, note_of
from tests.kube.apiserver import FakeApiServer
from tests.kube.test_ingest import pod

S = 1_000_000_000
START = 1_700_000_000 * S


@pytest.fixture
async def core_only() -> AsyncIterator[tuple[FakeApiServer, Any]]:
    """The in-repo server without ``events.k8s.io`` (a real one always serves it)."""
    server = FakeApiServer(without=("events.k8s.io",))
    await server.start()
    api = await api_client(host=server.url, token="test-token")
    try:
        yield server, api
    finally:
        await api.close()
        await server.stop()


async def _binder(apiserver: Any, api: Any, name: str) -> tuple[KubeBinder, MemoryLog, list[int]]:
    """A binder on a clock the test moves, with a burst of 3 and a token a minute, and
    the pod ``name`` submitted to it."""
    waiting = apiserver.put("Pod", pod(name))
    log = MemoryLog()
    now = [START]
    binder = KubeBinder(api, log, initial_backoff=0.01, clock=lambda: now[0])
    binder.recorder.burst = 3
    binder.recorder.refill_ns = 60 * S
    spec = PodSpec(namespace="default", name=name, uid=waiting["metadata"]["uid"])
    await log.append([Envelope(event=PodSubmitted(pod=spec), producer="ingest")])
    return binder, log, now


async def _unschedulable(binder: KubeBinder, log: MemoryLog, name: str, attempt: int) -> None:
    event = PodUnschedulable(pod=f"default/{name}", attempt=attempt, reason=f"no room {attempt}")
    await log.append([Envelope(event=event, producer="shard-0")])
    await binder.poll()


def _events_v1(apiserver: Any, name: str) -> list[dict[str, Any]]:
    found = [e for e in apiserver.all("EventsV1") if e["regarding"]["name"] == name]
    return sorted(found, key=lambda e: e["eventTime"])


@pytest.mark.real_kube
async def test_repeated_failed_scheduling_is_one_events_v1_event_with_a_series(
    apiserver: Any, api: Any
) -> None:
    """The first FailedScheduling creates one events.k8s.io/v1 Event (what kube-scheduler
    writes: reportingController, reportingInstance, action Scheduling, regarding the
    pod, the answer as note, eventTime, no deprecated fields); repeats raise its
    series.count and lastObservedTime and leave the note the first one's; held-back
    repeats are counted into the next write; `kubectl describe`'s core/v1 query finds it."""
    binder, log, now = await _binder(apiserver, api, "waiting")
    uid = apiserver.get("Pod", "waiting", "default")["metadata"]["uid"]
    now[0] += S
    await _unschedulable(binder, log, "waiting", 1)
    (event,) = _events_v1(apiserver, "waiting")
    assert event["reportingController"] == "shoal" and event["action"] == "Scheduling"
    assert event["reportingInstance"].startswith("shoal-"), event
    assert event["reason"] == "FailedScheduling" and event["type"] == "Warning"
    assert event["note"] == "no room 1" and event["eventTime"] == micro_time(START + S)
    assert event["regarding"]["uid"] == uid and event["regarding"]["kind"] == "Pod"
    assert not event.get("series") and not event.get("deprecatedCount"), event
    for attempt in range(2, 6):  # two more written (the burst), two held back
        now[0] += S
        await _unschedulable(binder, log, "waiting", attempt)
    (event,) = _events_v1(apiserver, "waiting")
    assert event["series"]["count"] == 3 and event["note"] == "no room 1", event
    assert event["series"]["lastObservedTime"] == micro_time(START + 3 * S)
    assert binder.recorder.counters == {"created": 1, "bumped": 2, "suppressed": 2}
    now[0] += 60 * S  # a token more: the write carries the two held back
    await _unschedulable(binder, log, "waiting", 6)
    (event,) = _events_v1(apiserver, "waiting")
    assert event["series"] == {"count": 6, "lastObservedTime": micro_time(START + 65 * S)}
    selected = await client.CoreV1Api(api).list_namespaced_event(
        "default",
        field_selector="involvedObject.kind=Pod,involvedObject.name=waiting,"
        f"involvedObject.namespace=default,involvedObject.uid={uid}",
    )
    assert [(e.reason, e.message, e.series.count) for e in selected.items] == [
        ("FailedScheduling", "no room 1", 6)
    ]


@pytest.mark.real_kube
async def test_a_series_ends_after_six_minutes_and_an_expired_event_is_created_again(
    apiserver: Any, api: Any
) -> None:
    """A repeat more than 6 minutes after the last one seen starts a new Event (with
    the new answer as note), as client-go's broadcaster does; an Event the server
    dropped is created again, counting on."""
    binder, log, now = await _binder(apiserver, api, "later")
    await _unschedulable(binder, log, "later", 1)
    now[0] += 361 * S
    await _unschedulable(binder, log, "later", 2)
    first, second = _events_v1(apiserver, "later")
    assert not first.get("series") and first["note"] == "no room 1", first
    assert not second.get("series") and second["note"] == "no room 2", second
    now[0] += S
    await _unschedulable(binder, log, "later", 3)
    apiserver.remove("Event", second["metadata"]["name"], "default")
    now[0] += S
    await _unschedulable(binder, log, "later", 4)
    first, again = _events_v1(apiserver, "later")
    assert again["series"]["count"] == 3 and again["note"] == "no room 4", again


@pytest.mark.real_kube
async def test_a_long_answer_is_cut_to_what_the_server_takes(apiserver: Any, api: Any) -> None:
    """A note is at most 1,024 bytes on the server: a longer answer is cut, ending in
    " ..." (kube-scheduler's truncateMessage), and the Event is written."""
    binder, log, _ = await _binder(apiserver, api, "wordy")
    long = PodUnschedulable(pod="default/wordy", attempt=1, reason="é" * 700)
    await log.append([Envelope(event=long, producer="shard-0")])
    await binder.poll()
    (event,) = _events_v1(apiserver, "wordy")
    assert event["note"].endswith(" ...") and len(event["note"].encode()) <= 1024, event
    assert event["note"].startswith("é" * 500)


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=1500))
@example("x" * 1024)
@example("x" * 1021 + "€€")
def test_a_note_is_what_the_server_takes_and_the_answer_as_far_as_it_goes(answer: str) -> None:
    """Any answer: its note fits (bytes, as the server counts), is the answer itself
    where it fits, else as much of it as fits with " ..." after (never a broken
    character)."""
    note = note_of(answer)
    assert len(note.encode()) <= NOTE_LIMIT
    if len(answer.encode()) <= NOTE_LIMIT:
        assert note == answer
    else:
        assert note.endswith(" ...") and answer.startswith(note[:-4])
        assert len(note.encode()) > NOTE_LIMIT - 8  # cut at most a character short


@pytest.mark.real_kube
@pytest.mark.parametrize(
    "change,field",
    [
        ({"eventTime": None}, "eventTime"),
        ({"deprecatedCount": 2}, "count"),
        ({"action": None}, "action"),
        ({"reportingController": None}, "reportingController"),
        ({"reportingInstance": None}, "reportingInstance"),
        ({"series": {"count": 1, "lastObservedTime": micro_time(START)}}, "series.count"),
    ],
)
async def test_the_servers_refuse_what_v1_37_refuses(
    apiserver: Any, api: Any, change: dict[str, Any], field: str
) -> None:
    """The in-repo server validates events.k8s.io/v1 writes as the real one does: an
    Event without eventTime, action or the reporting fields, or with a deprecated field
    set, or a series of one, is refused (422); a patch of the note is refused, one of
    the series taken."""
    custom = client.CustomObjectsApi(api)
    good = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": "e1", "namespace": "default"},
        "eventTime": micro_time(START),
        "reportingController": "shoal",
        "reportingInstance": "shoal-test",
        "action": "Scheduling",
        "reason": "FailedScheduling",
        "regarding": {"apiVersion": "v1", "kind": "Pod", "namespace": "default", "name": "p"},
        "note": "no room",
        "type": "Warning",
    }
    args = ("events.k8s.io", "v1", "default", "events")
    with pytest.raises(ApiException) as refused:
        await custom.create_namespaced_custom_object(*args, {**good, **change})
    assert refused.value.status == 422 and field in str(refused.value.body), refused.value.body
    await custom.create_namespaced_custom_object(*args, good)
    with pytest.raises(ApiException) as refused:
        await custom.patch_namespaced_custom_object(*args, "e1", {"note": "x"}, **AS_MERGE_PATCH)
    assert refused.value.status == 422, refused.value.body
    series = {"series": {"count": 2, "lastObservedTime": micro_time(START + S)}}
    patched = await custom.patch_namespaced_custom_object(*args, "e1", series, **AS_MERGE_PATCH)
    assert patched["series"]["count"] == 2 and patched["note"] == "no room"


async def test_without_events_k8s_io_repeats_are_one_core_event_with_a_count(
    core_only: tuple[FakeApiServer, Any],
) -> None:
    """A server without events.k8s.io/v1 (discovery 404): core/v1 Events, as
    client-go's older recorder writes them: one per pod and reason, its count,
    lastTimestamp and message raised; a burst, then the rest counted into the next
    write; an Event the server dropped is created again, counting on."""
    apiserver, api = core_only
    binder, log, now = await _binder(apiserver, api, "waiting")
    uid = apiserver.get("Pod", "waiting", "default")["metadata"]["uid"]
    for attempt in range(1, 6):
        now[0] += S
        await _unschedulable(binder, log, "waiting", attempt)
    (event,) = apiserver.all("Event")
    assert event["count"] == 3  # the burst; two more were counted, not written
    assert event["involvedObject"]["uid"] == uid and event["message"] == "no room 3"
    assert event["source"]["component"] == "shoal" and not event.get("eventTime")
    assert binder.recorder.counters == {"created": 1, "bumped": 2, "suppressed": 2}
    assert binder.recorder.api == "v1"
    now[0] += 60 * S
    await _unschedulable(binder, log, "waiting", 6)
    (event,) = apiserver.all("Event")
    assert event["count"] == 6 and event["message"] == "no room 6"
    # what `kubectl describe pod` asks for finds it
    selected = await client.CoreV1Api(api).list_namespaced_event(
        "default",
        field_selector="involvedObject.kind=Pod,involvedObject.name=waiting,"
        f"involvedObject.namespace=default,involvedObject.uid={uid}",
    )
    assert [(e.reason, e.count) for e in selected.items] == [("FailedScheduling", 6)]
    assert event["lastTimestamp"] > event["firstTimestamp"]
    apiserver.remove("Event", event["metadata"]["name"], "default")
    now[0] += 60 * S
    await _unschedulable(binder, log, "waiting", 7)
    (event,) = apiserver.all("Event")
    assert event["count"] == 7
    asked = [path for _, path in apiserver.requests if path.startswith("/apis/events.k8s.io")]
    assert asked == ["/apis/events.k8s.io/v1"]  # discovery, once; no write
