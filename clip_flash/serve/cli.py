"""``clip-flash serve`` / ``python -m clip_flash.serve``: the command line of the embedding server.

    clip-flash serve --model ViT-L-14::laion2b_s32b_b82k --port 8000
    clip-flash serve                      # ViT-B-32, random-init weights, on whatever device is here

``add_arguments(parser)`` fills a parser (the ``clip-flash`` command's ``serve`` subcommand uses it);
``run(args)`` serves until SIGTERM or Ctrl-C and returns the exit status.
"""
from __future__ import annotations

import argparse
import logging
import sys
from typing import List, Optional, Sequence

from .config import DEFAULT_MODEL, TEXT_GROUPINGS, ServeConfig

logger = logging.getLogger("clip_flash.serve")

# What `clip-flash serve --help` opens with.
DESCRIPTION = """An OpenAI-compatible CLIP embedding server: captions and images to embeddings, batched across requests.

    clip-flash serve --model ViT-L-14::laion2b_s32b_b82k --port 8000
    clip-flash serve                      # ViT-B-32, random-init weights, on whatever device is here

Routes: POST /v1/embeddings (OpenAI's shape; an image as a data:image/... URI), POST /v1/embeddings/image (raw
image bytes or multipart files), GET /health, /ready, /v1/models, /metrics. Stops on SIGTERM or Ctrl-C after
answering every request it accepted. Needs the serve extra: pip install -e ".[serve]" in a checkout."""

# The `serve` extra's packages (pyproject.toml) the server imports, checked before it starts.
SERVE_EXTRA = ("uvicorn", "starlette", "orjson", "prometheus_client")


def missing_serve_packages() -> List[str]:
    """The `serve` extra's packages this environment lacks."""
    import importlib.util

    return [name for name in SERVE_EXTRA if importlib.util.find_spec(name) is None]


