"""Helpers shared by the tests (import them as ``from tests.utils import ...``): token batches that probe edges,
image sizes, and error measures."""
from __future__ import annotations

import torch

SOT, EOT = 49406, 49407


def image_size(model: torch.nn.Module) -> int:
    size = getattr(model.visual, "image_size", 224)
    return size[0] if isinstance(size, (tuple, list)) else size


def edge_case_tokens(context_length: int = 77, vocab_size: int = 49408, seed: int = 0) -> torch.Tensor:
    """Rows that stress skipping padding: mixed lengths, length 1, full length, junk after EOT, no EOT at all."""
    g = torch.Generator().manual_seed(seed)
    eot = vocab_size - 1
    rows = []
    for length in (5, 1, context_length, 12, 30):
        row = torch.zeros(context_length, dtype=torch.long)
        row[:length] = torch.randint(1, eot - 1, (length,), generator=g)
        row[0] = min(SOT, eot - 1)
        row[length - 1] = eot
        rows.append(row)
    junk = rows[3].clone()
    junk[12:40] = torch.randint(1, eot - 1, (28,), generator=g)  # tokens after EOT must not matter
    rows.append(junk)
    rows.append(torch.randint(1, eot - 1, (context_length,), generator=g))  # no EOT: argmax picks the max id
    return torch.stack(rows)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.float() - expected.float()).abs().max() / expected.float().abs().max().clamp_min(1e-12)).item()
