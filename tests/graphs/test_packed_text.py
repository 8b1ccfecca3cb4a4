"""Packed text graphs on the CPU: the packed input's layout (what the graph reads) and the token buckets."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from clip_flash.graphs.packed_text import (PackedLayout, PackedTextGraphs, cheapest_bucket, pack_token_rows,
                                          token_buckets)


def unpack(vector: np.ndarray, layout: PackedLayout, rows: int):
    t, slots = layout.tokens, layout.slots
    ids, positions = vector[:t], vector[t:2 * t]
    starts = vector[2 * t:2 * t + slots + 1]
    last = vector[2 * t + slots + 1:]
    return ids, positions, starts, last[:rows]


@pytest.mark.parametrize("seed", range(10))
def test_packed_rows_unpack_to_each_rows_real_tokens_and_padding_is_whole_sequences(seed):
    rng = np.random.default_rng(seed)
    context = 77
    n = int(rng.integers(0, 33))
    lengths = rng.integers(1, context + 1, size=n)
    tokens = rng.integers(1, 49408, size=(n, context))
    layout = PackedLayout(int(lengths.sum()) + int(rng.integers(0, 300)), 32, context)
    ids, positions, starts, last = unpack(pack_token_rows(tokens, lengths, layout), layout, n)
    assert starts[0] == 0 and np.all(np.diff(starts) >= 0) and starts[-1] == layout.tokens
    sizes = np.diff(starts)
    assert sizes.max() <= context  # every sequence, padding too, fits the attention's max_seqlen
    for row in range(n):
        begin, end = starts[row], starts[row + 1]
        assert end - begin == lengths[row]
        assert np.array_equal(ids[begin:end], tokens[row, :lengths[row]])
        assert np.array_equal(positions[begin:end], np.arange(lengths[row]))
        assert last[row] == end - 1
    for begin, end in zip(starts[n:-1], starts[n + 1:]):  # padding sequences, then empty slots
        assert np.array_equal(ids[begin:end], np.zeros(end - begin)) and np.array_equal(
            positions[begin:end], np.arange(end - begin))
    padding = sizes[n:]
    whole = np.count_nonzero(padding)
    assert np.all(padding[:whole] > 0) and np.all(padding[whole:] == 0)  # empty slots only at the end


def test_rows_or_tokens_past_the_layout_raise():
    layout = PackedLayout(100, 2, 77)
    with pytest.raises(ValueError, match="do not fit"):
        pack_token_rows(np.ones((3, 77), dtype=np.int64), np.array([1, 1, 1]), layout)
    with pytest.raises(ValueError, match="do not fit"):
        pack_token_rows(np.ones((2, 77), dtype=np.int64), np.array([77, 77]), layout)


@pytest.mark.parametrize("per_doubling", [4, 8])
def test_token_buckets_rise_by_at_most_one_step_a_doubling_and_end_at_the_largest(per_doubling):
    buckets = token_buckets(1024 * 77, per_doubling)
    assert buckets[0] == 256 and buckets[-1] == 1024 * 77 and buckets == sorted(set(buckets))
    assert all(b / a <= 1 + 1 / per_doubling + 1e-9 for a, b in zip(buckets, buckets[1:]))
    assert token_buckets(300, 4) == [256, 300] and token_buckets(300, 8) == [256, 288, 300]


def test_a_typical_web_caption_batch_pads_to_the_next_thirty_second_by_default():
    buckets = token_buckets(1024 * 77)
    assert len(buckets) == 264 and min(b for b in buckets if b >= 25_650) == 26_112


def test_a_batch_replays_the_cheapest_measured_bucket_holding_it():
    buckets = [256, 512, 1024, 2048]
    assert cheapest_bucket(buckets, 300) == 512  # not timed: the smallest holding it
    assert cheapest_bucket(buckets, 2049) is None
    timed = {256: 1.0, 512: 3.0, 1024: 2.5, 2048: 2.5}  # 1,024 tiles better than 512; 2,048 only ties it
    assert cheapest_bucket(buckets, 300, timed) == 1024
    assert cheapest_bucket(buckets, 200, timed) == 256
    assert cheapest_bucket(buckets, 1500, timed) == 2048


def test_a_model_on_the_cpu_or_not_patched_is_refused_with_the_reason():
    import open_clip

    import clip_flash

    torch.manual_seed(0)
    model = open_clip.model.CLIP(embed_dim=32, vision_cfg=dict(layers=1, width=64, head_width=32, patch_size=8,
                                                               image_size=32),
                                 text_cfg=dict(context_length=77, vocab_size=49408, width=64, heads=2, layers=1))
    with pytest.raises(ValueError, match="patch the model"):
        PackedTextGraphs(model.eval(), max_rows=8)
    clip_flash.patch(model)
    with pytest.raises(ValueError, match="CUDA device"):
        PackedTextGraphs(model, max_rows=8)