def _devices(text: str):
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--devices takes CUDA device indices like 0,1; got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The server's options (see ``ServeConfig`` for what each one does)."""
    defaults = ServeConfig()
    add = parser.add_argument
    add("--model", default=DEFAULT_MODEL,
        help="OpenCLIP model: NAME (random-init weights), NAME::TAG or NAME::/path/ckpt (default: %(default)s, "
             "random init)")
    add("--served-name", default=None, help="the model name clients send (default: --model as written)")
    add("--host", default=defaults.host, help="address to listen on (default: %(default)s)")
    add("--port", type=int, default=defaults.port, help="port (default: %(default)s)")
    add("--device", default=None, help="cuda, cuda:N or cpu (default: CUDA if there is one)")
    add("--devices", type=_devices, default=(), help="CUDA devices, one engine each: e.g. 0,1")
    add("--precision", choices=("fp32", "fp16", "bf16"), default=None,
        help="model precision (default: fp16 on CUDA, fp32 on the CPU)")
    add("--max-batch", type=int, default=defaults.max_batch,
        help="largest image batch, also the largest CUDA-graph bucket (default: %(default)s)")
    add("--max-text-batch", type=int, default=defaults.max_text_batch,
        help="largest caption batch (default: %(default)s)")
    add("--text-graphs-per-doubling", type=int, default=defaults.text_graphs_per_doubling,
        help="caption batch sizes with a CUDA graph per doubling past 8 (1: powers of two); more pad length groups "
             "less and take longer to capture at start (default: %(default)s)")
    add("--text-grouping", choices=TEXT_GROUPINGS, default=defaults.text_grouping,
        help="encode each caption batch or length group by the cheaper measured graph: packed real tokens or "
             "the padded length bucket (cost-packed; fp16/bf16); padded graphs only, cut where they cost least "
             "(cost) or at every length bucket (buckets) (default: %(default)s)")
    add("--max-wait-ms", type=float, default=defaults.max_wait_ms,
        help="how long a batch's first input waits for more while a batch is in flight; with none in flight it "
             "closes at once (default: %(default)s)")
    add("--wait-when-idle", action="store_true",
        help="wait --max-wait-ms for more inputs even when no batch is in flight (fuller batches, more latency)")
    add("--max-batches-in-flight", type=int, default=defaults.max_batches_in_flight,
        help="per tower, batches on the device or being prepared at most; while that many are, arrivals wait to "
             "join the next batch (0: no limit) (default: %(default)s)")
    add("--max-queue", type=int, default=defaults.max_queue,
        help="inputs waiting, all towers; past it requests get 429 with Retry-After (default: %(default)s)")
    add("--request-timeout", type=float, default=defaults.request_timeout,
        help="seconds; past it a request gets 503 and its queued inputs are dropped (default: %(default)s)")
    add("--max-request-bytes", type=int, default=defaults.max_request_bytes,
        help="larger bodies get 413 (default: %(default)s)")
    add("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every route but /health")
    add("--decode", choices=("cpu", "gpu"), default=defaults.decode,
        help="cpu: exact (OpenCLIP's pixels, bit for bit); gpu: nvJPEG, faster, not exact (default: %(default)s)")
    add("--decode-workers", type=int, default=None,
        help="image decoding threads per engine (default: one per core, shared out between --devices' engines)")
    add("--no-split-jpegs", dest="split_jpegs", action="store_false",
        help="decode each JPEG on one thread even in a batch of one (default: a batch of few JPEGs splits each "
             "one's entropy decode across the decoding threads: the same pixels, sooner)")
    add("--no-early-launch", dest="early_launch", action="store_false",
        help="launch a lone image batch's device work after its decode (default: queued while it decodes, behind a "
             "gate the decode opens: the same rows, sooner)")
    add("--no-patch", dest="patch", action="store_false", help="serve the stock OpenCLIP model (a baseline)")
    add("--no-cuda-graphs", dest="cuda_graphs", action="store_false", help="run every batch eager")
    add("--no-cudnn-attention", dest="cudnn_attention", action="store_false",
        help="turn PyTorch's cuDNN attention off: no per-shape plans to build, so a ViT-L-14 engine loads in "
             "about half the time (an H200 server was ready 12 s sooner), its replays a few percent slower "
             "(default: on)")
    add("--inputs", choices=("fast", "stock"), default=defaults.inputs,
        help="fast: clip_flash's exact image preparer and tokenizer; stock: OpenCLIP's own preprocess and "
             "tokenizer (a baseline) (default: %(default)s)")
    add("--workers", type=int, default=None,
        help="HTTP frontend processes in front of the engine process(es); 1: one process does everything "
             f"(default: one per 4 cores, at most 4 per engine: {defaults.workers} here for one engine)")
    add("--log-level", default=defaults.log_level, choices=("critical", "error", "warning", "info", "debug"),
        help="clip_flash's and uvicorn's; other libraries' records at warning and above, all at debug "
             "(default: %(default)s)")
    return parser


def check_devices(config: ServeConfig) -> None:
    """``ValueError`` (one line, naming the option) when the devices asked for are not here: ``--device cuda``,
    ``--devices 0,1`` or ``--decode gpu`` without CUDA, a CUDA index past this machine's devices, ``--decode
    gpu`` with ``--device cpu``, a device torch cannot parse. Checked before anything starts, so the server
    exits with status 2 and that line, not after uvicorn has started with a traceback."""
    asked = []
    if config.devices:
        asked.append("--devices " + ",".join(str(index) for index in config.devices))
    elif config.device is not None and not config.device.startswith("cuda") and config.decode == "gpu":
        raise ValueError(f"--decode gpu decodes on a CUDA device, but --device {config.device} is not one")
    elif config.device is not None and config.device.startswith("cuda"):
        asked.append(f"--device {config.device}")
    if config.decode == "gpu":
        asked.append("--decode gpu")
    if config.device is not None and not config.devices:
        import torch

        try:
            torch.device(config.device)
        except RuntimeError:
            raise ValueError(f"--device {config.device!r} is not a device: give cuda, cuda:N or cpu") from None
    if not asked:
        return
    import warnings

    import torch

    with warnings.catch_warnings(record=True) as caught:  # e.g. a driver too old: said on the same line
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
        count = torch.cuda.device_count() if available else 0
    if not available:
        why = f": {' '.join(str(caught[0].message).split())}" if caught else ""
        raise ValueError(f"{' and '.join(asked)} asked for, but CUDA is not available here "
                         f"(torch.cuda.is_available() is False{why})")
    indices = list(config.devices)
    if not indices and config.device is not None and config.device.startswith("cuda"):
        index = torch.device(config.device).index
        indices = [index] if index is not None else []
    missing = [index for index in indices if not 0 <= index < count]
    if missing:
        have = f"{count} (0-{count - 1})" if count > 1 else "1 (0)"
        raise ValueError(f"{asked[0]}: no CUDA device {', '.join(map(str, missing))} here; this machine has {have}")


