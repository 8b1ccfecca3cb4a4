#!/usr/bin/env python
"""Captions to embeddings, end to end: strings in, fp16 embeddings in host memory out, captions/s.

    PYTHONPATH=. python benchmarks/bench_caption_embedding.py --model ViT-L-14 \
        --json $OUT/captions-e2e.json --markdown $OUT/captions-e2e.md

Pipelines, each over the same caption list (ImageNet prompts and web-style captions, see
``benchmarks.harness.captions``):
- ``stock``: OpenCLIP's tokenizer + the stock model (what a user has today);
- ``patched``: OpenCLIP's tokenizer + the clip_flash-patched model;
- ``clip_flash``: clip_flash.get_tokenizer + the patched model.
A producer thread tokenizes batch i+1 (and pins it) while the GPU encodes batch i; embeddings are copied
back to pinned host memory. The clock runs from the first string to the last embedding on the host. Each
pipeline first runs ``--warmup-batches`` untimed batches (CUDA, cuBLAS, the tokenizers' word caches).
Also reported: the encoder alone on pre-tokenized batches, and each tokenizer alone, on this host's cores.
"""
from __future__ import annotations

import argparse
import os
import queue
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def tokenized_batches(tokenizer: Callable, captions: Sequence[str], batch: int, pin: bool):
    """Yields pinned token batches, produced by a background thread two batches ahead."""
    out: "queue.Queue" = queue.Queue(maxsize=2)
    error: List[BaseException] = []

    def produce() -> None:
        try:
            for start in range(0, len(captions), batch):
                tokens = tokenizer(list(captions[start:start + batch]))
                out.put(tokens.pin_memory() if pin else tokens)
        except BaseException as caught:  # re-raised in the consumer
            error.append(caught)
        finally:
            out.put(None)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    while True:
        tokens = out.get()
        if tokens is None:
            break
        yield tokens
    thread.join()
    if error:
        raise error[0]


