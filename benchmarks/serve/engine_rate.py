"""The engine process alone behind its Unix socket: the rate of requests it carries and its CPU time per
request, with no HTTP in front (``--workers N``'s engine side; the HTTP frontends' cost is another matter).

    python -m benchmarks.serve.engine_rate --rate 5000 --seconds 5 [--workload caption|captions64|image]
        [--connections 2]

``caption`` and ``image`` send one input a request, ``captions64`` 64 captions a request (a request counts as
answered when its last row is back). Each image request carries a 60 kB body of its own (``--image-payloads``
distinct objects cycled through), as HTTP bodies are.

This process runs the real ``EngineServer`` and ``EnginePool`` over the no-op model of ``overhead_server`` (no
model, no image decoding); a driver process speaks the frontends' wire protocol (``clip_flash/serve/wire.py``)
over ``--connections`` connections, sending each connection's due requests once a millisecond in one frame (as
a frontend's event-loop pass does) with captions tokenized ahead of time, and reads the per-batch results. The
engine process's CPU seconds per answered request bound from above the GIL time it needs per request, which one
process can spend at most once per second, whatever the host's core count; its socket thread's alone (reading
the frames, queueing the requests, sending the results) are reported beside them.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import pickle
import sys
import tempfile
import time
from typing import Any, Dict, List, Sequence


async def read_frame(reader: asyncio.StreamReader) -> List[Any]:
    """The next frame's messages through an asyncio ``StreamReader`` (the plain way: the driver's reading is not
    what is measured here; ``bench_wire.py`` sets it beside ``wire.FrameProtocol``)."""
    from clip_flash.serve.wire import HEADER

    header = await reader.readexactly(HEADER.size)
    return pickle.loads(await reader.readexactly(HEADER.unpack(header)[0]))


def _thread_cpu_seconds(native_id: int) -> float:
    """User + system CPU seconds of one of this process's threads so far (``sample_threads``' reading of /proc)."""
    from benchmarks.serve.sample_threads import thread_ticks

    return thread_ticks(os.getpid())[native_id][1] / os.sysconf("SC_CLK_TCK")


def _drive(path: str, rate: float, seconds: float, warmup: float, workload: str, connections: int,
           image_payloads: int, started: Any, ended: Any, out: Any) -> None:
    sys.path.insert(0, os.getcwd())
    from clip_flash.inputs.text.tokenizer import get_tokenizer
    from clip_flash.serve.wire import frame, token_bytes

    from benchmarks.serve.workloads import CAPTIONS_PER_BATCH, request_captions

    captions = request_captions(2000)
    payloads = token_bytes(get_tokenizer("ViT-B-32")(captions, context_length=77))
    # The no-op image tower counts bytes, never decodes them. One object per request, as request bodies are:
    # pickle writes an object met twice in a frame once, so one shared object would cross the socket once per
    # frame instead of once per request.
    images = [bytes([number % 251]) * 60_000 for number in range(image_payloads)]
    per_request = CAPTIONS_PER_BATCH if workload == "captions64" else 1

    async def connection(number: int, stats: Dict[str, Any]) -> None:
        reader, writer = await asyncio.open_unix_connection(path)
        sent: Dict[int, float] = {}
        rows_left: Dict[int, int] = {}
        next_id = 0
        per_connection = rate / connections

        async def read() -> None:
            while True:
                for message in await read_frame(reader):
                    if message[0] != "results":
                        stats["refused"] += 1
                        sent.pop(message[1], None)
                        continue
                    now = time.perf_counter()
                    for request_id in list(message[1]) + [error[0] for error in message[6]]:
                        left = rows_left.get(request_id, 1) - 1
                        if left:
                            rows_left[request_id] = left
                            continue
                        rows_left.pop(request_id, None)
                        begun = sent.pop(request_id, None)
                        if begun is not None and stats["measuring"]:
                            stats["answered"] += 1
                            stats["latencies"].append(now - begun)

        reading = asyncio.ensure_future(read())
        start = time.perf_counter()
        while time.perf_counter() - start < warmup + seconds:
            due = int((time.perf_counter() - start) * per_connection) - next_id
            if due > 0:
                requests: List[Any] = []
                now = time.perf_counter()
                for _ in range(due):
                    if workload != "image":
                        first = next_id * per_request
                        requests.append((next_id, 30.0, ([], []), (list(range(per_request)),
                                         [payloads[(first + index) % len(payloads)] for index in range(per_request)]),
                                         True))
                        rows_left[next_id] = per_request
                    else:
                        requests.append((next_id, 30.0, ([0], [images[next_id % image_payloads]]), ([], []), True))
                    sent[next_id] = now
                    next_id += 1
                writer.write(frame([("embed", requests)]))
                if stats["measuring"]:
                    stats["sent"] += due
            await asyncio.sleep(0.001)
        await asyncio.sleep(1.0)  # the last answers
        reading.cancel()
        writer.close()

    async def main() -> Dict[str, Any]:
        stats = {"sent": 0, "answered": 0, "refused": 0, "latencies": [], "measuring": False}

        async def window() -> None:
            await asyncio.sleep(warmup)
            stats["measuring"] = True
            started.set()
            await asyncio.sleep(seconds)
            stats["measuring"] = False
            ended.set()

        await asyncio.gather(window(), *(connection(n, stats) for n in range(connections)))
        return stats

    stats = asyncio.run(main())
    latencies = sorted(stats.pop("latencies")) or [float("nan")]
    stats.pop("measuring")
    stats["p50_ms"] = 1e3 * latencies[len(latencies) // 2]
    stats["p99_ms"] = 1e3 * latencies[int(len(latencies) * 0.99)]
    out.put(stats)


def main(argv: Sequence[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=5000, help="requests/s offered (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--workload", choices=("caption", "captions64", "image"), default="caption")
    parser.add_argument("--connections", type=int, default=2, help="frontends simulated (default: %(default)s)")
    parser.add_argument("--max-wait-ms", type=float, default=2.0)
    parser.add_argument("--image-payloads", type=int, default=512,
                        help="distinct 60 kB image bodies the image workload cycles through (1: one object shared by "
                             "every request, which a frame carries once) (default: %(default)s)")
    parser.add_argument("--json", help="append this run (with the environment: host, versions, revision, command) "
                                       "to a JSON list in this file")
    args = parser.parse_args(argv)
    if args.image_payloads < 1:
        parser.error("--image-payloads must be at least 1")

    from clip_flash.serve.config import ServeConfig
    from clip_flash.serve.engine import EnginePool
    from clip_flash.serve.engine_server import EngineServer

    from benchmarks.serve.overhead_server import install
    from benchmarks.serve.server_metrics import Scrape, curve_means, parse

    install(768)
    config = ServeConfig(model="ViT-B-32", device="cpu", workers=args.connections, max_wait_ms=args.max_wait_ms)
    pool = EnginePool(config)
    pool.load()
    directory = tempfile.mkdtemp(prefix="clip_flash_engine_rate_")
    path = os.path.join(directory, "engine.sock")
    server = EngineServer(pool, path)
    server.start()
    context = multiprocessing.get_context("spawn")
    started, ended, out = context.Event(), context.Event(), context.Queue()
    driver = context.Process(target=_drive, args=(path, args.rate, args.seconds, args.warmup, args.workload,
                                                  args.connections, args.image_payloads, started, ended, out))
    driver.start()
    started.wait()
    socket_thread = server.thread.native_id
    cpu_before, wall_before = time.process_time(), time.perf_counter()
    socket_before = _thread_cpu_seconds(socket_thread)
    ended.wait()
    cpu, wall = time.process_time() - cpu_before, time.perf_counter() - wall_before
    socket_cpu = _thread_cpu_seconds(socket_thread) - socket_before
    stats = out.get()
    driver.join()
    server.stop()
    # Over the whole run, warm-up included (no earlier read: everything the engine batched).
    means = curve_means(Scrape({}, {}), parse(pool.metrics.render().decode()))
    pool.close()
    os.unlink(path)
    os.rmdir(directory)
    answered = max(stats["answered"], 1)
    stats.update(workload=args.workload, image_payloads=args.image_payloads, offered_rps=args.rate,
                 achieved_rps=round(stats["answered"] / wall, 1),
                 engine_cpu_us_per_request=round(1e6 * cpu / answered, 1),
                 socket_thread_cpu_us_per_request=round(1e6 * socket_cpu / answered, 1),
                 mean_batch={tower: round(tower_means["mean batch"], 2) for tower, tower_means in means.items()
                             if "mean batch" in tower_means},
                 engine_cpu_cores=round(cpu / wall, 2))
    print(json.dumps(stats))
    if args.json:
        import shlex

        import torch

        from benchmarks.harness.results import environment_record

        command = "python -m benchmarks.serve.engine_rate " + shlex.join(argv if argv is not None else sys.argv[1:])
        runs = json.loads(open(args.json).read()) if os.path.exists(args.json) else []
        runs.append({**environment_record(torch.device("cpu"), command), "cpu_cores": len(os.sched_getaffinity(0)),
                     "load_average_after": os.getloadavg()[0], **stats})
        with open(args.json, "w") as handle:
            handle.write(json.dumps(runs, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
