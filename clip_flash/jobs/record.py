"""What a finished embedding job reports: the summary it prints and the JSON record it keeps.

Rates count inputs (embedded + failed) from files or strings to committed ``.npy`` files. ``items_per_s``: over
the pipeline's wall time (the run: on CUDA it starts with the device half of the warm-up, overlapping the first
reads); ``steady_items_per_s`` leaves the first written shard out, which is the rate a long job runs at;
``after_load_items_per_s`` from the model loaded to the end (the decoder's start, the warm-up, the run: what a
job costs beyond its model load); ``job_items_per_s`` counts the whole setup too (planning, model loading), the
rate a user waits for. Through Ray the run counts from the first actor's model loaded (the setup is the planning,
the actors' start and that load; the other actors' loads and every warm-up are in the run), and
``actor_timeline`` says when each actor got there.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch


@dataclass
class JobSummary:
    """One run of an embedding job (``clip_flash.embed`` returns it)."""

    out: str
    model: str
    weights: str
    device: str
    precision: str
    patched: bool
    pipeline: str
    decode: str
    shards_planned: int
    shards_skipped: int                      # finished by an earlier run
    shards_written: int
    rows: int                                # embedded in this run
    failures: int                            # inputs that failed in this run
    failures_total: int                      # in failures.parquet (every finished shard)
    seconds: float
    cpu_cores: int
    gpu_peak_mib: Optional[float] = None
    steady_items_per_s: Optional[float] = None
    setup_seconds: Optional[float] = None       # embed() called to the pipeline's start (model load, decoder start)
    model_load_seconds: Optional[float] = None  # embed() called to the model loaded (planning, loading, patching)
    warm_up_seconds: Optional[float] = None     # the pipeline's warm-up: the decoder's start (in setup_seconds)
    #                                             and the device half at the run's start (in seconds)
    warm_up_steps: Dict[str, float] = field(default_factory=dict)  # the device half's steps: each one's end, seconds
    # the device's first uses made on stand-ins while the model loaded (jobs.device_ahead): each step's end, seconds
    beside_load_steps: Dict[str, float] = field(default_factory=dict)
    first_batch_seconds: Optional[float] = None  # the pipeline's start to its first batch's embeddings
    record_path: Optional[str] = None
    main_thread_seconds: Dict[str, float] = field(default_factory=dict)  # what the device stage waited on
    pinned_blocks_created: int = 0       # page-locked host blocks torch's allocator made during the run
    pinned_block_seconds: float = 0.0    # and the seconds CUDA took making them
    pinned_block_bytes: int = 0          # and their bytes together
    shard_marks: List[Tuple[int, float]] = field(default_factory=list, repr=False)  # (inputs so far, seconds)
    # Through Ray: per actor, seconds after the call its process was created, had imported torch, entered its
    # constructor, imported OpenCLIP, loaded the model, warmed up, was handed its first shard and committed its last,
    # and the shards it embedded.
    actor_timeline: List[Dict[str, Any]] = field(default_factory=list)

    @property
    def items(self) -> int:
        """Inputs this run went through: embedded plus failed."""
        return self.rows + self.failures

    @property
    def items_per_s(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else 0.0

    @property
    def job_items_per_s(self) -> Optional[float]:
        """Inputs per second from the call to the end, setup included (None when the setup was not timed)."""
        if self.setup_seconds is None:
            return None
        total = self.setup_seconds + self.seconds
        return self.items / total if total > 0 else 0.0

    @property
    def after_load_seconds(self) -> Optional[float]:
        """Seconds from the model loaded to the end: the decoder's start, the warm-up, the run."""
        if self.setup_seconds is None or self.model_load_seconds is None:
            return None
        return self.setup_seconds - self.model_load_seconds + self.seconds

    @property
    def after_load_items_per_s(self) -> Optional[float]:
        """Inputs per second from the model loaded to the end (None when the load was not timed)."""
        seconds = self.after_load_seconds
        if seconds is None:
            return None
        return self.items / seconds if seconds > 0 else 0.0

    def to_dict(self) -> Dict[str, Any]:
        record = asdict(self)
        record.update(items=self.items, items_per_s=self.items_per_s, job_items_per_s=self.job_items_per_s,
                      after_load_seconds=self.after_load_seconds, after_load_items_per_s=self.after_load_items_per_s)
        return record

    def format(self) -> str:
        """The few lines printed at the end of a job."""
        lines = [
            f"clip_flash embed: {self.model} {self.weights}".rstrip() + f" on {self.device} ({self.precision}, "
            f"{'patched' if self.patched else 'stock model'}, {self.pipeline} inputs, decode {self.decode})",
            f"  shards: {self.shards_written} written, {self.shards_skipped} already done, "
            f"{self.shards_planned} planned",
            f"  items: {self.items} ({self.rows} embedded, {self.failures} failed; "
            f"{self.failures_total} failures listed in failures.parquet)",
            f"  rate: {self.items_per_s:,.1f} items/s over {self.seconds:.2f} s"
            + (f", {self.steady_items_per_s:,.1f} items/s after the first shard" if self.steady_items_per_s else "")
            + f", fed by {self.cpu_cores} CPU cores",
        ]
        if self.setup_seconds is not None:
            lines.append(f"  setup: {self.setup_seconds:.2f} s before the run"
                         + (f" (model load {self.model_load_seconds:.2f} s)" if self.model_load_seconds is not None
                            else "")
                         + (f"; warm-up {self.warm_up_seconds:.2f} s" if self.warm_up_seconds is not None else "")
                         + (f"; first batch done {self.first_batch_seconds:.2f} s into the run"
                            if self.first_batch_seconds is not None else "")
                         + (f"; {self.after_load_items_per_s:,.1f} items/s from the model loaded"
                            if self.after_load_items_per_s is not None else "")
                         + f"; {self.job_items_per_s:,.1f} items/s counting all of it")
        if self.beside_load_steps:
            lines.append("  beside the model load: " + ", ".join(f"{step} by {seconds:.2f} s"
                                                                 for step, seconds in self.beside_load_steps.items()))
        if self.warm_up_steps:
            lines.append("  device warm-up: " + ", ".join(f"{step} by {seconds:.2f} s"
                                                          for step, seconds in self.warm_up_steps.items()))
        for actor in self.actor_timeline:
            lines.append(f"  actor {describe_actor(actor)}")
        if any(self.main_thread_seconds.values()):
            lines.append("  main thread: " + ", ".join(f"{step} {seconds:.2f} s"
                                                       for step, seconds in self.main_thread_seconds.items()))
        if self.pinned_blocks_created:
            lines.append(f"  page-locked host memory: {self.pinned_blocks_created} blocks made during the run "
                         f"({self.pinned_block_bytes / 2**20:,.1f} MiB, {self.pinned_block_seconds:.2f} s)")
        if self.gpu_peak_mib is not None:
            lines.append(f"  GPU memory: {self.gpu_peak_mib:,.0f} MiB peak allocated")
        lines.append(f"  output: {self.out}" + (f"; run record {self.record_path}" if self.record_path else ""))
        return "\n".join(lines)


