"""The batcher threads' polling before sleep (``clip_flash.serve.idle_spin``): a ``SpinningQueue`` loses no item and
no wake-up whether its getter polls or sleeps; a ``TowerBatcher`` whose threads poll answers as one that sleeps; the
compiled bell's own behaviour where the extension is built; the setting from the command line to the engine."""
from __future__ import annotations

import argparse
import asyncio
import random
import threading
import time

import pytest
import torch

from clip_flash.ops._extension import load_extension
from clip_flash.serve import idle_spin
from clip_flash.serve.batcher import TowerBatcher
from clip_flash.serve.config import DEFAULT_IDLE_SPIN_MS, ServeConfig
from clip_flash.serve.idle_spin import Bell, SpinningQueue
from clip_flash.serve.jobs import Embedded, EmbeddingJob, ItemError, QueuedInputs

from .test_batching import FakeTower


class PythonBell:
    """The extension's three bell calls in Python (polling with short sleeps), counting how each wait ended."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rung = 0  # waits that saw a ring
        self.expired = 0  # waits that polled for their whole spin

    def host_bell_ring(self, counter):
        with self.lock:
            counter[0] += 1
            return int(counter[0])

    def host_bell_count(self, counter):
        with self.lock:
            return int(counter[0])

    def host_bell_wait(self, counter, seen, spin_ns):
        deadline = time.monotonic() + spin_ns / 1e9
        while True:
            with self.lock:
                if int(counter[0]) != seen:
                    self.rung += 1
                    return True
            if time.monotonic() >= deadline:
                with self.lock:
                    self.expired += 1
                return False
            time.sleep(0.0002)


@pytest.fixture
def python_bell(monkeypatch):
    fake = PythonBell()
    monkeypatch.setattr(idle_spin, "load_extension", lambda: fake)
    return fake


def test_no_bell_without_a_spin_or_an_extension(monkeypatch):
    assert Bell.create(0) is None
    monkeypatch.setattr(idle_spin, "load_extension", lambda: None)
    assert Bell.create(0.05) is None
    queue = SpinningQueue(1, Bell.create(0.05))  # a plain queue then
    queue.put(1)
    assert queue.get() == 1


@pytest.mark.parametrize("spin", [0.2, 0.002])
def test_a_spinning_queue_hands_over_every_item_in_order_polling_or_asleep(python_bell, spin):
    """A producer with gaps mostly shorter than the spin (0.2 s: the getter finds items polling) or longer
    (0.002 s: it has gone to sleep): every item arrives once, in order, through a queue of one slot."""
    queue = SpinningQueue(1, Bell.create(spin))
    items = list(range(300))
    random.seed(0)

    def produce():
        for item in items:
            time.sleep(random.choice((0, 0, 0.001, 0.004)))
            queue.put(item)

    producer = threading.Thread(target=produce)
    producer.start()
    got = [queue.get() for _ in items]
    producer.join()
    assert got == items
    if spin > 0.1:
        assert python_bell.rung > 50 and python_bell.expired == 0
    else:
        assert python_bell.expired > 50  # slept between most items, and was still woken for each


def test_a_batcher_whose_threads_poll_answers_as_one_that_sleeps(python_bell):
    """A CPU TowerBatcher with a 0.3 s spin: requests 0.05 s apart find the collector and the launch thread polling
    (their bells rung), and every result is the one the sleeping batcher gives."""
    lock = threading.Lock()
    batcher = TowerBatcher("image", FakeTower(), lambda x: x * 2, max_batch=4, max_wait=0.001, lock=lock,
                           on_dequeue=lambda count: None, idle_spin=0.3)
    assert batcher._input_bell is not None and batcher._to_launch.bell is not None

    async def main():
        loop = asyncio.get_running_loop()
        jobs = []
        for number in range(12):
            job = EmbeddingJob(loop, 2, time.monotonic() + 10)
            with lock:
                batcher.put_locked([QueuedInputs(job, [0, 1], [number, "bad"])], time.monotonic())
            jobs.append(job)
            await asyncio.sleep(0.05)
        await asyncio.wait_for(asyncio.gather(*(job.future for job in jobs)), 10)
        return jobs

    try:
        jobs = asyncio.run(main())
    finally:
        started = time.monotonic()
        batcher.close()
    assert time.monotonic() - started < 0.25  # close() rings the collector out of its poll
    for number, job in enumerate(jobs):
        good, bad = job.results
        assert isinstance(good, Embedded) and good.raw.tolist() == [number * 2.0, 2.0]
        assert isinstance(bad, ItemError) and bad.message == "bad input"
    assert python_bell.rung >= 12  # the threads were polling when work came


def _compiled_bell():
    extension = load_extension()
    if extension is None or not hasattr(extension, "host_bell_wait"):
        pytest.skip("the compiled extension (clip_flash._C) is not built here")
    return extension


def test_the_compiled_bell_polls_for_its_spin_and_wakes_on_a_ring_without_the_gil():
    extension = _compiled_bell()
    bell = Bell(0.05, extension)
    seen = bell.count()
    started = time.perf_counter()
    assert not bell.wait(seen)
    assert time.perf_counter() - started >= 0.05
    with pytest.raises(RuntimeError, match="int64 CPU tensor"):
        extension.host_bell_wait(torch.zeros(1, dtype=torch.int32), 0, 1)

    bell = Bell(5.0, extension)
    seen = bell.count()
    steps = []

    def ring_later():
        for _ in range(100):  # Python work while the waiter polls: the waiter holds no GIL
            steps.append(time.perf_counter())
        bell.ring()

    ringer = threading.Thread(target=ring_later)
    started = time.perf_counter()
    ringer.start()
    assert bell.wait(seen)
    ringer.join()
    assert time.perf_counter() - started < 2.0 and len(steps) == 100
    assert bell.count() == seen + 1
    assert bell.wait(seen)  # already past: at once


def test_idle_spin_reaches_the_config_and_defaults_to_polling_on_a_gpu_only():
    from clip_flash.serve.cli import add_arguments, config_from_args

    parser = add_arguments(argparse.ArgumentParser())
    default = config_from_args(parser.parse_args([]))
    assert default.idle_spin_ms is None
    assert default.idle_spin_seconds(torch.device("cuda", 0)) == DEFAULT_IDLE_SPIN_MS / 1e3 > 0
    assert default.idle_spin_seconds(torch.device("cpu")) == 0
    chosen = config_from_args(parser.parse_args(["--idle-spin-ms", "7.5"]))
    assert chosen.idle_spin_seconds(torch.device("cpu")) == chosen.idle_spin_seconds(torch.device("cuda")) == 0.0075
    off = config_from_args(parser.parse_args(["--idle-spin-ms", "0"]))
    assert off.idle_spin_seconds(torch.device("cuda", 0)) == 0
    with pytest.raises(ValueError, match="idle_spin_ms"):
        ServeConfig(idle_spin_ms=-1)
