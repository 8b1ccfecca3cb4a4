"""The batcher's pieces without a server: out-of-memory retries in halves, caption length groups, the graph
batch sizes, and a TowerBatcher end to end with a fake tower (batches close at max_batch, results scattered back
in order)."""
from __future__ import annotations

import asyncio
import itertools
import math
import threading
import time

import numpy as np
import pytest
import torch

from clip_flash.serve.batcher import TowerBatcher, encode_in_pieces
from clip_flash.serve.engine import IMAGE_BUCKETS_PER_OCTAVE, batch_buckets, single_threaded_host_ops
from clip_flash.serve.inputs import length_groups
from clip_flash.serve.text_graphs import ReplayCosts, cost_groups
from clip_flash.serve.jobs import DROPPED, QUEUED, Embedded, EmbeddingJob, ItemError, QueuedInputs


def oom_above(limit: int, calls: list):
    def encode(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[0])
        if x.shape[0] > limit:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return x * 2
    return encode


@pytest.mark.parametrize("largest", [1, 3, 8, 9, 17, 64, 100, 256, 1024])
def test_batch_buckets_cover_every_batch_with_bounded_padding(largest):
    for per_octave, worst in ((1, 2.0), (IMAGE_BUCKETS_PER_OCTAVE, 1.25)):
        sizes = batch_buckets(largest, per_octave)
        assert list(sizes) == sorted(set(sizes)) and sizes[0] == 1 and sizes[-1] == largest
        for n in range(1, largest + 1):
            padded = min(size for size in sizes if size >= n)
            assert padded <= max(8, worst * n), (largest, per_octave, n, padded)
    assert batch_buckets(64) == (1, 2, 4, 8, 16, 32, 64)  # powers of two
    assert batch_buckets(64, IMAGE_BUCKETS_PER_OCTAVE) == (1, 2, 4, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48,
                                                           56, 64)


def test_an_engine_on_cuda_keeps_torch_cpu_ops_on_one_thread_and_on_the_cpu_leaves_the_pool(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "get_num_threads", lambda: 16)
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    assert not single_threaded_host_ops("cpu") and calls == []
    assert single_threaded_host_ops(torch.device("cuda", 0)) and calls == [1]


def test_out_of_memory_retried_in_halves():
    calls = []
    x = torch.arange(10, dtype=torch.float32).reshape(10, 1)
    assert torch.equal(encode_in_pieces(oom_above(3, calls), x), x * 2)
    assert calls[0] == 10 and max(calls[1:]) <= 5
    with pytest.raises(torch.cuda.OutOfMemoryError):
        encode_in_pieces(oom_above(0, []), x)


def test_length_groups_cover_every_caption_once():
    counts = [5, 70, 9, 12, 30] * 10 + [77]
    groups = length_groups(counts, min_group=8)
    assert sorted(p for group in groups for p in group) == list(range(len(counts)))
    assert all(len(group) >= 8 for group in groups)
    longest = [max(counts[p] for p in group) for group in groups]
    assert longest == sorted(longest)  # shortest captions first, each group with its own length
    assert len(groups) > 1


LENGTHS = (8, 16, 24, 32, 48, 64, 77)
SIZES = (1, 2, 4, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64)


def _replay_costs(fixed, per_token_row):
    """A replay cost table as the engine measures it, from a fixed cost and a cost per (graph row x length)."""
    return ReplayCosts({(rows, length): fixed + per_token_row * rows * length for rows in SIZES for length in LENGTHS})


def _groups_cost(groups, counts, costs):
    limits = costs.lengths
    return sum(costs(len(group), limits[min(np.searchsorted(limits, max(counts[p] for p in group)), len(limits) - 1)])
               for group in groups)


