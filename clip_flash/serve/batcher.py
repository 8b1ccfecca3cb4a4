"""One dynamic batcher per tower: inputs from every request join one queue (a request's inputs for the tower as
one entry, ``QueuedInputs``); a batch closes at ``max_batch`` inputs or ``max_wait`` seconds after its first
input, whichever comes first (taking part of a run that does not fit), and at once when no batch of this
tower is in flight (nothing to overlap with: waiting would only add latency; under load a batch is always in
flight, so batches still fill for up to ``max_wait``).

No batch closes while ``max_in_flight`` batches are between the queue and their answers (default 2: one on the
device, the next being prepared behind it, as a Triton model instance takes a batch only when it is free). The
device's backlog then stays in the queue, where the next batch can take all of it, instead of in the stages as
many small batches, each paying the device's fixed cost per batch: the busier the device, the larger its
batches. With one batch preparing while one encodes, the device waits only when a batch takes longer to prepare
than the one before it takes to encode.

Three threads, each a stage, with at most one batch waiting between stages, so that while the device encodes
batch N the next batch is already decoded (or tokenized) and launched behind it:

1. ``collect``: takes a batch from the queue (dropping items whose client went away or whose deadline passed)
   and runs the CPU step (decoding images, tokenizing captions).
2. ``launch``: the device step (upload, exact resampling), the encoder (a replayed CUDA graph on CUDA), the
   L2 normalisation, and an asynchronous copy of the embeddings to page-locked host memory (on a stream of its
   own, so the next batch's work does not queue behind it).
3. ``answer``: waits for that copy and hands every item's result back to its request's event loop.

On a GPU, a batch that is alone in the pipeline with nothing queued behind it (low load) skips the hand-off to
``launch``: the collector queues its device work itself (launches, no waiting), as the launch thread is idle and
waking it would only add to the request's latency. With inputs queued, the collector hands the batch off and
takes the next one: under load the CPU step sets the pace, and launching on the collect thread would add the
launches to it. On the CPU the device step is the computation itself, so it stays on its thread.

Early launch (images on a GPU, exact path): for a batch alone in the pipeline, the launch thread queues the
device step, the encoder and the copy back while the collector still decodes, behind a gate
(``clip_flash.ops.host_gate``) that the native decoder opens the moment the pixels are written: the launches
overlap the decode instead of following it. If the decode handed a file to Pillow after all (its rows are not the
layout's), the early work is dropped and the batch goes the usual way; if the gate's wait timed out, the batch
fails rather than answer from inputs read too soon.

A failure in any step fails only the batch's items concerned, as per-item errors; out of device memory retries
the batch in halves (``encode_in_pieces``). Nothing here can stop the threads but ``close()``.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from typing import Any, Callable, Deque, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .device_rows import encode_in_pieces, in_batch_order, to_host
from .inputs import describe_error
from .jobs import DROPPED, QUEUED, TAKEN, BatchRows, ItemError, QueuedInputs, Result, deliver_rows, failed_rows

logger = logging.getLogger(__name__)

_STOP = object()


class TowerBatcher:
    """The queue and the three stage threads of one tower of one engine.

    Args:
        tower: ``"image"`` or ``"text"`` (labels metrics and thread names).
        inputs: the tower's ``host``/``device`` steps (see ``inputs.py``).
        encode: features of a model-ready batch (on the device), unnormalised.
        max_batch, max_wait: when a batch closes.
        lock: the engine's queue lock (shared by its towers, so one count covers every queued input).
        on_dequeue: called (under ``lock``) with how many inputs left the queue, taken or dropped.
        metrics: a ``ServeMetrics`` or None.
        device: the CUDA device the threads work on (None: the CPU).
        close_when_idle: close a batch at once when none of this tower is in flight (else wait ``max_wait``).
        max_in_flight: batches taken and not yet answered at most (0: no limit; a batch then closes after
            ``max_wait`` however far behind the device is).
        launch_alone: the collector runs the device step of a batch that is alone in the pipeline itself
            (None: on a CUDA device, where that step only queues work).
        launch_early: a batch alone in the pipeline is launched while it decodes, behind ``gate`` (default: a
            ``HostGate`` on a CUDA device whose ``inputs`` can hand out their layout early; otherwise off).
    """

    def __init__(self, tower: str, inputs: Any, encode: Callable[[torch.Tensor], torch.Tensor], max_batch: int,
                 max_wait: float, lock: threading.Lock, on_dequeue: Callable[[int], None], metrics: Any = None,
                 device: Optional[torch.device] = None, close_when_idle: bool = True, max_in_flight: int = 2,
                 launch_alone: Optional[bool] = None, launch_early: bool = True, gate: Any = None) -> None:
        self.tower = tower
        self.inputs = inputs
        self.encode = encode
        self.max_batch = max_batch
        self.max_wait = max_wait
        self.lock = lock
        self.on_dequeue = on_dequeue
        self.metrics = metrics
        self.device = device if device is not None and device.type == "cuda" else None
        self.ready = threading.Condition(lock)
        self.runs: Deque[QueuedInputs] = deque()
        self.waiting = 0  # inputs in ``runs``
        self.stopping = False
        self.close_when_idle = close_when_idle
        self.max_in_flight = max_in_flight
        self.launch_alone = self.device is not None if launch_alone is None else launch_alone
        self.in_flight = 0  # batches taken and not yet answered (under lock)
        # The embeddings go to the host on a stream of their own: on the launching stream the copy (6.3 MB for
        # 1,024 captions' raw and normalised rows) held the next batch's replay back until it was done. Saturated at
        # 64 captions a request: 1,540 -> 1,556-1,559 req/s (benchmarks/results/h200/copy_stream_b2396ad).
        self._copy_stream = torch.cuda.Stream(self.device) if self.device is not None else None
        if launch_early and gate is None and getattr(inputs, "launches_early", False):
            from ..ops.host_gate import HostGate

            gate = HostGate.create(self.device)
        self._gate = gate if launch_early else None
        # The launch thread queues on a stream of its own, made its current stream once (``_run``): a gate waiting
        # on a shared stream would hold the other tower's work queued there too, and a stream context entered for
        # each early launch cost 0.18 ms of host time on a core that idled (0.02 on a busy one), on a lone
        # request's critical path (benchmarks/results/h200/launch_chain_2eae52c).
        self._early_stream = torch.cuda.Stream(self.device) if self._gate is not None and self.device else None
        self._to_launch: "queue.Queue[Any]" = queue.Queue(maxsize=1)
        self._to_answer: "queue.Queue[Any]" = queue.Queue(maxsize=1)
        self._threads = [threading.Thread(target=self._run, args=(stage,), daemon=True,
                                          name=f"clip_flash-{tower}-{stage.__name__.strip('_')}")
                         for stage in (self._collect, self._launch, self._answer)]
        for thread in self._threads:
            thread.start()

    # -- the queue (called with self.lock held) -------------------------------------------------------------------
    def put_locked(self, runs: Sequence[QueuedInputs], now: float) -> None:
        count = 0
        for run in runs:
            run.enqueued = now
            count += len(run.indices)
        # The collector waits for a first input, then for a full batch (or its deadline, or the batch in flight
        # to land): waking it for every request in between would only make it take the GIL to go back to sleep.
        waiting = self.waiting
        wake = not waiting or waiting < self.max_batch <= waiting + count
        self.runs.extend(runs)
        self.waiting = waiting + count
        if wake:
            self.ready.notify()

    def __len__(self) -> int:
        """Inputs in the queue (those of runs dropped by their requests included until the collector meets them)."""
        return self.waiting

    def _take_batch(self) -> Optional[List[QueuedInputs]]:
        """Wait for the next batch; None when stopping with nothing left."""
        while True:
            taken = self._take_locked()
            if taken is None:
                return None
            batch, dropped, now = taken
            if self.metrics is not None:
                if dropped:
                    self.metrics.dropped(self.tower, dropped)
                if batch:
                    self.metrics.queued(self.tower, _waits_per_request(batch, now))
            if batch:
                return batch
            # everything taken had been abandoned: wait for the next batch

    def _drop_abandoned_head_locked(self) -> bool:
        """Drop the inputs at the queue's head that their requests gave up (client gone, deadline answered; counted
        there), so that the batch's window opens at its first input still queued: an abandoned one would close a
        later request's batch early. Whether an input is left."""
        while self.runs and self.runs[0].state != QUEUED:
            self.waiting -= len(self.runs.popleft().indices)
        return bool(self.runs)

    def _take_locked(self) -> Optional[Tuple[List[QueuedInputs], int, float]]:
        """(batch, how many inputs were dropped, when) once a batch closes; None when stopping with nothing left."""
        with self.lock:
            while True:
                while not self.runs and not self.stopping:
                    self.ready.wait()
                if not self.runs:
                    return None
                # The device is as far behind as allowed: what arrives meanwhile joins this batch.
                while self.max_in_flight and self.in_flight >= self.max_in_flight and not self.stopping:
                    self.ready.wait()
                if not self._drop_abandoned_head_locked():
                    continue
                closes = self.runs[0].enqueued + self.max_wait
                while self.waiting < self.max_batch and not self.stopping and (
                        self.in_flight or not self.close_when_idle):
                    remaining = closes - time.monotonic()
                    if remaining <= 0:
                        break
                    self.ready.wait(remaining)
                    if not self._drop_abandoned_head_locked():
                        break
                    closes = self.runs[0].enqueued + self.max_wait
                if self.runs:
                    break
            now = time.monotonic()
            batch: List[QueuedInputs] = []
            size = dropped = left = 0
            runs = self.runs
            while runs and size < self.max_batch:
                run = runs[0]
                count = len(run.indices)
                if run.state != QUEUED:  # dropped by its request already (and uncounted then)
                    runs.popleft()
                    self.waiting -= count
                    continue
                if run.job.expired(now):
                    runs.popleft()
                    self.waiting -= count
                    run.state = DROPPED
                    dropped += count
                    left += count
                    continue
                room = self.max_batch - size
                if count > room:  # the batch takes what fits; the rest stays first in the queue
                    run = run.split(room)
                    count = room
                else:
                    runs.popleft()
                self.waiting -= count
                run.state = TAKEN
                batch.append(run)
                size += count
                left += count
            if left:
                self.on_dequeue(left)
            if batch:
                self.in_flight += 1
            return batch, dropped, now

    # -- the stages ----------------------------------------------------------------------------------------------
    def _run(self, stage: Callable[[], bool]) -> None:
        if self.device is not None:
            torch.cuda.set_device(self.device)
            if stage == self._launch and self._early_stream is not None:
                torch.cuda.set_stream(self._early_stream)
        with torch.inference_mode():
            while True:
                try:
                    if not stage():
                        return
                except Exception:  # noqa: BLE001 - a bug here must not stop the tower; its requests time out
                    logger.exception("%s batcher: unexpected error in %s", self.tower, threading.current_thread().name)

    def _collect(self) -> bool:
        batch = self._take_batch()
        if batch is None:
            self._to_launch.put(_STOP)
            return False
        started = time.perf_counter()
        payloads = [payload for run in batch for payload in run.payloads]
        if self._gate is not None and self._alone():
            self._collect_early(batch, payloads, started)
            return True
        try:
            host = self.inputs.host(payloads)
        except Exception as error:  # noqa: BLE001 - a batch the step refuses fails its inputs, not the server
            self._fail(batch, len(payloads), f"preparing the {self.tower} batch failed: {describe_error(error)}")
            return True
        work = (batch, len(payloads), host, time.perf_counter() - started)
        if self.launch_alone and self._alone():
            self._launch_batch(work)  # nothing to overlap with: no hand-off to wait for
        else:
            self._to_launch.put(work)
        return True

    def _alone(self) -> bool:
        """Whether the batch just collected is the only one of this tower between the queue and its answer, with
        no input queued behind it: the launch thread is then idle, and the collector launching the batch itself
        saves that thread's wake-up (about a tenth of a millisecond on the critical path of a request at low
        load). With inputs queued the collector's next CPU step comes first: the launches were 15% of the collect
        thread's samples in the ViT-B-32 ``--decode gpu`` server at 7,000 one-JPEG requests/s, the thread that set
        its pace. With this hand-off and the native scan's views of the request bytes: 7,000 req/s at p99 <= 100
        ms in both runs, on a host where the code before reached it in neither
        (benchmarks/results/h200/collect_handoff_e00caed)."""
        with self.lock:
            return self.in_flight == 1 and self._to_launch.empty() and not self.waiting

    def _collect_early(self, batch: List[QueuedInputs], payloads: List[Any], started: float) -> None:
        """The CPU step of a batch alone in the pipeline, its device work queued by the launch thread behind the
        gate meanwhile (from the moment the layout is known); the gate opens when the pixels are written (the
        decoder opens it) and again when the step returns, whatever happened."""
        early = _EarlyLaunch(batch, len(payloads), self._gate.next_ticket())

        def on_layout(layout: Any) -> Any:
            early.layout = layout
            self._to_launch.put(early)  # empty: the batch is alone
            # The decoder opens the gate itself, before taking the GIL back from the launching thread.
            return self._gate.opener(early.ticket)

        host, error = None, None
        try:
            host = self.inputs.host(payloads, on_layout=on_layout)
        except Exception as caught:  # noqa: BLE001 - a batch the step refuses fails its inputs, not the server
            error = caught
        finally:
            if early.layout is not None:
                self._gate.open(early.ticket)
        seconds = time.perf_counter() - started
        if early.layout is not None:
            early.outcome.put((host, error, seconds))  # the launch thread owns the batch from here
        elif error is not None:
            self._fail(batch, len(payloads), f"preparing the {self.tower} batch failed: {describe_error(error)}")
        else:  # no layout (e.g. every input left to Pillow): as any lone batch
            self._launch_batch((batch, len(payloads), host, seconds))

    def _launch(self) -> bool:
        work = self._to_launch.get()
        if work is _STOP:
            self._to_answer.put(_STOP)
            return False
        if isinstance(work, _EarlyLaunch):
            self._launch_early(work)
        else:
            self._launch_batch(work)
        return True

    def _launch_early(self, early: "_EarlyLaunch") -> None:
        """Queue a batch's device step, encoder and copy back behind the gate while the collector decodes it; once
        the decode is done, answer from them, or (the decode did not give the layout's rows, or queuing failed)
        prepare the batch the usual way."""
        launched = None
        try:  # on the launch thread's own stream (``_run``)
            self._gate.wait(early.ticket)
            launched = self._encode_groups(self.inputs.device_early(early.layout), early.size)
        except Exception as error:  # noqa: BLE001 - whatever failed here, the usual way still answers the batch
            logger.debug("%s batch not launched early (%s)", self.tower, describe_error(error))
        host, error, host_seconds = early.outcome.get()
        batch, size = early.batch, early.size
        if error is not None:
            self._fail(batch, size, f"preparing the {self.tower} batch failed: {describe_error(error)}")
            return
        failures = self.inputs.early_failures(host) if launched is not None else None
        if failures is None:
            self._launch_batch((batch, size, host, host_seconds))
            return
        results, rows, done, covered = launched
        for position, reason in failures:
            results[position] = ItemError(reason)
        prepared = time.perf_counter()
        if self.metrics is not None:
            self.metrics.batch(self.tower, size, host_seconds)
        del host
        self._to_answer.put((batch, size, None, results, rows, covered, done, prepared, early.ticket))

    def _launch_batch(self, work: Tuple[List[QueuedInputs], int, Any, float]) -> None:
        """The device step, the encoder and the copy to the host for one batch; then to the answer stage."""
        batch, size, host, host_seconds = work
        started = time.perf_counter()
        try:
            groups, failures = self.inputs.device(host)
        except Exception as error:  # noqa: BLE001
            self._fail(batch, size, f"preparing the {self.tower} batch failed: {describe_error(error)}")
            return
        prepared = time.perf_counter()
        if self.metrics is not None:
            self.metrics.batch(self.tower, size, host_seconds + prepared - started)
        try:
            results, rows, done, covered = self._encode_groups(groups, size)
        except Exception as error:  # noqa: BLE001 - e.g. out of memory for the copy: these inputs fail
            self._fail(batch, size, f"copying the {self.tower} batch's embeddings failed: {describe_error(error)}")
            return
        for position, reason in failures:
            results[position] = ItemError(reason)
        counts = host[1] if self.tower == "text" else None  # captions' token counts; the rest of host can go
        del host  # (an image batch's host step may hold a reused pixel arena)
        self._to_answer.put((batch, size, counts, results, rows, covered, done, prepared, None))

    def _encode_groups(self, groups: List[Tuple[List[int], torch.Tensor]], size: int
                       ) -> Tuple[List[Optional[Result]], Optional[torch.Tensor], Any, List[List[int]]]:
        """Encode each group and queue the (raw, normalised) rows' copy to the host: (per-position results, with
        the encoder's failures; the host rows; the copy's event; the positions with rows). Raises only if the
        copy cannot be queued."""
        results: List[Optional[Result]] = [None] * size
        encoded: List[Tuple[List[int], torch.Tensor]] = []
        for positions, tensor in groups:
            try:
                features = encode_in_pieces(self.encode, tensor).float()
                encoded.append((positions, torch.stack([features,
                                                        torch.nn.functional.normalize(features, dim=-1)])))
            except Exception as error:  # noqa: BLE001 - OOM on one row, a model error: these items fail
                reason = ("out of device memory" if isinstance(error, torch.cuda.OutOfMemoryError)
                          else f"encoding failed: {describe_error(error)}")
                logger.error("%s batch of %d: %s", self.tower, len(positions), reason)
                for position in positions:
                    results[position] = ItemError(reason)
        rows, done = to_host(in_batch_order(encoded, size), self._copy_stream) if encoded else (None, None)
        return results, rows, done, [positions for positions, _ in encoded]

    def _answer(self) -> bool:
        work = self._to_answer.get()
        if work is _STOP:
            return False
        batch, size, counts, results, rows, covered, done, prepared, ticket = work
        try:
            if done is not None:
                done.synchronize()
            both = rows.numpy() if rows is not None else np.zeros((2, size, 0), dtype=np.float32)
        except Exception as error:  # noqa: BLE001 - a device error surfacing here fails this batch's inputs
            self._fail(batch, size, f"encoding the {self.tower} batch failed: {describe_error(error)}")
            return True
        if ticket is not None and self._gate.timed_out(ticket):  # the device read the inputs before they were written
            self._fail(batch, size, f"the {self.tower} batch ran before its inputs were decoded (the host gate timed "
                                    "out); send it again")
            return True
        if self.metrics is not None:
            self.metrics.encoded(self.tower, time.perf_counter() - prepared)
        errors = {position: result for position, result in enumerate(results) if result is not None}
        if len(errors) + sum(map(len, covered)) < size:  # a step left positions without a row or a reason
            with_rows = {position for positions in covered for position in positions}
            missing = ItemError("no embedding was produced")
            for position in range(size):
                if position not in errors and position not in with_rows:
                    errors[position] = missing
        try:
            deliver_rows(batch, BatchRows(both, counts, errors))
        finally:  # whatever happened, the batch left: a count left high would hold the queue (max_in_flight)
            self._landed()
        return True

    def _fail(self, batch: List[QueuedInputs], size: int, reason: str) -> None:
        logger.error("%s", reason)
        try:
            deliver_rows(batch, failed_rows(size, reason))
        finally:
            self._landed()

    def _landed(self) -> None:
        """A batch left the pipeline: if the queue waits on it, the next batch may close now."""
        with self.lock:
            self.in_flight -= 1
            if self.runs:
                self.ready.notify()

    # -- stopping ------------------------------------------------------------------------------------------------
    def close(self, timeout: Optional[float] = None) -> None:
        """Finish every item queued so far, then stop the threads."""
        with self.lock:
            self.stopping = True
            self.ready.notify_all()
        for thread in self._threads:
            thread.join(timeout)


class _EarlyLaunch:
    """A lone batch launched while it decodes: the layout the CPU step handed out, the gate's ticket, and the CPU
    step's outcome ``(host, error, seconds)`` once it returns."""

    def __init__(self, batch: List[QueuedInputs], size: int, ticket: int) -> None:
        self.batch = batch
        self.size = size
        self.ticket = ticket
        self.layout: Any = None
        self.outcome: "queue.Queue[Tuple[Any, Optional[BaseException], float]]" = queue.Queue(maxsize=1)


def _waits_per_request(batch: List[QueuedInputs], now: float) -> List[float]:
    """How long each request's inputs in this batch waited (one value per request: its inputs were queued
    together, so they waited alike; one histogram observation per input would cost the GIL dearly at 100,000
    captions/s)."""
    waits, last_job = [], None
    for run in batch:
        if run.job is not last_job:
            waits.append(now - run.enqueued)
            last_job = run.job
    return waits
