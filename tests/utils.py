"""Helpers shared by the tests (import them as ``from tests.utils import ...``): token batches that probe edges,
image sizes, error measures, and a child process's environment."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Tuple

import torch

SOT, EOT = 49406, 49407


REPO = Path(__file__).resolve().parents[1]


def child_env(**extra: str) -> Dict[str, str]:
    """This process's environment for a child Python with the repository first on its path, keeping the path
    it already had (where the project's dependencies may live, as on a machine with packages beside the system's)."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


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


def errors_against(output: torch.Tensor, reference: torch.Tensor) -> Tuple[float, float]:
    """(max relative error, max 1 - cosine per row) of ``output`` against an fp32 ``reference``."""
    output, reference = output.float(), reference.float()
    max_rel = ((output - reference).abs().max() / reference.abs().max()).item()
    one_minus_cos = (1 - torch.nn.functional.cosine_similarity(output, reference, dim=-1)).max().item()
    return max_rel, one_minus_cos


def assert_within_twice_stock(patched: torch.Tensor, stock: torch.Tensor, reference: torch.Tensor, what: str = "",
                              *, check_cosine: bool = True, log: bool = False) -> None:
    """The project's accuracy rule: the patched output's error against the fp32 ``reference`` is at most about twice
    the stock output's (same dtype), in max relative error (+1e-4) and, unless ``check_cosine`` is off, in
    1 - cosine (+1e-5). ``log`` prints one ``ACCURACY`` line (GPU runs use ``-s`` and keep the lines)."""
    stock_rel, stock_cos = errors_against(stock, reference)
    rel, cos = errors_against(patched, reference)
    if log:
        print(f"ACCURACY {what}: max-rel stock {stock_rel:.3e} patched {rel:.3e} | "
              f"1-cos stock {stock_cos:.3e} patched {cos:.3e}")
    assert rel <= 2 * stock_rel + 1e-4, f"{what} max relative error {rel:.3e} vs stock {stock_rel:.3e}"
    if check_cosine:
        assert cos <= 2 * stock_cos + 1e-5, f"{what} 1-cos {cos:.3e} vs stock {stock_cos:.3e}"
