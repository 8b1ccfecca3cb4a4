"""Helpers shared by the tests (import them as ``from tests.utils import ...``): token batches that probe edges,
image sizes, error measures, a child process's environment, and the native batch decoder built for the CPU."""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

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


# The native batch decoder's sources: plain C++ (libjpeg-turbo and zlib opened at run time), so the CPU can run it.
NATIVE_DECODER_SOURCES = ("image_batch_decoder.cpp", "image_batch_decoder_binding.cpp", "png_decoder.cpp",
                          "jpeg_entropy_split.cpp")
_NATIVE_DECODER_MODULE = """#include <torch/extension.h>
namespace clip_flash { void register_image_batch_decoder(pybind11::module& module); }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) { clip_flash::register_image_batch_decoder(module); }
"""


@functools.lru_cache(maxsize=None)
def cpu_native_decoder_extension() -> Tuple[Optional[Any], str]:
    """(module, "") with ``ImageBatchDecoder`` compiled for the CPU from ``csrc/`` (once per source version, in the
    user's cache, shared by the processes of one test run), or (None, why not). The package builds the decoder
    only into its CUDA extension; this lets a machine without CUDA test the same C++ code. Kept under
    the package's extension cache (``cache_root()``)."""
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return None, "no C++ compiler"
    try:
        from torch.utils.cpp_extension import is_ninja_available, load

        if not is_ninja_available():
            raise RuntimeError("ninja is not installed")
        from clip_flash.ops.jit_build import _drop_abandoned_lock, cache_key, cache_root, probe_toolchain

        csrc = REPO / "csrc"
        # The package's own key (the sources, torch, Python, the flags: a per-user cache outlives an upgrade),
        # and this module's text.
        key = cache_key(probe_toolchain(), REPO) + hashlib.sha256(_NATIVE_DECODER_MODULE.encode()).hexdigest()[:8]
        directory = cache_root() / "tests" / f"native_cpu_{key}"
        directory.mkdir(parents=True, exist_ok=True)
        module_source = directory / "module.cpp"
        if not module_source.exists():  # written whole, then renamed: the test processes build it at once
            partial = directory / f"module.cpp.{os.getpid()}"
            partial.write_text(_NATIVE_DECODER_MODULE)
            os.replace(partial, module_source)
        _drop_abandoned_lock(directory)  # as the package's own build: a killed run's lock, once older than any build
        module = load(f"clip_flash_native_cpu_{key[:8]}",
                      [str(module_source)] + [str(csrc / name) for name in NATIVE_DECODER_SOURCES],
                      extra_include_paths=[str(csrc), str(csrc / "third_party")],
                      extra_cflags=["-O2", "-std=c++17"], build_directory=str(directory), verbose=False)
        return module, ""
    except Exception as error:  # noqa: BLE001 - any failure to build: the tests say why they skip
        return None, f"building it for the CPU failed: {type(error).__name__}: {error}"[:300]


def native_batch_decoder(threads: int) -> Tuple[Optional[Any], str]:
    """(``NativeBatchDecoder``, "") from the package's extension where it is built, else from the CPU build of
    its sources; (None, why not) where neither can be had."""
    from clip_flash.inputs.image.native_decode import NativeBatchDecoder

    decoder = NativeBatchDecoder.create(threads=threads)
    if decoder is not None:
        return decoder, ""
    module, reason = cpu_native_decoder_extension()
    if module is None:
        return None, reason
    decoder = NativeBatchDecoder(module, threads)
    failure = decoder._native().failure
    return (decoder, "") if not failure else (None, f"the CPU build cannot run here: {failure}")
