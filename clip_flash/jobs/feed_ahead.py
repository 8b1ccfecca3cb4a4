"""The run's first batches, read and decoded while the model loads.

A run's inputs need the model's image transform and context length, not its weights, and OpenCLIP reads both from
configurations it has before it builds the model (:func:`clip_flash.models.inputs_before_load`). So the job builds
the image preparer and the tokenizer from those while the model loads, and starts the run's
:class:`~.batch_feed.BatchFeed` on them: by the time the model has loaded, the first batches (as many as the
feed's queue holds) are decoded and wait for the device, where the run would otherwise begin by waiting for its
first batch's files to be read and decoded.

Once the model has loaded, its own transform and context length are compared with the expected ones (the
transform as the exact path reads it, :func:`~clip_flash.inputs.image.transform_spec.spec_from_preprocess`): only
when they are the same does the run take the feed, so its rows are those of a preparer made from the loaded
model. Otherwise (or when anything here failed) the feed is dropped with what it decoded, and the run makes its
inputs as it would without it.
"""
from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any, Callable, Optional, Sequence, Tuple

import torch

from .batch_feed import BatchFeed, decode_batch
from .beside_load import BesideModelLoad

logger = logging.getLogger(__name__)


class FeedAhead(BesideModelLoad):
    """Builds the run's inputs from the model's expected ones and starts its feed of ``shards``, after the work in
    ``after`` (page-locked blocks, nvJPEG's first calls, the inputs' checks: what the feed's decoding uses) is
    done. ``build(expected)``: the preparer and tokenizer for a model with those inputs (the job's
    :func:`~.runner.build_inputs`); ``batch_size``, ``decode_threads``, ``prefetch_batches`` and ``pin_tokens`` as the
    run's pipeline has them. ``start()`` it before the model load; :meth:`take` after it."""

    thread_name = "clip_flash-feed-ahead"

    def __init__(self, spec: Any, shards: Sequence[Any], build: Callable[[Any], Tuple[Any, Any]], batch_size: int,
                 decode_threads: int, prefetch_batches: int, pin_tokens: bool,
                 after: Sequence[BesideModelLoad] = ()) -> None:
        super().__init__()
        self.spec = spec
        self.shards = shards
        self.build = build
        self.batch_size = batch_size
        self.decode_threads = decode_threads
        self.prefetch_batches = prefetch_batches
        self.pin_tokens = pin_tokens
        self.after = list(after)
        self.expected: Any = None
        self.inputs: Optional[Tuple[Any, Any]] = None  # (image preparer, tokenizer)
        self.feed: Optional[BatchFeed] = None

    def _work(self) -> None:
        from clip_flash.models import inputs_before_load

        expected = inputs_before_load(self.spec)
        if expected is None:
            return
        for work in self.after:
            work.join()
        preparer, tokenizer = self.build(expected)
        self.expected, self.inputs = expected, (preparer, tokenizer)
        if preparer is not None:
            preparer.start(batch_size=self.batch_size, wait=True)  # its decoding threads, before the first read
        self.feed = BatchFeed(self.shards, self.batch_size,
                              lambda items: decode_batch(preparer, tokenizer, self.pin_tokens, items),
                              self.decode_threads, self.prefetch_batches).start()

    def _failed(self, error: Exception) -> None:
        # the run makes its inputs after the load, where a real failure is raised
        logger.info("the run's first batches were not decoded beside the model load: %s", error)

    def take(self, loaded: Any) -> Optional[Tuple[Any, Any, BatchFeed]]:
        """(preparer, tokenizer, started feed) when the loaded model's inputs are the expected ones; else None,
        with this feed closed and its preparer's threads let go."""
        self.join()
        if self.feed is not None and same_inputs(self.expected, loaded):
            (preparer, tokenizer), feed = self.inputs, self.feed
            self.inputs = self.feed = None  # the run's now: close() lets nothing go
            return preparer, tokenizer, feed
        if self.feed is not None:
            logger.info("the model's inputs are not the ones expected before it loaded: the batches decoded "
                        "beside the load are dropped")
        self.close()
        return None

    def close(self) -> None:
        """Stop the feed and let the preparer's threads go, unless :meth:`take` handed them to the run."""
        self.join()
        feed, self.feed = self.feed, None
        if feed is not None:
            feed.close()
        preparer = self.inputs[0] if self.inputs is not None else None
        self.inputs = None
        if preparer is not None and hasattr(preparer, "close"):
            preparer.close()


def same_inputs(expected: Any, loaded: Any) -> bool:
    """Whether ``loaded`` (its ``preprocess``, ``context_length``) prepares inputs as ``expected`` does: the same
    transform as the exact path reads it and the same context length."""
    from clip_flash.inputs.image.transform_spec import spec_from_preprocess

    try:
        return (expected.context_length == loaded.context_length
                and spec_from_preprocess(expected.preprocess) == spec_from_preprocess(loaded.preprocess))
    except Exception:  # noqa: BLE001 - a transform the exact path does not read: the run builds its own inputs
        return False


def expected_model(expected: Any, spec: Any, dtype: torch.dtype) -> SimpleNamespace:
    """What :func:`~.runner.build_inputs` reads of a loaded model, from the expected inputs."""
    return SimpleNamespace(preprocess=expected.preprocess, context_length=expected.context_length, spec=spec,
                           dtype=dtype)
