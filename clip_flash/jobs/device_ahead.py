"""The device's first uses of a job's image run, made on stand-ins while the model loads.

A process's first image batch pays once for what any later one finds ready: CUDA loads each kernel on its first
launch, cuBLAS and the attention library set themselves up on their first calls, and every GEMM shape the encoder
meets for the first time loads the kernel chosen for it. The run's device warm-up (:mod:`.warm_up`) pays the
first of these on one row after the model has loaded, and the first full batch pays for its shapes; measured on
an H100 host in fresh processes, the image path's first synthetic batch took 0.13-0.15 s (a second preparer's
0.013-0.017 s), the encoder's first row 0.14-0.22 s (0.06 s after a few library calls) and ViT-L-14's first batch
of 256 0.19-0.20 s against 0.09 s for the next
(``benchmarks/results/h100/device_first_uses_400c074/first_uses_probe/``).

None of it needs the model's weights: it is kernels and libraries, loaded once a process. So
:class:`DeviceFirstUses` makes those calls while the model loads, on stand-ins of the same shapes: a vision tower
of the model's own configuration with one block (zero weights, in the job's precision, patched as the model
is), run on a full batch and on one row, and a preparer of the model's input size on the warm-up's synthetic
images. The run's warm-up then finds them done. Only the kernels are shared with the run, never a value, and the
stand-ins draw nothing from torch's random number generator (the load's random-init weights come from it).

Some of what the encoder's first calls make is kept per thread: PyTorch caches cuDNN's attention plans per thread,
one for each shape. Measured on an H100 host
(``benchmarks/results/h100/first_batch_start_c9dadb4/first_uses_per_thread/``), ViT-L-14's one-block stand-in at
batch 256 run first on one thread took 1.3 s, then 2 ms there, but 136 ms on the first call from the main thread and
82 ms from a third thread: cuDNN's attention alone, 83 ms on the first call of a thread after another thread had
made its plan. So the stand-in tower runs on the thread that will launch the run's batches
(:meth:`DeviceFirstUses.make_encoder_first_uses`, while the model loads on a thread of its own: see
:func:`~.beside_load.load_beside`); the image path's first uses, which the run's own threads meet, are made on this
object's thread.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, Optional

import torch

from .beside_load import BesideModelLoad

logger = logging.getLogger(__name__)

# The steps, as DeviceFirstUses.steps names them; the run's warm-up skips its own step for each one made.
VISION_TOWER_STEP = "vision tower of one block"
IMAGE_PATH_STEP = "image path on synthetic images"


class DeviceFirstUses(BesideModelLoad):
    """The device's first uses of an image run on ``device`` (CUDA), on stand-ins. :meth:`make_encoder_first_uses`
    runs the model's vision tower with one block, patched where the job patches, on ``batch_size`` rows and on
    one, on the calling thread: call it on the thread that will launch the run's batches, while the model loads.
    ``start()`` makes, on a thread of its own (``image_path``), a preparer of the model's input size prepare the
    synthetic images, decoded by ``decode_threads`` threads at once, once ``inputs`` (the
    :class:`~clip_flash.jobs.inputs_ahead.InputsAhead` making the image checks) is done; ``join()`` it before the
    run. ``steps``: each step's end, seconds from ``start()``. A failure is logged, not raised: without it the
    run's warm-up and first batch make the same calls."""

    thread_name = "clip_flash-device-first-uses"

    def __init__(self, model_name: str, device: torch.device, precision: str, batch_size: int, patch: bool,
                 image_path: bool, decode_threads: int, inputs: Optional[BesideModelLoad] = None) -> None:
        super().__init__()
        self.model_name = model_name
        self.device = torch.device(device)
        self.precision = precision
        self.batch_size = max(1, batch_size)
        self.patch = patch
        self.image_path = image_path
        self.decode_threads = max(1, decode_threads)
        self.inputs = inputs
        self.steps: Dict[str, float] = {}
        self._started = time.perf_counter()

    def start(self) -> "DeviceFirstUses":
        self._started = time.perf_counter()
        return super().start()

    def make_encoder_first_uses(self) -> None:
        """The stand-in tower on the calling thread (the run's launching thread), on the run's full batch and on
        one row; a failure is logged, not raised."""
        try:
            config = vision_config(self.model_name)
            if config is not None:
                with torch.cuda.device(self.device):
                    self._vision_tower(*config)
                self.steps[VISION_TOWER_STEP] = time.perf_counter() - self._started
        except Exception as error:  # noqa: BLE001 - an optimisation: the run's warm-up makes these calls without it
            self._failed(error)

    def join(self) -> None:
        """Wait for the image path's first uses; log what was made. ``seconds``: from ``start()`` to the last
        step's end."""
        super().join()
        self.seconds = max([self.seconds, *self.steps.values()])
        logger.info("the device's first uses made beside the model load (%s)",
                    ", ".join(f"{step} by {seconds:.2f} s" for step, seconds in self.steps.items()) or "none")

    def _work(self) -> None:
        if not self.image_path:
            return
        config = vision_config(self.model_name)
        with torch.cuda.device(self.device):
            if self.inputs is not None:
                self.inputs.join()  # its image checks are the preparer's: made once, not twice at once
            self._image_path(config[1]["image_size"] if config is not None else 224)
            self.steps[IMAGE_PATH_STEP] = time.perf_counter() - self._started

    def _vision_tower(self, embed_dim: int, vision: Dict[str, Any], quick_gelu: bool) -> None:
        tower = stand_in_vision_tower(embed_dim, vision, quick_gelu, self.precision, self.device, self.patch)
        size = _pair(vision["image_size"])
        from ..backends import choosing_for_replay

        # the attention kernels the run's image batches choose (jobs.pipeline: as a capture does)
        with torch.inference_mode(), choosing_for_replay():
            for rows in (self.batch_size, 1):  # the run's full batches' shapes, and the warm-up's one row
                tower(torch.zeros((rows, 3, *size), dtype=_input_dtype(self.precision), device=self.device))
        torch.cuda.current_stream(self.device).synchronize()

    def _image_path(self, image_size: Any) -> None:
        import open_clip

        from ..inputs.image.preprocessor import ImagePreprocessor
        from .warm_up import prepare_synthetic_images

        transform = open_clip.image_transform(_pair(image_size), is_train=False)
        with ImagePreprocessor(transform, device=self.device, dtype=_input_dtype(self.precision)) as preparer:
            with torch.inference_mode():
                prepare_synthetic_images(preparer, torch.cuda.Stream(self.device), self.decode_threads)

    def _failed(self, error: Exception) -> None:
        # an optimisation: without it the run's warm-up and first batch make these calls
        logger.warning("the device's first uses were not made beside the model load: %s", error)



