"""What a job's inputs need that the model does not, made in a thread while the model loads.

Building the image preparer runs the image path's once-a-process checks (the decoders' pixels and the resize's
arithmetic against Pillow's, each cached for the process) and imports its modules; building the tokenizer reads
OpenCLIP's vocabulary and makes the fast BPE tables. None of it needs the model, and all of it was paid after the
model had loaded, inside the time the job's rate counts. Made beside the load, it costs the job only the GIL it
takes from the load's Python. A failure here is not reported: the job makes the same things again after the load
and raises what fails then.
"""
from __future__ import annotations

import logging
from typing import Any, Optional

from .beside_load import BesideModelLoad

logger = logging.getLogger(__name__)


class InputsAhead(BesideModelLoad):
    """Started before the model load; :meth:`tokenizer` (or :meth:`join`) before the inputs are built."""

    thread_name = "clip_flash-inputs-ahead"

    def __init__(self, model_name: str, images: bool, captions: bool) -> None:
        super().__init__()
        self.model_name = model_name
        self.images = images
        self.captions = captions
        self._tokenizer: Optional[Any] = None

    def tokenizer(self) -> Optional[Any]:
        """The model's tokenizer (``clip_flash.get_tokenizer``), made ahead; None where captions were not asked for
        or it failed."""
        self.join()
        return self._tokenizer

    def _work(self) -> None:
        if self.images:
            from clip_flash.inputs.image import preprocessor  # noqa: F401 - the image path's modules
            from clip_flash.inputs.image.decoder_check import decoder_agreement
            from clip_flash.inputs.image.image_resize import pillow_mismatch

            decoder_agreement()
            pillow_mismatch()
        if self.captions:
            from clip_flash.inputs.text.tokenizer import get_tokenizer

            self._tokenizer = get_tokenizer(self.model_name)

    def _failed(self, error: Exception) -> None:
        # made again after the load, where the same failure is raised
        logger.debug("inputs made ahead of the model failed (%s); they are made after the load", error)
