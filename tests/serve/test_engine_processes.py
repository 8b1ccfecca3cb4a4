"""One engine process per GPU (``--devices 0,1``), the frontend's side: requests routed whole to the ready engine
with the fewest outstanding, the engines' state and queue depths as one, their /metrics merged into one body.
(Two engine processes need two GPUs: ``tests/serve/test_serve_gpu.py::test_one_engine_process_per_gpu``.)"""
from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("prometheus_client", reason="the serve extra is not installed: pip install 'clip_flash[serve]'")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from clip_flash.serve import engine_hosts  # noqa: E402
from clip_flash.serve.config import ServeConfig  # noqa: E402
from clip_flash.serve.metrics import ServeMetrics, merge_expositions  # noqa: E402
from clip_flash.serve.remote_pool import RemotePools  # noqa: E402


def _values(body: bytes):
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(body.decode()) for sample in family.samples}


def test_merged_metrics_are_the_engines_summed():
    first, second = ServeMetrics(lambda tower: 3), ServeMetrics(lambda tower: 4)
    first.answered("/v1/embeddings", 200, 0.01, 0.001)
    second.answered("/v1/embeddings", 200, 0.02, 0.002)
    second.answered("/v1/embeddings", 429)
    first.batch("image", 8, 0.004)
    second.batch("image", 16, 0.005)
    bodies = [first.render(), second.render()]
    merged, parts = _values(merge_expositions(bodies)), [_values(body) for body in bodies]
    assert set(merged) == set(parts[0]) | set(parts[1])
    for key, value in merged.items():
        expected = [part[key] for part in parts if key in part]
        assert value == (min(expected) if key[0].endswith("_created") else sum(expected)), key
    route = (("route", "/v1/embeddings"), ("status", "200"))
    assert merged[("clip_flash_requests_total", route)] == 2
    assert merged[("clip_flash_queue_depth", (("tower", "image"),))] == 7
    assert merged[("clip_flash_batch_size_count", (("tower", "image"),))] == 2


class _Engine:
    """What RemotePools reads of a RemotePool."""

    def __init__(self, name: str, state: str = "ready", outstanding: int = 0, depth: int = 0) -> None:
        self.description, self.state, self.outstanding, self.depth = name, state, outstanding, depth
        self.error = "it failed" if state == "failed" else None
        self.metrics = ServeMetrics(lambda tower: depth)
        self.submitted = []

    def queue_depth(self, tower: str) -> int:
        return self.depth

    def submit(self, job, images, texts):
        self.submitted.append(job)
        self.outstanding += 1
        return self

    async def engine_metrics(self) -> bytes:
        return self.metrics.render()


def test_requests_go_to_the_ready_engine_with_fewest_outstanding():
    busy, idle, loading = _Engine("a", outstanding=5), _Engine("b", outstanding=1), _Engine("c", state="loading")
    pools = RemotePools([busy, idle, loading])
    for job in range(6):
        pools.submit(job, [], [])
    # 1, 2, 3, 4 outstanding on the idle one; at 5 and 5 the tie goes by turn; then the idle one again
    assert idle.submitted == [0, 1, 2, 3, 5] and busy.submitted == [4] and not loading.submitted
    assert pools.state == "loading"  # as one process's EnginePool: ready once every engine is
    loading.state = "ready"
    assert pools.state == "ready"
    assert pools.metrics is busy.metrics  # the frontend's own counts travel with one engine only


def test_engines_equally_free_take_requests_in_turn():
    first, second = _Engine("a"), _Engine("b")
    pools = RemotePools([first, second])
    for job in range(4):
        pools.submit(job, [], [])
        first.outstanding = second.outstanding = 0  # each answered before the next arrives
    assert first.submitted == [0, 2] and second.submitted == [1, 3]


def test_state_depth_and_description_are_the_engines_together():
    pools = RemotePools([_Engine("ViT on cuda:0", depth=2), _Engine("ViT on cuda:1", depth=5)])
    assert pools.queue_depth("image") == 7
    assert pools.description == "ViT on cuda:0; ViT on cuda:1"
    merged = _values(asyncio.run(pools.engine_metrics()))
    assert merged[("clip_flash_queue_depth", (("tower", "text"),))] == 7
    failed = RemotePools([_Engine("a"), _Engine("b", state="failed")])
    assert failed.state == "failed" and failed.error == "it failed"


