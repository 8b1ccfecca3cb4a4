"""Embedding on a Ray cluster (Ray Data): one patched model per GPU, the same output folder and rules.

Two ways in (the ``ray`` extra: ``pip install -e ".[ray]"`` in the checkout):

1. The job, ``scripts/embed.py --ray [ADDRESS]`` or :func:`embed_with_ray`. The driver plans the shards
   exactly as the one-GPU job does (same settings check, same skipping of finished shards) and makes a
   Ray dataset of one row per shard left. ``map_batches(ShardEmbedder, batch_size=1, num_gpus=1)`` runs
   a pool of actors, one per GPU, each holding one patched model: an actor reads its shard's files,
   decodes them in its own threads, embeds them on its GPU and commits the shard to the output folder
   itself. Each actor holds two shards at a time and runs them as one pipeline run (``ShardStream``), so
   its GPU does not drain at a shard's end. Shard numbers come from the plan, so file names are unique
   across workers, and a shard is committed by the same atomic writer, so a retried or re-run shard never
   duplicates rows.
2. Your own Ray Data pipeline: :class:`ClipEmbedder` for ``ds.map_batches`` adds ``img_emb`` /
   ``text_emb`` and ``error`` columns to batches of encoded images (``read_binary_files``' ``bytes``,
   ``read_webdataset``'s ``jpg``), paths, or decoded arrays (``read_images``), and captions::

       ds = ray.data.read_binary_files("s3://bucket/photos/", include_paths=True)
       ds = ds.map_batches(ClipEmbedder, fn_constructor_kwargs={"model": "ViT-L-14::laion2b_s32b_b82k",
                           "image_column": "bytes"}, batch_size=256, num_gpus=1,
                           compute=ray.data.ActorPoolStrategy(size=8))

Where image decoding runs: in the GPU actor, from the encoded bytes. A decoded web photo is about ten
times its JPEG (a 1024x768 RGB image is 2.4 MB), so decoding in CPU tasks would push ten times the
bytes through Ray's object store (and across nodes when the tasks run elsewhere), while the actor's
decode threads spend their time in libjpeg-turbo with the GIL released and the device half of the
preparation (resize, crop, normalise) runs on the GPU beside the encoder. Each actor gets the node's
cores divided by its GPUs as decode threads. Decoded arrays are accepted too, for pipelines that decode
anyway. This placement follows from those sizes and from per-core decoding being far slower than the
patched encoder (so the bytes, not the pixels, should travel); the two placements have not been timed
against each other through Ray.

N GPUs, N nodes: start Ray on every node (``ray start --head`` on one, ``ray start --address=HEAD:6379``
on the others), put the inputs and the output folder on storage that every node mounts at the same path,
and run ``scripts/embed.py --ray HEAD:6379`` (or ``--ray`` with ``RAY_ADDRESS`` set) anywhere. One actor
per GPU of the cluster by default (``--ray-workers``). Each actor takes whole shards, so have several
times more shards than GPUs for an even finish. A shard whose actor dies is retried by Ray; what is left
unfinished is embedded by the next run of the same command. The tests run it on a local CPU Ray; its speed
on a cluster is not measured.
"""
from __future__ import annotations

import logging
import os
import pickle
import time
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from .beside_load_work import device_first_uses, inputs_ahead, reserve_pinned_blocks
from .job import DEFAULT_SHARD_SIZE, default_batch_size, finish_job, load_job_model, plan_job
from .runner import OUTPUT_DTYPES, build_inputs, make_runner
from ..backends import choosing_for_replay
from ..models import import_model_library
from .pinned_reserve import first_images
from .pipeline import finish_features
from .launch_thread import LaunchThread
from .shard_stream import ShardStream
from .run_stats import PipelineStats
from .record import JobSummary
from .writer import OutputFolder

logger = logging.getLogger(__name__)
_IMPORTED_AT = time.time()  # in an actor: when its process had imported torch and this module
# each actor's start, in order
ACTOR_MARKS = ("spawned", "imported", "started", "libraries", "loaded", "ready", "first_shard")


