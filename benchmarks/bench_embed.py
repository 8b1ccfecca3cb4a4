#!/usr/bin/env python
"""End-to-end speed of the embedding job on a GPU, files or strings to committed ``.npy``, beside stock.

    python benchmarks/bench_embed.py --photos .device/photos --results benchmarks/results/h100/embed

For each case it runs ``clip_flash.embed`` (the job ``scripts/embed.py`` runs) into a scratch folder:

- ViT-B-32 and ViT-L-14 images from ``--photos`` (the list repeated to reach a steady state): the exact
  path (``decode="cpu"``), the fast path (``decode="gpu"``), and stock OpenCLIP (PIL ``preprocess`` in a
  ``DataLoader`` with the machine's cores minus one as workers, OpenCLIP's tokenizer, unpatched model);
- ViT-L-14 captions from a caption file (ImageNet class names x templates), clip_flash vs stock;
- the patched encoder alone (batch 256, random pixels / tokens already on the GPU, CUDA events), the
  ceiling each end-to-end rate is compared with, measured after a model's image jobs: its calls would make the
  encoder's first uses (kernels, libraries, cuDNN's per-thread attention plans) for the job, which a user's
  script meets in a fresh process.

``--cases`` picks the image jobs run after stock, in order (``exact-native-eager`` is the exact job with
``cuda_graphs=False``); name two cases alternately to compare them.

Rates are inputs per second: after the run's first shard (the steady rate), over the whole run (the
pipeline's wall time; on CUDA it begins with the device half of the warm-up, :mod:`clip_flash.jobs.warm_up`,
beside the first reads), from the model loaded to the end (the decoder's start, the warm-up and the run: what
the job costs beyond loading its model), and with all of the setup. Beside them: the model load's and the
warm-up's seconds, the first batch's from the model loaded, and the page-locked host blocks the run had to make;
the number of CPU cores that fed them is recorded. The embeddings of each clip_flash run are compared with the
stock run of the same inputs (cosine, max |diff|).
Writes ``embed_bench.json`` and ``embed_bench.md`` under ``--results``.
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import open_clip  # noqa: E402,F401 - imported at the top, as a user's script does
import torch  # noqa: E402

import clip_flash  # noqa: E402
from clip_flash.models.model_spec import load_model, parse_model_spec  # noqa: E402
from benchmarks.harness.results import environment_record, markdown_table  # noqa: E402
from benchmarks.harness.timing import synchronize  # noqa: E402
from benchmarks.harness.workloads import caption_prompts  # noqa: E402
from clip_flash.jobs.job import DEFAULT_TEXT_BATCH  # noqa: E402
from clip_flash.environment import usable_cores  # noqa: E402

CAPTION_SHARD = 32768  # captions per shard of the caption jobs: a steady rate over several shards of 8 batches

# name -> (pipeline, decode, executor, CUDA graphs)
IMAGE_CASES = {"stock": ("stock", "cpu", "thread", False),
               "exact-threads": ("clip_flash", "cpu", "thread", True),
               "exact-native": ("clip_flash", "cpu", "native", True),
               "exact-native-eager": ("clip_flash", "cpu", "native", False),
               "gpu-decode": ("clip_flash", "gpu", "native", True)}
DEFAULT_CASES = ("exact-native", "gpu-decode")

COLUMNS = ("model", "inputs", "pipeline", "items", "failures", "items/s (steady)", "items/s (whole run)",
           "items/s (after the model load)", "items/s (with setup)", "model load s", "warm-up s",
           "first batch s after the load", "pinned blocks made (MiB, s)",
           "x stock", "after the load, of encoder-only", "GPU peak MiB",
           "cos vs stock (min)", "max abs diff vs stock")


def encoder_only_rates(model_name: str, device: torch.device, precision: str, calls: int = 30) -> Dict[str, float]:
    """Items/s of the patched image encoder (batch 256) and text encoder (the job's text batch, ImageNet captions) on
    inputs already on the device, after warm-up, synchronized."""
    loaded = load_model(parse_model_spec(model_name), device, precision)
    clip_flash.patch(loaded.model)
    height, width = loaded.image_size
    pixels = torch.randn(256, 3, height, width, device=device, dtype=loaded.dtype)
    towers = {"image": (loaded.model.encode_image, pixels),
              "text": (loaded.model.encode_text,
                       loaded.tokenizer()(caption_prompts(DEFAULT_TEXT_BATCH, seed=0)).to(device))}
    rates = {}
    with torch.inference_mode():
        for tower, (encode, inputs) in towers.items():
            for _ in range(min(5, calls)):
                encode(inputs)
            synchronize(device)
            started = time.perf_counter()
            for _ in range(calls):
                encode(inputs)
            synchronize(device)
            rates[tower] = inputs.shape[0] * calls / (time.perf_counter() - started)
    del loaded, towers, pixels
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rates


def compare(out: Path, reference: Path) -> Dict[str, float]:
    """Min cosine and max |diff| between two job outputs of the same inputs (row-aligned)."""
    result: Dict[str, float] = {}
    for folder in ("img_emb", "text_emb"):
        ours = sorted((out / folder).glob("*.npy"))
        theirs = sorted((reference / folder).glob("*.npy"))
        if not ours or not theirs:
            continue
        a = np.concatenate([np.load(path) for path in ours]).astype(np.float32)
        b = np.concatenate([np.load(path) for path in theirs]).astype(np.float32)
        if a.shape != b.shape:
            result["shape_mismatch"] = 1.0
            continue
        cosine = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        result["cos_min"] = float(cosine.min())
        result["max_abs_diff"] = float(np.abs(a - b).max())
    return result


def run_case(scratch: Path, name: str, source: Any, model: str, pipeline: str, decode: str, repeat: int,
             shard_size: int, batch_size: Optional[int], device: torch.device,
             executor: str = "thread", cuda_graphs: bool = True, decode_threads: Optional[int] = None,
             exact_share: float = 0.0) -> Dict[str, Any]:
    out = scratch / name
    shutil.rmtree(out, ignore_errors=True)
    summary = clip_flash.embed(source, out, model, device=device, patch=pipeline != "stock", pipeline=pipeline,
                               decode=decode, executor=executor, cuda_graphs=cuda_graphs, repeat=repeat,
                               shard_size=shard_size, batch_size=batch_size, decode_threads=decode_threads,
                               exact_share=exact_share, progress=False)
    print(summary.format(), flush=True)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"name": name, "out": out, "summary": summary.to_dict()}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--photos", type=Path, required=True, help="folder of JPEG photos")
    parser.add_argument("--results", type=Path, required=True, help="where embed_bench.json/.md are written")
    parser.add_argument("--models", nargs="*", default=["ViT-B-32", "ViT-L-14"],
                        help="image jobs to run (none: only the caption job)")
    parser.add_argument("--repeat", nargs="+", type=int, default=[60, 20],
                        help="how many times the photo list is embedded, per model (default 60 for B-32, 20 for L-14)")
    parser.add_argument("--cases", nargs="+", choices=tuple(IMAGE_CASES)[1:], default=list(DEFAULT_CASES),
                        help="the image jobs run after stock, in this order (a case named twice runs twice: "
                             "alternate two to compare them)")
    parser.add_argument("--no-stock", action="store_true",
                        help="skip the stock image job (no x stock, no comparison with it): alternation runs")
    parser.add_argument("--captions", type=int, default=240_000, help="captions for the ViT-L-14 text job")
    parser.add_argument("--caption-model", default="ViT-L-14")
    parser.add_argument("--shard-size", type=int, default=2048)
    parser.add_argument("--scratch", type=Path, default=None, help="where the embeddings go (deleted after)")
    parser.add_argument("--device", default="cuda", help="cuda (the benchmark); cpu only to smoke-test the script")
    parser.add_argument("--encoder-calls", type=int, default=30, help="timed calls of the encoder-only ceiling")
    parser.add_argument("--decode-threads", type=int, default=None,
                        help="the image jobs' decode_threads (batches prepared at once; default: the job's)")
    parser.add_argument("--exact-share", type=float, default=0.0, help="the decode-gpu jobs' exact_share")
    args = parser.parse_args(argv)
    missing = [name for name in ("pyarrow", "tqdm", "tokenizers") if importlib.util.find_spec(name) is None]
    if missing:  # fail in a second, not after the first model load
        print(f"error: the job needs {', '.join(missing)} here (pip install {' '.join(missing)})", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA GPU here (use --device cpu only to smoke-test the script)", file=sys.stderr)
        return 2
    precision = "fp16" if device.type == "cuda" else "fp32"
    args.results.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="embed_bench_", dir=args.scratch))
    command = "python " + " ".join(shlex.quote(arg) for arg in [sys.argv[0], *(argv or sys.argv[1:])])
    rows: List[Dict[str, Any]] = []
    ceilings: Dict[str, Dict[str, float]] = {}
    try:
        repeats = dict(zip(args.models, args.repeat + [args.repeat[-1]] * len(args.models)))
        for model in args.models:
            done = []  # (case, its result), in the order run
            for count, case in enumerate(["stock"] * (not args.no_stock) + args.cases):
                pipeline, decode, executor, graphs = IMAGE_CASES[case]
                if decode == "gpu" and device.type != "cuda":
                    continue
                done.append((case, run_case(scratch, f"{model}-{case}-{count}", args.photos, model, pipeline, decode,
                                            repeats[model], args.shard_size, None, device, executor, graphs,
                                            args.decode_threads, args.exact_share)))
            ceilings[model] = encoder_only_rates(model, device, precision, calls=args.encoder_calls)
            stock = done[0][1] if not args.no_stock else None
            for case_name, case in done:
                pipeline, decode, executor, graphs = IMAGE_CASES[case_name]
                photos = case["summary"]["items"] // repeats[model]
                label = ("stock OpenCLIP (DataLoader)" if pipeline == "stock" else
                         f"clip_flash, exact, decode {'natively' if executor == 'native' else 'in Python threads'}"
                         if decode == "cpu" else "clip_flash, decode gpu, read natively")
                if decode == "gpu" and args.exact_share:  # the label compare_results.py matches runs by, as before
                    label += f", exact share {args.exact_share:.2f}"
                if pipeline != "stock" and not graphs:
                    label += ", no CUDA graphs"
                rows.append(_row(model, f"{photos} photos x {repeats[model]}", label, case, stock,
                                 ceilings[model]["image"], compare(case["out"], stock["out"]) if stock else {}))
            for _, case in done:
                shutil.rmtree(case["out"], ignore_errors=True)
        if args.captions:
            captions_file = scratch / "captions.txt"
            captions_file.write_text("\n".join(caption_prompts(args.captions, seed=0)) + "\n")
            if args.caption_model not in ceilings:
                ceilings[args.caption_model] = encoder_only_rates(args.caption_model, device, precision,
                                                                  calls=args.encoder_calls)
            ceiling = ceilings[args.caption_model]["text"]
            stock = run_case(scratch, "captions-stock", captions_file, args.caption_model, "stock", "cpu", 1,
                             CAPTION_SHARD, None, device)
            ours = run_case(scratch, "captions-clip_flash", captions_file, args.caption_model, "clip_flash", "cpu",
                            1, CAPTION_SHARD, None, device)  # the job's own text batch
            for case, label in ((stock, "stock OpenCLIP"), (ours, "clip_flash")):
                rows.append(_row(args.caption_model, f"{args.captions} ImageNet captions", label, case, stock,
                                 ceiling, compare(case["out"], stock["out"])))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    record = {**environment_record(device, command), "cpu_cores": usable_cores(), "encoder_only_items_per_s": ceilings,
              "rows": rows}
    (args.results / "embed_bench.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    table = markdown_table(COLUMNS, [[str(row[column]) for column in COLUMNS] for row in rows])
    env = record["clip_flash_environment"]
    text = (f"<!-- command: {command} -->\n<!-- git: {record['git_revision']} -->\n"
            f"Embedding job end to end (files or strings to committed .npy) on `{record['device_name']}`, "
            f"fed by {record['cpu_cores']} CPU cores (torch {env.get('torch')}, CUDA {env.get('cuda')}); {precision} "
            "random-init weights; steady = after the first shard of "
            f"{args.shard_size} inputs ({CAPTION_SHARD} for captions); encoder-only = patched encoder at batch 256 "
            f"({DEFAULT_TEXT_BATCH} for text, the job's batches) on inputs "
            "already on the GPU.\n\n" + table + "\n")
    (args.results / "embed_bench.md").write_text(text)
    print(text)
    return 0


def _maybe(value: Optional[float], form: str) -> str:
    return "n/a" if value is None else form.format(value)


def _row(model: str, inputs: str, pipeline: str, case: Dict[str, Any], stock: Optional[Dict[str, Any]], ceiling: float,
         versus_stock: Dict[str, float]) -> Dict[str, Any]:
    summary = case["summary"]
    steady = summary["steady_items_per_s"] or summary["items_per_s"]
    stock_steady = (stock["summary"]["steady_items_per_s"] or stock["summary"]["items_per_s"]) if stock else None
    same = case is stock
    after_load = summary.get("after_load_items_per_s")
    first_batch = None  # from the model loaded to the first batch's embeddings on the host
    if summary.get("first_batch_seconds") is not None and summary.get("model_load_seconds") is not None:
        first_batch = summary["setup_seconds"] - summary["model_load_seconds"] + summary["first_batch_seconds"]
    return {
        "model": model, "inputs": inputs, "pipeline": pipeline, "items": summary["items"],
        "failures": summary["failures"], "items/s (steady)": f"{steady:,.0f}",
        "items/s (whole run)": f"{summary['items_per_s']:,.0f}",
        "items/s (after the model load)": _maybe(after_load, "{:,.0f}"),
        "items/s (with setup)": _maybe(summary.get("job_items_per_s"), "{:,.0f}"),
        "model load s": _maybe(summary.get("model_load_seconds"), "{:.2f}"),
        "warm-up s": _maybe(summary.get("warm_up_seconds"), "{:.2f}"),
        "first batch s after the load": _maybe(first_batch, "{:.2f}"),
        "pinned blocks made (MiB, s)": (f"{summary['pinned_blocks_created']} "
                                        f"({summary.get('pinned_block_bytes', 0) / 2**20:,.0f}, "
                                        f"{summary['pinned_block_seconds']:.2f})"
                                        if summary.get("pinned_blocks_created") is not None else "n/a"),
        "x stock": f"{steady / stock_steady:.2f}" if stock_steady else "n/a",
        "after the load, of encoder-only": _maybe(after_load and after_load / ceiling * 100, "{:.1f}%")
                                           + f" of {ceiling:,.0f}",
        "GPU peak MiB": f"{summary['gpu_peak_mib']:,.0f}" if summary["gpu_peak_mib"] else "n/a",
        "cos vs stock (min)": ("-" if same or stock is None
                               else f"{versus_stock.get('cos_min', float('nan')):.5f}"),
        "max abs diff vs stock": ("-" if same or stock is None
                                  else f"{versus_stock.get('max_abs_diff', float('nan')):.2e}"),
        "summary": summary,
    }


if __name__ == "__main__":
    sys.exit(main())
