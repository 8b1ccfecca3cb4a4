"""The host gate (``clip_flash.ops.host_gate``): work queued behind a ticket waits until the host opens it; a ticket
opened before its wait is queued (or an earlier ticket than one opened) lets it through at once; a gate never opened
lets the stream go after its timeout."""
from __future__ import annotations

import time

import pytest
import torch

from clip_flash.ops.host_gate import HostGate


def _gate(timeout: float = 10.0) -> HostGate:
    gate = HostGate.create(torch.device("cuda"), timeout=timeout)
    if gate is None:
        pytest.skip("the compiled extension clip_flash._C is not available")
    return gate


def _queued_behind(gate: HostGate, ticket: int, x: torch.Tensor) -> torch.cuda.Event:
    # Loaded before the gate closes: a kernel's first launch (CUDA's lazy loading) waits for the device, so the
    # thread queuing behind a closed gate must not be the one to open it, as here.
    x.add_(0)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        gate.wait(ticket)
        x.add_(1)
        done = torch.cuda.Event()
        done.record()
    return done


def test_work_behind_the_gate_waits_for_the_host_then_runs():
    gate = _gate()
    x = torch.zeros(1, device="cuda")
    ticket = gate.next_ticket()
    done = _queued_behind(gate, ticket, x)
    time.sleep(0.2)
    assert not done.query()  # still held: the host has not opened it
    gate.open(ticket)
    done.synchronize()
    assert x.item() == 1.0 and not gate.timed_out(ticket)


def test_a_ticket_opened_before_its_wait_and_earlier_tickets_pass_at_once():
    gate = _gate()
    x = torch.zeros(1, device="cuda")
    first, second = gate.next_ticket(), gate.next_ticket()
    gate.open(second)  # opens the first too
    for ticket in (first, second):
        started = time.perf_counter()
        _queued_behind(gate, ticket, x).synchronize()
        assert time.perf_counter() - started < 1.0
    assert x.item() == 2.0


def test_a_gate_never_opened_lets_the_stream_go_after_its_timeout():
    gate = _gate(timeout=0.3)
    x = torch.zeros(1, device="cuda")
    started = time.perf_counter()
    ticket = gate.next_ticket()
    _queued_behind(gate, ticket, x).synchronize()
    assert 0.25 < time.perf_counter() - started < 5.0
    assert x.item() == 1.0 and gate.timed_out(ticket)
    opened = gate.next_ticket()
    gate.open(opened)
    _queued_behind(gate, opened, x).synchronize()
    assert not gate.timed_out(opened)


def test_a_counter_the_device_cannot_read_is_refused_with_the_reason():
    gate = _gate()
    with pytest.raises(RuntimeError, match="page-locked"):  # pageable memory
        gate._extension.host_gate_device_address(torch.zeros(2, dtype=torch.int64), gate.device.index)
    assert "device address" in gate._extension.host_gate_wait(0, 1, 10**9, gate.device.index)
