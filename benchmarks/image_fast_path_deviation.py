#!/usr/bin/env python
"""How far the opt-in fast path (``decode="gpu"``: nvJPEG) is from the exact one, on real photos.

    python benchmarks/image_fast_path_deviation.py --photos .device/photos --json out.json --markdown out.md

Both chroma modes of the fast path are measured: ``nvjpeg`` (nvJPEG's own RGB: chroma repeated per
block) and ``libjpeg`` (chroma recovered and upsampled the libjpeg-turbo way). Per JPEG of the folder:
the decoded pixels against libjpeg-turbo's (Pillow's), the model inputs against the exact path's in
8-bit levels (|difference| x std x 255), and each model's embeddings (cosine with the exact path's
embedding of the same photo). Random-init weights unless a checkpoint is given (``NAME::/path``).
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
from PIL import Image, JpegImagePlugin  # noqa: E402

import clip_flash  # noqa: E402
from benchmarks.harness import results  # noqa: E402
from clip_flash.models.model_spec import load_model, parse_model_spec  # noqa: E402
from clip_flash.inputs.image.jpeg_chroma import refine_nearest_chroma  # noqa: E402

CHROMA_MODES = ("nvjpeg", "libjpeg")


def summary(values: List[float]) -> Dict[str, float]:
    ordered = sorted(values)
    return {"median": statistics.median(ordered), "p99": ordered[int(0.99 * (len(ordered) - 1))],
            "max": ordered[-1], "min": ordered[0], "mean": statistics.fmean(ordered)}


def decoded_pixel_deviation(paths: List[Path], device: torch.device) -> Dict[str, Any]:
    """nvJPEG (raw, and with libjpeg-style chroma) vs torchvision's CPU decode (libjpeg-turbo: Pillow's
    pixels) of the same bytes."""
    from torchvision.io import decode_jpeg, read_file

    stats: Dict[str, Dict[str, List[float]]] = {mode: {"max": [], "differing": [], "mean": []}
                                                for mode in CHROMA_MODES}
    refused = []
    for path in paths:
        data = read_file(str(path))
        with Image.open(path) as image:
            sampling = JpegImagePlugin.get_sampling(image)
        try:
            exact = decode_jpeg(data).to(device).int()
            fast = decode_jpeg(data, device=device)
        except RuntimeError as error:  # e.g. CMYK, or a broken file: not part of the comparison
            refused.append(f"{path.name}: {error}")
            continue
        refined = refine_nearest_chroma(fast.permute(1, 2, 0), sampling).permute(2, 0, 1) if fast.shape[0] == 3 \
            else fast
        for mode, pixels in (("nvjpeg", fast), ("libjpeg", refined)):
            diff = (exact - pixels.int()).abs()
            stats[mode]["max"].append(diff.max().item())
            stats[mode]["differing"].append(100.0 * (diff > 0).float().mean().item())
            stats[mode]["mean"].append(diff.float().mean().item())
    return {"images": len(stats["nvjpeg"]["max"]), "refused": refused,
            **{mode: {"max_abs_levels": summary(values["max"]),
                      "percent_pixels_differing": summary(values["differing"]),
                      "mean_abs_levels": summary(values["mean"])} for mode, values in stats.items()}}


def model_deviation(spec_text: str, paths: List[Path], device: torch.device, dtype: str, batch: int
                    ) -> Dict[str, Any]:
    """Model inputs and embeddings of both fast modes against the exact path, for one model."""
    loaded = load_model(parse_model_spec(spec_text), device, dtype)
    model = loaded.model
    clip_flash.patch(model)
    std = torch.tensor(loaded.preprocess.transforms[-1].std, device=device).view(1, 3, 1, 1)
    found: Dict[str, Dict[str, List[float]]] = {mode: {"max": [], "mean": [], "cos": []} for mode in CHROMA_MODES}
    preps = {"exact": clip_flash.ImagePreprocessor(loaded.preprocess, device=device, dtype=torch.float32)}
    for mode in CHROMA_MODES:
        preps[mode] = clip_flash.ImagePreprocessor(loaded.preprocess, device=device, dtype=torch.float32,
                                                   decode="gpu", gpu_chroma=mode)
    with torch.inference_mode():
        for start in range(0, len(paths), batch):
            chunk = paths[start:start + batch]
            exact = preps["exact"](chunk)
            exact_embeddings = model.encode_image(exact.pixels.to(loaded.dtype)).float()
            for mode in CHROMA_MODES:
                fast = preps[mode](chunk)
                assert fast.indices == exact.indices, "the two paths read different files"
                levels = (exact.pixels - fast.pixels).abs() * std * 255
                found[mode]["max"] += levels.amax(dim=(1, 2, 3)).tolist()
                found[mode]["mean"] += levels.mean(dim=(1, 2, 3)).tolist()
                embeddings = model.encode_image(fast.pixels.to(loaded.dtype)).float()
                found[mode]["cos"] += F.cosine_similarity(exact_embeddings, embeddings, dim=-1).tolist()
    for prep in preps.values():
        prep.close()
    del model
    torch.cuda.empty_cache()
    return {"model": spec_text, "weights": loaded.spec.weights_note.strip(),
            **{mode: {"model_input_max_abs_levels": summary(values["max"]),
                      "model_input_mean_abs_levels": summary(values["mean"]),
                      "embedding_cosine": summary(values["cos"])} for mode, values in found.items()}}


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
    rows: List[Dict[str, Any]] = [{"step": "decode", **decode}]
    lines = ["| model | what (per image) | chroma | images | median | p99 | max | also |",
             "|---|---|---|---|---|---|---|---|"]
    for mode in CHROMA_MODES:
        d = decode[mode]["max_abs_levels"]
        lines.append(f"| - | decoded pixels vs libjpeg-turbo: max abs diff (levels) | {mode} | {decode['images']} | "
                     f"{d['median']:.0f} | {d['p99']:.0f} | {d['max']:.0f} | pixels differing: median "
                     f"{decode[mode]['percent_pixels_differing']['median']:.2f}%, mean abs diff median "
                     f"{decode[mode]['mean_abs_levels']['median']:.3f} |")
    for spec_text in args.models:
        row = model_deviation(spec_text, paths, device, args.dtype, args.batch)
        rows.append(row)
        for mode in CHROMA_MODES:
            inputs, cos = row[mode]["model_input_max_abs_levels"], row[mode]["embedding_cosine"]
            lines.append(f"| {spec_text} | model input vs exact: max abs diff (levels) | {mode} | {len(paths)} | "
                         f"{inputs['median']:.1f} | {inputs['p99']:.1f} | {inputs['max']:.1f} | mean abs diff median "
                         f"{row[mode]['model_input_mean_abs_levels']['median']:.3f} |")
            lines.append(f"| {spec_text} | embedding cosine vs exact | {mode} | {len(paths)} | {cos['median']:.6f} | "
                         f"- | min {cos['min']:.6f} | mean {cos['mean']:.6f}; {row['weights']} |")
    title = (f"decode='gpu' (nvJPEG; chroma as nvJPEG gives it, or recovered and upsampled the libjpeg-turbo way) "
             f"against the exact path on {len(paths)} JPEGs of {args.photos}, {args.dtype} patched models.")
    print(title + "\n\n" + "\n".join(lines))
    results.write_microbenchmark(args.json, args.markdown, title, lines, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