@pytest.mark.parametrize("seed", range(20))
def test_cost_groups_are_the_cheapest_cut_at_bucket_changes(seed):
    rng = np.random.default_rng(seed)
    counts = rng.integers(2, 78, size=int(rng.integers(2, 65))).tolist()
    costs = _replay_costs(fixed=float(rng.uniform(0, 2)), per_token_row=float(rng.uniform(1e-4, 1e-2)))
    groups = cost_groups(counts, costs)
    assert sorted(p for group in groups for p in group) == list(range(len(counts)))
    longest = [max(counts[p] for p in group) for group in groups]
    assert longest == sorted(longest) and all(group for group in groups)
    # every way of cutting the length-sorted captions at bucket changes, tried
    order = sorted(range(len(counts)), key=lambda p: counts[p])
    buckets = [min(np.searchsorted(LENGTHS, counts[p]), len(LENGTHS) - 1) for p in order]
    changes = [i for i in range(1, len(order)) if buckets[i] != buckets[i - 1]]
    cheapest = math.inf
    for chosen in itertools.product((False, True), repeat=len(changes)):
        cuts = [0] + [c for c, keep in zip(changes, chosen) if keep] + [len(order)]
        candidate = [order[a:b] for a, b in zip(cuts, cuts[1:])]
        cheapest = min(cheapest, _groups_cost(candidate, counts, costs))
    assert _groups_cost(groups, counts, costs) == pytest.approx(cheapest)


def test_cost_groups_merge_when_replays_are_dear_and_cut_at_every_bucket_when_they_are_free():
    counts = [10] * 20 + [20] * 20 + [60] * 20
    assert len(cost_groups(counts, _replay_costs(fixed=100.0, per_token_row=1e-3))) == 1
    free = cost_groups(counts, _replay_costs(fixed=0.0, per_token_row=1e-3))
    assert [sorted({counts[p] for p in group}) for group in free] == [[10], [20], [60]]


def test_replay_costs_pad_rows_to_the_graph_that_holds_them():
    costs = _replay_costs(fixed=1.0, per_token_row=0.0)
    costs.ms[(20, 16)] = 5.0
    assert costs(17, 16) == 5.0 and costs(20, 16) == 5.0 and costs(21, 16) == 1.0
    assert costs(130, 16) == 3.0  # past the largest graph (64): one replay of it per piece


def test_text_inputs_group_by_measured_costs_once_they_are_set():
    from clip_flash.serve.inputs import TextInputs

    inputs = TextInputs(None, 77, group_by_length=True)
    tokens = torch.zeros((40, 77), dtype=torch.long)
    counts = [10] * 20 + [60] * 20
    for row, count in enumerate(counts):
        tokens[row, :count] = 5
    groups, _ = inputs.device((tokens, counts))
    assert len(groups) == 2  # by buckets: two groups of 20
    inputs.replay_costs = _replay_costs(fixed=100.0, per_token_row=1e-3)
    groups, _ = inputs.device((tokens, counts))
    assert len(groups) == 1 and groups[0][0] == list(range(40)) and groups[0][1] is tokens
    inputs.replay_costs = _replay_costs(fixed=0.0, per_token_row=1e-3)
    groups, _ = inputs.device((tokens, counts))
    assert [positions for positions, _ in groups] == [list(range(20)), list(range(20, 40))]
    assert all(torch.equal(tensor, tokens[positions]) for positions, tensor in groups)


def test_packed_costs_are_the_cheapest_token_bucket_holding_them():
    costs = _replay_costs(fixed=1.0, per_token_row=0.0)
    assert costs.packed(1000) == math.inf
    costs.packed_points = sorted({256: 2.0, 1024: 4.0, 2048: 8.0}.items())
    assert costs.packed(1) == 2.0 and costs.packed(256) == 2.0 and costs.packed(257) == 4.0
    assert costs.packed(2048) == 8.0 and costs.packed(2049) == math.inf  # no graph holds it
    costs.packed_points = sorted({256: 2.0, 1024: 4.0, 2048: 3.0}.items())  # the larger graph measured cheaper
    assert costs.packed(257) == 3.0 and costs.packed(100) == 2.0


