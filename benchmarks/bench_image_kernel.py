#!/usr/bin/env python
"""Time the image-resample CUDA kernel on a batch of real photos, per model input size.

For each size it packs --batch decoded photos (cycling through the folder) once, then reports CUDA-event
medians (three alternating blocks of --repeats calls, median block) of: the kernel alone on the uploaded
batch; the one non-blocking upload of the packed pinned buffer plus the kernel; and, with wall-clock and
a synchronize, the whole ``resample_batch`` from decoded uint8 tensors (host packing, upload, kernel).
It also checks every image of the batch against OpenCLIP's ``preprocess(pil)`` (float32 bit-exact, and
the --dtype output against the reference cast).

    python benchmarks/bench_image_kernel.py --photos .device/photos --json out.json --markdown out.md
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import List, Tuple

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from clip_flash.ops._extension import load_extension  # noqa: E402
from benchmarks.harness.results import parse_kernel_benchmark_args, write_microbenchmark  # noqa: E402
from benchmarks.harness.timing import alternating_median_ms  # noqa: E402
from clip_flash.inputs.image.transform_spec import spec_from_preprocess  # noqa: E402
from clip_flash.ops.image_resample import (  # noqa: E402
    META_FIELDS, _value_table, plan_batch, resample_batch,
)

PHOTO_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")


def load_photos(folder: Path, count: int) -> Tuple[List[Image.Image], List[np.ndarray]]:
    """``count`` decoded photos (cycling through the folder): PIL images in their own mode ("L" or "RGB";
    other modes converted to RGB, as this benchmark is about the resize) and their uint8 (H, W, C) pixels."""
    paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in PHOTO_SUFFIXES)
    if not paths:
        raise SystemExit(f"no photos ({', '.join(PHOTO_SUFFIXES)}) in {folder}")
    images, arrays = [], []
    for index in range(count):
        with Image.open(paths[index % len(paths)]) as opened:
            image = opened.convert("RGB") if opened.mode not in ("L", "RGB") else opened.copy()
        array = np.asarray(image)
        images.append(image)
        arrays.append(array[:, :, None] if array.ndim == 2 else array)
    return images, arrays


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=Path, default=Path(".device/photos"))
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--sizes", nargs="+", type=int, default=[224, 256, 336, 384])
    parser.add_argument("--modes", nargs="+", choices=["shortest", "longest", "squash"], default=["shortest", "squash"])
    parser.add_argument("--interpolation", choices=["bicubic", "bilinear"], default="bicubic")
    parser.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], default="float16")
    args = parse_kernel_benchmark_args(parser)
    extension = load_extension()
    if extension is None:
        parser.error("needs the compiled extension clip_flash._C (build it from csrc/ first)")
    from open_clip.transform import image_transform

    dtype = getattr(torch, args.dtype)
    device = torch.device("cuda")
    pil_images, arrays = load_photos(args.photos, args.batch)
    tensors = [torch.from_numpy(a) for a in arrays]
    sizes = [a.shape for a in arrays]
    megapixels = sum(h * w for h, w, _ in sizes) / 1e6
    header = ("| size | mode | batch | kernel ms | kernel img/s | upload+kernel ms | resample_batch ms | "
              "resample_batch img/s | upload MB | vertical-first | fp32 exact | dtype exact |")
    lines, rows = [header, "|" + "---|" * 12], []
    print(header, flush=True)
    for size in args.sizes:
        for mode in args.modes:
            preprocess = image_transform(size, is_train=False, resize_mode=mode, interpolation=args.interpolation)
            spec = spec_from_preprocess(preprocess)
            plan = plan_batch(sizes, spec)
            host = plan.allocate_host(pin=True)
            for index, tensor in enumerate(tensors):
                plan.pixel_slot(host, index).copy_(tensor)
            on_device = host.to(device)
            n = len(arrays)
            meta = on_device[: plan.meta.nbytes].view(torch.int64).view(n, len(META_FIELDS))
            tables = on_device[plan.tables_at: plan.tables_at + plan.tables.nbytes].view(torch.int32)
            pixels = on_device[plan.pixels_at:]
            out = torch.empty((n, 3, size, size), dtype=dtype, device=device)
            lut = _value_table(spec, dtype, device)

            def kernel() -> None:
                extension.image_resample(pixels, meta, tables, lut, out)

            def upload_and_kernel() -> None:
                uploaded = host.to(device, non_blocking=True)
                extension.image_resample(uploaded[plan.pixels_at:], meta, tables, lut, out)

            for _ in range(3):
                kernel()
                upload_and_kernel()
            ms = alternating_median_ms({"kernel": kernel, "upload": upload_and_kernel}, args.repeats)

            full = []
            for _ in range(max(5, args.repeats // 3)):
                torch.cuda.synchronize()
                began = time.perf_counter()
                resample_batch(tensors, spec, device, dtype)
                torch.cuda.synchronize()
                full.append((time.perf_counter() - began) * 1e3)
            full_ms = statistics.median(full)

            reference = torch.stack([preprocess(image) for image in pil_images])
            got32 = resample_batch(tensors, spec, device, torch.float32).cpu()
            exact32 = sum(torch.equal(a, b) for a, b in zip(got32, reference))
            kernel()
            exact_dtype = sum(torch.equal(a, b) for a, b in zip(out.cpu(), reference.to(dtype)))
            vertical_first = int(plan.meta[:, META_FIELDS.index("vertical_first")].sum())
            row = dict(size=size, mode=mode, interpolation=args.interpolation, dtype=args.dtype, batch=n,
                       source_megapixels=megapixels, kernel_ms=ms["kernel"], kernel_images_per_s=n / ms["kernel"] * 1e3,
                       upload_and_kernel_ms=ms["upload"], resample_batch_ms=full_ms,
                       resample_batch_images_per_s=n / full_ms * 1e3, upload_megabytes=plan.total_bytes / 1e6,
                       vertical_first_images=vertical_first, fp32_bit_exact_images=exact32,
                       dtype_exact_images=exact_dtype)
            rows.append(row)
            line = (f"| {size} | {mode} | {n} | {ms['kernel']:.3f} | {row['kernel_images_per_s']:,.0f} | "
                    f"{ms['upload']:.3f} | {full_ms:.2f} | {row['resample_batch_images_per_s']:,.0f} | "
                    f"{row['upload_megabytes']:.1f} | {vertical_first} | {exact32}/{n} | {exact_dtype}/{n} |")
            lines.append(line)
            print(line, flush=True)
    write_microbenchmark(
        args.json, args.markdown,
        f"Image-resample kernel on {len(arrays)} photos from {args.photos} ({megapixels:.1f} source megapixels, "
        f"{args.interpolation}, output {args.dtype}). kernel / upload+kernel: CUDA events, median of {args.repeats} "
        "calls per block, median of 3 alternating blocks; resample_batch: wall clock with synchronize, median, "
        "from decoded uint8 tensors (host packing into pinned memory, one upload, the kernel). Exact: images "
        "equal to OpenCLIP's preprocess(pil) (fp32) and to its cast to the output dtype.", lines, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
