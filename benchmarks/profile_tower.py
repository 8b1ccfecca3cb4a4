"""Share of GPU kernel time by kind, stock vs patched, for one encoder call (torch.profiler).

    python benchmarks/profile_tower.py --model ViT-L-14 --tower image --batch 256 --markdown results/profile.md
"""
from __future__ import annotations

import argparse
import copy
import subprocess
import sys
import threading
import time
from collections import defaultdict

import open_clip
import torch
from torch.profiler import ProfilerActivity, profile

import clip_flash

# Kernel-name fragments -> kind; first match wins, so specific kinds come before generic ones.
KINDS = [
    ("clip_flash fused LN/residual", ("layer_norm_packed", "layer_norm_scalar")),
    ("clip_flash bias+activation", ("bias_act",)),
    ("clip_flash residual add", ("residual_add_kernel", "residual_add_packed", "residual_add_scalar")),
    # cuDNN's patch-embedding conv (and its layout conversion) before "attention", which matches "cudnn".
    ("patch embedding conv (cuDNN)", ("s16816fprop", "nchwtonhwc", "nhwctonchw", "implicit_gemm", "convolve")),
    ("attention", ("fmha", "flash", "attention", "cudnn", "sdpa")),
    ("GEMM", ("gemm", "xmma", "cutlass", "cublas", "matmul", "sm90_", "nvjet")),
    ("LayerNorm (torch)", ("layer_norm", "LayerNorm")),
    ("GELU / activation", ("gelu", "sigmoid")),
    ("dtype casts / copies", ("copy", "cast", "to_copy", "convert")),
    ("adds / other elementwise", ("elementwise", "add", "mul")),
]


def kind_of(name: str) -> str:
    lowered = name.lower()
    for kind, fragments in KINDS:
        if any(fragment.lower() in lowered for fragment in fragments):
            return kind
    return "other"


def kernel_times(fn, calls: int = 3):
    """(ms per call by kind, ms per call by kernel name)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    by_kind, by_name = defaultdict(float), defaultdict(float)
    for event in prof.key_averages():
        device_us = getattr(event, "self_device_time_total", 0) or getattr(event, "self_cuda_time_total", 0)
        if device_us > 0:
            by_kind[kind_of(event.key)] += device_us / calls / 1000
            by_name[event.key] += device_us / calls / 1000
    return by_kind, by_name


def _sample_clocks(samples: list, stop: threading.Event) -> None:
    query = ["nvidia-smi", f"--id={torch.cuda.current_device()}", "--query-gpu=clocks.sm,power.draw",
             "--format=csv,noheader,nounits"]
    while not stop.is_set():
        try:
            sm_mhz, watts = subprocess.run(query, capture_output=True, text=True, timeout=5).stdout.split(",")[:2]
            samples.append((float(sm_mhz), float(watts)))
        except (OSError, ValueError, subprocess.SubprocessError):
            return  # no nvidia-smi here: the clock column says n/a
        stop.wait(0.05)


def _mean_times(runs):
    """Average (by kind, by name) over profiler runs."""
    merged = []
    for index in range(2):
        total = defaultdict(float)
        for run in runs:
            for key, ms in run[index].items():
                total[key] += ms / len(runs)
        merged.append(total)
    return tuple(merged)


def wall_ms(fn, calls: int = 20):
    """(median wall ms per call, each call synchronized; mean SM MHz and watts meanwhile, or None)."""
    samples, stop = [], threading.Event()
    sampler = threading.Thread(target=_sample_clocks, args=(samples, stop), daemon=True)
    sampler.start()
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    stop.set()
    sampler.join()
    clocks = tuple(sum(column) / len(samples) for column in zip(*samples)) if samples else None
    return sorted(times)[len(times) // 2], clocks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ViT-L-14")
    parser.add_argument("--tower", choices=("image", "text"), default="image")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16")
    parser.add_argument("--markdown", help="also write the summary here")
    args = parser.parse_args()
    torch.manual_seed(0)
    stock = open_clip.create_model(args.model, pretrained=None, precision=args.dtype, device="cuda").eval()
    patched = copy.deepcopy(stock)
    clip_flash.patch(patched)
    dtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    if args.tower == "image":
        size = stock.visual.image_size
        size = size[0] if isinstance(size, (tuple, list)) else size
        inputs = torch.randn(args.batch, 3, size, size, device="cuda", dtype=dtype)
        encode = lambda m: m.encode_image(inputs)
    else:
        tokenizer = open_clip.get_tokenizer(args.model)
        prompts = [t(c) for c in open_clip.IMAGENET_CLASSNAMES for t in open_clip.OPENAI_IMAGENET_TEMPLATES]
        inputs = tokenizer(prompts[:: max(1, len(prompts) // args.batch)][: args.batch]).cuda()
        encode = lambda m: m.encode_text(inputs)
    lines = [f"Kernel time per call, {args.model} {args.tower} batch {args.batch} {args.dtype} on "
             f"`{torch.cuda.get_device_name()}` (torch {torch.__version__}; torch.profiler, mean of 3 calls per run, runs in ABBA order averaged)", ""]  # noqa: E501
    with torch.inference_mode():
        models = {"stock": stock, "patched": patched}
        # ABBA order, averaged, so clock drift over the run (the GPU heating up) hits both sides alike.
        runs = {name: [] for name in models}
        for name in ("stock", "patched", "patched", "stock"):
            runs[name].append(kernel_times(lambda m=models[name]: encode(m)))
        results = {name: _mean_times(pair) for name, pair in runs.items()}
        walls = {name: wall_ms(lambda m=m: encode(m)) for name, m in models.items()}
    kinds = sorted({k for by_kind, _ in results.values() for k in by_kind},
                   key=lambda k: -results["stock"][0].get(k, 0) - results["patched"][0].get(k, 0))
    totals = {name: sum(by_kind.values()) for name, (by_kind, _) in results.items()}
    lines.append("| kind | stock ms | stock % | patched ms | patched % |")
    lines.append("|---|---|---|---|---|")
    for kind in kinds:
        cells = []
        for name in ("stock", "patched"):
            ms = results[name][0].get(kind, 0.0)
            cells += [f"{ms:.2f}", f"{100 * ms / totals[name]:.1f}"]
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    lines.append(f"| total kernel time | {totals['stock']:.2f} | 100 | {totals['patched']:.2f} | 100 |")
    lines.append(f"| wall time per call (no profiler; > kernel time: launch-bound) | {walls['stock'][0]:.2f} | | "
                 f"{walls['patched'][0]:.2f} | |")
    clocks = [walls[name][1] for name in ("stock", "patched")]
    if all(clocks):
        lines.append(f"| mean SM clock MHz / board watts during those calls | {clocks[0][0]:.0f} / {clocks[0][1]:.0f} | | "  # noqa: E501
                     f"{clocks[1][0]:.0f} / {clocks[1][1]:.0f} | |")
    for side in ("stock", "patched"):
        lines += ["", f"Top {side} kernels:", ""]
        for name, ms in sorted(results[side][1].items(), key=lambda kv: -kv[1])[:12]:
            lines.append(f"- {ms:7.2f} ms  [{kind_of(name)}] {name[:110]}")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as handle:
            handle.write(f"<!-- command: {' '.join(sys.argv)} -->\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
