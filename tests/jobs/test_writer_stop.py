"""The job's writer thread is waited for through a Ctrl-C or SIGTERM that arrives as the last shards are written:
the stop message then counts what the folder keeps. A second interrupt stops the wait."""
from __future__ import annotations

import queue
import signal
import threading
import time

import pytest

from clip_flash.jobs.batch_feed import DONE
from clip_flash.jobs.commit_thread import stop_writer


def interrupt(*_):
    raise KeyboardInterrupt


@pytest.fixture
def interrupts():
    """``send(after_s)``: a KeyboardInterrupt in the main thread ``after_s`` from now, as SIGTERM's handler gives."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    previous = signal.signal(signal.SIGUSR1, interrupt)
    timers = []

    def send(after_s: float) -> None:
        timer = threading.Timer(after_s, signal.pthread_kill, (threading.main_thread().ident, signal.SIGUSR1))
        timers.append(timer)
        timer.start()

    yield send
    for timer in timers:
        timer.cancel()
    signal.signal(signal.SIGUSR1, previous)


def slow_writer(commit_s: float, committed: list) -> "tuple[queue.Queue, threading.Event, threading.Thread]":
    finished: "queue.Queue" = queue.Queue(maxsize=2)
    ended = threading.Event()

    def loop() -> None:
        try:
            while True:
                result = finished.get()
                if result is DONE:
                    return
                time.sleep(commit_s)
                committed.append(result)
        finally:
            ended.set()

    writer = threading.Thread(target=loop, daemon=True)
    writer.start()
    finished.put("shard 3")
    return finished, ended, writer


def test_an_interrupt_during_the_last_commit_waits_for_it_then_goes_on(interrupts):
    committed = []
    finished, ended, writer = slow_writer(0.5, committed)
    interrupts(0.1)
    with pytest.raises(KeyboardInterrupt):
        stop_writer(finished, ended)
    assert committed == ["shard 3"]  # committed before the interrupt went on
    writer.join(timeout=5)
    assert not writer.is_alive()


def test_a_second_interrupt_stops_the_wait(interrupts):
    committed = []
    finished, ended, writer = slow_writer(3.0, committed)
    interrupts(0.1)
    interrupts(0.3)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        stop_writer(finished, ended)
    assert time.monotonic() - started < 2.0 and committed == [] and writer.is_alive()


def test_without_an_interrupt_the_writer_ends_after_its_commits():
    committed = []
    finished, ended, writer = slow_writer(0.05, committed)
    stop_writer(finished, ended)
    writer.join(timeout=5)
    assert committed == ["shard 3"] and not writer.is_alive()
