"""The pipeline a job runs on its loaded model, and the image preparer and tokenizer that feed it.

:func:`make_runner` builds clip_flash's :class:`~.pipeline.EmbeddingPipeline` (or the stock baseline) for a loaded
model; :func:`build_inputs` its image preparer and tokenizer, which a job may have built already while the model
loaded (:mod:`.feed_ahead`); :func:`decoding_workers` says in the run record how the images were decoded.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

from .inputs_ahead import InputsAhead
from .pipeline import DEFAULT_DECODE_THREADS, EmbeddingPipeline
from .sources import Source

OUTPUT_DTYPES = {"float16": np.float16, "float32": np.float32}


def nvjpeg_decoders(decode_threads: Optional[int]) -> int:
    """The hardware decoder states a decode="gpu" job uses: one per decoding thread, up to nvJPEG's 8."""
    from clip_flash.inputs.image.preprocessor import MAX_NVJPEG_DECODERS

    return max(1, min(MAX_NVJPEG_DECODERS, decode_threads or DEFAULT_DECODE_THREADS))


def build_inputs(loaded: Any, source: Source, device: torch.device, decode: str, workers: Optional[int],
                 executor: str = "thread", decode_threads: int = DEFAULT_DECODE_THREADS,
                 exact_share: float = 0.0, ahead: Optional[InputsAhead] = None) -> Tuple[Any, Any]:
    """clip_flash's image preparer and tokenizer for this model (None for what the source lacks). With
    ``decode="gpu"``, one nvJPEG hardware decoder per decoding thread (up to nvJPEG's 8), so that no batch waits
    for another's decoder, and ``exact_share`` of each batch decoded exactly beside it. ``ahead``: what was made
    while the model loaded (joined here; the tokenizer taken from it where it was made)."""
    from clip_flash.inputs.image.preprocessor import ImagePreprocessor
    from clip_flash.inputs.text.tokenizer import get_tokenizer

    preparer = tokenizer = None
    base = ahead.tokenizer() if ahead is not None else None
    if source.has_images:
        preparer = ImagePreprocessor(loaded.preprocess, device=device, dtype=loaded.dtype, decode=decode,
                                     workers=workers, executor=executor,
                                     nvjpeg_decoders=nvjpeg_decoders(decode_threads),
                                     exact_share=exact_share)
    if source.has_captions:
        base = base if base is not None else get_tokenizer(loaded.spec.name)
        context = loaded.context_length
        tokenizer = lambda texts: base(texts, context_length=context)  # noqa: E731
    return preparer, tokenizer


def make_runner(loaded: Any, source: Source, device: torch.device, pipeline: str, decode: str, batch_size: int,
                normalize: bool, out_dtype: str, workers: Optional[int], executor: str = "thread",
                cuda_graphs: bool = True, decode_threads: Optional[int] = None,
                exact_share: float = 0.0, ahead: Optional[InputsAhead] = None,
                inputs: Optional[Tuple[Any, Any]] = None) -> Any:
    """The pipeline that runs the job: clip_flash's, or the stock baseline. ``ahead``: see :func:`build_inputs`.
    ``inputs``: (image preparer, tokenizer) made already (by :class:`~.feed_ahead.FeedAhead`)."""
    if pipeline == "stock":
        from .stock import StockPipeline

        return StockPipeline(loaded, device, source, batch_size=batch_size, normalize=normalize,
                             out_dtype=OUTPUT_DTYPES[out_dtype], workers=workers)
    decode_threads = decode_threads or DEFAULT_DECODE_THREADS
    preparer, tokenizer = inputs if inputs is not None else build_inputs(
        loaded, source, device, decode, workers, executor, decode_threads, exact_share, ahead)
    return EmbeddingPipeline(loaded.model, device, preparer, tokenizer, batch_size=batch_size, normalize=normalize,
                             out_dtype=OUTPUT_DTYPES[out_dtype], wds_key_column=source.kind == "webdataset",
                             cuda_graphs=cuda_graphs, decode_threads=decode_threads)


def decoding_workers(runner: Any) -> Dict[str, Any]:
    """How the run's images were decoded: the executor asked for, the workers, and whether natively."""
    preparer = getattr(runner, "image_preparer", None)
    if preparer is None or not hasattr(preparer, "executor"):
        return {}
    described = {"decode_executor": preparer.executor, "decode_workers": preparer.workers,
                 "decode_native": preparer.native}
    if getattr(preparer, "decoder", None) == "gpu":
        described["decode_exact_share"] = preparer.exact_share
    return described
