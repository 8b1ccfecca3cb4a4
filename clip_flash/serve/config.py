"""Every setting of ``clip-flash serve`` in one dataclass; the command line (``cli.py``) and the Ray deployment
(``ray.py``) both build one of these."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple

from ..environment import usable_cores

DEFAULT_MODEL = "ViT-B-32"
INPUTS = ("fast", "stock")
DECODERS = ("cpu", "gpu")
TEXT_GROUPINGS = ("cost-packed", "cost", "buckets")
MAX_DEFAULT_WORKERS_PER_ENGINE = 4
CORES_PER_DEFAULT_WORKER = 4  # leave most cores to image decoding, the engine process and the clients


def default_workers(engines: int = 1) -> int:
    """HTTP frontend processes when ``--workers`` is not given: one per 4 cores this process may use, at most 4
    per engine (one on a machine of fewer than 8 cores, where extra processes only compete with the engine).

    The frontends' HTTP work grows with the request rate, and the rate with the GPUs: on two H100s (32 cores),
    one JPEG a request, 4 frontends left about 1.6% of requests at 4,000 req/s over 100 ms before the app's
    clock started, while the server's own clock saw 0.14% (``benchmarks/results/h100x2/serve_581abb9``)."""
    return max(1, min(MAX_DEFAULT_WORKERS_PER_ENGINE * max(1, engines), usable_cores() // CORES_PER_DEFAULT_WORKER))


@dataclass
class ServeConfig:
    """What the server serves, where, and how it batches and sheds load.

    Attributes:
        model: an OpenCLIP model spec (``NAME``: random-init weights; ``NAME::TAG``; ``NAME::/path/ckpt``).
        host, port: where uvicorn listens.
        device: ``"cuda"``, ``"cuda:1"`` or ``"cpu"``; None picks CUDA where there is one.
        devices: CUDA device indices, one engine each (``--devices 0,1``); empty: ``device`` alone.
        precision: ``fp32``, ``fp16`` or ``bf16``; None: fp16 on CUDA, fp32 on the CPU.
        max_batch: largest image batch (and a CUDA-graph bucket); a batch closes at it or at ``max_wait_ms``.
        max_text_batch: largest caption batch (graphs are captured up to it). A text batch's launches cost the host
            about the same at any size (measured for the batch job at 1,024 and 4,096 captions), so under a
            backlog larger batches carry more captions per second; below it batches close after ``max_wait_ms``.
        text_graphs_per_doubling: caption batch sizes with a CUDA graph in each doubling past 8 rows (1: powers of
            two). A batch's captions are grouped by length, and each group runs the smallest graph that holds it:
            on web-style captions the graphs compute 1.32-1.50 rows per caption with powers of two, 1.07-1.09
            with 4 sizes per doubling, and ViT-L-14's 64-caption requests saturated at 616 req/s against more
            than 807 on an H100; each size adds a graph per length bucket to capture at start (224 text graphs
            instead of 77: ready after 41 s instead of 23-27 s). ``benchmarks/results/h100/
            text_graphs_per_doubling_595a825``.
        text_grouping: how a caption batch is encoded. ``"cost-packed"`` (default): each batch, or each length
            group of it, replays whichever graph its measured costs say is cheaper: a packed text graph
            (``graphs.PackedTextGraphs``: the captions' real tokens one after another, padded only to a
            token-count bucket; about 25 token rows a web caption against 37-50 padded) or the padded caption graph
            of its length bucket; both kinds are captured and timed at start (264 packed graphs in about 11 s and
            1,862 MiB for ViT-L-14 at 1,024 captions). fp16 and bf16 only (the packed attention kernels take no fp32,
            which replays padded graphs). ViT-L-14 at 64 captions a request on an H100, alternated twice with
            ``cost``: 1,002-1,010 req/s answered at 1,100 offered against 840-851, at 950 offered 953-954 against
            764-848 (``benchmarks/results/h100/packed_text_graphs_18449c5``); with clip_flash's packed attention
            kernel in the packed graphs, 1,176-1,189 req/s saturated against 1,008-1,019 before it
            (``benchmarks/results/h100/packed_attention_a17619e``), and with 8 token-count buckets a doubling
            instead of 4, 1,269-1,272 against 1,171-1,172 (``benchmarks/results/h100/text_buckets_04bca1b``).
            ``"cost"``: padded graphs only, each batch cut into length groups where their replays cost least in
            sum; ``"buckets"``: cut at every length bucket, groups under 16 captions joined to the next.
            ``cost``, ``cost-packed`` need CUDA graphs (else ``buckets``).
        max_wait_ms: how long the first item of a batch waits for others while a batch of its tower is in flight
            (with none in flight a batch closes at once: waiting would only add latency).
        wait_when_idle: wait ``max_wait_ms`` even with no batch in flight (fuller batches at low load, at the cost
            of that much latency).
        max_batches_in_flight: per tower, batches between the queue and their answers at most; while that many
            are, no batch closes and arrivals wait to join the next one (2: one on the device, one being prepared;
            0: no limit, every batch closes after ``max_wait_ms``).
        max_queue: items waiting in all towers together (split evenly between engines); a request that would
            pass it gets 429.
        request_timeout: seconds from arrival; past it the request gets 503 and its items are dropped.
        max_request_bytes: a larger body gets 413.
        api_key: when set, every route but ``/health`` needs ``Authorization: Bearer <api_key>``.
        decode: ``"cpu"`` (exact) or ``"gpu"`` (nvJPEG; not exact).
        patch: run ``clip_flash.patch`` on the model (``--no-patch``: the stock model).
        inputs: ``"fast"`` (clip_flash's exact image preparer and tokenizer) or ``"stock"`` (OpenCLIP's own
            ``preprocess`` and tokenizer: a baseline).
        cuda_graphs: replay CUDA graphs (``clip_flash.GraphedEncoder``) on CUDA.
        cudnn_attention: let PyTorch's attention take its cuDNN kernel where it picks it. False
            (``--no-cudnn-attention``): flash instead, a ViT-L-14 engine loaded in about half the time (no per-shape
            plans to build for the hundreds of graphs) and replays a few percent slower
            (``engine.without_cudnn_attention``).
        decode_workers: image decoding workers (None: the preparer's default, a thread per core; with several
            ``devices`` the cores shared out between their engine processes).
        split_jpegs: a batch of few JPEGs (at low load, one) splits each one's entropy decode across the decoding
            workers (the same pixels, sooner; ``ImagePreprocessor(split_jpegs=...)``). False: one worker a JPEG.
        early_launch: on a GPU with the exact path, an image batch alone in the pipeline (low load) has its device
            step and encoder queued while its JPEGs decode, behind a gate opened when they are decoded
            (``batcher.TowerBatcher``): the same rows, sooner (the server's median at 50 one-JPEG requests/s on an
            H200 4.50 -> 4.36 ms). False: launched after the decode.
        workers: HTTP frontend processes feeding the engine process(es); 1: one process does everything. None
            (the default): ``default_workers(engines)``, 1 on small machines and up to 4 per engine on large ones:
            one process's event loop shares the GIL with the batchers (one process answered 1,500-2,400
            requests/s on a 16-core GPU host).
        log_level: uvicorn's and the server's log level; other libraries' records at warning and above, all at debug.
        served_name: the model name clients send (default: the spec as written, e.g. ``ViT-B-32``).
    """

    model: str = DEFAULT_MODEL
    host: str = "127.0.0.1"
    port: int = 8000
    device: Optional[str] = None
    devices: Tuple[int, ...] = field(default_factory=tuple)
    precision: Optional[str] = None
    max_batch: int = 64
    max_text_batch: int = 1024
    text_graphs_per_doubling: int = 4
    text_grouping: str = "cost-packed"
    max_wait_ms: float = 2.0
    wait_when_idle: bool = False
    max_batches_in_flight: int = 2
    max_queue: int = 16384
    request_timeout: float = 30.0
    max_request_bytes: int = 64 * 1024 * 1024
    api_key: Optional[str] = None
    decode: str = "cpu"
    patch: bool = True
    inputs: str = "fast"
    cuda_graphs: bool = True
    cudnn_attention: bool = True
    decode_workers: Optional[int] = None
    split_jpegs: bool = True
    early_launch: bool = True
    workers: Optional[int] = None
    log_level: str = "info"
    served_name: Optional[str] = None

    def __post_init__(self) -> None:
        if self.decode not in DECODERS:
            raise ValueError(f"decode must be one of {DECODERS}, got {self.decode!r}")
        if self.inputs not in INPUTS:
            raise ValueError(f"inputs must be one of {INPUTS}, got {self.inputs!r}")
        if self.text_grouping not in TEXT_GROUPINGS:
            raise ValueError(f"text_grouping must be one of {TEXT_GROUPINGS}, got {self.text_grouping!r}")
        if self.inputs == "stock" and self.decode == "gpu":
            raise ValueError("--decode gpu is clip_flash's image path; --inputs stock uses OpenCLIP's preprocess")
        self.devices = tuple(int(d) for d in self.devices)
        if self.workers is None:
            self.workers = default_workers(len(self.devices))
        for name in ("max_batch", "max_text_batch", "text_graphs_per_doubling", "max_queue", "max_request_bytes",
                     "workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_batches_in_flight < 0:
            raise ValueError(f"max_batches_in_flight must be at least 0, got {self.max_batches_in_flight}")
        if self.max_wait_ms < 0 or self.request_timeout <= 0:
            raise ValueError("max_wait_ms must be >= 0 and request_timeout > 0")

    def device_names(self) -> Tuple[Optional[str], ...]:
        """One device name per engine (None: pick CUDA where there is one, else the CPU)."""
        if self.devices:
            return tuple(f"cuda:{index}" for index in self.devices)
        return (self.device,)
