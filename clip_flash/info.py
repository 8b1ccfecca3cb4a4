"""What this machine can run: ``python -m clip_flash.info``."""
from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
from typing import Dict, Optional, Sequence


def _version(module_name: str) -> Optional[str]:
    try:
        return getattr(importlib.import_module(module_name), "__version__", "unknown")
    except Exception:
        return None


def _attention_table() -> Dict[str, object]:
    """The measured attention table ``backend="auto"`` uses on this GPU (path, GPU, entries), or why none."""
    from clip_flash.backends import attention_table

    table = attention_table.active_table()
    if table is not None:
        return {"path": table.source, "gpu": table.gpu, "entries": len(table.entries), "note": None}
    gpu = attention_table.current_gpu()
    known = attention_table.candidate_tables()
    if gpu is None:
        note = f"no CUDA device (tables are per GPU; {len(known)} known)"
    else:
        note = (f"none of the {len(known)} known tables is for {gpu[0]} (sm_{gpu[1][0]}{gpu[1][1]}), so auto "
                "takes the first backend that serves a site; make one with clip-flash measure-attention")
    return {"path": None, "gpu": None, "entries": 0, "note": note}


def environment() -> Dict[str, object]:
    """GPU, capability and library versions, and each backend's availability (recorded with every result)."""
    import torch

    import clip_flash
    from clip_flash.ops import _extension, fused_ops, packed_attention

    info: Dict[str, object] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "triton": _version("triton"),
        "flash_attn": _version("flash_attn"),
        "open_clip": _version("open_clip"),
        "clip_flash": clip_flash.__version__,
        "gpu": None,
        "capability": None,
        "fused_ops": fused_ops.describe_backend(),
        "text_attn": packed_attention.describe_kernel(),  # a patched text tower's packed attention
        # Where the compiled kernels came from (installed, or compiled on first use and where); None: not in use.
        "extension": _extension.extension_origin() if torch.cuda.is_available() else None,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["capability"] = "sm_%d%d" % torch.cuda.get_device_capability()
        info["gpu_count"] = torch.cuda.device_count()
    info["attention_table"] = _attention_table()
    info["backends"] = {
        name: {"available": status.available, "reason": status.reason, "version": status.version}
        for name, status in clip_flash.available_backends().items()
    }
    return info


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``clip-flash info [--json]`` (also ``python -m clip_flash.info``)."""
    parser = argparse.ArgumentParser(description="Which kernels and attention backends this machine runs, and "
                                                 "why: the device, versions, each backend's availability and the "
                                                 "attention table backend='auto' reads.")
    parser.add_argument("--json", action="store_true", help="print the same as one JSON object")
    args = parser.parse_args(argv)
    info = environment()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    backends = info.pop("backends")
    table = info.pop("attention_table")
    width = max(len(key) for key in info)
    for key, value in info.items():
        print(f"{key:<{width}}  {value if value is not None else '-'}")
    print("attention backends:")
    for name, status in backends.items():
        mark = "yes" if status["available"] else "no "
        print(f"  {mark} {name:<16} {status['reason'] or ''}")
    runnable = [name for name, status in backends.items() if status["available"]]
    print(f"can run here: {', '.join(runnable)}")
    if table["path"]:
        print(f"attention table: {table['path']} ({table['gpu']}, {table['entries']} entries)")
    else:
        print(f"attention table: none: {table['note']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
