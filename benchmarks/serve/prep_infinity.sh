#!/usr/bin/env bash
# Wheels for the serve bench's third baseline, infinity-emb, for the GPU machine (Python 3.12, no registry).
#
#   benchmarks/serve/prep_infinity.sh            # here: downloads into .device/infinity-wheels/
#   # there (carry .device):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/infinity-site .device/infinity-wheels/*.whl
#   python benchmarks/serve/bench_serve.py --configs infinity --infinity-site /tmp/infinity-site ...
#
# They stay out of .device/wheels (which .device/setup.sh puts on every process's path): infinity pins
# transformers, tokenizers, huggingface-hub, uvicorn and click versions of its own, so only the infinity
# process gets them (bench_serve.py adds --infinity-site to that process's PYTHONPATH alone). torch, Pillow,
# numpy, timm and torchvision come from the machine; fastapi, pydantic, starlette, orjson, aiohttp from
# .device/wheels (prep-device --extra, see bench_serve.py's docstring). sentence-transformers is left out: its
# import pulls scikit-learn and scipy (over 40 MB), and infinity's CLIP path does not use it.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
mkdir -p "$root/.device/infinity-wheels"
plat=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: "${plat[@]}" -d "$root/.device/infinity-wheels" \
    "infinity-emb==0.0.78" "transformers==4.57.1" "tokenizers==0.22.1" "huggingface-hub==0.36.2" \
    "typer==0.12.5" "click==8.1.8" "rich==13.9.4" "uvicorn==0.32.1" posthog prometheus-fastapi-instrumentator \
    shellingham markdown-it-py mdurl pygments backoff distro six python-dateutil cloudpickle safetensors regex \
    2>&1 | grep -v '^WARNING' || true
du -sh "$root/.device/infinity-wheels"
