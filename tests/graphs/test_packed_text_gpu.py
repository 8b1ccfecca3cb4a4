"""Packed text graphs on a CUDA GPU (fp16: the variable-length attention kernels take fp16 and bf16): the features
are within twice stock fp16's error against stock fp32, whatever the rows' lengths, and stay valid once the graphs
are gone; an fp32 tower is refused with the reason."""
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
def stock16(stock32):
    return copy.deepcopy(stock32).half()


@pytest.fixture(scope="module")
def packed16(stock16):
    model = copy.deepcopy(stock16)
    clip_flash.patch(model)
    graphs = PackedTextGraphs(model, max_rows=64)
    graphs.capture_all()
    return graphs


def check_rows(graphs, stock32, stock16, tokens, what, normalize=False):
    with torch.inference_mode():
        reference = stock32.encode_text(tokens.cuda(), normalize=normalize)
        stock = stock16.encode_text(tokens.cuda(), normalize=normalize)
    got = graphs.encode_text(tokens, normalize=normalize)
    assert got.shape == stock.shape and got.dtype == stock.dtype
    assert_within_twice_stock(got, stock, reference, what)


@pytest.mark.parametrize("lengths", [[5], [77], [2] * 64, [77] * 64, list(range(2, 66)), [1, 77, 3, 40]])
def test_rows_match_stock_whatever_their_lengths(stock32, stock16, packed16, lengths):
    check_rows(packed16, stock32, stock16, captions_of_lengths(lengths), f"lengths {lengths[:4]}")


def test_edge_case_rows_and_normalize(stock32, stock16, packed16):
    # junk after EOT, no EOT, length 1 and full length
    check_rows(packed16, stock32, stock16, edge_case_tokens(), "edge cases", normalize=True)


def test_a_batch_just_past_a_bucket_replays_the_next_one(stock32, stock16, packed16):
    bucket = packed16.buckets[3]
    lengths = [77] * (bucket // 77) + [bucket % 77 + 1]  # one token more than the bucket
    tokens = captions_of_lengths(lengths)
    assert packed16.bucket_for(int(packed16.lengths(tokens).sum())) == packed16.buckets[4]
    check_rows(packed16, stock32, stock16, tokens, "past a bucket")


def test_rows_stay_valid_after_the_graphs_are_dropped(stock32, stock16):
    model = copy.deepcopy(stock16)
    clip_flash.patch(model)
    graphs = PackedTextGraphs(model, max_rows=16, buckets=[256, 1232])
    graphs.capture_all()
    tokens = captions_of_lengths([9, 20, 33, 4])
    with torch.inference_mode():
        expected = graphs.encode_text(tokens).clone()
    rows = graphs.encode_text(tokens)
    del graphs, model
    gc.collect()
    torch.cuda.empty_cache()
    with torch.inference_mode():
        torch.zeros(64, 1024, 1024, device="cuda")  # reuse freed memory
    torch.testing.assert_close(rows, expected, atol=0, rtol=0)


def test_inputs_it_cannot_take_raise(stock32, packed16):
    with pytest.raises(ValueError, match="host token ids"):
        packed16.encode_text(captions_of_lengths([5]).cuda())
    with pytest.raises(ValueError, match="1 to 64 rows"):
        packed16.encode_text(captions_of_lengths([5] * 65))
    assert np.all(packed16.lengths(captions_of_lengths([5, 9])) == [5, 9])
    fp32 = copy.deepcopy(stock32)
    clip_flash.patch(fp32)
    with pytest.raises(ValueError, match="no packed"):
        PackedTextGraphs(fp32, max_rows=8)


def test_a_batch_in_a_larger_bucket_measured_cheaper_gives_the_same_rows(stock32, stock16):
    model = copy.deepcopy(stock16)
    clip_flash.patch(model)
    graphs = PackedTextGraphs(model, max_rows=16, buckets=[256, 1232])
    graphs.capture_all()
    assert set(graphs.time_replays()) == {256, 1232}
    tokens = captions_of_lengths([9, 20, 33, 4])
    smallest = graphs.encode_text(tokens)
    graphs.replay_ms = {256: 5.0, 1232: 1.0}  # as if the larger graph replayed faster
    assert graphs.bucket_for(66) == 1232
    check_rows(graphs, stock32, stock16, tokens, "the larger bucket")
    # Another bucket runs other GEMM tiles, which round differently: a few fp16 ulps of these features.
    torch.testing.assert_close(graphs.encode_text(tokens), smallest, atol=1e-2, rtol=0)