def test_text_inputs_keep_the_batch_whole_where_the_packed_route_costs_less():
    from clip_flash.serve.inputs import TextInputs

    inputs = TextInputs(None, 77, group_by_length=True)
    counts = [10] * 20 + [60] * 20
    tokens = torch.zeros((40, 77), dtype=torch.long)
    for row, count in enumerate(counts):
        tokens[row, :count] = 5
    inputs.replay_costs = _replay_costs(fixed=0.0, per_token_row=1e-3)  # two groups: 0.32 + 1.28 ms
    assert len(inputs.device((tokens, counts))[0]) == 2
    inputs.replay_costs.packed_points = [(sum(counts), 1.7)]
    assert len(inputs.device((tokens, counts))[0]) == 2
    inputs.replay_costs.packed_points = [(sum(counts), 1.5)]
    groups, _ = inputs.device((tokens, counts))
    assert len(groups) == 1 and groups[0][0] == list(range(40)) and groups[0][1] is tokens


def test_cheapest_text_encode_replays_padded_unless_the_packed_graph_is_measured_cheaper():
    from clip_flash.serve.text_graphs import CheapestTextEncode

    routes = []
    costs = _replay_costs(fixed=1.0, per_token_row=1e-3)
    chooser = CheapestTextEncode(lambda t: routes.append("padded"), lambda t: routes.append("packed"), costs,
                                 max_rows=64)
    tokens = torch.zeros((64, 77), dtype=torch.long)
    tokens[:, :30] = 5  # one replay of 64 rows x 32: 1 + 2.048 ms
    chooser(tokens)  # no packed graph measured: padded
    costs.packed_points = [(64 * 30, 3.5)]
    chooser(tokens)
    costs.packed_points = [(64 * 30, 2.5)]
    chooser(tokens)
    chooser(tokens.to("meta"))  # ids already on a device: padded (counting them would wait on it)
    chooser(torch.cat([tokens, tokens[:1]]))  # more rows than the packed graphs take
    assert routes == ["padded", "padded", "packed", "padded", "padded"]


class FakeTower:
    """host: squares the numbers; device: a tensor; item 'bad' fails."""

    def host(self, payloads):
        return payloads

    def device(self, payloads):
        good = [i for i, p in enumerate(payloads) if p != "bad"]
        failures = [(i, "bad input") for i, p in enumerate(payloads) if p == "bad"]
        tensor = torch.tensor([[float(payloads[i]), 1.0] for i in good])
        return ([(good, tensor)] if good else []), failures

    def close(self):
        pass


def test_tower_batcher_batches_and_scatters_in_order():
    lock = threading.Lock()
    sizes, calls = [], []
    queued = [0]

    def dequeued(count):
        queued[0] -= count

    def encode(x):
        sizes.append(x.shape[0])
        return oom_above(2, calls)(x)  # every batch above 2 rows is split

    batcher = TowerBatcher("image", FakeTower(), encode, max_batch=4, max_wait=0.05, lock=lock,
                           on_dequeue=dequeued)

    async def main():
        loop = asyncio.get_running_loop()
        jobs = []
        for start in range(0, 9, 3):
            job = EmbeddingJob(loop, 3, time.monotonic() + 10)
            run = QueuedInputs(job, [0, 1, 2], [start, "bad", start + 2])  # split across batches of 4
            with lock:
                queued[0] += len(run)
                batcher.put_locked([run], time.monotonic())
            jobs.append(job)
        await asyncio.wait_for(asyncio.gather(*(job.future for job in jobs)), 10)
        return jobs

    jobs = asyncio.run(main())
    batcher.close()
    assert queued[0] == 0
    for number, job in enumerate(jobs):
        first, bad, last = job.results
        assert isinstance(bad, ItemError) and bad.message == "bad input"
        assert isinstance(first, Embedded) and first.raw.tolist() == [number * 6.0, 2.0]
        assert last.raw.tolist() == [number * 6.0 + 4, 2.0]
        assert abs(float((first.normalized ** 2).sum()) - 1) < 1e-6
    assert max(sizes) <= 4  # max_batch items a batch (bad ones are not encoded)


