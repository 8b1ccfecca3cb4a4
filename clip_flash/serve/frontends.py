"""``--workers N``: N HTTP frontend processes in front of one engine process, never one model copy per frontend.

One Python process's HTTP work (parsing, routing, JSON encoding, the event loop's per-request steps) caps the
small requests it answers whether or not there is a model behind it, so past that rate the HTTP work is spread
over processes while the model stays in one per GPU: this process serves its engine on a Unix socket
(``engine_server.py``), or with ``--devices 0,1`` starts one engine process per GPU, each on its own socket
(``engine_hosts.py``); each frontend (spawned, accepting on one listening socket this process opened and handed
to them, so the kernel spreads connections) runs the same routes over a ``RemotePool`` (``remote_pool.py``) that
forwards each request's inputs through a socket and gets their embeddings back.
An engine process's GIL is then the one serial resource, so whatever is per request moves to the frontends
(tokenizing captions, scattering results into requests, aggregating metrics) and the engine process works
per frame and per batch. The messages are in ``wire.py``.

SIGTERM (or Ctrl-C) here: the frontends stop accepting and answer what they accepted, then the engines stop.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import tempfile
import threading
from typing import List

from .config import ServeConfig
from .engine_hosts import start_engines
from .remote_pool import RemotePool, RemotePools

logger = logging.getLogger(__name__)


def _frontend_main(config: ServeConfig, paths: List[str], listener: socket.socket) -> None:
    """One frontend process: uvicorn on the shared listening socket, the routes over a RemotePool (one per engine
    process)."""
    import uvicorn

    from .app import build_app
    from .cli import configure_logging, uvicorn_config

    configure_logging(config.log_level)
    from .engine import freeze_loaded_objects

    preloaded = None
    if config.inputs == "fast":
        # The tokenizer the engine will name (its model's), loaded while the engine loads the model: loaded later,
        # OpenCLIP's import would stall this process's requests for seconds, and its objects would sit in every
        # full collection.
        from clip_flash.inputs.text.tokenizer import get_tokenizer
        from clip_flash.models import parse_model_spec

        name = parse_model_spec(config.model).name
        try:
            preloaded = (name, get_tokenizer(name))
        except Exception:  # noqa: BLE001 - loaded once the engine names it, or the engine tokenizes
            logger.warning("could not load the %s tokenizer at start", name, exc_info=True)
    pools = [RemotePool(path, preloaded) for path in paths]
    app = build_app(config, pools[0] if len(pools) == 1 else RemotePools(pools))
    server = uvicorn.Server(uvicorn_config(app, config))
    freeze_loaded_objects()  # the imported libraries stay out of every full collection (see there)
    server.run(sockets=[listener])


def serve_with_frontends(config: ServeConfig) -> int:
    """This process: the engines and their sockets; ``config.workers`` frontend processes; SIGTERM stops all."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    # Listening first: connections made while engine processes start wait in the backlog instead of failing.
    listener = socket.socket(socket.AF_INET6 if ":" in config.host else socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((config.host, config.port))
    listener.listen(2048)
    listener.set_inheritable(True)
    directory = tempfile.mkdtemp(prefix="clip_flash_serve_")
    engines = start_engines(config, directory)
    context = multiprocessing.get_context("spawn")
    frontends = [context.Process(target=_frontend_main, args=(config, engines.paths, listener),
                                 name=f"clip_flash-http-{n}") for n in range(config.workers)]
    for process in frontends:
        process.start()
    logger.info("%d HTTP frontends on http://%s:%d; loading the model", config.workers, config.host, config.port)
    engines.load()
    while not stop.wait(0.5):
        if engines.failed is not None or not any(process.is_alive() for process in frontends):
            break
    for process in frontends:  # they stop accepting and answer what they accepted
        if process.is_alive():
            os.kill(process.pid, signal.SIGTERM)
    for process in frontends:
        process.join()
    listener.close()
    failed = engines.failed
    engines.stop()
    for path in engines.paths:
        try:
            os.unlink(path)
        except OSError:
            pass
    try:
        os.rmdir(directory)
    except OSError:
        pass
    if failed is not None:
        logger.error("the server stops: %s", failed)  # a model that could not load, or an engine process gone
        return 1
    if not stop.is_set():
        logger.error("the HTTP frontends exited (exit codes %s)", [process.exitcode for process in frontends])
        return 1
    return 0