def test_no_ready_engine_leaves_the_request_to_the_first_to_refuse():
    first, second = _Engine("a", state="loading"), _Engine("b", state="loading")
    RemotePools([first, second]).submit("job", [], [])
    assert first.submitted == ["job"] and not second.submitted


def test_an_engine_already_gone_leaves_the_frontend_running_and_saying_why(tmp_path):
    """A frontend that starts after its engine process exited (a model that failed to load) starts anyway, its
    pool failed with the reason: the server then stops with the engine's own reason, with no traceback."""
    from clip_flash.serve.jobs import NotReady
    from clip_flash.serve.remote_pool import RemotePool

    async def connect_then_ask():
        pool = RemotePool(str(tmp_path / "engine-0.sock"))  # no engine listens there
        await pool.connect()
        await pool.refresh_state()  # answered at once: nothing waits on an engine that is not there
        with pytest.raises(NotReady) as refused:
            pool.submit("job", [], [])
        await pool.disconnect()
        return pool, str(refused.value)

    pool, reason = asyncio.run(connect_then_ask())
    assert pool.state == "failed" and "not reachable" in pool.error and reason == pool.error
    assert not pool._replies


class _Process:
    def __init__(self, name: str, exitcode=None) -> None:
        self.name, self.exitcode = name, exitcode

    def is_alive(self) -> bool:
        return self.exitcode is None


def test_engine_processes_gone_are_named_with_their_reason_else_their_exit_code():
    """What the server's last line says: the reason an engine process sent (its model could not load), else its
    exit code (killed, or ended without a word); an engine still running says nothing."""
    import multiprocessing

    from clip_flash.serve.engine_hosts import EngineProcesses

    pipes = [multiprocessing.Pipe(duplex=False) for _ in range(4)]
    pipes[0][1].send("the model could not be loaded on cuda:0: cannot build it")
    pipes[2][1].close()  # ended without sending
    engines = object.__new__(EngineProcesses)
    engines.processes = [_Process("clip_flash-engine-0", 1), _Process("clip_flash-engine-1", -9),
                         _Process("clip_flash-engine-2", 1), _Process("clip_flash-engine-3")]
    engines._reasons, engines._ended = [receiver for receiver, _ in pipes], {}
    said = ("the model could not be loaded on cuda:0: cannot build it; "
            "engine process clip_flash-engine-1 exited with code -9 (see its log); "
            "engine process clip_flash-engine-2 exited with code 1 (see its log)")
    assert engines.failed == said
    assert engines.failed == said  # asked again (the server asks every 0.5 s): a reason read once is kept
    engines.processes = engines.processes[3:]
    assert engines.failed is None


def test_engine_processes_share_the_queue_and_the_cores(monkeypatch):
    started = []
    monkeypatch.setattr(engine_hosts, "EngineProcesses", lambda configs, directory: started.append(configs))
    monkeypatch.setattr(engine_hosts, "usable_cores", lambda: 32)
    engine_hosts.start_engines(ServeConfig(devices=(0, 1), max_queue=101), "unused")
    assert [(c.devices, c.max_queue, c.decode_workers) for c in started[-1]] == [((0,), 51, 16), ((1,), 51, 16)]
    engine_hosts.start_engines(ServeConfig(devices=(0, 1, 2), decode_workers=5), "unused")
    assert [c.decode_workers for c in started[-1]] == [5, 5, 5]  # given: each engine's own


