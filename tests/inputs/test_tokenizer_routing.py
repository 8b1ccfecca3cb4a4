"""Which OpenCLIP tokenizers get the fast path, and that every other one comes back as OpenCLIP's own."""
from __future__ import annotations

import numpy as np
import open_clip
import pytest
import torch

import clip_flash
from clip_flash.inputs.text.tokenizer import FastCLIPTokenizer, describe_tokenizer, fast_path_refusal, get_tokenizer

TEXTS = ["a photo of a dog.", "Tom &amp; Jerry’s “cat”", "", " ".join(["many words"] * 60), "猫 <start_of_text>"]


@pytest.mark.parametrize("model_name, context_length", [
    ("ViT-B-32", 77), ("ViT-L-14", 77), ("coca_ViT-L-14", 76), ("PE-Core-B-16", 32), ("PE-Core-bigG-14-448", 72),
    ("MobileCLIP2-S0", 77), ("EVA02-L-14", 77),
])
def test_simple_tokenizer_configs_get_the_fast_path(model_name, context_length):
    fast = clip_flash.get_tokenizer(model_name)
    stock = open_clip.get_tokenizer(model_name)
    assert isinstance(fast, FastCLIPTokenizer)
    assert fast.context_length == stock.context_length == context_length
    assert torch.equal(fast(TEXTS), stock(TEXTS))
    assert torch.equal(fast(TEXTS, context_length=10), stock(TEXTS, context_length=10))
    assert "FastCLIPTokenizer" in describe_tokenizer(fast)


@pytest.mark.parametrize("kwargs, reason", [
    ({"reduction_mask": "simple"}, "reduction_mask"),
    ({"reduction_mask": "random"}, "reduction_mask"),
    ({"clean": "whitespace"}, "not 'lower'"),
    ({"clean": "canonicalize"}, "not 'lower'"),
    ({"additional_special_tokens": ["<mask>"]}, "special tokens"),
    ({"fast": False}, "fast=False"),
])
def test_other_settings_get_openclips_own_tokenizer(kwargs, reason):
    tokenizer = get_tokenizer("ViT-B-32", **kwargs)
    assert type(tokenizer) is open_clip.tokenizer.SimpleTokenizer
    if "fast" not in kwargs:
        assert reason in describe_tokenizer(tokenizer)


def test_non_simple_tokenizers_are_refused():
    class SomeHFTokenizer:
        pass
    assert "not OpenCLIP's SimpleTokenizer" in fast_path_refusal(SomeHFTokenizer())
    with pytest.raises(ValueError, match="no fast path"):
        FastCLIPTokenizer(SomeHFTokenizer())


def test_serial_and_parallel_agree_and_attributes_pass_through():
    stock = open_clip.get_tokenizer("ViT-B-32")
    parallel = FastCLIPTokenizer(stock)
    serial = FastCLIPTokenizer(stock, parallel=False)
    rng = np.random.default_rng(0)
    texts = ["".join(chr(int(c)) for c in rng.integers(32, 0x3000, int(n))) for n in rng.integers(0, 30, 2000)]
    assert torch.equal(parallel(texts), serial(texts))
    assert torch.equal(parallel(texts), stock(texts))
    assert parallel.sot_token_id == 49406 and parallel.eot_token_id == 49407 and parallel.vocab_size == 49408
    assert parallel.decode(parallel("a photo")[0, 1:3].tolist()) == stock.decode(stock("a photo")[0, 1:3].tolist())
    assert parallel("one string").shape == (1, 77) and parallel("one string").dtype == torch.long


def test_tokenizers_parallelism_setting_is_restored():
    import os
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    get_tokenizer("ViT-B-32")(["restore the setting"])
    assert os.environ.get("TOKENIZERS_PARALLELISM") == before


def test_word_memory_bound_keeps_results_exact():
    stock = open_clip.get_tokenizer("ViT-B-32")
    fast = FastCLIPTokenizer(stock)
    fast.word_ids.max_words = 50
    fast.chunk_ids.max_chunks = 40
    texts = [f"caption number {i} of a {w} photo" for i, w in enumerate(["red", "green", "blue"] * 40)]
    for start in range(0, len(texts), 7):
        assert torch.equal(fast(texts[start:start + 7]), stock(texts[start:start + 7]))
    assert len(fast.word_ids.ids) <= 50 + 8 and len(fast.chunk_ids) <= 40 + 8


def test_threads_share_one_tokenizer():
    from concurrent.futures import ThreadPoolExecutor
    stock = open_clip.get_tokenizer("ViT-B-32")
    fast = FastCLIPTokenizer(stock)
    fast.word_ids.max_words = 300  # resets happen while other threads look words up
    fast.chunk_ids.max_chunks = 200
    batches = [[f"thread {i} caption {j} about word{(i * 7 + j) % 97}" for j in range(40)] for i in range(24)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(fast, batches))
    for batch, got in zip(batches, results):
        assert torch.equal(got, stock(batch))


def test_without_tokenizers_installed_openclips_own_comes_back(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers now raises ImportError
    tokenizer = get_tokenizer("ViT-B-32")
    assert type(tokenizer) is open_clip.tokenizer.SimpleTokenizer


def test_empty_batches_and_sequence_types():
    stock = open_clip.get_tokenizer("ViT-B-32")
    fast = FastCLIPTokenizer(stock)
    assert torch.equal(fast([]), stock([])) and fast([]).shape == (0, 77)
    assert torch.equal(fast(("a tuple", "of captions")), stock(["a tuple", "of captions"]))
    assert torch.equal(fast([np.str_("numpy string")]), stock([np.str_("numpy string")]))
