#!/usr/bin/env python
"""Do the batched nvJPEG decodes keep to themselves, or wait on the GIL beside busy Python?

    python scripts/probe_nvjpeg_gil.py --photos .device/photos --json out.json

A second thread runs a pure-Python counting loop (as a thread launching a model or scanning files runs
Python) while this one times ``decode_jpeg(batch, device="cuda")`` (torchvision), then the same with the
counter idle; likewise clip_flash's own call (``nvjpeg_hw_decode``, into one buffer), where the extension
has it, and the whole hardware route a decoding thread runs (``decode_into_layout``: layout, decode, chroma).
The same loop in another process (no GIL shared) tells CPU contention from GIL waits.
A call that released the GIL once and took it back once would take as long either way; one that takes
it back per image waits up to the interpreter's switch interval (5 ms; ``--switch-interval``) each time.
Each is repeated (``--repeats``) and the median reported, with the counter's rate beside it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from clip_flash.benchmark.results import environment_record  # noqa: E402
from clip_flash.benchmark.workloads import image_files  # noqa: E402
from clip_flash.inputs.image import nvjpeg_packed  # noqa: E402
from clip_flash.inputs.image.image_decoding import DecodedItem  # noqa: E402
from clip_flash.inputs.image.jpeg_header import scan_jpeg_header  # noqa: E402
from clip_flash.inputs.image.transform_spec import ImageTransformSpec  # noqa: E402
from clip_flash.ops._extension import load_extension  # noqa: E402


def _timed(call, busy: str):
    """(seconds, counter increments per second) of ``call`` beside ``busy``: "" (nothing), "thread" (a Python
    loop in this process, competing for its GIL) or "process" (the same loop in another process: no GIL)."""
    counter, stop = [0], threading.Event()

    def count() -> None:
        while not stop.is_set():
            counter[0] += 1

    thread = process = None
    if busy == "thread":
        thread = threading.Thread(target=count, daemon=True)
        thread.start()
        time.sleep(0.01)
    elif busy == "process":  # a bare interpreter spinning: running at once, no imports to wait for
        process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.2)
    torch.cuda.synchronize()
    before, started = counter[0], time.perf_counter()
    call()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    counted = counter[0] - before
    stop.set()
    if thread is not None:
        thread.join()
    if process is not None:
        process.kill()
        process.wait()
    return seconds, counted / seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--photos", type=Path, required=True)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--switch-interval", type=float, default=None,
                        help="sys.setswitchinterval for the run (default: the interpreter's, 5 ms)")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    if not torch.cuda.is_available():
        print("error: no CUDA GPU here", file=sys.stderr)
        return 2
    from torchvision.io import decode_jpeg

    files = image_files(args.photos)[:args.batch]
    encoded = [torch.frombuffer(bytearray(Path(path).read_bytes()), dtype=torch.uint8) for path in files]
    decode = lambda: decode_jpeg(encoded, device="cuda")  # noqa: E731
    for _ in range(3):
        decode()
    decoders = {"torchvision": decode}
    extension = load_extension()
    if extension is not None and hasattr(extension, "nvjpeg_hw_decode"):
        headers = [scan_jpeg_header(data.numpy().tobytes()) for data in encoded]
        slots, end = [], 0
        for header in headers:
            usable = header is not None and header.channels == 3 and not header.progressive
            slots += [end, header.height, header.width] if usable else [-1, 0, 0]
            end += header.height * header.width * 3 if usable else 0
        out = torch.empty(end, dtype=torch.uint8, device="cuda")
        library = nvjpeg_packed._nvjpeg_library()
        decoders["clip_flash"] = lambda: extension.nvjpeg_hw_decode(encoded, out, slots, library)  # noqa: E731
        items = [DecodedItem(index, route="gpu-jpeg", encoded=data, image_size=(header.height, header.width),
                             channels=header.channels, jpeg_sampling=header.sampling,
                             jpeg_progressive=header.progressive)
                 for index, (data, header) in enumerate(zip(encoded, headers)) if header is not None]
        # ViT-B-32's transform: 224, shortest side, bicubic (the layout's tables depend on it, not the decode).
        spec = ImageTransformSpec((224, 224), "shortest", "bicubic", (0.48145466, 0.4578275, 0.40821073),
                                  (0.26862954, 0.26130258, 0.27577711))
        device = torch.device("cuda", torch.cuda.current_device())
        decoders["clip_flash route"] = lambda: nvjpeg_packed.decode_into_layout(  # noqa: E731
            items, device, spec, "libjpeg")
        for call in (decoders["clip_flash"], decoders["clip_flash route"]):
            call()
    env = environment_record(torch.device("cuda"), "python " + " ".join(sys.argv))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    rows = {}
    for name, call in decoders.items():
        for label, busy in (("alone", ""), ("beside a busy Python thread", "thread"),
                            ("beside a busy process", "process")):
            runs = [_timed(call, busy) for _ in range(args.repeats)]
            key = f"{name}, {label}"
            rows[key] = {"median_ms": statistics.median(run[0] for run in runs) * 1e3,
                         "runs_ms": [run[0] * 1e3 for run in runs],
                         "python_loop_per_s_median": statistics.median(run[1] for run in runs)}
            print(f"{args.batch} photos, {name} batched nvJPEG decode {label}: median {rows[key]['median_ms']:.1f} ms "
                  f"(runs {', '.join(f'{run[0] * 1e3:.0f}' for run in runs)} ms)", flush=True)
            # Written after every case: a run cut short keeps what it measured.
            args.json.write_text(json.dumps({"environment": env, "batch": len(files),
                                             "switch_interval_s": sys.getswitchinterval(), "results": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
