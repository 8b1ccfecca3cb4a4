"""Embed a collection into clip-retrieval's layout (img_emb/, text_emb/, metadata/), resumably.

    clip-flash embed --model ViT-L-14::laion2b_s32b_b82k --input photos/ --out emb/
    clip-flash embed --model ViT-B-32::/path/ckpt.pt --input 'shards/{00000..00099}.tar' --out emb/
    clip-flash embed --model ViT-L-14::laion2b_s32b_b82k --input captions.parquet --out text_emb/    # text only
    clip-flash embed ... --ray [ADDRESS]          # one patched model per GPU of a Ray cluster

Captions are read where they exist (x.txt beside x.jpg; txt or json in tars): an image without one is
embedded with an empty caption; --require-captions embeds pairs only. In a caption file, a blank line or
a null is a failure ("empty caption"); rows keep the file's id column, or FILE:N.

Run the same command again after a crash, a kill or Ctrl-C: finished shards are kept, the rest is
embedded. An output folder whose finished shards were made with another model, other weights (a
checkpoint is identified by its bytes), other settings, or from inputs that changed since (each file's
size and modification time) is refused with what differs. Bad inputs are listed in
OUT/failures.parquet with their reason. The summary goes to stdout, the progress bar to stderr, a JSON
record of the run under OUT/_clip_flash/runs/. Exit status: 0 done, 2 bad input/output/model (one clear
message), 130/143 stopped by Ctrl-C/SIGTERM.
"""
# The command line of clip_flash.embed: add_arguments(parser) and run(args) -> int, called by `clip-flash embed`
# and scripts/embed.py (the module docstring above is their --help text).
from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
from pathlib import Path
from typing import Iterator, List

from .job import DEFAULT_SHARD_SIZE
from .writer import STATE_DIR

STOPPED_MESSAGE = "run the same command to resume"
DEFAULT_MODEL = "ViT-B-32"


def stopped_message(out: Path) -> str:
    """What a stopped job prints last: the finished shards its output folder keeps, and how to go on."""
    finished = len(list((Path(out) / STATE_DIR / "done").glob("*.json")))
    return f"stopped with {finished} finished shard{'' if finished == 1 else 's'} kept in {out}; {STOPPED_MESSAGE}"


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def share_of_one(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be from 0 to 1, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The job's options on ``parser``."""
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="NAME (random init: meaningless for search), NAME::TAG or NAME::/path/to/checkpoint "
                             f"(default {DEFAULT_MODEL}, random init: for trying the job without downloading weights)")
    parser.add_argument("--input", required=True,
                        help="image folder (captions: x.txt beside x.jpg, read where they exist), WebDataset "
                             "tar(s) ('dir/{00000..00099}.tar'), or caption file (.txt/.csv/.tsv/.parquet)")
    parser.add_argument("--out", required=True, type=Path, help="output folder (resumed if it exists)")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--precision", choices=("fp16", "bf16", "fp32"), default=None,
                        help="model precision (default fp16 on CUDA, fp32 on CPU)")
    parser.add_argument("--no-patch", dest="patch", action="store_false", help="run the stock OpenCLIP model")
    parser.add_argument("--pipeline", choices=("clip_flash", "stock"), default="clip_flash",
                        help="stock: OpenCLIP's PIL preprocess in a DataLoader + its tokenizer (implies --no-patch)")
    parser.add_argument("--decode", choices=("cpu", "gpu"), default="cpu",
                        help="cpu: exact (Pillow's pixels); gpu: nvJPEG, faster, not bit-exact")
    parser.add_argument("--batch-size", type=positive_int, default=None,
                        help="default 256 (images), 4096 (text); on a CPU 32, 256")
    parser.add_argument("--shard-size", type=positive_int, default=DEFAULT_SHARD_SIZE,
                        help=f"inputs per output shard (default {DEFAULT_SHARD_SIZE}; a WebDataset tar is one shard)")
    parser.add_argument("--workers", type=positive_int, default=None,
                        help="native decoding threads (default: every core) / stock: DataLoader workers (cores - 1)")
    parser.add_argument("--executor", choices=("auto", "native", "thread"), default="auto",
                        help="decoding: the native batch decoder (auto: where the extension is built) or Python "
                             "threads")
    parser.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false",
                        help="launch every image batch eager (default on CUDA: full batches replay a CUDA graph, "
                             "same rows, where launching takes a quarter of an eager batch's time or more)")
    parser.add_argument("--decode-threads", type=positive_int, default=None,
                        help="batches prepared at once ahead of the GPU (default 2)")
    parser.add_argument("--exact-share", type=share_of_one, default=0.0,
                        help="with --decode gpu: the share of each batch decoded exactly on the CPU beside nvJPEG's "
                             "hardware decoder (those rows are exact; default 0)")
    parser.add_argument("--no-normalize", dest="normalize", action="store_false", help="keep raw embeddings")
    parser.add_argument("--out-dtype", choices=("float16", "float32"), default="float16",
                        help="the .npy files' dtype (default float16, as clip-retrieval writes them)")
    parser.add_argument("--no-captions", dest="captions", action="store_false", default=None,
                        help="ignore captions (by default they are read where they exist: .txt beside images, "
                             "txt/json in tars; an image without one gets an empty caption)")
    parser.add_argument("--require-captions", action="store_true",
                        help="pairs only: an image or sample without a caption is a failure, not embedded")
    parser.add_argument("--caption-column", default=None,
                        help="CSV/parquet column of the captions (default: caption, text, captions or txt)")
    parser.add_argument("--repeat", type=positive_int, default=1,
                        help="embed the input list this many times (steady-state speed on a small folder)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    parser.add_argument("--ray", nargs="?", const="auto", default=None, metavar="ADDRESS",
                        help="run on a Ray cluster, one model per GPU: ADDRESS (HOST:6379), or none for "
                             "RAY_ADDRESS, a running local cluster, or a new local Ray")
    parser.add_argument("--ray-workers", type=positive_int, default=None,
                        help="model actors (default: the cluster's GPUs, or 1 on a CPU-only cluster)")
    parser.add_argument("--ray-num-cpus", type=int, default=None, help="local Ray only: CPUs to start it with")


