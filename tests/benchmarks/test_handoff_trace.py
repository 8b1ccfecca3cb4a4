"""``handoff_trace.py``'s analysis on made-up stamps: only requests that arrived alone count, each stamp is its
first occurrence after the request's arrival, and the table is ordered by median offset."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.serve.handoff_trace import analyze, handoff_table, isolated_requests


def _stamps():
    stamps = []
    # eleven lone requests 100 ms apart, each: arrive, put 1 ms later, deliver 3 ms later (from two "processes")
    for number in range(11):
        start = number * 0.1
        stamps += [(start, "arrive"), (start + 0.001, "put"), (start + 0.003, "deliver")]
    # two arrivals 2 ms apart: neither is alone
    stamps += [(2.0, "arrive"), (2.002, "arrive"), (2.003, "put")]
    return sorted(stamps)


def test_only_lone_requests_count_and_warm_up_is_dropped():
    requests, arrived = isolated_requests(_stamps(), isolation_s=0.015)
    assert arrived == 13
    assert len(requests) == 10  # 11 alone, the first tenth (one) dropped as warm-up
    assert all(request == pytest.approx({"arrive": 0.0, "put": 0.001, "deliver": 0.003}) for request in requests)


def test_table_in_order_with_steps(tmp_path):
    rows = handoff_table(isolated_requests(_stamps(), 0.015)[0])
    assert [row["stamp"] for row in rows] == ["arrive", "put", "deliver"]
    assert [round(row["step_ms"], 6) for row in rows] == [0.0, 1.0, 2.0]
    folder = tmp_path / "stamps"
    folder.mkdir()
    stamps = _stamps()
    # the hook's files (one stamp a line, appended each second) beside a list per process, as older traces were kept
    (folder / "stamps_1.jsonl").write_text("".join(json.dumps([label, when]) + "\n" for when, label in stamps[::2]))
    (folder / "stamps_2.json").write_text(json.dumps([[label, when] for when, label in stamps[1::2]]))
    text = analyze(folder, tmp_path, isolation_ms=15)
    assert "10 requests that arrived alone (of 13)" in text
    assert json.loads((tmp_path / "handoffs.json").read_text())["stamps"][2]["stamp"] == "deliver"


def test_call_cpu_time_is_the_stamping_threads_between_a_calls_two_stamps(tmp_path):
    """``X0``/``X1`` stamps carrying the thread's CPU time give the call's CPU time beside its wall time: a call of
    0.4 ms whose thread ran 0.1 ms of it waited 0.3 ms."""
    stamps = []
    for number in range(11):
        start, cpu = number * 0.1, number * 0.01
        stamps += [["arrive", start, cpu], ["dev0", start + 0.001, cpu + 0.001], ["dev1", start + 0.0014, cpu + 0.0011],
                   ["deliver", start + 0.003, cpu + 0.002]]
    folder = tmp_path / "stamps"
    folder.mkdir()
    (folder / "stamps_1.jsonl").write_text("".join(json.dumps(stamp) + "\n" for stamp in stamps))
    text = analyze(folder, tmp_path, isolation_ms=15)
    rows = {row["stamp"]: row for row in json.loads((tmp_path / "handoffs.json").read_text())["stamps"]}
    assert rows["dev1"]["step_ms"] == pytest.approx(0.4) and rows["dev1"]["call_cpu_ms"] == pytest.approx(0.1)
    assert rows["deliver"]["call_cpu_ms"] is None and rows["dev0"]["call_cpu_ms"] is None
    assert "call cpu" in text


def test_the_hook_wraps_every_traced_function_of_the_package_as_it_is(tmp_path):
    """With ``CLIP_FLASH_TRACE_DIR`` set, importing each traced module wraps its functions: a target renamed in the
    package would make that import fail in a traced server. Every wrapped function stamps (``__wrapped__``)."""
    root = Path(__file__).resolve().parents[2]
    hook = root / "benchmarks" / "serve" / "handoff_hook"
    script = """
import importlib, sys
import sitecustomize
for name in sitecustomize.TRACED_MODULES:
    importlib.import_module(name)
from clip_flash.graphs.capture import CaptureSpace
from clip_flash.ops import image_resample
from clip_flash.ops.host_gate import HostGate
from clip_flash.inputs.image import native_batch
wrapped = [CaptureSpace.replay, HostGate.wait, image_resample.BatchPlan.allocate_host, image_resample._packed_rows,
           native_batch.plan_batch, native_batch.plan_dct_batch]
missing = [function for function in wrapped if not hasattr(function, "__wrapped__")]
assert not missing, missing
print("wrapped", len(sitecustomize.TRACED_MODULES))
"""
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hook), str(root)]),
                       CLIP_FLASH_TRACE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().startswith("wrapped ")
