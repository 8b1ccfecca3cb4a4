"""The encoder-alone batch rate the serve bench compares a server's throughput with.

    python -m benchmarks.serve.encoder_rate --model ViT-L-14 --precision fp16 --out encoder.json

Run as its own process (the server under test is not running then), on the same host and GPU: load the
model through ``clip_flash.models.load_model``, time ``encode_image`` on a batch of 256 images and
``encode_text`` on 1,024 web-style captions (tokenized by the model's own tokenizer) with CUDA events, stock
first, then after ``clip_flash.patch`` (what the clip_flash server runs). Pixels are standard-normal, the
scale of preprocessed images: the encoder's time does not depend on them. Writes a JSON record with the
environment (GPU, versions, git revision). On a CPU the batches can be made small and ``perf_counter``
times them, for a smoke run.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch


def _median_seconds(function: Callable[[], object], device: torch.device, repeats: int) -> float:
    if device.type == "cuda":
        from clip_flash.ops.cuda_timing import median_cuda_ms

        function()  # one more warm call: the first after a patch may still calibrate kernels
        return median_cuda_ms(function, repeats) / 1000.0
    function()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        function()
        times.append(time.perf_counter() - began)
    return sorted(times)[len(times) // 2]


def measure(model_spec: str, device: torch.device, precision: str, image_batch: int, text_batch: int,
            repeats: int) -> Dict[str, object]:
    """Images/s and captions/s of the stock and the patched encoder at the given batch sizes."""
    import clip_flash
    from benchmarks.harness.captions import web_captions
    from clip_flash.models import load_model, parse_model_spec

    loaded = load_model(parse_model_spec(model_spec), device, precision)
    model = loaded.model
    height, width = loaded.image_size
    images = torch.randn((image_batch, 3, height, width), generator=torch.Generator().manual_seed(0))
    images = images.to(device, loaded.dtype)
    tokens = loaded.tokenizer()(web_captions(text_batch, seed=0)).to(device)
    rates: Dict[str, object] = {"model": loaded.spec.text, "weights": loaded.spec.weights_note or loaded.spec.weights,
                                "precision": precision, "image_batch": image_batch, "text_batch": text_batch,
                                "repeats": repeats, "timing": "CUDA events, median" if device.type == "cuda"
                                else "perf_counter, median"}
    with torch.inference_mode():
        for side in ("stock", "patched"):
            if side == "patched":
                rates["patch_report"] = str(clip_flash.patch(model))
            image_s = _median_seconds(lambda: model.encode_image(images), device, repeats)
            text_s = _median_seconds(lambda: model.encode_text(tokens), device, repeats)
            rates[side] = {"image_batch_ms": image_s * 1000, "images_per_s": image_batch / image_s,
                           "text_batch_ms": text_s * 1000, "captions_per_s": text_batch / text_s}
    return rates


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ViT-L-14")
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--image-batch", type=int, default=256)
    parser.add_argument("--text-batch", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--environment-only", action="store_true", help="write the environment record only")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    from clip_flash.environment import environment_record

    device = torch.device(args.device)
    record = environment_record(device, "python -m benchmarks.serve.encoder_rate " + shlex.join(sys.argv[1:]))
    if not args.environment_only:
        record["encoder"] = measure(args.model, device, args.precision, args.image_batch, args.text_batch,
                                    args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
