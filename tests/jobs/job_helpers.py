"""Helpers of the embedding-job tests: make small image folders, read a job's output back."""
from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Dict, List

import numpy as np

MODEL = "ViT-S-32"  # OpenCLIP's smallest ViT config (63M parameters): a dozen images take a second on 2 cores


def write_photos(folder: Path, count: int = 6, captions: bool = True, seed: int = 0) -> List[Path]:
    """Small images of the kinds a collection holds: RGB and grayscale JPEG, RGB and RGBA PNG, odd sizes."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(count):
        height, width = int(rng.integers(24, 90)), int(rng.integers(24, 90))
        # a smooth gradient plus noise: JPEG-like content, cheap to make
        ramp = np.linspace(0, 255, width)[None, :, None] * np.ones((height, 1, 3))
        pixels = np.clip(ramp * rng.random(3) + rng.normal(0, 20, (height, width, 3)), 0, 255).astype(np.uint8)
        image = Image.fromarray(pixels)
        kind = index % 4
        sub = folder / ("nested" if index % 3 == 2 else "")
        sub.mkdir(exist_ok=True)
        if kind == 0:
            path = sub / f"photo_{index:02d}.jpg"
            image.save(path, quality=90)
        elif kind == 1:
            path = sub / f"photo_{index:02d}.jpeg"
            image.convert("L").save(path, quality=85)
        elif kind == 2:
            path = sub / f"photo_{index:02d}.png"
            image.save(path)
        else:
            path = sub / f"photo_{index:02d}.png"
            rgba = image.convert("RGBA")
            rgba.putalpha(Image.fromarray(pixels[..., 0]))
            rgba.save(path)
        if captions:
            path.with_suffix(".txt").write_text(f"a photo number {index} of a {['cat', 'dog', 'tree'][index % 3]}")
        paths.append(path)
    return paths


def read_output(out: Path) -> Dict[str, object]:
    """Every shard of a job's output, concatenated in shard order, as embedding-reader pairs them."""
    import pyarrow.parquet as pq

    result: Dict[str, object] = {}
    for folder, pattern in (("img_emb", "*.npy"), ("text_emb", "*.npy"), ("metadata", "*.parquet")):
        files = sorted(glob.glob(os.path.join(out, folder, pattern)))
        result[folder + "_files"] = [os.path.basename(name) for name in files]
        if folder == "metadata":
            tables = [pq.read_table(name).to_pydict() for name in files]
            columns = tables[0] if tables else {}
            result["metadata"] = {key: sum((table[key] for table in tables), []) for key in columns}
        else:
            result[folder] = np.concatenate([np.load(name) for name in files]) if files else None
    failures = out / "failures.parquet"
    result["failures"] = pq.read_table(failures).to_pylist() if failures.exists() else []
    return result
