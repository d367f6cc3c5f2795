"""The one coalescing queue of steps updates, and its two pumps (an asyncio task for the runtime's
clients, a thread for the LangGraph adapter): one update per workflow in arrival order, ``done``
final, nothing for a workflow the server never heard of, bounded, failures logged."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from kvflow_orch.clients.outbox import Outbox, OutboxThread, StepsQueue
from kvflow_orch.protocol import StepsUpdate


def update(wid: str, step: float = 1.0, done: bool = False) -> StepsUpdate:
    return StepsUpdate(workflow_id=wid, steps={} if done else {"a": step}, done=done)


def key(wid: str) -> tuple[str, str]:
    return ("default", wid)


def drain(queue: StepsQueue) -> list[tuple[str, object]]:
    out = []
    while (taken := queue.take()) is not None:
        k, u = taken
        queue.settle(k, u, None, "test")
        out.append((k[-1], u.steps or "done"))
    return out


def test_a_newer_update_replaces_the_queued_one_in_place() -> None:
    queue: StepsQueue[StepsUpdate] = StepsQueue()
    for wid, step in (("w1", 1), ("w2", 1), ("w1", 2)):
        queue.put(key(wid), update(wid, step), announced=True)
    assert drain(queue) == [("w1", {"a": 2.0}), ("w2", {"a": 1.0})]


def test_done_is_final_and_a_workflow_the_server_never_heard_of_is_dropped_whole() -> None:
    queue: StepsQueue[StepsUpdate] = StepsQueue()
    queue.put(key("heard"), update("heard"), announced=True)
    queue.put(key("heard"), update("heard", done=True), announced=True)
    assert not queue.put(key("heard"), update("heard", 5))  # after done: refused
    queue.put(key("quiet"), update("quiet"))
    assert not queue.put(key("quiet"), update("quiet", done=True))  # never announced, never delivered
    queue.announce(key("called"))  # a hinted request reached the server
    assert queue.put(key("called"), update("called", done=True))
    assert drain(queue) == [("heard", "done"), ("called", "done")]


def test_a_delivered_or_in_flight_update_makes_the_done_go() -> None:
    queue: StepsQueue[StepsUpdate] = StepsQueue()
    queue.put(key("w"), update("w"))
    k, u = queue.take()
    assert queue.put(key("w"), update("w", done=True))  # the first one is in flight
    queue.settle(k, u, None, "test")
    assert drain(queue) == [("w", "done")]
    queue.put(key("v"), update("v"))
    assert drain(queue) == [("v", {"a": 1.0})]
    assert queue.put(key("v"), update("v", done=True))  # delivered before: the server knows v


def test_the_queue_is_bounded_and_drops_the_oldest() -> None:
    queue: StepsQueue[StepsUpdate] = StepsQueue(max_pending=2)
    for wid in ("w1", "w2", "w1", "w3"):
        queue.put(key(wid), update(wid), announced=True)
    assert queue.dropped == 1 and [w for w, _ in drain(queue)] == ["w2", "w3"]
    with pytest.raises(ValueError, match="max_pending"):
        StepsQueue(max_pending=0)


def test_a_failed_delivery_is_logged_and_forgotten(caplog) -> None:
    queue: StepsQueue[StepsUpdate] = StepsQueue()
    queue.put(key("w"), update("w"))
    k, u = queue.take()
    with caplog.at_level(logging.WARNING, logger="kvflow.runtime"):
        queue.settle(k, u, ConnectionError("refused"), "http://x")
    assert "workflow 'w' not delivered to http://x: refused" in caplog.text
    assert not queue.busy and not queue.put(key("w"), update("w", done=True))  # still never heard of


async def test_the_async_pump_holds_until_released_and_coalesces_a_burst() -> None:
    sent: list[StepsUpdate] = []

    async def deliver(u: StepsUpdate) -> None:
        await asyncio.sleep(0.01)
        sent.append(u)

    outbox = Outbox(deliver, "test", held=True)
    outbox.put(update("w", 0), announced=True)
    await asyncio.sleep(0.05)
    assert sent == [] and len(outbox) == 1
    outbox.release()
    await asyncio.sleep(0)  # the pump has taken the held update: the burst queues behind it
    for step in range(1, 50):
        outbox.put(update("w", step), announced=True)
        await asyncio.sleep(0)
    outbox.put(update("w", done=True), announced=True)
    await outbox.close(5.0)
    assert 2 <= len(sent) < 10 and sent[-1].done and sent[0].steps == {"a": 0.0}


def test_the_thread_pump_sends_from_its_own_thread_and_leaves_when_idle() -> None:
    sent: list[tuple[str, float]] = []
    closed = threading.Event()

    class Sender:
        def send(self, u: StepsUpdate) -> None:
            sent.append((threading.current_thread().name, u.steps["a"]))

        def close(self) -> None:
            closed.set()

    pump: OutboxThread[StepsUpdate] = OutboxThread(Sender, lambda u: "test", name="kvflow-test-pump", idle_s=0.1)
    pump.put(key("w"), update("w", 1))
    assert pump.flush(5) and sent == [("kvflow-test-pump", 1.0)]
    assert closed.wait(5)  # idle: the thread closed its sender and left
    deadline = time.monotonic() + 5
    while pump.running and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not pump.running
    pump.put(key("w"), update("w", 2))  # a new thread starts on demand
    assert pump.flush(5) and sent[-1] == ("kvflow-test-pump", 2.0)
