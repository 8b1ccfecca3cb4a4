"""What a run record says about where it ran: versions, device, command, and the source revision.

The revision comes from git only when clip_flash runs from a git checkout (``pip install -e .`` or a clone on
``sys.path``); an installed package names its version, and nothing shells out from site-packages.
"""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Optional

from . import __version__, envs

if TYPE_CHECKING:  # imported where used: the serve CLI's --help reads usable_cores() without loading torch
    import torch

CHECKOUT_ROOT = Path(__file__).resolve().parents[1]


def usable_cores() -> int:
    """Cores this process may use (its affinity mask, which containers set), not the host's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def device_name(device: torch.device) -> str:
    """The GPU's name, or for CPU ``CPU: <model name> (<n> threads)``."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU: {model} ({torch.get_num_threads()} threads)"


def source_revision(root: Path = CHECKOUT_ROOT) -> str:
    """``git rev-parse HEAD`` (``+dirty`` with uncommitted changes) where ``root`` is a git checkout holding this
    package; ``CLIP_FLASH_GIT_REVISION`` where a checkout was copied without its ``.git``; else the version."""
    given = envs.GIT_REVISION.read()
    if given:
        return str(given)
    if not (root / ".git").exists() or not (root / "clip_flash" / "__init__.py").is_file():
        return f"clip_flash {__version__} (installed, not a git checkout)"

    def git(*args: str) -> Optional[str]:
        try:
            done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    revision = git("rev-parse", "HEAD")
    if revision is None:
        return "unknown (git could not read the checkout)"
    return revision + ("+dirty" if git("status", "--porcelain") else "")


def environment_record(device: torch.device, command: str) -> Dict[str, Any]:
    """What a result needs to be reproduced: the command, source revision, device and library versions."""
    from . import info

    return {
        "command": command,
        "git_revision": source_revision(),
        "device": str(device),
        "device_name": device_name(device),
        "python": platform.python_version(),
        "clip_flash_environment": info.environment(),
    }