def embed_captions(tokenizer: Callable, encode: Callable, captions: Sequence[str], batch: int,
                   device: torch.device, width: int, host_ids: bool = False) -> torch.Tensor:
    """All captions' embeddings in (pinned) host memory, fp16. ``host_ids``: ``encode`` takes the pinned
    host ids itself (a patched text tower: it reads the lengths there instead of syncing the device)."""
    pin = device.type == "cuda"
    result = torch.empty((len(captions), width), dtype=torch.float16, pin_memory=pin)
    start = 0
    with torch.inference_mode():
        for tokens in tokenized_batches(tokenizer, captions, batch, pin):
            embeddings = encode(tokens if host_ids else tokens.to(device, non_blocking=True))
            result[start:start + len(tokens)].copy_(embeddings, non_blocking=True)
            start += len(tokens)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="ViT-L-14")
    parser.add_argument("--captions", type=int, default=65536, help="captions per caption set and pipeline")
    parser.add_argument("--stock-captions", type=int, default=8192,
                        help="captions for the two pipelines with OpenCLIP's tokenizer (slower)")
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--warmup-batches", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="fp16", choices=("fp16", "bf16", "fp32"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--cuda-graphs", action="store_true", help="patched model through clip_flash.GraphedEncoder")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args(argv)

    import copy

    import open_clip

    import clip_flash
    from benchmarks.harness.captions import CAPTION_SETS
    from clip_flash.models.model_spec import load_model, parse_model_spec
    from benchmarks.harness.results import markdown_table, write_microbenchmark

    device = torch.device(args.device)
    loaded = load_model(parse_model_spec(args.model), device, args.dtype)
    stock_model = loaded.model
    patched_model = copy.deepcopy(stock_model)
    clip_flash.patch(patched_model)
    patched_encode = patched_model.encode_text
    if args.cuda_graphs:
        patched_encode = clip_flash.GraphedEncoder(patched_model, batch_sizes=[args.batch]).encode_text
    openclip_tok = open_clip.get_tokenizer(args.model)
    fast_tok = clip_flash.get_tokenizer(args.model)
    width = patched_model.encode_text(openclip_tok(["a"]).to(device)).shape[-1]
    from clip_flash.patching.text_fast_path import takes_host_token_ids
    host_ids = device.type == "cuda" and takes_host_token_ids(patched_model) and not args.cuda_graphs
    pipelines: Dict[str, tuple] = {
        "stock": (openclip_tok, stock_model.encode_text, args.stock_captions, False),
        "patched": (openclip_tok, patched_encode, args.stock_captions, host_ids),
        "clip_flash": (fast_tok, patched_encode, args.captions, host_ids),
    }
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    rows = []
    for set_name, make in CAPTION_SETS.items():
        captions = make(max(args.captions, args.stock_captions), 0)
        embeddings = {}
        for name, (tokenizer, encode, count, host) in pipelines.items():
            texts = captions[:count]
            embed_captions(tokenizer, encode, texts[:args.warmup_batches * args.batch], args.batch, device, width,
                           host)
            seconds = []
            for _ in range(args.repeats):
                started = time.perf_counter()
                embeddings[name] = embed_captions(tokenizer, encode, texts, args.batch, device, width, host)
                seconds.append(time.perf_counter() - started)
            rows.append({"caption_set": set_name, "pipeline": name, "captions": count,
                         "captions_per_s": count / statistics.median(seconds), "seconds": seconds})
        # Same ids on both tokenizers, so the patched pipelines agree on the captions both embedded.
        shared = min(args.captions, args.stock_captions)
        same = torch.equal(embeddings["patched"][:shared], embeddings["clip_flash"][:shared])
        for row in rows[-3:]:
            row["clip_flash_equals_patched_embeddings"] = same
        # Components alone: encoder on pre-tokenized batches; each tokenizer.
        host_tokens = fast_tok(captions[:args.batch])
        encoder_inputs = {"pre-tokenized, ids on the device": host_tokens.to(device)}
        if host_ids:
            encoder_inputs["pre-tokenized, pinned host ids"] = host_tokens.pin_memory()
        for label, tokens in encoder_inputs.items():
            with torch.inference_mode():
                for _ in range(3):
                    patched_encode(tokens)
                torch.cuda.synchronize(device) if device.type == "cuda" else None
                started = time.perf_counter()
                for _ in range(20):
                    patched_encode(tokens)
                torch.cuda.synchronize(device) if device.type == "cuda" else None
            rows.append({"caption_set": set_name, "pipeline": f"patched encoder alone ({label})",
                         "captions": 20 * args.batch,
                         "captions_per_s": 20 * args.batch / (time.perf_counter() - started)})
        tokenizer_rates = {}
        for name, tokenizer in (("openclip", openclip_tok), ("clip_flash", fast_tok)):
            texts = captions[:args.stock_captions]
            started = time.perf_counter()
            tokenizer(texts)
            tokenizer_rates[name] = len(texts) / (time.perf_counter() - started)
        for name, rate in tokenizer_rates.items():
            rows.append({"caption_set": set_name, "pipeline": f"{name} tokenizer alone (warm)",
                         "captions": args.stock_captions, "captions_per_s": rate})

    table = markdown_table(("captions", "pipeline", "captions timed", "captions/s", "same embeddings"), [
        (row["caption_set"], row["pipeline"], str(row["captions"]), f"{row['captions_per_s']:,.0f}",
         str(row.get("clip_flash_equals_patched_embeddings", "")))
        for row in rows])
    print(table)
    title = (f"Captions to embeddings end to end, `{args.model}` {args.dtype} random-init weights, batches of "
             f"{args.batch}{' through CUDA graphs' if args.cuda_graphs else ''}: strings in, fp16 embeddings in "
             f"pinned host memory out, tokenizing overlapped with encoding (one producer thread), median of "
             f"{args.repeats} passes after {args.warmup_batches} warm-up batches; host: {cores} usable cores.")
    write_microbenchmark(args.json, args.markdown, title, table.splitlines(), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