def test_frontend_results_round_trip_packed():
    import numpy as np

    from clip_flash.serve.jobs import BatchRows
    from clip_flash.serve.wire import pack_rows, unpack_batch

    both = np.arange(24, dtype=np.float32).reshape(2, 3, 4)  # raw, normalised
    rows = BatchRows(both, [5, 6, 0], {1: ItemError("bad")})
    message = pack_rows([3, 3], [7, 9], [0, 2], [False, True], rows, [(4, 8, "bad")])
    assert message[3].shape == (2, 4)  # one float32 matrix per batch, only the vector each request asked for
    pairs = {(request_id, index): result for request_id, index, result in unpack_batch(message)}
    assert sorted(pairs) == [(3, 7), (3, 9), (4, 8)]
    assert pairs[(4, 8)].message == "bad"
    assert pairs[(3, 7)].raw.tolist() == both[0, 0].tolist() and pairs[(3, 7)].normalized is None
    assert pairs[(3, 9)].normalized.tolist() == both[1, 2].tolist() and pairs[(3, 9)].raw is None
    gathered = pack_rows([1, 2], [0, 0], [0, 2], [True, True], rows, [])[3]  # not one slice: a row gather
    assert gathered.tolist() == both[1, [0, 2]].tolist()
    assert pairs[(3, 7)].tokens == 5
    assert unpack_batch(pack_rows([], [], [], [], rows, [(4, 8, "bad")]))[0][2].message == "bad"


def _one_item_seconds(close_when_idle: bool, max_wait: float) -> float:
    """Seconds from queueing one item into an idle batcher to its result."""
    lock = threading.Lock()
    batcher = TowerBatcher("image", FakeTower(), lambda x: x, max_batch=64, max_wait=max_wait, lock=lock,
                           on_dequeue=lambda count: None, close_when_idle=close_when_idle)

    async def main():
        job = EmbeddingJob(asyncio.get_running_loop(), 1, time.monotonic() + 30)
        started = time.monotonic()
        with lock:
            batcher.put_locked([QueuedInputs(job, [0], [3])], time.monotonic())
        await asyncio.wait_for(job.future, 10)
        assert isinstance(job.results[0], Embedded)
        return time.monotonic() - started

    try:
        return asyncio.run(main())
    finally:
        batcher.close()


def test_idle_batcher_closes_a_batch_at_once():
    assert _one_item_seconds(close_when_idle=True, max_wait=5.0) < 2.0  # not the 5 s wait
    assert _one_item_seconds(close_when_idle=False, max_wait=0.3) >= 0.3  # --wait-when-idle: the full wait


def _batch_sizes_behind_a_busy_device(max_in_flight: int) -> list:
    """Batch sizes when the first batch's encode is held while one input, then 19, arrive."""
    lock = threading.Lock()
    gate, sizes = threading.Event(), []

    def encode(x):
        sizes.append(x.shape[0])
        if len(sizes) == 1:
            assert gate.wait(10)
        return x

    batcher = TowerBatcher("image", FakeTower(), encode, max_batch=64, max_wait=0.01, lock=lock,
                           on_dequeue=lambda count: None, max_in_flight=max_in_flight)

    async def main():
        loop = asyncio.get_running_loop()
        jobs = []

        def put(count):
            job = EmbeddingJob(loop, count, time.monotonic() + 30)
            with lock:
                batcher.put_locked([QueuedInputs(job, list(range(count)), list(range(count)))], time.monotonic())
            jobs.append(job)

        for count in (1, 1, 1, 19):  # the device holds the first; the second is prepared behind it
            put(count)
            await asyncio.sleep(0.3)
        gate.set()
        await asyncio.wait_for(asyncio.gather(*(job.future for job in jobs)), 10)
        assert all(isinstance(result, Embedded) for job in jobs for result in job.results)

    try:
        asyncio.run(main())
    finally:
        gate.set()
        batcher.close()
    return sizes


def test_a_busy_device_gets_larger_batches():
    """Two batches in flight (one encoding, one prepared): what arrives meanwhile waits and goes as one batch,
    not as a batch per ``max_wait``."""
    assert _batch_sizes_behind_a_busy_device(max_in_flight=2) == [1, 1, 20]
    assert _batch_sizes_behind_a_busy_device(max_in_flight=0) == [1, 1, 1, 19]  # no limit: closes per max_wait


