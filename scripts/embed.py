#!/usr/bin/env python
"""Embed a collection into clip-retrieval's layout (img_emb/, text_emb/, metadata/), resumably.

    python scripts/embed.py --model ViT-L-14::laion2b_s32b_b82k --input photos/ --out emb/
    python scripts/embed.py --model ViT-B-32 --input 'shards/{00000..00099}.tar' --out emb/
    python scripts/embed.py --model ViT-L-14 --input captions.parquet --out text_emb/    # text only
    python scripts/embed.py ... --ray [ADDRESS]          # one patched model per GPU of a Ray cluster

Run the same command again after a crash or a kill: finished shards are kept, the rest is embedded.
An output folder made with another model or other settings is refused. The summary (items, failures,
rate, GPU memory) goes to stdout, the progress bar to stderr, a JSON record of the run under
OUT/_clip_flash/runs/. Exit status: 0 done, 2 bad input/output/model (one clear message).
"""
from __future__ import annotations

import argparse
import logging
import shlex
import sys
from pathlib import Path
from typing import Optional, Sequence

# The script belongs to this checkout: import its clip_flash, not some other installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clip_flash.models.model_spec import ModelLoadError  # noqa: E402
from clip_flash.jobs import DEFAULT_SHARD_SIZE, OutputError, SourceError, embed  # noqa: E402


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="NAME (random init), NAME::TAG or NAME::/path/to/checkpoint")
    parser.add_argument("--input", required=True,
                        help="image folder, WebDataset tar(s) ('dir/{00000..00099}.tar'), or caption file "
                             "(.txt/.csv/.tsv/.parquet)")
    parser.add_argument("--out", required=True, type=Path, help="output folder (resumed if it exists)")
    parser.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    parser.add_argument("--precision", choices=("fp16", "bf16", "fp32"), default=None,
                        help="model precision (default fp16 on CUDA, fp32 on CPU)")
    parser.add_argument("--no-patch", dest="patch", action="store_false", help="run the stock OpenCLIP model")
    parser.add_argument("--pipeline", choices=("clip_flash", "stock"), default="clip_flash",
                        help="stock: OpenCLIP's PIL preprocess in a DataLoader + its tokenizer (implies --no-patch)")
    parser.add_argument("--decode", choices=("cpu", "gpu"), default="cpu",
                        help="cpu: exact (Pillow's pixels); gpu: nvJPEG, faster, not bit-exact")
    parser.add_argument("--batch-size", type=positive_int, default=None, help="default 256 (images), 4096 (text)")
    parser.add_argument("--shard-size", type=positive_int, default=DEFAULT_SHARD_SIZE,
                        help=f"inputs per output shard (default {DEFAULT_SHARD_SIZE}; a WebDataset tar is one shard)")
    parser.add_argument("--workers", type=positive_int, default=None,
                        help="decoding workers (default: every core) / stock: DataLoader workers (cores - 1)")
    parser.add_argument("--executor", choices=("auto", "native", "thread"), default="auto",
                        help="decoding: the native batch decoder (auto: where the extension is built) or Python "
                             "threads")
    parser.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false",
                        help="launch every image batch eager (default on CUDA: full batches replay a CUDA graph, "
                             "same rows)")
    parser.add_argument("--decode-threads", type=positive_int, default=None,
                        help="batches prepared at once ahead of the GPU (default 2)")
    parser.add_argument("--no-normalize", dest="normalize", action="store_false", help="keep raw embeddings")
    parser.add_argument("--out-dtype", choices=("float16", "float32"), default="float16")
    parser.add_argument("--no-captions", dest="captions", action="store_false", default=None,
                        help="ignore captions (.txt beside images, txt/json in tars)")
    parser.add_argument("--caption-column", default=None, help="CSV/parquet column of the captions")
    parser.add_argument("--repeat", type=positive_int, default=1,
                        help="embed the input list this many times (steady-state speed on a small folder)")
    parser.add_argument("--no-progress", dest="progress", action="store_false")
    parser.add_argument("--ray", nargs="?", const="auto", default=None, metavar="ADDRESS",
                        help="run on a Ray cluster, one model per GPU: ADDRESS (HOST:6379), or none for "
                             "RAY_ADDRESS, a running local cluster, or a new local Ray")
    parser.add_argument("--ray-workers", type=positive_int, default=None,
                        help="model actors (default: the cluster's GPUs, or 1 on a CPU-only cluster)")
    parser.add_argument("--ray-num-cpus", type=int, default=None, help="local Ray only: CPUs to start it with")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # A first fetch of a tag's weights can take minutes: say so when it starts.
    logging.getLogger("clip_flash.models.weights_fetch").setLevel(logging.INFO)
    arguments = list(sys.argv[1:] if argv is None else argv)
    command = "python scripts/embed.py " + " ".join(shlex.quote(arg) for arg in arguments)
    patch = args.patch and args.pipeline != "stock"
    options = dict(device=args.device, precision=args.precision, patch=patch, pipeline=args.pipeline,
                   decode=args.decode, batch_size=args.batch_size, shard_size=args.shard_size,
                   normalize=args.normalize, out_dtype=args.out_dtype, captions=args.captions,
                   caption_column=args.caption_column, workers=args.workers, executor=args.executor,
                   cuda_graphs=args.cuda_graphs, decode_threads=args.decode_threads, repeat=args.repeat,
                   progress=args.progress, command=command)
    try:
        if args.ray is not None:
            from clip_flash.jobs.ray_data import embed_with_ray

            if options["executor"] == "auto":
                options["executor"] = "thread"
            summary = embed_with_ray(args.input, args.out, args.model, address=args.ray,
                                     actors=args.ray_workers, num_cpus=args.ray_num_cpus, **options)
        else:
            summary = embed(args.input, args.out, args.model, **options)
    except (SourceError, OutputError, ModelLoadError, ValueError) as error:
        message = str(error)
        print(message if message.startswith("error:") else f"error: {message}", file=sys.stderr)
        return 2
    print(summary.format())
    return 0


if __name__ == "__main__":
    sys.exit(main())
