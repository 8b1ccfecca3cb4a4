"""The graph-kernel benchmark's captions have exactly the token counts of the length buckets it names."""
from __future__ import annotations

import open_clip
import pytest

from benchmarks.graph_attention_kernels import caption_tokens


@pytest.mark.parametrize("length", [3, 8, 16, 32, 77])
def test_captions_fill_their_length_bucket_exactly(length):
    tokens = caption_tokens(open_clip.get_tokenizer("ViT-B-32"), 2, length)
    assert tokens.shape == (2, 77) and ((tokens != 0).sum(dim=1) == length).all()