def test_two_engine_processes_answer_as_stock(tmp_path):
    """Two engine processes (on the CPU here; one per GPU with ``--devices``) behind one frontend's routes: the
    requests alternate between them, every answer is stock's, and stopping them exits cleanly."""
    from starlette.testclient import TestClient

    from clip_flash.serve.app import build_app
    from clip_flash.serve.config import ServeConfig
    from clip_flash.serve.engine_hosts import EngineProcesses
    from clip_flash.serve.remote_pool import RemotePool
    from tests.serve.contract import CAPTIONS, StockReference, vectors
    from tests.serve.server_process import data_uri, jpeg_bytes

    config = ServeConfig(device="cpu", max_batch=8, max_text_batch=16)
    engines = EngineProcesses([config, config], str(tmp_path))
    try:
        pools = RemotePools([RemotePool(path) for path in engines.paths])
        reference = StockReference("ViT-B-32", "cpu", "fp32")
        photo = jpeg_bytes(3)
        with TestClient(build_app(config, pools)) as client:
            for _ in range(600):
                if client.get("/ready").status_code == 200:
                    break
                asyncio.run(asyncio.sleep(0.2))
            assert client.get("/ready").status_code == 200, engines.failed
            for _ in range(4):
                body = client.post("/v1/embeddings", json={"model": "ViT-B-32",
                                                           "input": CAPTIONS + [data_uri(photo)]}).json()
                got = vectors(body)
                assert abs(got[:-1] - reference.texts(CAPTIONS)).max() < 2e-5
                assert abs(got[-1] - reference.images([photo])[0]).max() < 2e-5
            batches = _values(client.get("/metrics").content)
            assert batches[("clip_flash_batch_size_count", (("tower", "text"),))] >= 4
            per_engine = [_values(asyncio.run(_metrics_of(path))) for path in engines.paths]
            assert all(values[("clip_flash_batch_size_count", (("tower", "text"),))] >= 2 for values in per_engine)
        assert engines.failed is None
    finally:
        engines.stop()
    assert [process.exitcode for process in engines.processes] == [0, 0]


async def _metrics_of(path: str) -> bytes:
    from clip_flash.serve.remote_pool import RemotePool

    pool = RemotePool(path)
    await pool.connect()
    try:
        return await pool.engine_metrics()
    finally:
        await pool.disconnect()


def test_a_server_of_two_engine_processes_starts_answers_and_stops():
    """The whole server as ``--devices 0,1`` runs it (two engine processes, two frontends; on the CPU here): ready
    once both engines are, answers through either frontend, and SIGTERM exits 0."""
    import httpx

    from tests.serve.contract import CAPTIONS, vectors
    from tests.serve.server_process import ServerProcess

    process = ServerProcess(["--device", "cpu", "--workers", "2", "--max-batch", "8", "--max-text-batch", "16"],
                            module="tests.serve.two_cpu_engines")
    try:
        process.wait_ready(timeout=240)
        # Each frontend polls the engines' state every 0.25 s: the other frontend may say ready a moment later.
        deadline = time.monotonic() + 10
        ready = httpx.get(process.url + "/ready", timeout=30)
        while ready.status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
            ready = httpx.get(process.url + "/ready", timeout=30)
        assert ready.json()["engine"].count("on cpu") == 2, ready.json()
        answers = [vectors(httpx.post(process.url + "/v1/embeddings", json={"model": "ViT-B-32", "input": CAPTIONS},
                                      timeout=60).json()) for _ in range(4)]
        assert all(abs(answer - answers[0]).max() < 1e-6 for answer in answers)
    finally:
        assert process.stop(timeout=60) == 0


def test_an_engine_process_that_cannot_load_stops_the_server_with_its_reason(tmp_path):
    import subprocess
    import sys

    from tests.serve.server_process import ROOT, free_port

    checkpoint = tmp_path / "not_a_checkpoint.pt"
    checkpoint.write_text("not a checkpoint")
    done = subprocess.run([sys.executable, "-m", "tests.serve.two_cpu_engines", "--model", f"ViT-B-32::{checkpoint}",
                           "--device", "cpu", "--workers", "2", "--port", str(free_port())], cwd=ROOT,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 1
    assert "cannot build" in done.stderr and "the model could not be loaded" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr  # the frontends stop quietly: the reason is the engine's
    last = done.stderr.strip().splitlines()[-1]
    assert "the server stops: the model could not be loaded on cpu: " in last and "cannot build" in last, last
