"""Bad arguments to the compiled kernels raise RuntimeError with a message naming the values, never crash the
process: on one of our toolchains, formatting a number in a TORCH_CHECK message crashed (csrc/check_message.h).
Each call runs in a child process, so that a crash fails the test instead of ending the session."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


CHILD = textwrap.dedent("""
    import torch
    from clip_flash.ops._extension import load_extension
    extension = load_extension()
    assert extension is not None, "the extension must build on a GPU machine"
    cuda = torch.device("cuda")
    calls = {
        "layer_norm fp32": lambda: extension.layer_norm(torch.ones(4, 8, device=cuda), None, None, 1e-5),
        "layer_norm 1-D weight shape": lambda: extension.layer_norm(
            torch.ones(4, 8, device=cuda, dtype=torch.half), torch.ones(7, device=cuda, dtype=torch.half),
            None, 1e-5),
        "image_resample out shape": lambda: extension.image_resample(
            torch.zeros(16, dtype=torch.uint8, device=cuda), torch.zeros(1, 13, dtype=torch.int64, device=cuda),
            torch.zeros(4, dtype=torch.int32, device=cuda), torch.zeros(768, device=cuda),
            torch.zeros(1, 4, 8, 8, device=cuda)),
        "jpeg_chroma factors": lambda: extension.jpeg_chroma(
            torch.zeros(1, 4, 4, 3, dtype=torch.uint8, device=cuda), 3, 1),
    }
    for name, call in calls.items():
        try:
            call()
        except RuntimeError as error:
            print(name, "->", str(error).splitlines()[0])
        else:
            raise SystemExit(f"{name}: no error raised")
""")


@pytest.mark.gpu
def test_bad_arguments_raise_with_their_values():
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=600)
    assert child.returncode == 0, (child.returncode, child.stdout, child.stderr[-3000:])
    lines = child.stdout.splitlines()
    assert len(lines) == 4, child.stdout
    assert "got Float" in lines[0]
    assert "[4, 3, 8, 8]" not in lines[2] and "[1, 4, 8, 8]" in lines[2]
    assert "(3, 1)" in lines[3]
