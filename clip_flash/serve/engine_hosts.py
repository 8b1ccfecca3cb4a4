"""Where ``--workers N``'s engines run: in the server's own process (one device), or one process per device
(``--devices 0,1``), each serving its engine on a Unix socket of its own.

An engine process's GIL is the server's one serial resource (the frontends take the per-request work), so a
second GPU's batches in the same process would share it with the first's: one process per GPU keeps each GPU's
batch work on its own GIL. The frontends route each request whole to the engine with the fewest requests
outstanding (``remote_pool.RemotePools``).
"""
from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence

from ..environment import usable_cores
from .config import ServeConfig
from .engine_server import EngineServer

logger = logging.getLogger(__name__)

ENGINE_START_SECONDS = 120.0  # an engine process's socket listening (imports included), before it counts as failed


class InProcessEngines:
    """The engines (one device) in this process, served on one socket."""

    def __init__(self, config: ServeConfig, directory: str) -> None:
        from .engine import EnginePool

        self.pool = EnginePool(config)
        self.paths = [os.path.join(directory, "engine.sock")]
        self.server = EngineServer(self.pool, self.paths[0])
        self.server.start()
        self.loader = threading.Thread(target=self.pool.load, daemon=True, name="clip_flash-load")

    def load(self) -> None:
        self.loader.start()

    @property
    def failed(self) -> Optional[str]:
        """Why the engines cannot serve (None while they can or still load)."""
        return f"the model could not be loaded: {self.pool.error}" if self.pool.state == "failed" else None

    def stop(self) -> None:
        self.server.stop()
        self.loader.join()  # a model still loading is not torn down under the loading thread
        self.pool.close()


def _engine_main(config: ServeConfig, path: str, listening: "multiprocessing.synchronize.Event",
                 reason: "multiprocessing.connection.Connection") -> None:
    """One engine process: one device's engine on its socket, until SIGTERM (Ctrl-C reaches the whole process
    group: the server stops its frontends first, then sends SIGTERM here). A model that cannot load ends it, its
    reason sent on ``reason`` for the server's last line."""
    from .cli import configure_logging
    from .engine import EnginePool

    parent = os.getppid()
    configure_logging(config.log_level)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    pool = EnginePool(config)
    server = EngineServer(pool, path)
    server.start()
    listening.set()
    pool.load()
    if pool.state == "failed":
        why = f"the model could not be loaded on {config.device_names()[0] or 'the default device'}: {pool.error}"
        logger.error("%s", why)
        reason.send(why)
    while pool.state != "failed" and not stop.wait(0.5):
        if os.getppid() != parent:  # the server was killed outright: nothing will send SIGTERM
            break
    server.stop()
    pool.close()
    sys.exit(1 if pool.state == "failed" else 0)


class EngineProcesses:
    """One engine process per config (per device), each on its socket under ``directory``."""

    def __init__(self, configs: Sequence[ServeConfig], directory: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.paths = [os.path.join(directory, f"engine-{number}.sock") for number in range(len(configs))]
        self.processes: List[multiprocessing.process.BaseProcess] = []
        listening = [context.Event() for _ in configs]
        pipes = [context.Pipe(duplex=False) for _ in configs]
        self._reasons = [receiver for receiver, _ in pipes]  # why each engine process ended, where it said
        self._ended: Dict[int, str] = {}
        for number, (config, path) in enumerate(zip(configs, self.paths)):
            process = context.Process(target=_engine_main, args=(config, path, listening[number], pipes[number][1]),
                                      name=f"clip_flash-engine-{number}")
            process.start()  # all at once: each spends its start importing
            pipes[number][1].close()  # the engine's end is the engine's
            self.processes.append(process)
        deadline = time.monotonic() + ENGINE_START_SECONDS
        for number, (process, event) in enumerate(zip(self.processes, listening)):
            while not event.wait(0.2) and process.is_alive():  # the frontends connect once every socket listens
                if time.monotonic() > deadline:
                    process.kill()  # reported by ``failed``
                    self._ended[number] = (f"engine process {process.name} was not listening "
                                           f"{ENGINE_START_SECONDS:.0f} s after it started")
                    break

    def load(self) -> None:
        pass  # each engine process loads its model as it starts

    @property
    def failed(self) -> Optional[str]:
        gone = [self._why_ended(number) for number, process in enumerate(self.processes) if not process.is_alive()]
        return "; ".join(dict.fromkeys(gone)) if gone else None  # engines that failed alike, said once

    def _why_ended(self, number: int) -> str:
        """The reason the engine process sent, else its exit code."""
        if number not in self._ended:
            process, reason = self.processes[number], None
            try:
                if self._reasons[number].poll():
                    reason = self._reasons[number].recv()
            except (EOFError, OSError):  # it ended without saying why
                pass
            self._ended[number] = reason or f"engine process {process.name} exited with code {process.exitcode} " \
                                            "(see its log)"
        return self._ended[number]

    def stop(self) -> None:
        for process in self.processes:
            if process.is_alive():
                os.kill(process.pid, signal.SIGTERM)
        for process in self.processes:
            process.join()


def start_engines(config: ServeConfig, directory: str):
    """The server's engines, serving on sockets under ``directory`` (their paths: ``.paths``)."""
    if len(config.devices) > 1:  # --max-queue and the host's cores shared out between them
        count = len(config.devices)
        share = -(-config.max_queue // count)
        # Each preparer would start a decoding thread per core, twice as many threads as cores between two
        # engines. On two H100s at 3,600 one-JPEG requests/s, 16 threads each: p99 48.6 ms, the load generator
        # 1.7 ms late at p99; a thread per core each: 107.2 ms and 15.1 ms (one run each,
        # benchmarks/results/h100x2/serve_rates_912c3c9/two_dw16 and two).
        decoders = config.decode_workers or max(1, usable_cores() // count)
        return EngineProcesses([dataclasses.replace(config, devices=(index,), max_queue=share,
                                                    decode_workers=decoders)
                                for index in config.devices], directory)
    return InProcessEngines(config, directory)
