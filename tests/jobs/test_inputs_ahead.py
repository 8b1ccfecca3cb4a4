"""The inputs made while the model loads: the tokenizer handed to the job is the one made ahead, the image path's
checks are cached by then, and a failure ahead leaves the job to make them itself."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from clip_flash.inputs.image.decoder_check import decoder_agreement
from clip_flash.inputs.image.image_resize import pillow_mismatch
from clip_flash.inputs.text import tokenizer as tokenizer_module
from clip_flash.jobs.inputs_ahead import InputsAhead
from clip_flash.jobs.runner import build_inputs
from .job_helpers import MODEL


def _loaded(stock_model):
    model, preprocess = stock_model
    return SimpleNamespace(model=model, preprocess=preprocess, dtype=torch.float32, context_length=77,
                           spec=SimpleNamespace(name=MODEL))


def test_the_job_takes_the_tokenizer_made_ahead_and_the_checks_are_cached(stock_model, monkeypatch):
    decoder_agreement.cache_clear()
    pillow_mismatch.cache_clear()
    ahead = InputsAhead(MODEL, images=True, captions=True).start()
    made_ahead = ahead.tokenizer()
    assert made_ahead is not None and ahead.seconds > 0
    assert decoder_agreement.cache_info().currsize == 1 and pillow_mismatch.cache_info().currsize == 1

    def no_second_tokenizer(*args, **kwargs):
        raise AssertionError("the job made a second tokenizer")

    monkeypatch.setattr(tokenizer_module, "get_tokenizer", no_second_tokenizer)
    source = SimpleNamespace(has_images=True, has_captions=True)
    preparer, tokenizer = build_inputs(_loaded(stock_model), source, torch.device("cpu"), "cpu", 1, ahead=ahead)
    assert torch.equal(tokenizer(["a photo of a cat"]), made_ahead(["a photo of a cat"], context_length=77))
    preparer.close()


def test_a_failure_ahead_leaves_the_job_to_make_the_tokenizer(stock_model, monkeypatch):
    real = tokenizer_module.get_tokenizer
    calls = []

    def failing_once(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise OSError("vocabulary file unreadable")
        return real(*args, **kwargs)

    monkeypatch.setattr(tokenizer_module, "get_tokenizer", failing_once)
    ahead = InputsAhead(MODEL, images=False, captions=True).start()
    assert ahead.tokenizer() is None
    source = SimpleNamespace(has_images=False, has_captions=True)
    _, tokenizer = build_inputs(_loaded(stock_model), source, torch.device("cpu"), "cpu", 1, ahead=ahead)
    assert len(calls) == 2 and tokenizer(["a dog"]).shape == (1, 77)
