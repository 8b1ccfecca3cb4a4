"""Choosing an attention backend between measured shapes (clip_flash/backends/shape_timings.py): the estimate
on log-log axes, the tie rule, and the shipped H200 table's choices against the kernels ViT-B-32's and ViT-L-14's
CUDA graphs were measured to run fastest (benchmarks/results/h200/graph_kernels_5bd9b80)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from clip_flash.backends import shape_timings
from clip_flash.backends.attention_table import read_table
from clip_flash.backends.shape_timings import TimedShape, choose, choose_at, estimate_ms, winners

TABLES = Path(shape_timings.__file__).resolve().parent / "attention_tables"


def test_estimate_is_log_log_between_bracketing_batches():
    shapes = [TimedShape(8, 1, 77, {"a": 1.0}), TimedShape(8, 256, 77, {"a": 256.0})]
    assert estimate_ms(shapes, 8, 16, 77)["a"] == pytest.approx(16.0)  # time proportional to batch: exact
    assert estimate_ms(shapes, 8, 1024, 77)["a"] == pytest.approx(256.0)  # past the range: the edge shape
    assert estimate_ms(shapes, 8, 1, 77) == {"a": 1.0}


def test_estimate_goes_between_lengths_after_batches():
    shapes = [TimedShape(8, 1, 8, {"a": 1.0}), TimedShape(8, 64, 8, {"a": 4.0}),
              TimedShape(8, 1, 32, {"a": 2.0}), TimedShape(8, 64, 32, {"a": 8.0})]
    # at b8 (half way in log batch): 2.0 at s8, 4.0 at s32; s16 is half way in log length between them
    assert estimate_ms(shapes, 8, 8, 16)["a"] == pytest.approx(math.sqrt(2.0 * 4.0))


def test_a_backend_is_compared_only_where_it_was_timed_at_every_bracketing_shape():
    shapes = [TimedShape(8, 1, 77, {"a": 1.0, "b": 0.5}), TimedShape(8, 256, 77, {"a": 2.0})]
    assert set(estimate_ms(shapes, 8, 16, 77)) == {"a"}
    assert estimate_ms(shapes, 8, 1, 77) == {"a": 1.0, "b": 0.5}  # both timed at the exact shape
    lonely = [TimedShape(8, 1, 77, {"b": 0.5}), TimedShape(8, 256, 77, {"a": 2.0})]
    assert estimate_ms(lonely, 8, 8, 77) == {"b": 0.5}  # nothing timed at both: the nearest shape's timings


def test_estimate_uses_the_nearest_head_count():
    shapes = [TimedShape(8, 16, 77, {"a": 1.0, "b": 2.0}), TimedShape(16, 16, 77, {"a": 2.0, "b": 1.0})]
    assert choose_at(shapes, 12, 16, 77) == "b"  # log 12 is nearer log 16
    assert choose_at(shapes, 9, 16, 77) == "a"
    assert estimate_ms([], 8, 16, 77) == {} and choose_at([], 8, 16, 77) is None


@pytest.mark.parametrize("estimates, expected", [
    ({"sdpa:cudnn": 1.05, "sdpa:flash": 1.0}, "sdpa:cudnn"),        # within the margin: torch's own kernel
    ({"sdpa:cudnn": 1.2, "sdpa:flash": 1.0}, "sdpa:flash"),         # a clear gain
    ({"sdpa:flash": 1.05, "sdpa:efficient": 1.0}, "sdpa:flash"),    # torch's order among its kernels
    ({"flash_attn": 1.0, "sdpa:efficient": 1.08}, "sdpa:efficient"),
    ({"flash_attn": 1.0, "other": 1.05}, "flash_attn"),             # neither preferred: the faster
    ({}, None),
])
def test_choice_leaves_torchs_kernel_only_for_a_clear_gain(estimates, expected):
    assert choose(estimates) == expected


def test_winners_are_the_choices_at_the_measured_shapes():
    shapes = [TimedShape(8, 1, 77, {"sdpa:cudnn": 1.0, "sdpa:flash": 0.95}),
              TimedShape(8, 16, 77, {"sdpa:cudnn": 2.0, "sdpa:efficient": 1.0}),
              TimedShape(8, 64, 77, {"sdpa:cudnn": 4.0, "sdpa:efficient": 2.0})]
    assert winners(shapes) == ["sdpa:efficient", "sdpa:cudnn"]


def _h200_replay_shapes(causal: bool, heads: int, head_dim: int = 64):
    table = read_table(TABLES / "nvidia-h200.json")
    return [TimedShape(e.heads, e.batch, e.seq, {k: v for k, v in e.device_ms.items() if v is not None})
            for e in table.entries if e.dtype == "float16" and e.causal == causal and not e.varlen
            and e.head_dim == head_dim and e.heads == heads]


# (rows, caption tokens) of ViT-L-14's caption graphs and the kernel its replays ran fastest, by the attention
# kernels' device time a replay with and without the table (graph_kernels_5bd9b80/kernels_L14_*.md).
@pytest.mark.parametrize("rows, tokens, fastest", [
    (16, 77, "sdpa:cudnn"), (32, 77, "sdpa:cudnn"), (48, 77, "sdpa:cudnn"), (64, 77, "sdpa:cudnn"),
    (32, 8, "sdpa:efficient"), (32, 16, "sdpa:efficient"), (48, 32, "sdpa:efficient"), (64, 8, "sdpa:efficient"),
    (64, 16, "sdpa:efficient"), (64, 32, "sdpa:efficient"),
])
def test_h200_table_picks_what_vit_l14_caption_graphs_ran_fastest(rows, tokens, fastest):
    assert choose_at(_h200_replay_shapes(causal=True, heads=12), 12, rows, tokens) == fastest


@pytest.mark.parametrize("rows, fastest", [(16, "sdpa:efficient"), (64, "sdpa:efficient")])
def test_h200_table_picks_what_vit_b32_image_graphs_ran_fastest(rows, fastest):
    assert choose_at(_h200_replay_shapes(causal=False, heads=12), 12, rows, 50) == fastest