def test_a_run_split_across_batches_then_abandoned_drops_only_its_queued_part():
    """A 10-input run with room for 4 a batch: the batch takes 4 (a split), the request is abandoned while they
    encode (as ``Engine.abandon`` does: queued parts dropped and uncounted), and only those 4 are answered; the
    queue and its count end empty, nothing computed twice or lost from the count."""
    lock = threading.Lock()
    gate, sizes, queued = threading.Event(), [], [0]

    def encode(x):
        sizes.append(x.shape[0])
        assert gate.wait(10)
        return x

    def dequeued(count):
        queued[0] -= count

    batcher = TowerBatcher("image", FakeTower(), encode, max_batch=4, max_wait=0.0, lock=lock, on_dequeue=dequeued,
                           max_in_flight=1)

    async def main():
        job = EmbeddingJob(asyncio.get_running_loop(), 10, time.monotonic() + 30)
        run = QueuedInputs(job, list(range(10)), list(range(10)))
        with lock:
            queued[0] += len(run)
            batcher.put_locked([run], time.monotonic())
        for _ in range(200):  # the first batch is taken and encoding
            if sizes:
                break
            await asyncio.sleep(0.01)
        with lock:  # Engine.abandon
            assert run.state == QUEUED and len(run) == 6  # the queued rest of the split run
            run.state = DROPPED
            queued[0] -= len(run)
        gate.set()
        for _ in range(200):
            if job.pending == 6:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        return job

    try:
        job = asyncio.run(main())
    finally:
        gate.set()
        batcher.close()
    assert sizes == [4]
    assert [type(result).__name__ for result in job.results] == ["Embedded"] * 4 + ["NoneType"] * 6
    assert [float(result.raw[0]) for result in job.results[:4]] == [0.0, 1.0, 2.0, 3.0]
    assert queued[0] == 0 and len(batcher) == 0


def test_a_batch_failing_after_its_encode_fails_its_inputs_and_the_queue_goes_on(monkeypatch):
    """Copying a batch's embeddings fails (out of memory, say): its inputs get the reason, and the batch counts as
    landed, so with one batch allowed in flight the next one still closes and is answered."""
    from clip_flash.serve import batcher as batcher_module

    calls = []
    to_host = batcher_module.to_host

    def failing_once(features, copy_stream):
        calls.append(features.shape)
        if len(calls) == 1:
            raise RuntimeError("out of pinned memory (simulated)")
        return to_host(features, copy_stream)

    monkeypatch.setattr(batcher_module, "to_host", failing_once)
    lock = threading.Lock()
    batcher = TowerBatcher("image", FakeTower(), lambda x: x, max_batch=4, max_wait=0.01, lock=lock,
                           on_dequeue=lambda count: None, max_in_flight=1)

    async def main():
        loop = asyncio.get_running_loop()
        first, second = EmbeddingJob(loop, 2, time.monotonic() + 30), EmbeddingJob(loop, 1, time.monotonic() + 30)
        with lock:
            batcher.put_locked([QueuedInputs(first, [0, 1], [5, 6])], time.monotonic())
        await asyncio.wait_for(first.future, 10)
        with lock:
            batcher.put_locked([QueuedInputs(second, [0], [7])], time.monotonic())
        await asyncio.wait_for(second.future, 10)
        return first, second

    try:
        first, second = asyncio.run(main())
    finally:
        batcher.close()
    assert [result.message for result in first.results] == [
        "copying the image batch's embeddings failed: RuntimeError: out of pinned memory (simulated)"] * 2
    assert isinstance(second.results[0], Embedded) and float(second.results[0].raw[0]) == 7.0


def test_text_groups_are_the_tokens_of_their_positions():
    from clip_flash.serve.inputs import TextInputs

    counts = [5, 70, 9, 12, 30] * 10
    tokens = torch.arange(len(counts)).unsqueeze(1).repeat(1, 4)
    groups, failures = TextInputs(None, 77, group_by_length=True).device((tokens, counts))
    assert not failures and len(groups) > 1
    for positions, rows in groups:
        assert rows[:, 0].tolist() == positions