def config_from_args(args: argparse.Namespace) -> ServeConfig:
    return ServeConfig(
        model=args.model, host=args.host, port=args.port, device=args.device, devices=args.devices,
        precision=args.precision, max_batch=args.max_batch, max_text_batch=args.max_text_batch,
        text_graphs_per_doubling=args.text_graphs_per_doubling, text_grouping=args.text_grouping,
        max_wait_ms=args.max_wait_ms, wait_when_idle=args.wait_when_idle,
        max_batches_in_flight=args.max_batches_in_flight, max_queue=args.max_queue,
        request_timeout=args.request_timeout,
        max_request_bytes=args.max_request_bytes, api_key=args.api_key, decode=args.decode, patch=args.patch,
        inputs=args.inputs, cuda_graphs=args.cuda_graphs, cudnn_attention=args.cudnn_attention,
        decode_workers=args.decode_workers,
        split_jpegs=args.split_jpegs, early_launch=args.early_launch, workers=args.workers,
        log_level=args.log_level, served_name=args.served_name)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; 0 after a clean shutdown, 1 when the model cannot be loaded, 2 when the serve
    extra is not installed or the options cannot be served here (``check_devices``)."""
    from clip_flash.models import parse_model_spec

    missing = missing_serve_packages()
    if missing:
        print(f"clip-flash serve needs the serve extra, which lacks {', '.join(missing)} here: "
              'pip install -e ".[serve]" in a checkout of clip_flash', file=sys.stderr)
        return 2

    configure_logging(args.log_level)
    try:
        config = config_from_args(args)
        spec = parse_model_spec(config.model)
        check_devices(config)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if spec.kind == "random":
        logger.warning("serving %s with random-init weights (no checkpoint): embeddings are meaningless; pass "
                       "--model %s::TAG or --model %s::/path/ckpt for real ones", spec.name, spec.name, spec.name)
    if config.workers > 1:
        from .frontends import serve_with_frontends

        return serve_with_frontends(config)
    return serve_in_process(config)


def serve_in_process(config: ServeConfig) -> int:
    """One process: uvicorn's event loop in front, the engine's batcher threads behind it."""
    import uvicorn

    from .app import build_app

    failure = []
    server: Optional[uvicorn.Server] = None

    def on_load_failure(message: str) -> None:
        failure.append(message)
        if server is not None:
            server.should_exit = True

    app = build_app(config, on_load_failure=on_load_failure)
    server = uvicorn.Server(uvicorn_config(app, config))
    server.run()
    if failure:
        print(f"error: the model could not be loaded: {failure[0]}", file=sys.stderr)
        return 1
    return 0


def configure_logging(level: str) -> None:
    """The log of each of the server's processes: clip_flash's records at ``level``, other libraries' at warnings
    and above unless ``level`` is debug. OpenCLIP logs each model and tokenizer load at info on the root logger,
    once a process: three lines an HTTP frontend (24 at the start of eight), saying what the engine's one "engine
    ready" line says. uvicorn's loggers keep their own level (``uvicorn_config``)."""
    level = level.upper()
    others = level if level == "DEBUG" else max(logging.WARNING, logging.getLevelName(level))
    logging.basicConfig(level=others, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("clip_flash").setLevel(level)


def uvicorn_config(app, config: ServeConfig, **overrides):
    """uvicorn with uvloop and httptools where installed (the ``serve`` extra), no access log (it costs more
    than a request at these rates), and no limit on the graceful shutdown: every accepted request is answered."""
    import uvicorn

    options = dict(host=config.host, port=config.port, log_level=config.log_level, access_log=False,
                   loop="auto", http="auto", timeout_graceful_shutdown=None, lifespan="on")
    options.update(overrides)
    return uvicorn.Config(app, **options)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="clip-flash serve", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))
