"""Packed text graphs on a CUDA GPU: the features are stock ``encode_text``'s (fp32 to rounding, fp16 within twice
stock's error against fp32), whatever the rows' lengths, and they stay valid once the graphs are gone."""
from __future__ import annotations

import copy
import gc

import numpy as np
import open_clip
import pytest
import torch
from tests.utils import assert_within_twice_stock, edge_case_tokens

import clip_flash
from clip_flash.graphs.packed_text import PackedTextGraphs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def captions_of_lengths(lengths, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rows = torch.zeros(len(lengths), 77, dtype=torch.long)
    for row, length in zip(rows, lengths):
        row[:length] = torch.randint(1, 49406, (length,), generator=g)
        row[0], row[length - 1] = 49406, 49407
    return rows


@pytest.fixture(scope="module")
def stock32():
    torch.manual_seed(0)
    return open_clip.create_model("ViT-B-32", pretrained=None, device="cuda").eval()


@pytest.fixture(scope="module")
def packed32(stock32):
    model = copy.deepcopy(stock32)
    clip_flash.patch(model)
    graphs = PackedTextGraphs(model, max_rows=64)
    graphs.capture_all()
    return graphs


@pytest.mark.parametrize("lengths", [[5], [77], [2] * 64, [77] * 64, list(range(2, 66)), [1, 77, 3, 40]])
def test_fp32_rows_are_stock_encode_text(stock32, packed32, lengths):
    tokens = captions_of_lengths(lengths)
    with torch.inference_mode():
        expected = stock32.encode_text(tokens.cuda())
    got = packed32.encode_text(tokens)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_edge_case_rows_and_normalize(stock32, packed32):
    tokens = edge_case_tokens()  # junk after EOT, no EOT, length 1 and full length
    with torch.inference_mode():
        expected = stock32.encode_text(tokens.cuda(), normalize=True)
    torch.testing.assert_close(packed32.encode_text(tokens, normalize=True), expected, atol=1e-5, rtol=0)


def test_a_batch_just_past_a_bucket_replays_the_next_one(stock32, packed32):
    bucket = packed32.buckets[3]
    lengths = [77] * (bucket // 77) + [bucket % 77 + 1]  # one token more than the bucket
    tokens = captions_of_lengths(lengths)
    assert packed32.bucket_for(int(packed32.lengths(tokens).sum())) == packed32.buckets[4]
    with torch.inference_mode():
        expected = stock32.encode_text(tokens.cuda())
    torch.testing.assert_close(packed32.encode_text(tokens), expected, atol=1e-4, rtol=0)


def test_fp16_within_twice_stocks_error_against_fp32(stock32):
    stock16 = copy.deepcopy(stock32).half()
    patched = copy.deepcopy(stock16)
    clip_flash.patch(patched)
    graphs = PackedTextGraphs(patched, max_rows=32, buckets=[512, 1024, 2464])
    graphs.capture_all()
    tokens = captions_of_lengths(list(range(3, 35)), seed=1)
    with torch.inference_mode():
        reference = stock32.encode_text(tokens.cuda())
        stock = stock16.encode_text(tokens.cuda())
    assert_within_twice_stock(graphs.encode_text(tokens), stock, reference, "packed text graphs fp16")


def test_rows_stay_valid_after_the_graphs_are_dropped(stock32):
    model = copy.deepcopy(stock32)
    clip_flash.patch(model)
    graphs = PackedTextGraphs(model, max_rows=16, buckets=[256, 1232])
    graphs.capture_all()
    tokens = captions_of_lengths([9, 20, 33, 4])
    rows = graphs.encode_text(tokens)
    del graphs, model
    gc.collect()
    torch.cuda.empty_cache()
    with torch.inference_mode():
        expected = stock32.encode_text(tokens.cuda())
    torch.testing.assert_close(rows, expected, atol=1e-4, rtol=0)


def test_inputs_it_cannot_take_raise(packed32):
    with pytest.raises(ValueError, match="host token ids"):
        packed32.encode_text(captions_of_lengths([5]).cuda())
    with pytest.raises(ValueError, match="1 to 64 rows"):
        packed32.encode_text(captions_of_lengths([5] * 65))
    assert np.all(packed32.lengths(captions_of_lengths([5, 9])) == [5, 9])