def test_default_workers_leave_small_machines_one_process(monkeypatch):
    import os

    from clip_flash.serve import config

    for cores, workers in ((2, 1), (7, 1), (8, 2), (16, 4), (128, 4)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cores: set(range(n)), raising=False)
        assert config.default_workers() == workers
        assert config.ServeConfig().workers == workers
    # with an engine per GPU, up to 4 frontends each, cores allowing
    for cores, devices, workers in ((32, (0, 1), 8), (16, (0, 1), 4), (128, (0, 1, 2, 3), 16), (32, (0,), 4)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cores: set(range(n)), raising=False)
        assert config.ServeConfig(devices=devices).workers == workers
    assert config.ServeConfig(devices=(0, 1), workers=2).workers == 2  # given: kept


def test_a_batch_alone_is_launched_by_the_collector_and_one_behind_another_by_the_launch_thread():
    """``launch_alone`` (the default on a GPU): a batch with nothing else in flight runs its device step on the
    collect thread (no hand-off to wake the launch thread for); one taken while the first still waits for its
    answer (held here in the answer stage, as a GPU still encoding holds it) goes through the launch thread, and
    both are answered."""
    lock = threading.Lock()
    gate, threads = threading.Event(), []

    def encode(x):
        threads.append(threading.current_thread().name)
        return x

    class HeldFirstAnswer:
        """Metrics whose first ``encoded`` (in the answer stage) waits for the gate."""

        def __init__(self):
            self.answers = 0

        def encoded(self, tower, seconds):
            self.answers += 1
            if self.answers == 1:
                assert gate.wait(10)

        def queued(self, tower, waits):
            pass

        def batch(self, tower, size, seconds):
            pass

        def dropped(self, tower, count):
            pass

    batcher = TowerBatcher("image", FakeTower(), encode, max_batch=64, max_wait=0.01, lock=lock,
                           on_dequeue=lambda count: None, metrics=HeldFirstAnswer(), launch_alone=True)

    async def main():
        loop = asyncio.get_running_loop()
        jobs = []
        for count in (1, 2):
            job = EmbeddingJob(loop, count, time.monotonic() + 30)
            with lock:
                batcher.put_locked([QueuedInputs(job, list(range(count)), list(range(count)))], time.monotonic())
            jobs.append(job)
            await asyncio.sleep(0.3)
        gate.set()
        await asyncio.wait_for(asyncio.gather(*(job.future for job in jobs)), 10)
        return jobs

    try:
        jobs = asyncio.run(main())
    finally:
        gate.set()
        batcher.close()
    assert threads == ["clip_flash-image-collect", "clip_flash-image-launch"]
    assert [[float(result.raw[0]) for result in job.results] for job in jobs] == [[0.0], [0.0, 1.0]]


def test_a_batch_alone_with_inputs_queued_behind_it_goes_to_the_launch_thread():
    """Under load the collector hands even a batch alone in flight to the launch thread when inputs wait in the
    queue, and takes the next batch: its CPU step sets the pace there. The first batch's CPU step here lasts
    until a second request is queued."""
    lock = threading.Lock()
    second_queued, threads = threading.Event(), []

    def encode(x):
        threads.append(threading.current_thread().name)
        return x

    class SlowFirstHost(FakeTower):
        def __init__(self):
            self.calls = 0

        def host(self, payloads):
            self.calls += 1
            if self.calls == 1:
                assert second_queued.wait(10)
            return payloads

    batcher = TowerBatcher("image", SlowFirstHost(), encode, max_batch=64, max_wait=0.01, lock=lock,
                           on_dequeue=lambda count: None, launch_alone=True)

    async def main():
        loop = asyncio.get_running_loop()
        jobs = [EmbeddingJob(loop, count, time.monotonic() + 30) for count in (1, 2)]
        with lock:
            batcher.put_locked([QueuedInputs(jobs[0], [0], [0])], time.monotonic())
        await asyncio.sleep(0.2)  # the collector took the first batch and is in its CPU step
        with lock:
            batcher.put_locked([QueuedInputs(jobs[1], [0, 1], [0, 1])], time.monotonic())
        second_queued.set()
        await asyncio.wait_for(asyncio.gather(*(job.future for job in jobs)), 10)
        return jobs

    try:
        jobs = asyncio.run(main())
    finally:
        second_queued.set()
        batcher.close()
    assert threads[0] == "clip_flash-image-launch"
    assert [[float(result.raw[0]) for result in job.results] for job in jobs] == [[0.0], [0.0, 1.0]]