class _Stopped(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, so the job unwinds as it does for Ctrl-C."""

    def __init__(self, signal_number: int) -> None:
        super().__init__(signal_number)
        self.signal_number = signal_number


@contextlib.contextmanager
def _stop_on_sigterm() -> Iterator[None]:
    def stop(signal_number: int, _frame: object) -> None:
        raise _Stopped(signal_number)

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread: leave signals to whoever owns them
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args: argparse.Namespace) -> int:
    """Run the job ``args`` describe; print its summary (or one clear message); return the exit status."""
    from clip_flash.models import ModelLoadError

    from . import OutputError, SourceError, embed

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # A first fetch of a tag's weights can take minutes: say so when it starts.
    logging.getLogger("clip_flash.models.weights_fetch").setLevel(logging.INFO)
    patch = args.patch and args.pipeline != "stock"
    options = dict(device=args.device, precision=args.precision, patch=patch, pipeline=args.pipeline,
                   decode=args.decode, batch_size=args.batch_size, shard_size=args.shard_size,
                   normalize=args.normalize, out_dtype=args.out_dtype, captions=args.captions,
                   caption_column=args.caption_column, require_captions=args.require_captions,
                   workers=args.workers, executor=args.executor, cuda_graphs=args.cuda_graphs,
                   decode_threads=args.decode_threads, exact_share=args.exact_share, repeat=args.repeat,
                   progress=args.progress,
                   command=getattr(args, "command", None))
    try:
        with _stop_on_sigterm():
            if args.ray is not None:
                from .ray_data import embed_with_ray

                summary = embed_with_ray(args.input, args.out, args.model, address=args.ray,
                                         actors=args.ray_workers, num_cpus=args.ray_num_cpus, **options)
            else:
                summary = embed(args.input, args.out, args.model, **options)
    except KeyboardInterrupt as stopped:
        print(stopped_message(args.out), file=sys.stderr)
        return 128 + getattr(stopped, "signal_number", signal.SIGINT)
    except (SourceError, OutputError, ModelLoadError, ValueError) as error:
        message = str(error)
        print(message if message.startswith("error:") else f"error: {message}", file=sys.stderr)
        return 2
    print(summary.format())
    return 0


def main(argv: List[str]) -> int:
    """``add_arguments`` + ``run`` on a new parser (what ``scripts/embed.py`` calls)."""
    import shlex

    parser = argparse.ArgumentParser(description=__doc__.replace("clip-flash embed ", "python scripts/embed.py "),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.command = "python scripts/embed.py " + " ".join(shlex.quote(arg) for arg in argv)
    return run(args)
