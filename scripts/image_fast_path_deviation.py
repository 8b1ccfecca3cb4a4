#!/usr/bin/env python
"""How far the opt-in fast path (``decode="gpu"``: nvJPEG) is from the exact one, on real photos.

    python scripts/image_fast_path_deviation.py --photos .device/photos --json out.json --markdown out.md

Per JPEG of the folder: the decoded pixels (nvJPEG vs libjpeg-turbo, which are Pillow's), the model
inputs (``ImagePreprocessor(decode="gpu")`` vs the exact one, in 8-bit levels: |difference| x std x 255),
and the embeddings of each model (cosine between the two paths' embeddings of the same photo).
Random-init weights unless a checkpoint is given (``NAME::/path``); the cosine of trained weights
can differ.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import clip_flash  # noqa: E402
from clip_flash.benchmark import results  # noqa: E402
from clip_flash.benchmark.model_spec import load_model, parse_model_spec  # noqa: E402


def summary(values: List[float]) -> Dict[str, float]:
    ordered = sorted(values)
    return {"median": statistics.median(ordered), "p99": ordered[int(0.99 * (len(ordered) - 1))],
            "max": ordered[-1], "min": ordered[0], "mean": statistics.fmean(ordered)}


def decoded_pixel_deviation(paths: List[Path], device: torch.device) -> Dict[str, Any]:
    """nvJPEG vs torchvision's CPU decode (libjpeg-turbo: Pillow's pixels) of the same bytes."""
    from torchvision.io import decode_jpeg, read_file

    max_diff, differing, mean_diff = [], [], []
    for path in paths:
        data = read_file(str(path))
        exact = decode_jpeg(data).to(device).int()
        fast = decode_jpeg(data, device=device).int()
        diff = (exact - fast).abs()
        max_diff.append(diff.max().item())
        differing.append(100.0 * (diff > 0).float().mean().item())
        mean_diff.append(diff.float().mean().item())
    return {"images": len(paths), "max_abs_levels": summary(max_diff),
            "percent_pixels_differing": summary(differing), "mean_abs_levels": summary(mean_diff)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--photos", type=Path, required=True)
    parser.add_argument("--models", nargs="+", default=["ViT-B-32", "ViT-L-14"])
    parser.add_argument("--dtype", default="fp16", choices=("fp16", "bf16", "fp32"))
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("error: needs a CUDA GPU (nvJPEG)")
    device = torch.device("cuda")
    paths = sorted(path for path in args.photos.iterdir() if path.suffix.lower() in (".jpg", ".jpeg"))
    decode = decoded_pixel_deviation(paths, device)
    rows: List[Dict[str, Any]] = [{"step": "decode (nvJPEG vs libjpeg-turbo)", **decode}]
    lines = ["| model | step | images | median | p99 | max | note |", "|---|---|---|---|---|---|---|"]
    d = decode["max_abs_levels"]
    lines.append(f"| - | decoded pixels: max abs diff per image (levels) | {len(paths)} | {d['median']:.0f} | "
                 f"{d['p99']:.0f} | {d['max']:.0f} | pixels differing per image: median "
                 f"{decode['percent_pixels_differing']['median']:.1f}% |")
    for spec_text in args.models:
        loaded = load_model(parse_model_spec(spec_text), device, args.dtype)
        model = loaded.model
        clip_flash.patch(model)
        std = torch.tensor(loaded.preprocess.transforms[-1].std, device=device).view(1, 3, 1, 1)
        level_diff: List[float] = []
        mean_level_diff: List[float] = []
        cosines: List[float] = []
        with clip_flash.ImagePreprocessor(loaded.preprocess, device=device, dtype=torch.float32) as exact, \
                clip_flash.ImagePreprocessor(loaded.preprocess, device=device, dtype=torch.float32,
                                             decode="gpu") as fast, torch.inference_mode():
            for start in range(0, len(paths), args.batch):
                chunk = paths[start:start + args.batch]
                a, b = exact(chunk), fast(chunk)
                assert a.indices == b.indices, "the two paths read different files"
                levels = (a.pixels - b.pixels).abs() * std * 255
                level_diff += levels.amax(dim=(1, 2, 3)).tolist()
                mean_level_diff += levels.mean(dim=(1, 2, 3)).tolist()
                ea = model.encode_image(a.pixels.to(loaded.dtype)).float()
                eb = model.encode_image(b.pixels.to(loaded.dtype)).float()
                cosines += F.cosine_similarity(ea, eb, dim=-1).tolist()
        inputs, cos = summary(level_diff), summary(cosines)
        rows.append({"model": spec_text, "model_input_max_abs_levels": inputs,
                     "model_input_mean_abs_levels": summary(mean_level_diff), "embedding_cosine": cos})
        lines.append(f"| {spec_text} | model input: max abs diff per image (levels) | {len(level_diff)} | "
                     f"{inputs['median']:.1f} | {inputs['p99']:.1f} | {inputs['max']:.1f} | mean abs diff "
                     f"median {statistics.median(mean_level_diff):.2f} levels |")
        lines.append(f"| {spec_text} | embedding cosine, fast vs exact | {len(cosines)} | {cos['median']:.5f} | "
                     f"- | min {cos['min']:.5f} | mean {cos['mean']:.5f}; {loaded.spec.weights_note.strip()} |")
        del model
        torch.cuda.empty_cache()
    title = (f"decode='gpu' (nvJPEG) against the exact path on {len(paths)} JPEGs of {args.photos}, "
             f"{args.dtype} models, patched.")
    print(title + "\n\n" + "\n".join(lines))
    results.write_microbenchmark(args.json, args.markdown, title, lines, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
