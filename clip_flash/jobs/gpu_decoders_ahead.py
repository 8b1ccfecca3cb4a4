"""nvJPEG's first calls for a ``decode="gpu"`` job, made while its model loads.

A ``decode="gpu"`` run's first batches are nvJPEG's first use in the process: its library's load, the hardware
decoder's states (one per batch decoding at once), the chroma kernels' first launches, and torchvision's own
nvJPEG decoder for the JPEGs the hardware route leaves (progressive, grayscale). Paid at the run's start, the
device warm-up (:mod:`.warm_up`) waits for each in turn: measured on two H100 hosts, ViT-B-32 over 57,600
photos, the warm-up took 1.27-1.96 s, most of it these two decoders' first calls, one after the other (a profile:
``benchmarks/results/h100/resize_ahead_6b11839/``). None of it depends on the model or its transform, so
:class:`GpuDecodersWarmUp` makes those calls on a synthetic photo in threads of its own while the model is
built, and the run's warm-up finds them done.
"""
from __future__ import annotations

import logging
import threading
from typing import List

import torch

from .beside_load import BesideModelLoad

logger = logging.getLogger(__name__)

# Any transform plans the layout the hardware decoder writes into; OpenCLIP's usual one.
_SPEC_ARGUMENTS = ((224, 224), "shortest", "bicubic", (0.48145466, 0.4578275, 0.40821073),
                   (0.26862954, 0.26130258, 0.27577711))
_CHROMA = "libjpeg"  # ImagePreprocessor's default gpu_chroma: its refinement kernels are loaded too


class GpuDecodersWarmUp(BesideModelLoad):
    """In a background thread: ``decoders`` hardware decodes at once of a synthetic 640x480 JPEG (each makes the
    decoder state a decoding thread of the run uses) and, beside them, torchvision's nvJPEG decode of a
    progressive one. ``start()`` it before the model load; ``join()`` before the run. A failure is logged, not
    raised: without it the run's warm-up makes the same calls."""

    thread_name = "clip_flash-gpu-decoders-ahead"

    def __init__(self, device: torch.device, decoders: int) -> None:
        super().__init__()
        self.device = torch.device(device)
        self.decoders = max(1, decoders)
        self.hardware_decoded = False

    def _work(self) -> None:
        from .warm_up import synthetic_images

        baseline, progressive = synthetic_images()[:2]
        torchvision_decode = threading.Thread(target=self._torchvision, args=(progressive,), daemon=True,
                                              name="clip_flash-torchvision-nvjpeg-ahead")
        torchvision_decode.start()
        together = threading.Barrier(self.decoders)
        results: List[bool] = []
        threads = [threading.Thread(target=self._hardware, args=(baseline, together, results), daemon=True,
                                    name=f"clip_flash-nvjpeg-ahead_{number}")
                   for number in range(self.decoders)]
        for thread in threads:
            thread.start()
        for thread in threads + [torchvision_decode]:
            thread.join()
        self.hardware_decoded = bool(results) and all(results)

    def _failed(self, error: Exception) -> None:
        # an optimisation: without it the run's warm-up makes these calls
        logger.warning("nvJPEG's first calls were not made ahead: %s", error)

    def _finished(self) -> None:
        logger.info("nvJPEG's decoders made ready in %.2f s, beside the model load (hardware decoder: %s)",
                    self.seconds, "yes" if self.hardware_decoded else "not here")

    def _hardware(self, encoded: bytes, together: threading.Barrier, results: List[bool]) -> None:
        try:
            from ..inputs.image.image_decoding import EncodedJpeg
            from ..inputs.image.jpeg_header import scan_jpeg_header
            from ..inputs.image.nvjpeg_packed import decode_into_layout
            from ..inputs.image.transform_spec import ImageTransformSpec

            header = scan_jpeg_header(encoded)  # what the CPU step reads of a JPEG it keeps for nvJPEG
            item = EncodedJpeg(0, torch.frombuffer(bytearray(encoded), dtype=torch.uint8),
                               (header.height, header.width), header.channels, header.sampling, header.progressive)
            together.wait(timeout=60)
            with torch.cuda.device(self.device):
                packed = decode_into_layout([item], self.device, ImageTransformSpec(*_SPEC_ARGUMENTS), _CHROMA,
                                            self.decoders)
                if packed is not None:
                    packed.ready.synchronize()
            results.append(packed is not None)
        except Exception as error:  # noqa: BLE001 - logged; the run's warm-up tries again
            together.abort()  # the other threads stop waiting for this one
            logger.debug("hardware JPEG decode ahead failed: %s", error)
            results.append(False)

    def _torchvision(self, encoded: bytes) -> None:
        from torchvision.io import decode_jpeg

        try:
            with torch.cuda.device(self.device):
                decode_jpeg(torch.frombuffer(bytearray(encoded), dtype=torch.uint8), device=self.device)
                torch.cuda.synchronize(self.device)
        except Exception as error:  # noqa: BLE001 - logged; the run's warm-up tries again
            logger.debug("torchvision's nvJPEG decode ahead failed: %s", error)
