"""nvJPEG decoding of a batch's JPEGs (``decode="gpu"``): fast, and NOT Pillow's pixels.

nvJPEG upsamples 4:2:0 / 4:2:2 chroma by repetition where libjpeg-turbo (Pillow's decoder) interpolates,
so its pixels differ from Pillow's by up to tens of levels on real photos. With ``chroma="libjpeg"``
the chroma is recovered and re-upsampled the libjpeg-turbo way (:mod:`.jpeg_chroma`), which brings it
close (not exact). ``benchmarks/image_fast_path_deviation.py`` measures both against the exact path.
Whatever nvJPEG refuses, and any group whose chroma step fails, goes back to the exact CPU decode.

torchvision's batched call takes the GIL back about once per image, so beside a busy Python thread it
crawls; it runs on the thread that launches the model, between launches. Where clip_flash's own call runs
(:mod:`.nvjpeg_packed`: the hardware decoder, straight into the resize kernel's layout, ahead on a decoding
thread), this module decodes only what that one leaves.

Streams: torchvision allocates nvJPEG's outputs from the caching allocator on the *current* stream but
writes them from its own decoder stream, which does not wait for the current one. Memory that kernels
still queued on the current stream read (freed by Python, reusable there in stream order) can thus be
overwritten before they run (under a busy GPU: the chroma step's int64 index planes, say, then read out of
bounds). So the decode runs with a private stream current, on which nothing else
runs, and its outputs are recorded on the stream that uses them next, so that their memory is handed out
again only after that work is done. That next stream is a second private one, for the copies and the
chroma step: :meth:`ImagePreprocessor.prepare` queues all of it, then makes its own stream wait for it
(:meth:`GpuDecoded.hand_over`).
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .image_decoding import EncodedJpeg, describe_error
from .jpeg_chroma import SUBSAMPLING, refine_nearest_chroma

logger = logging.getLogger(__name__)


CHROMA = ("nvjpeg", "libjpeg")
Decoded = Tuple[List[Tuple[EncodedJpeg, torch.Tensor]], List[Tuple[EncodedJpeg, str]]]  # (pixels, refused)
# Images refined together: bounds the chroma step's temporaries (a few int64 / float32 planes per image).
REFINE_CHUNK = 32


@dataclass
class GpuDecoded:
    """nvJPEG's work for one batch, queued on the fast path's streams; :meth:`hand_over` gives it to the
    current stream."""

    decoded: List[Tuple[EncodedJpeg, torch.Tensor]]  # (item, (H, W, C) uint8 on the device)
    refused: List[Tuple[EncodedJpeg, str]]           # what nvJPEG or the chroma step could not do, and why
    ready: "torch.cuda.Event"                        # recorded after the last of that work
    device: torch.device
    packed: Optional[Tuple[Any, torch.Tensor]] = None  # the decoded pixels laid out for the resize kernel

    def hand_over(self, use_packed: bool = False
                  ) -> Tuple[List[Tuple[EncodedJpeg, torch.Tensor]], List[Tuple[EncodedJpeg, str]]]:
        """Make the current stream wait for the work, and keep the memory it will read until it is done:
        the packed buffer when ``use_packed`` (the per-image pixels were read only by the packing, on the
        work stream), else each image's pixels."""
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(self.ready)
        if use_packed:
            self.packed[1].record_stream(stream)
        else:
            for _, pixels in self.decoded:
                pixels.record_stream(stream)
        return self.decoded, self.refused


def decode_jpegs_on_gpu(items: List[EncodedJpeg], device: torch.device, chroma: str = "nvjpeg",
                        pack: Optional[Callable[[List[torch.Tensor]], Tuple[Any, torch.Tensor]]] = None) -> GpuDecoded:
    """Queue torchvision's nvJPEG decode of ``items`` and, with
    ``chroma="libjpeg"``, the chroma step on the fast path's own streams, without waiting for it on the
    caller's stream. ``pack`` (the resize's packing) also lays the pixels out for the resize kernel there,
    when all of them were decoded; if it fails, the pixels are handed over unpacked."""
    work = work_stream(device)
    packed = None
    with torch.cuda.stream(work):
        decoded, refused = _decode_with_torchvision(items, device) if items else ([], [])
        if chroma == "libjpeg":
            decoded, failed = _refine_chroma(decoded)
            refused = refused + failed
        if pack is not None and decoded and not refused:
            try:
                packed = pack([pixels for _, pixels in decoded])
            except Exception as error:  # noqa: BLE001 - prepare() then resizes them image by image
                logger.debug("packing nvJPEG's pixels failed (%s); prepare() packs them", describe_error(error))
        ready = torch.cuda.Event()
        ready.record(work)
    return GpuDecoded(decoded, refused, ready, device, packed)