def steady_rate(marks: List[Tuple[int, float]]) -> Optional[float]:
    """Inputs per second after the first shard was handed to the writer (None with fewer than 2 shards)."""
    if len(marks) < 2:
        return None
    (first_items, first_time), (last_items, last_time) = marks[0], marks[-1]
    elapsed = last_time - first_time
    return (last_items - first_items) / elapsed if elapsed > 0 else None


def gpu_peak_mib(device: torch.device) -> Optional[float]:
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**20


def describe_actor(actor: Dict[str, Any]) -> str:
    """One line of a Ray actor's timeline (an entry of ``JobSummary.actor_timeline``)."""
    return (f"{actor['actor']}: process started {actor['spawned']:.2f} s after the call, imported torch and "
            f"clip_flash at {actor['imported']:.2f} s, entered its constructor at {actor['started']:.2f} s, "
            f"imported OpenCLIP at {actor['libraries']:.2f} s, model loaded at {actor['loaded']:.2f} s, ready at "
            f"{actor['ready']:.2f} s, first shard handed at {actor['first_shard']:.2f} s, last shard committed at "
            f"{actor['last_shard_done']:.2f} s; {actor['shards']} shards")


def run_record(summary: JobSummary, settings: Dict[str, Any], device: torch.device, command: str,
               options: Dict[str, Any]) -> Dict[str, Any]:
    """The JSON record of a run: environment (versions, git revision, GPU, command), settings, summary."""
    from clip_flash.environment import environment_record

    return {
        "kind": "clip_flash embedding job",
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "environment": environment_record(device, command),
        "libraries": library_versions(),
        "settings": settings,
        "options": options,  # what does not change the output (batch size, threads, device index)
        "summary": summary.to_dict(),
    }


def library_versions() -> Dict[str, Optional[str]]:
    """Versions of what the job's inputs and outputs go through (None: not installed)."""
    from importlib import metadata

    versions: Dict[str, Optional[str]] = {}
    for name in ("pillow", "torchvision", "tokenizers", "ftfy", "pyarrow", "numpy", "ray"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def record_name() -> str:
    """A file name for this run's record, unique per run: UTC time and process id."""
    return time.strftime("run_%Y%m%dT%H%M%SZ", time.gmtime()) + f"_{os.getpid()}.json"
