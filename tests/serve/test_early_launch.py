"""The batcher's early launch (CPU, fake inputs and gate): a lone batch's device work is queued by the launch thread
while the collector still decodes, behind a gate the collector always opens; its rows are used only when the decode
says the early layout was the batch, otherwise the batch goes the usual way. The real gate and preparer on a GPU:
tests/serve/test_early_launch_gpu.py."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from clip_flash.serve.batcher import TowerBatcher
from clip_flash.serve.jobs import Embedded, EmbeddingJob, ItemError, QueuedInputs


class RecordingGate:
    def __init__(self, times_out=False):
        self.events = []
        self.tickets = 0
        self.times_out = times_out

    def next_ticket(self):
        self.tickets += 1
        return self.tickets

    def wait(self, ticket):
        self.events.append(("wait", ticket, threading.current_thread().name))

    def open(self, ticket):
        self.events.append(("open", ticket, threading.current_thread().name))

    def opener(self, ticket):
        return ("counter", ticket)

    def timed_out(self, ticket):
        return self.times_out


class Decoded:
    def __init__(self, payloads, is_batch):
        self.payloads = payloads
        self.failures = [(i, "bad input") for i, p in enumerate(payloads) if p == "bad"]
        self.is_batch = is_batch


class EarlyTower:
    """Payloads are numbers ("bad" fails, "pillow" makes the early layout not the batch, "raise" makes the CPU step
    raise after handing out its layout). The early rows are the number plus ``early_offset`` (so a test sees which
    rows answered); the usual rows are the number."""

    launches_early = True

    def __init__(self, early_offset=0.0, early_raises=False):
        self.early_offset = early_offset
        self.early_raises = early_raises
        self.launched = threading.Event()
        self.launched_while_decoding = []
        self.usual = 0

    def host(self, payloads, on_layout=None):
        if on_layout is not None:
            self.launched.clear()
            assert on_layout(list(payloads))[0] == "counter"  # what the native decoder opens the gate with
            # The decode lasts until the launch thread has queued the device work (or gives up after 5 s).
            self.launched_while_decoding.append(self.launched.wait(5))
        if "raise" in payloads:
            raise OSError("disk gone")
        return Decoded(payloads, is_batch="pillow" not in payloads)

    def _groups(self, payloads, offset):
        good = [i for i, p in enumerate(payloads) if p not in ("bad", "pillow")]
        tensor = torch.tensor([[float(payloads[i]) + offset, 1.0] for i in good])
        return [(good, tensor)] if good else []

    def device_early(self, layout):
        try:
            if self.early_raises:
                raise RuntimeError("out of memory, say")
            return self._groups(layout, self.early_offset)
        finally:
            self.launched.set()

    @staticmethod
    def early_failures(host):
        return list(host.failures) if host.is_batch else None

    def device(self, host):
        self.usual += 1
        groups = self._groups(host.payloads, 0.0)
        extra = [(i, "left to Pillow: fails here") for i, p in enumerate(host.payloads) if p == "pillow"]
        return groups, host.failures + extra

    def close(self):
        pass


def _serve(batcher, lock, requests):
    """Each request (a list of payloads) alone in turn; their jobs once answered."""

    async def main():
        loop = asyncio.get_running_loop()
        jobs = []
        for payloads in requests:
            job = EmbeddingJob(loop, len(payloads), time.monotonic() + 30)
            with lock:
                batcher.put_locked([QueuedInputs(job, list(range(len(payloads))), payloads)], time.monotonic())
            await asyncio.wait_for(job.future, 10)
            jobs.append(job)
        return jobs

    try:
        return asyncio.run(main())
    finally:
        batcher.close()


def _batcher(tower, gate, lock):
    return TowerBatcher("image", tower, lambda x: x, max_batch=64, max_wait=0.01, lock=lock,
                        on_dequeue=lambda count: None, launch_alone=True, gate=gate)


def test_a_lone_batch_is_launched_while_it_decodes_and_answered_from_those_rows():
    lock, gate, tower = threading.Lock(), RecordingGate(), EarlyTower(early_offset=100.0)
    jobs = _serve(_batcher(tower, gate, lock), lock, [[1, "bad", 3], [5]])
    first, bad, third = jobs[0].results
    assert isinstance(bad, ItemError) and bad.message == "bad input"
    assert isinstance(first, Embedded) and first.raw.tolist() == [101.0, 1.0] and third.raw.tolist() == [103.0, 1.0]
    assert jobs[1].results[0].raw.tolist() == [105.0, 1.0]
    assert tower.usual == 0 and tower.launched_while_decoding == [True, True]
    # Each ticket: waited for on the launch thread, opened by the collector.
    assert sorted(gate.events) == [("open", 1, "clip_flash-image-collect"), ("open", 2, "clip_flash-image-collect"),
                                   ("wait", 1, "clip_flash-image-launch"), ("wait", 2, "clip_flash-image-launch")]


@pytest.mark.parametrize("case", ["not the batch", "launch failed"])
def test_a_lone_batch_whose_early_rows_cannot_be_used_goes_the_usual_way(case):
    lock, gate = threading.Lock(), RecordingGate()
    tower = EarlyTower(early_offset=100.0, early_raises=case == "launch failed")
    requests = [[1, "pillow", 3], [4]] if case == "not the batch" else [[1, 2], [4]]
    jobs = _serve(_batcher(tower, gate, lock), lock, requests)
    if case == "not the batch":
        first, pillow, third = jobs[0].results
        assert pillow.message == "left to Pillow: fails here"
        assert first.raw.tolist() == [1.0, 1.0] and third.raw.tolist() == [3.0, 1.0]  # the usual rows
        assert tower.usual == 1 and jobs[1].results[0].raw.tolist() == [104.0, 1.0]
    else:
        assert [result.raw.tolist() for result in jobs[0].results] == [[1.0, 1.0], [2.0, 1.0]]
        assert tower.usual == 2 and jobs[1].results[0].raw.tolist() == [4.0, 1.0]
    assert [event[:2] for event in gate.events if event[0] == "open"] == [("open", 1), ("open", 2)]


def test_a_cpu_step_that_raises_after_handing_out_its_layout_fails_its_batch_opens_the_gate_and_the_next_is_served():
    lock, gate, tower = threading.Lock(), RecordingGate(), EarlyTower(early_offset=100.0)
    jobs = _serve(_batcher(tower, gate, lock), lock, [[1, "raise"], [7]])
    assert all(isinstance(result, ItemError) and "disk gone" in result.message for result in jobs[0].results)
    assert jobs[1].results[0].raw.tolist() == [107.0, 1.0]
    assert ("open", 1, "clip_flash-image-collect") in gate.events


def test_early_launch_off_or_without_a_gate_takes_the_usual_way():
    for launch_early in (False, True):
        lock, tower = threading.Lock(), EarlyTower(early_offset=100.0)
        gate = RecordingGate() if not launch_early else None  # on the CPU no gate is made
        batcher = TowerBatcher("image", tower, lambda x: x, max_batch=64, max_wait=0.01, lock=lock,
                               on_dequeue=lambda count: None, launch_alone=True, launch_early=launch_early,
                               gate=gate)
        jobs = _serve(batcher, lock, [[2]])
        assert jobs[0].results[0].raw.tolist() == [2.0, 1.0] and tower.usual == 1
        assert gate is None or gate.events == []


def test_a_batch_whose_gate_timed_out_is_failed_not_answered_from_rows_read_too_soon():
    lock, gate, tower = threading.Lock(), RecordingGate(times_out=True), EarlyTower(early_offset=100.0)
    jobs = _serve(_batcher(tower, gate, lock), lock, [[1, 2]])
    assert all(isinstance(result, ItemError) and "host gate timed out" in result.message
               for result in jobs[0].results)
