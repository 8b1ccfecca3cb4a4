"""The job's threads beside the model load start only once OpenCLIP (and torchvision with it) is imported whole:
a thread entering torchvision by another module while the load imports it can find a module half made
(``ImportError ... partially initialized module 'torchvision.ops'``). Run in a fresh interpreter, as a script that
does not import OpenCLIP itself meets it. (The page-locked blocks' thread, which imports neither, may start first:
on CUDA only.)"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from clip_flash.jobs.pinned_reserve import PinnedReservation
from tests.utils import child_env
from .job_helpers import MODEL, write_photos


PROBE = """
import json, sys
import clip_flash
from clip_flash.jobs.beside_load import BesideModelLoad

seen = []
real_start = BesideModelLoad.start

def start(self):
    seen.append({"thread": self.thread_name, "open_clip": "open_clip" in sys.modules,
                 "torchvision.ops": "torchvision.ops" in sys.modules})
    return real_start(self)

BesideModelLoad.start = start
summary = clip_flash.embed(sys.argv[1], sys.argv[2], model=sys.argv[3], device="cpu", batch_size=2, progress=False)
print(json.dumps({"rows": summary.rows, "starts": seen}))
"""


def test_threads_beside_the_load_start_after_the_model_library_is_imported(tmp_path: Path):
    write_photos(tmp_path / "photos", count=2, captions=True)
    env = child_env(OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "photos"), str(tmp_path / "out"), MODEL],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["rows"] == 2
    assert result["starts"], "no thread was started beside the load (the probe measures nothing)"
    for start in result["starts"]:
        if start["thread"] != PinnedReservation.thread_name:  # imports neither (it may start before the import)
            assert start["open_clip"] and start["torchvision.ops"], start


def test_the_page_locked_blocks_thread_imports_neither():
    """What PinnedReservation imports (it starts before OpenCLIP is imported): torchvision stays unimported."""
    probe = ("import sys\n"
             "import clip_flash.jobs.pinned_reserve\n"
             "from clip_flash.inputs.image import jpeg_dct, native_decode\n"
             "from clip_flash.jobs import warm_up\n"
             "print(sorted(name for name in sys.modules if name.split('.')[0] in ('torchvision', 'open_clip')))\n")
    env = child_env()
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
