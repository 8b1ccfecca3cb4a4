#!/usr/bin/env python
"""The CPU a connection's reading thread spends per request on the frontends' wire protocol: frames of one-JPEG
requests (``("embed", [...])`` as a frontend sends them) read by ``wire.FrameProtocol`` against the same frames
read through an asyncio ``StreamReader`` and ``pickle.loads`` (what the engine did before).

A writer thread sends ``--frames`` frames of ``--per-frame`` requests, each request a photo file's bytes of its own
(cycled from ``--photos``), over a Unix socket pair as fast as the reader takes them; the reader runs a uvloop
event loop (the server's, where installed) on the main thread. Reported per way and round (the ways alternate):
the reading thread's CPU time (``time.thread_time``) and the wall time per request.

    python benchmarks/serve/bench_wire.py --photos DIR --rounds 3 --json out.json --markdown out.md
"""
from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.harness.results import write_microbenchmark  # noqa: E402
from benchmarks.serve.engine_rate import read_frame  # noqa: E402
from clip_flash.serve.engine_server import new_event_loop  # noqa: E402
from clip_flash.serve.wire import FrameProtocol, frame  # noqa: E402


async def read_with_stream_reader(sock: socket.socket) -> int:
    """Requests read through a StreamReader: a header, then the frame by ``readexactly``, then ``pickle.loads``."""
    reader, _ = await asyncio.open_unix_connection(sock=sock)
    requests = 0
    try:
        while True:
            for message in await read_frame(reader):
                requests += len(message[1])
    except asyncio.IncompleteReadError:
        return requests


async def read_with_frame_protocol(sock: socket.socket) -> int:
    """Requests read by ``wire.FrameProtocol``."""
    loop = asyncio.get_running_loop()
    ended = loop.create_future()
    counted = [0]

    class Counting(FrameProtocol):
        def messages_received(self, messages: List[Any]) -> None:
            for message in messages:
                counted[0] += len(message[1])

        def connection_lost(self, exc: Any) -> None:
            ended.set_result(None)

    await loop.create_unix_connection(Counting, sock=sock)
    await ended
    return counted[0]


WAYS: Dict[str, Callable[[socket.socket], Any]] = {"StreamReader + pickle.loads": read_with_stream_reader,
                                                   "wire.FrameProtocol": read_with_frame_protocol}


def one_pass(way: str, frames: List[bytes]) -> Dict[str, float]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

    def send() -> None:
        for data in frames:
            theirs.sendall(data)
        theirs.close()

    writer = threading.Thread(target=send)
    loop = new_event_loop()  # uvloop where installed, as the server's
    cpu, wall = time.thread_time(), time.perf_counter()
    writer.start()
    requests = loop.run_until_complete(WAYS[way](ours))
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    writer.join()
    loop.close()
    return {"requests": requests, "cpu_us_per_request": cpu / requests * 1e6,
            "wall_us_per_request": wall / requests * 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=Path, required=True, help="a folder of JPEG files (the request bodies)")
    parser.add_argument("--frames", type=int, default=3000)
    parser.add_argument("--per-frame", type=int, default=8, help="requests a frame (one frontend event-loop pass)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    photos = [path.read_bytes() for path in sorted(args.photos.glob("*.jpg"))]
    if not photos:
        parser.error(f"no .jpg files in {args.photos}")
    frames, number = [], 0
    for _ in range(args.frames):
        requests = []
        for _ in range(args.per_frame):  # a body of its own per request, as HTTP bodies are
            requests.append((number, 30.0, ([0], [bytes(photos[number % len(photos)])]), ([], []), True))
            number += 1
        frames.append(frame([("embed", requests)]))
    rows: List[Dict[str, Any]] = []
    for round_ in range(args.rounds):
        for way in (WAYS if round_ % 2 == 0 else list(reversed(WAYS))):
            result = one_pass(way, frames)
            rows.append({"round": round_ + 1, "way": way, **result})
            print(f"round {round_ + 1} {way}: {result['cpu_us_per_request']:.1f} us of the reader's CPU a request, "
                  f"{result['wall_us_per_request']:.1f} us wall", flush=True)
    lines = ["| way | reader CPU us a request (rounds) | median | wall us a request (median) |", "|---|---|---|---|"]
    for way in WAYS:
        cpu = [row["cpu_us_per_request"] for row in rows if row["way"] == way]
        wall = [row["wall_us_per_request"] for row in rows if row["way"] == way]
        lines.append(f"| {way} | {' / '.join(f'{value:.1f}' for value in cpu)} | {statistics.median(cpu):.1f} | "
                     f"{statistics.median(wall):.1f} |")
    mean_kb = statistics.mean(len(photo) for photo in photos) / 1e3
    write_microbenchmark(
        args.json, args.markdown,
        f"The wire protocol's reading side: {args.frames} frames of {args.per_frame} one-JPEG requests ({len(photos)} "
        f"photos, {mean_kb:.1f} kB on average, a bytes object of its own per request) over a Unix socket pair, read "
        f"on a uvloop event loop; the ways alternate, {args.rounds} rounds.", lines, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
