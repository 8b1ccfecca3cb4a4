#!/usr/bin/env python
"""Check, on a CUDA machine, that clip_flash compiles its kernels on first use when they were not installed.

    python benchmarks/check_jit_build.py --out DIR [--cache CACHE]

Runs three fresh processes from this tree, which must hold no compiled ``clip_flash/_C*.so``, with an
empty per-user cache (``--cache``, emptied first; by default a new temporary directory, so DIR gets no
binaries). The first uses a fused op on CUDA: the extension is compiled, and its log line says how long that
took. The second does the same: the compiled module is loaded from the cache, nothing is compiled. The third
runs ``python -m clip_flash.info``. Each checks the op against PyTorch's own LayerNorm. Writes
DIR/jit_build.log (everything the processes printed) and DIR/jit_build.json (timings, origins, errors,
environment); exits non-zero when a step did not do what it should.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

# One fused op on CUDA, timed from a cold start, checked against torch's LayerNorm (fp32 math, fp16 out).
CHILD = r"""
import importlib.util, json, logging, sys, time
logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                    format="%(asctime)s %(name)s %(levelname)s: %(message)s")
if importlib.util.find_spec("clip_flash._C") is not None:
    sys.exit("clip_flash._C is installed in this tree: remove clip_flash/_C*.so (SKIP_EXT_BUILD=1) to test the "
             "build on first use")
started = time.perf_counter()
import torch
import torch.nn.functional as F
import clip_flash
from clip_flash.ops import _extension, fused_ops
imported = time.perf_counter()
x = torch.randn(4096, 1024, device="cuda", dtype=torch.float16)
weight = torch.randn(1024, device="cuda", dtype=torch.float16)
bias = torch.randn(1024, device="cuda", dtype=torch.float16)
first = time.perf_counter()
y = fused_ops.layer_norm(x, weight, bias, 1e-5)
torch.cuda.synchronize()
done = time.perf_counter()
reference = F.layer_norm(x.float(), (1024,), weight.float(), bias.float(), 1e-5)
stock = F.layer_norm(x, (1024,), weight, bias, 1e-5).float()
print(json.dumps({
    "import_s": imported - started, "first_fused_op_s": done - first,
    "extension_available": _extension.extension_available(), "origin": _extension.extension_origin(),
    "reason": _extension.extension_unavailable_reason(), "fused_ops": fused_ops.describe_backend(),
    "max_abs_err_vs_fp32": (y.float() - reference).abs().max().item(),
    "torch_fp16_max_abs_err_vs_fp32": (stock - reference).abs().max().item(),
}))
"""


def run(command, environment, log) -> subprocess.CompletedProcess:
    log.write(f"\n$ {shlex.join(command)}\n")
    log.flush()
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO_ROOT, env=environment, capture_output=True, text=True, timeout=1200)
    log.write(done.stderr + done.stdout + f"[exit {done.returncode}, {time.perf_counter() - started:.1f} s]\n")
    log.flush()
    return done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where the log and the JSON go")
    parser.add_argument("--cache", type=Path, default=None,
                        help="the per-user cache to compile into (emptied first) [default: a new temporary directory]")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cache = args.cache or Path(tempfile.mkdtemp(prefix="clip_flash_jit_"))
    shutil.rmtree(cache, ignore_errors=True)
    path = os.pathsep.join(filter(None, (str(REPO_ROOT), os.environ.get("PYTHONPATH"))))
    environment = {**os.environ, "CLIP_FLASH_CACHE": str(cache), "PYTHONPATH": path}
    environment.pop("CLIP_FLASH_JIT", None)
    summary = {"command": shlex.join([sys.executable, *sys.argv]), "cache": str(cache), "steps": {}}
    ok = True
    with open(args.out / "jit_build.log", "w", encoding="utf-8") as log:
        for step, wanted in (("first", "compiled on first use in"), ("again", "loaded from")):
            done = run([sys.executable, "-c", CHILD], environment, log)
            result = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {}
            result["exit"] = done.returncode
            summary["steps"][step] = result
            good = (done.returncode == 0 and result.get("extension_available")
                    and wanted in (result.get("origin") or "")
                    and result["max_abs_err_vs_fp32"] <= 2 * result["torch_fp16_max_abs_err_vs_fp32"] + 1e-3)
            ok = ok and bool(good)
            print(f"{step}: {'ok' if good else 'FAILED'} {json.dumps(result)}", file=sys.stderr)
        info = run([sys.executable, "-m", "clip_flash.info"], environment, log)
        summary["info"] = info.stdout
        ok = ok and info.returncode == 0 and "compiled on first use" in info.stdout
    try:
        sys.path.insert(0, str(REPO_ROOT))
        import torch

        from benchmarks.harness.results import environment_record

        summary["environment"] = environment_record(torch.device("cuda"), summary["command"])
    except Exception as error:  # the record is a courtesy; the checks above decide
        summary["environment"] = f"unavailable: {error}"
    summary["ok"] = ok
    (args.out / "jit_build.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(f"{'ok' if ok else 'FAILED'}: wrote {args.out / 'jit_build.log'} and {args.out / 'jit_build.json'}",
          file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