def _refine_chroma(decoded: List[Tuple[EncodedJpeg, torch.Tensor]]
                   ) -> Tuple[List[Tuple[EncodedJpeg, torch.Tensor]], List[Tuple[EncodedJpeg, str]]]:
    """libjpeg-style chroma for the subsampled colour JPEGs, batched over images of one size and sampling
    (at most ``REFINE_CHUNK`` at a time); a chunk that fails (e.g. out of memory) is returned as refused,
    with the reason, for the exact CPU decode."""
    groups: Dict[Tuple, List[int]] = {}
    for position, (item, pixels) in enumerate(decoded):
        if item.channels == 3 and item.jpeg_sampling in SUBSAMPLING:
            groups.setdefault((tuple(pixels.shape), item.jpeg_sampling), []).append(position)
    result: List = list(decoded)
    refused: List[Tuple[EncodedJpeg, str]] = []
    for (_, sampling), positions in groups.items():
        for first in range(0, len(positions), REFINE_CHUNK):
            chunk = positions[first:first + REFINE_CHUNK]
            try:
                refined = refine_nearest_chroma(torch.stack([decoded[position][1] for position in chunk]), sampling)
            except Exception as error:  # noqa: BLE001 - these images go to the exact CPU decode instead
                reason = f"chroma step failed ({describe_error(error)})"
                logger.warning("%s for %d image(s); decoding them on the CPU", reason, len(chunk))
                for position in chunk:
                    refused.append((decoded[position][0], reason))
                    result[position] = None
                continue
            for row, position in enumerate(chunk):
                result[position] = (decoded[position][0], refined[row])
    return [pair for pair in result if pair is not None], refused


def work_stream(device: torch.device) -> "torch.cuda.Stream":
    """The fast path's stream for the work on decoded pixels (chroma, packing) of ``device``."""
    return _stream("work", device)


@functools.lru_cache(maxsize=None)
def _stream(role: str, device: torch.device) -> "torch.cuda.Stream":
    """The fast path's two streams per device: ``decoder``, current while torchvision's nvJPEG allocates its
    outputs and nothing else (see the module docstring); ``work``, for everything after it."""
    return torch.cuda.Stream(device)


def _nvjpeg(encoded: "torch.Tensor | Sequence[torch.Tensor]", device: torch.device):
    """``decode_jpeg(encoded, device=device)`` whose outputs never alias memory the caller's stream still uses."""
    from torchvision.io import decode_jpeg

    caller = torch.cuda.current_stream(device)
    private = _stream("decoder", device)
    with torch.cuda.stream(private):
        outputs = decode_jpeg(encoded, device=device)
    caller.wait_stream(private)  # torchvision made ``private`` wait for its decoder: the pixels are ready
    for output in outputs if isinstance(outputs, list) else [outputs]:
        output.record_stream(caller)
    return outputs


def _decode_with_torchvision(items: List[EncodedJpeg], device: torch.device) -> Decoded:
    try:
        outputs = _nvjpeg([item.encoded for item in items], device)
        pairs = list(zip(items, outputs))
    except Exception as error:  # noqa: BLE001 - one bad file fails the batched call: retry one by one
        logger.debug("batched nvJPEG decode failed (%s); decoding one by one", describe_error(error))
        pairs, refused = [], []
        for item in items:
            try:
                pairs.append((item, _nvjpeg(item.encoded, device)))
            except Exception as single_error:  # noqa: BLE001
                refused.append((item, describe_error(single_error)))
        return _check_shapes(pairs, refused)
    return _check_shapes(pairs, [])


def _check_shapes(pairs, refused):
    """Pixels whose shape is the one Pillow's header gave, as (H, W, C); the others refused."""
    decoded = []
    for item, pixels in pairs:
        expected = (item.channels, *item.image_size)
        if tuple(pixels.shape) != expected:
            refused.append((item, f"nvJPEG gave shape {tuple(pixels.shape)}, Pillow's header says {expected}"))
        else:  # torchvision's nvJPEG writes planes; the resize reads HWC
            decoded.append((item, pixels.permute(1, 2, 0).contiguous()))
    return decoded, refused
