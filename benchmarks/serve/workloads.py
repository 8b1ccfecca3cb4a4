"""The request mixes the serve bench offers: real photos as 640x480 JPEGs, web-style captions.

- ``image-raw``: one JPEG a request, the file itself as the body of ``POST /v1/embeddings/image``.
- ``image-uri``: one JPEG a request as a ``data:image/jpeg;base64,...`` string on ``POST /v1/embeddings``.
- ``caption``: one caption a request on ``POST /v1/embeddings``.
- ``captions64``: 64 captions a request on ``POST /v1/embeddings``.
- ``mix``: each arrival one of the above, drawn with ``MIX_WEIGHTS`` (mostly single items, a few 64-caption
  batches), as a search service taking both queries and uploads sees.

JSON requests ask for ``"encoding_format": "base64"``, as the official ``openai`` client does by default.
The 640x480 JPEGs are made at bench start from real photos (``/work/shared/tools/photo-set DIR`` output, or
scikit-image's sample photos when no folder is given): centre-cropped to 4:3, resized, baseline JPEG
quality 90 with 4:2:0 chroma, the common web encoding.
"""
from __future__ import annotations

import base64
import io
import json
import random
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .load_generator import Request, Workload

WORKLOAD_NAMES = ("image-raw", "image-uri", "caption", "captions64", "mix")
MIX_WEIGHTS = {"image-raw": 0.40, "image-uri": 0.10, "caption": 0.45, "captions64": 0.05}
REQUEST_IMAGE_SIZE = (640, 480)
CAPTIONS_PER_BATCH = 64
PHOTO_SUFFIXES = (".jpg", ".jpeg", ".png")


def _photos(photo_dir: Optional[Path], count: int) -> List["object"]:
    """Up to ``count`` RGB photos as PIL images, from ``photo_dir`` or scikit-image's samples."""
    from PIL import Image

    if photo_dir is not None:
        files = sorted(p for p in Path(photo_dir).iterdir() if p.suffix.lower() in PHOTO_SUFFIXES)
        if not files:
            raise FileNotFoundError(f"no .jpg/.png photos in {photo_dir}")
        step = max(1, len(files) // count)
        return [Image.open(path).convert("RGB") for path in files[::step][:count]]
    try:
        from skimage import data
    except ImportError:
        raise FileNotFoundError(
            "no photos: pass --photos DIR (make one with /work/shared/tools/photo-set DIR) or install scikit-image"
        ) from None
    names = ["astronaut", "coffee", "chelsea", "rocket", "motorcycle_left", "hubble_deep_field", "retina", "cat"]
    photos = []
    for name in names:
        loader = getattr(data, name, None)
        if loader is None:
            continue
        try:
            array = loader()
        except Exception:  # a sample that needs a download (pooch) is skipped
            continue
        photos.append(Image.fromarray(array if array.ndim == 3 else array[..., None].repeat(3, -1)).convert("RGB"))
        if len(photos) == count:
            break
    return photos


def request_jpegs(photo_dir: Optional[Path], count: int = 8) -> List[bytes]:
    """``count`` distinct 640x480 baseline JPEGs (q90, 4:2:0), centre crops of real photos."""
    from PIL import Image

    width, height = REQUEST_IMAGE_SIZE
    jpegs = []
    for photo in _photos(photo_dir, count):
        scale = max(width / photo.width, height / photo.height)
        crop_w, crop_h = round(width / scale), round(height / scale)
        left, top = (photo.width - crop_w) // 2, (photo.height - crop_h) // 2
        framed = photo.crop((left, top, left + crop_w, top + crop_h)).resize((width, height), Image.LANCZOS)
        buffer = io.BytesIO()
        framed.save(buffer, format="JPEG", quality=90, subsampling=2, progressive=False)
        jpegs.append(buffer.getvalue())
    if not jpegs:
        raise FileNotFoundError("no usable photos for the request JPEG")
    return jpegs


def request_captions(count: int, seed: int = 0) -> List[str]:
    """Alt-text-like captions (the benchmark harness's ``web_captions``: 10-60 tokens, some non-ASCII)."""
    from benchmarks.harness.captions import web_captions

    return web_captions(count, seed)


def _json_request(path: str, model: str, inputs: Sequence[str], extra: Optional[Dict[str, object]] = None) -> bytes:
    body = {"model": model, "input": list(inputs), "encoding_format": "base64"}
    body.update(extra or {})
    return json.dumps(body).encode()


def build_workloads(model: str, jpegs: Sequence[bytes], captions: Sequence[str],
                    embeddings_path: str = "/v1/embeddings", image_path: Optional[str] = "/v1/embeddings/image",
                    names: Sequence[str] = WORKLOAD_NAMES,
                    json_extra: Optional[Dict[str, object]] = None, seed: int = 0) -> Dict[str, Workload]:
    """The workloads a server can take: ``image-raw`` only where it has a raw-image route (``image_path``)."""
    rng = random.Random(seed)
    uris = ["data:image/jpeg;base64," + base64.b64encode(jpeg).decode() for jpeg in jpegs]
    singles = {
        "image-uri": Workload("image-uri", "one 640x480 JPEG a request, as a data URI on " + embeddings_path,
                              [Request(embeddings_path, _json_request(embeddings_path, model, [uri], json_extra),
                                       "application/json", 1) for uri in uris]),
        "caption": Workload("caption", "one caption a request on " + embeddings_path,
                            [Request(embeddings_path, _json_request(embeddings_path, model, [text], json_extra),
                                     "application/json", 1) for text in captions]),
        "captions64": Workload("captions64", f"{CAPTIONS_PER_BATCH} captions a request on {embeddings_path}",
                               [Request(embeddings_path,
                                        _json_request(embeddings_path, model,
                                                      rng.choices(list(captions), k=CAPTIONS_PER_BATCH), json_extra),
                                        "application/json", CAPTIONS_PER_BATCH) for _ in range(64)]),
    }
    if image_path:
        singles["image-raw"] = Workload("image-raw", "one 640x480 JPEG a request, raw bytes on " + image_path,
                                        [Request(image_path, jpeg, "image/jpeg", 1) for jpeg in jpegs])
    workloads = {name: singles[name] for name in names if name in singles}
    if "mix" in names and all(name in singles for name in MIX_WEIGHTS):
        requests, weights = [], []
        for name, share in MIX_WEIGHTS.items():
            members = singles[name].requests
            requests += members
            weights += [share / len(members)] * len(members)
        shares = ", ".join(f"{share:.0%} {name}" for name, share in MIX_WEIGHTS.items())
        workloads["mix"] = Workload("mix", f"each request drawn at random: {shares}", requests, weights)
    return workloads