def test_text_graphs_per_doubling_reaches_the_config_and_is_checked():
    import argparse

    from clip_flash.serve.cli import add_arguments, config_from_args
    from clip_flash.serve.config import ServeConfig

    parser = add_arguments(argparse.ArgumentParser())
    assert config_from_args(parser.parse_args([])).text_graphs_per_doubling == ServeConfig().text_graphs_per_doubling
    assert config_from_args(parser.parse_args(["--text-graphs-per-doubling", "4"])).text_graphs_per_doubling == 4
    with pytest.raises(ValueError, match="text_graphs_per_doubling"):
        ServeConfig(text_graphs_per_doubling=0)


def test_no_split_jpegs_reaches_the_image_preparer():
    import argparse

    from open_clip.transform import image_transform

    from clip_flash.serve.cli import add_arguments, config_from_args
    from clip_flash.serve.inputs import FastImageInputs

    vit_b32_transform = image_transform(224, is_train=False)
    parser = add_arguments(argparse.ArgumentParser())
    assert config_from_args(parser.parse_args([])).split_jpegs is True
    config = config_from_args(parser.parse_args(["--no-split-jpegs"]))
    assert config.split_jpegs is False
    inputs = FastImageInputs(vit_b32_transform, torch.device("cpu"), torch.float32, "cpu", 2, 8, config.split_jpegs)
    try:
        assert inputs.preparer.split_jpegs is False
    finally:
        inputs.close()


def test_no_cudnn_attention_reaches_the_config_and_turns_it_off_on_cuda_only():
    import argparse

    from clip_flash.serve.cli import add_arguments, config_from_args
    from clip_flash.serve.engine import without_cudnn_attention

    parser = add_arguments(argparse.ArgumentParser())
    assert config_from_args(parser.parse_args([])).cudnn_attention is True
    assert config_from_args(parser.parse_args(["--no-cudnn-attention"])).cudnn_attention is False
    was = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        assert without_cudnn_attention("cpu") is False and torch.backends.cuda.cudnn_sdp_enabled()
        assert without_cudnn_attention(torch.device("cuda", 0)) is True
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert without_cudnn_attention("cuda") is False  # already off
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)


def test_text_graphs_are_captured_largest_first_with_the_end_of_text_at_each_length():
    from clip_flash.serve.text_graphs import capture_text_graphs

    class Recorder:
        calls = []

        def encode_text(self, tokens):
            ends = (tokens == 49407).nonzero()[:, 1].unique().tolist()
            self.calls.append((tokens.shape[0], ends, tokens.shape[1], int(tokens[0, 0])))

    recorder = Recorder()
    capture_text_graphs(recorder, (1, 4, 2), (8, 77, 16), 77)
    assert recorder.calls == [(size, [length - 1], 77, 49406) for size in (4, 2, 1) for length in (77, 16, 8)]


@pytest.mark.parametrize("failure", ["refused", "capture"])
def test_packed_text_graphs_that_cannot_be_made_leave_the_padded_graphs_serving(monkeypatch, caplog, failure):
    import clip_flash.graphs.packed_text as packed_text
    from clip_flash.serve.text_graphs import with_packed_graphs

    class Refusing:
        def __init__(self, model, max_rows):
            if failure == "refused":
                raise ValueError("the text tower's attention backend has no packed kernel")
            self.max_rows = max_rows

        def capture_all(self):
            raise RuntimeError("CUDA-graph capture of text b1 failed (out of memory)")

    monkeypatch.setattr(packed_text, "PackedTextGraphs", Refusing)
    costs = _replay_costs(fixed=1.0, per_token_row=0.0)

    def padded(tokens):
        return tokens

    with caplog.at_level("INFO", logger="clip_flash.serve.text_graphs"):
        assert with_packed_graphs(None, padded, costs, max_rows=1024) is padded
    assert "replay padded graphs only" in caplog.text
    assert not costs.packed_points