def _process_started_at() -> float:
    """When this process was created, on the wall clock (Linux: its start in clock ticks after boot, against the
    uptime now, so to about 10 ms); elsewhere when it had imported this module."""
    try:
        with open("/proc/self/stat") as stat:
            started_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime") as uptime:
            up = float(uptime.read().split()[0])
        return time.time() - (up - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return _IMPORTED_AT


def _decode_threads_per_gpu() -> Optional[int]:
    """This node's CPUs divided among its GPUs (each GPU actor's share of decode threads)."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    for entry in ray.nodes():
        if entry.get("NodeID") == node:
            resources = entry.get("Resources", {})
            return max(1, int(resources.get("CPU", 1) // max(1, resources.get("GPU", 1))))
    return None


def _actor_device(requested: Optional[str]) -> torch.device:
    if requested:
        return torch.device(requested)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class ShardEmbedder:
    """A Ray Data actor that embeds whole shards of a planned job and commits each to the output folder.

    ``ds.map_batches(ShardEmbedder, batch_size=1, ...)`` over rows ``{"shard": N, "payload": pickled Shard}``;
    returns one row per shard: ``shard``, ``rows``, ``failures``, ``seconds`` (from handed to the actor's pipeline
    run to committed, the previous shard's last batches included), ``done_at`` (when it was committed),
    ``gpu_peak_mib``, ``node``, and the actor's name (``actor``: host and pid) and start marks (``spawned_at``,
    ``imported_at``, ``started_at``, ``libraries_at``, ``loaded_at``, ``ready_at``, ``first_shard_at``): wall-clock
    seconds.
    """

    def __init__(self, job: Dict[str, Any]) -> None:
        import socket

        # Wall-clock marks of this actor's start, reported with each shard: the driver times the run from the
        # first model loaded, as the one-device job times its own (see :func:`_actor_timeline`).
        self.marks = {"actor": f"{socket.gethostname()}:{os.getpid()}", "spawned_at": _process_started_at(),
                      "imported_at": _IMPORTED_AT, "started_at": time.time()}
        self.device = _actor_device(job["device"])
        self.job = SimpleNamespace(spec=job["spec"], precision=job["precision"], patch=job["patch"])
        source = SimpleNamespace(**job["source"])
        # The first batch's page-locked blocks, made while the model loads (as the one-device job does); this thread
        # imports neither OpenCLIP nor torchvision, so it starts before the import below, beside it.
        reservation = reserve_pinned_blocks(self.device, source.has_images, "clip_flash", job["decode"],
                                            job["batch_size"], job.get("exact_share", 0.0), job["executor"],
                                            lambda count: job["first_images"][:count])
        import_model_library()  # what the load imports, before the threads beside it that import parts of it
        self.marks["libraries_at"] = time.time()
        ahead = inputs_ahead(self.job.spec.name, source, "clip_flash")  # the inputs' checks and tokenizer, beside
        first_uses = device_first_uses(self.job, source, self.device, "clip_flash", job["decode"], job["batch_size"],
                                       job.get("decode_threads"), ahead)
        # Every device call of the actor's runs is made on one thread, which makes the encoder's first uses on a
        # stand-in while the model loads (some of them are kept per thread; see clip_flash.jobs.launch_thread).
        self.launch_thread = LaunchThread("clip_flash-actor-launch")
        made = self.launch_thread.submit(first_uses.make_encoder_first_uses) if first_uses is not None else None
        loaded = load_job_model(self.job, self.device)
        self.marks["loaded_at"] = time.time()
        if first_uses is not None:
            made.result()
            first_uses.join()
        workers = job["workers"] or _decode_threads_per_gpu()
        self.runner = make_runner(loaded, source, self.device, "clip_flash", job["decode"], job["batch_size"],
                                  job["normalize"], job["out_dtype"], workers, job["executor"],
                                  job["cuda_graphs"], job.get("decode_threads"), job.get("exact_share", 0.0),
                                  ahead)
        if first_uses is not None:
            self.runner.made_beside_load = frozenset(first_uses.steps)  # the warm-up does not make them again
        # with the model load, before the actor takes shards (see clip_flash.jobs.warm_up)
        self.launch_thread.submit(self.runner.warm_up).result()
        if reservation is not None:
            reservation.join()
        self.output = OutputFolder(job["out"], job["shard_count"])
        # Ray Data runs two calls at once on this actor (see _run_on_actors): both shards feed one pipeline run.
        self.stream = ShardStream(self.runner, self.output.write, self.launch_thread)
        self.marks["ready_at"] = time.time()

    def __call__(self, batch: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        import socket

        self.marks.setdefault("first_shard_at", time.time())
        rows: Dict[str, List[Any]] = {"shard": [], "rows": [], "failures": [], "seconds": [], "done_at": [],
                                      "gpu_peak_mib": [], "node": [], **{name: [] for name in self.marks}}
        for payload in batch["payload"]:
            report = self.stream.embed(pickle.loads(payload))
            rows["shard"].append(report.index)
            rows["rows"].append(report.rows)
            rows["failures"].append(report.failures)
            rows["seconds"].append(report.seconds)
            rows["done_at"].append(time.time())
            peak = torch.cuda.max_memory_allocated(self.device) / 2**20 if self.device.type == "cuda" else -1.0
            rows["gpu_peak_mib"].append(peak)
            rows["node"].append(socket.gethostname())
            for name, value in self.marks.items():
                rows[name].append(value)
        return {name: np.asarray(values) for name, values in rows.items()}


def _init_ray(address: Optional[str], num_cpus: Optional[int]) -> None:
    import ray

    if ray.is_initialized():
        return
    if address in (None, "", "auto"):
        # RAY_ADDRESS, else a cluster already running on this machine, else a new local Ray
        ray.init(**({"num_cpus": num_cpus} if num_cpus else {}))
    else:
        ray.init(address=address)


def embed_with_ray(input: Any, out: Any, model: str = "ViT-B-32", *, address: Optional[str] = None,
                   actors: Optional[int] = None, num_cpus: Optional[int] = None, device: Optional[str] = None,
                   precision: Optional[str] = None, patch: bool = True, pipeline: str = "clip_flash",
                   decode: str = "cpu", batch_size: Optional[int] = None, shard_size: int = DEFAULT_SHARD_SIZE,
                   normalize: bool = True, out_dtype: str = "float16", captions: Optional[bool] = None,
                   caption_column: Optional[str] = None, require_captions: bool = False,
                   workers: Optional[int] = None, executor: str = "auto",
                   cuda_graphs: bool = True, decode_threads: Optional[int] = None,
                   exact_share: float = 0.0, repeat: int = 1, progress: bool = True,
                   command: Optional[str] = None) -> JobSummary:
    """:func:`clip_flash.embed` on a Ray cluster: same arguments, same output folder, same resume rules.

    ``address``: a running cluster (``HOST:6379``); None or ``"auto"`` starts a local Ray (``num_cpus``)
    unless ``RAY_ADDRESS`` is set. ``actors``: model actors (default: the cluster's GPUs, or 1 without GPUs).
    ``device``: what the actors run on (default CUDA when the cluster has GPUs). The inputs and ``out``
    must be reachable at the same paths from every node.
    """
    import ray

    called, called_wall = time.perf_counter(), time.time()
    if pipeline != "clip_flash":
        raise ValueError("--ray runs clip_flash's pipeline; the stock baseline runs on one device")
    if decode_threads is not None and decode_threads < 1:
        raise ValueError(f"decode_threads must be at least 1, got {decode_threads}")
    _init_ray(address, num_cpus)
    gpus = int(ray.cluster_resources().get("GPU", 0))
    device = device or ("cuda" if gpus else "cpu")
    job = plan_job(input, out, model, device_type=torch.device(device).type, precision=precision, patch=patch,
                   pipeline=pipeline, decode=decode, shard_size=shard_size, normalize=normalize, out_dtype=out_dtype,
                   captions=captions, caption_column=caption_column, repeat=repeat,
                   require_captions=require_captions)
    source = job.source
    batch_size = batch_size or default_batch_size(source.has_images, torch.device(device).type)
    actors = actors or max(1, gpus)
    actor_job = {"device": device, "spec": job.spec, "precision": job.precision, "patch": patch, "decode": decode,
                 "batch_size": batch_size, "normalize": normalize, "out_dtype": out_dtype, "workers": workers,
                 "executor": executor, "cuda_graphs": cuda_graphs, "decode_threads": decode_threads,
                 "exact_share": exact_share, "out": str(job.output.root), "shard_count": len(job.plan),
                 "source": {"kind": source.kind, "has_images": source.has_images, "has_captions": source.has_captions},
                 # a folder's first batch of paths, which size the actors' page-locked blocks on CUDA (the samples
                 # of tars stay unread here: the actors then size them for 640x480 JPEGs)
                 "first_images": (first_images(job.todo, batch_size)
                                  if source.kind == "folder" and torch.device(device).type == "cuda" else [])}
    try:
        job.output.record_settings(job.settings)  # the actors load the model; a bad spec failed in plan_job
        handed_seconds = time.perf_counter() - called
        stats, peak, marks = _run_on_actors(job.todo, actor_job, actors, progress)
        timeline = _actor_timeline(marks, called_wall)
        model_load_seconds = None
        if timeline:
            # The run counts from the first model loaded, as the one-device job's does from its model loaded: the
            # other actors' loads, every warm-up and Ray's dispatch stay inside it.
            model_load_seconds = min(actor["loaded"] for actor in timeline)
            _start_run_at(stats, model_load_seconds - handed_seconds)
        return finish_job(job, stats, device=f"ray: {actors} actor(s) on {device}", pipeline="clip_flash (ray)",
                          gpu_peak=peak, command=command, environment_device=torch.device("cpu"),
                          setup_seconds=model_load_seconds, model_load_seconds=model_load_seconds,
                          actor_timeline=timeline,
                          options={"batch_size": batch_size, "workers": workers, "actors": actors,
                                   "cuda_graphs": cuda_graphs, "decode_threads": decode_threads,
                                   "cluster": {key: value for key, value in ray.cluster_resources().items()
                                               if key in ("CPU", "GPU")}})
    finally:
        job.output.close()


def _actor_timeline(marks: Dict[str, Dict[str, Any]], called_wall: float) -> List[Dict[str, Any]]:
    """Each actor's start in seconds after the job was called: its process was created (``spawned``; before the
    call where Ray had started the worker ahead), had imported torch and this module (``imported``), entered its
    constructor (``started``), imported OpenCLIP (``libraries``), loaded the model (``loaded``), warmed up
    (``ready``) and was handed its first shard (``first_shard``); when it committed its last shard
    (``last_shard_done``), and the shards it embedded. Wall clocks: across nodes they are as close as the nodes'
    clocks."""
    timeline = []
    for name, actor in sorted(marks.items(), key=lambda item: item[1]["loaded_at"]):
        entry: Dict[str, Any] = {"actor": name}
        for mark in ACTOR_MARKS:
            entry[mark] = round(float(actor[f"{mark}_at"]) - called_wall, 3)
        entry["last_shard_done"] = round(actor["last_done_at"] - called_wall, 3)
        entry["shards"] = actor["shards"]
        timeline.append(entry)
    return timeline


def _start_run_at(stats: PipelineStats, offset: float) -> None:
    """Moves the run's start ``offset`` seconds later (shard marks and wall time counted from there)."""
    offset = min(max(offset, 0.0), stats.seconds)
    stats.seconds -= offset
    stats.marks = [(items, seconds - offset) for items, seconds in stats.marks]


def _run_on_actors(todo: List[Any], actor_job: Dict[str, Any], actors: int,
                   progress: bool) -> Tuple[PipelineStats, Optional[float], Dict[str, Dict[str, Any]]]:
    """Hand each shard to the pool of :class:`ShardEmbedder` actors; tally their reports as they come. Also
    returns each actor's start marks and shard count, by actor name."""
    import ray
    from tqdm.auto import tqdm

    stats = PipelineStats()
    peak = None
    marks: Dict[str, Dict[str, Any]] = {}
    started = time.perf_counter()
    if todo:
        ray.data.DataContext.get_current().enable_progress_bars = False
        rows = [{"shard": shard.index, "payload": pickle.dumps(shard)} for shard in todo]
        dataset = ray.data.from_items(rows, override_num_blocks=len(rows)).map_batches(
            ShardEmbedder, batch_size=1, fn_constructor_kwargs={"job": actor_job},
            num_gpus=1 if torch.device(actor_job["device"]).type == "cuda" else 0, num_cpus=1,
            # Two shards at a time on each actor, both fed to one pipeline run (ShardStream): the next shard's
            # batches decode while this one's last ones are on the device, as in the one-device job's run.
            # No more than those two in flight, so the last shards go to whichever actor is free.
            compute=ray.data.ActorPoolStrategy(size=actors, max_concurrent_calls_per_actor=2,
                                               enable_true_multi_threading=True, max_tasks_in_flight_per_actor=2))
        known = [shard.size for shard in todo]
        total = sum(known) if all(size is not None for size in known) else None
        with tqdm(total=total, unit="item", desc=f"embedding on {actors} Ray actor(s)", disable=not progress,
                  dynamic_ncols=True) as bar:
            for row in dataset.iter_rows():
                stats.rows += int(row["rows"])
                stats.failures += int(row["failures"])
                stats.shards += 1
                stats.marks.append((stats.rows + stats.failures, time.perf_counter() - started))
                if row["gpu_peak_mib"] >= 0:
                    peak = max(peak or 0.0, float(row["gpu_peak_mib"]))
                actor = marks.setdefault(str(row["actor"]), {
                    "shards": 0, **{f"{mark}_at": float(row[f"{mark}_at"]) for mark in ACTOR_MARKS}})
                actor["shards"] += 1
                actor["last_done_at"] = max(actor.get("last_done_at", 0.0), float(row["done_at"]))
                bar.update(int(row["rows"]) + int(row["failures"]))
    stats.seconds = time.perf_counter() - started
    return stats, peak, marks


class ClipEmbedder:
    """For ``ds.map_batches``: one (patched) OpenCLIP model per actor, embeddings added as columns.

    Args:
        model: ``NAME``, ``NAME::TAG`` or ``NAME::/path/to/checkpoint``.
        image_column: a column of encoded images (bytes), file paths (str) or decoded ``(H, W, 3)`` uint8
            arrays (Ray's ``read_images``: decoded to RGB, so preprocessing starts from RGB pixels).
        text_column: a column of captions. At least one of the two.
        device, precision, patch, decode, normalize, out_dtype, workers, executor: as for :func:`clip_flash.embed`.

    Each batch comes back with ``img_emb`` / ``text_emb`` (``(rows, dim)`` arrays) and ``error`` (empty for
    rows that embedded; the reason otherwise, with that row's image embedding all NaN: filter on it).
    """

    def __init__(self, model: str, *, image_column: Optional[str] = None, text_column: Optional[str] = None,
                 device: Optional[str] = None, precision: Optional[str] = None, patch: bool = True,
                 decode: str = "cpu", normalize: bool = True, out_dtype: str = "float16",
                 workers: Optional[int] = None, executor: str = "auto") -> None:
        from clip_flash.models.model_spec import parse_model_spec

        if image_column is None and text_column is None:
            raise ValueError("ClipEmbedder needs an image_column, a text_column, or both")
        self.device = _actor_device(device)
        precision = precision or ("fp16" if self.device.type == "cuda" else "fp32")
        self.job = SimpleNamespace(spec=parse_model_spec(model), precision=precision, patch=patch)
        source = SimpleNamespace(has_images=image_column is not None, has_captions=text_column is not None)
        import_model_library()  # before the thread beside the load, which imports parts of it
        ahead = inputs_ahead(self.job.spec.name, source, "clip_flash")
        self.loaded = load_job_model(self.job, self.device)
        self.image_column, self.text_column = image_column, text_column
        self.normalize, self.out_dtype = normalize, OUTPUT_DTYPES[out_dtype]
        self.preparer, self.tokenizer = build_inputs(self.loaded, source, self.device, decode, workers, executor,
                                                     ahead=ahead)

    @staticmethod
    def _image_input(value: Any) -> Any:
        if isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim in (2, 3):
            from PIL import Image

            return Image.fromarray(value)
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        return str(value)

    def __call__(self, batch: Dict[str, Any]) -> Dict[str, Any]:
        count = len(batch[self.image_column or self.text_column])
        errors = np.array([""] * count, dtype=object)
        with torch.inference_mode():
            if self.preparer is not None:
                prepared = self.preparer([self._image_input(value) for value in batch[self.image_column]])
                dim = self.loaded.model.visual.output_dim
                embeddings = np.full((count, dim), np.nan, dtype=self.out_dtype)
                indices = prepared.indices
                keep = indices.tolist() if isinstance(indices, torch.Tensor) else list(indices)
                if keep:
                    # the kernels the job chooses for its image batches (jobs.pipeline), so the rows are the job's
                    with choosing_for_replay():
                        features = self.loaded.model.encode_image(prepared.pixels)
                    embeddings[keep] = finish_features(features, self.normalize, self.out_dtype).cpu().numpy()
                for index, reason in prepared.failures:
                    errors[index] = str(reason) or "unreadable image"
                batch["img_emb"] = embeddings
            if self.tokenizer is not None:
                tokens = self.tokenizer([str(text) for text in batch[self.text_column]]).to(self.device)
                features = self.loaded.model.encode_text(tokens)
                batch["text_emb"] = finish_features(features, self.normalize, self.out_dtype).cpu().numpy()
        batch["error"] = errors
        return batch