def vision_config(model_name: str) -> "tuple | None":
    """(embed_dim, vision_cfg, quick_gelu) from OpenCLIP's own configuration of ``model_name``, where it is one of
    OpenCLIP's built-in models with its own vision transformer; None for others (a hub model's configuration is
    a download; a timm tower is built another way), whose first uses the run's warm-up makes."""
    import open_clip

    if model_name not in open_clip.list_models():
        return None
    config = open_clip.get_model_config(model_name)
    vision = dict((config or {}).get("vision_cfg") or {})
    if not vision or vision.get("timm_model_name") or "embed_dim" not in config:
        return None
    vision.setdefault("image_size", 224)
    return config["embed_dim"], vision, bool(config.get("quick_gelu", False))


def stand_in_vision_tower(embed_dim: int, vision: Dict[str, Any], quick_gelu: bool, precision: str,
                          device: torch.device, patch: bool) -> torch.nn.Module:
    """OpenCLIP's vision tower of ``vision`` (see :func:`vision_config`) with one block, in ``precision`` on
    ``device`` as OpenCLIP casts the model, patched where ``patch``: the model's kernels at its shapes, in eval
    mode. Its weights are zeros: it is built on the meta device, so it draws nothing from torch's random number
    generator, which the model load beside it seeds and draws its random-init weights from."""
    from open_clip.model import _build_vision_tower, convert_weights_to_lp, get_cast_dtype

    with torch.device("meta"):
        tower = _build_vision_tower(embed_dim, dict(vision, layers=1), quick_gelu, get_cast_dtype(precision))
    tower = tower.to_empty(device=torch.device(device))
    if precision in ("fp16", "bf16"):  # OpenCLIP's mixed precision: its low-precision weights, fp32 elsewhere
        convert_weights_to_lp(tower, dtype=_input_dtype(precision))
    with torch.no_grad():
        for tensor in list(tower.parameters()) + list(tower.buffers()):
            tensor.zero_()
    tower.eval()
    if patch:
        import clip_flash

        clip_flash.patch(tower)
    return tower


def _pair(size: Any) -> "tuple":
    return tuple(size) if isinstance(size, (tuple, list)) else (int(size), int(size))


def _input_dtype(precision: str) -> torch.dtype:
    from clip_flash.models.model_spec import PRECISION_DTYPES

    return PRECISION_DTYPES[precision]
