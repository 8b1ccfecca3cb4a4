"""The model load beside work that must stay on the calling thread (:func:`~clip_flash.jobs.beside_load.load_beside`)
and the one thread a Ray actor makes its device calls on (:class:`~clip_flash.jobs.launch_thread.LaunchThread`)."""
from __future__ import annotations

import threading
import time

import pytest

from clip_flash.jobs.beside_load import load_beside
from clip_flash.jobs.launch_thread import LaunchThread


def test_the_load_runs_on_its_own_thread_while_the_work_runs_on_this_one():
    loading, working = threading.Event(), []

    def load():
        loading.set()
        return "model", threading.get_ident()

    def work_here():
        assert loading.wait(timeout=30), "the load did not start while this thread worked"
        working.append(threading.get_ident())

    before = time.perf_counter()
    (model, load_thread), load_ended = load_beside(load, work_here)
    assert model == "model" and load_thread != threading.get_ident()
    assert working == [threading.get_ident()]
    assert before < load_ended <= time.perf_counter()


def test_the_loads_error_is_raised_here_once_the_work_is_done():
    worked = []

    def load():
        raise RuntimeError("no such checkpoint")

    with pytest.raises(RuntimeError, match="no such checkpoint"):
        load_beside(load, lambda: worked.append(1))
    assert worked == [1]


def test_without_work_the_load_runs_on_this_thread():
    (thread, _), _ = load_beside(lambda: (threading.get_ident(), None), None)
    assert thread == threading.get_ident()


def test_the_launch_thread_runs_its_calls_in_order_on_one_thread_and_hands_back_errors():
    launch = LaunchThread()
    order = []
    futures = [launch.submit(lambda n=n: order.append((n, threading.get_ident()))) for n in range(5)]
    failing = launch.submit(int, "not a number")
    after = launch.submit(threading.get_ident)
    for future in futures:
        future.result(timeout=30)
    with pytest.raises(ValueError):
        failing.result(timeout=30)
    ident = after.result(timeout=30)  # the thread goes on after a call failed
    assert [n for n, _ in order] == list(range(5)) and {thread for _, thread in order} == {ident}
    assert ident != threading.get_ident()
    launch.close()
    assert not launch._thread.is_alive()
