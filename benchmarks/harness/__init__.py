"""Benchmark helpers behind ``scripts/bench_clip.py``.

The benchmark is a *user* of clip_flash's public API (``clip_flash.patch`` and friends): it builds
an OpenCLIP model, keeps one stock copy and one patched copy of the same weights, and times both on
the same inputs. The modules are small and separate so each can be read on its own:

- :mod:`.model_spec` — ``NAME``, ``NAME::TAG`` and ``NAME::/path`` model specs, loading, clear errors;
- :mod:`.workloads` — random token ids, ImageNet captions, random or real images;
- :mod:`.timing` — honest timing: warm-up, alternating stock/patched, CUDA events, percentiles;
- :mod:`.runner` — per-model measurements (the published table, extra columns, zero-shot, latency);
- :mod:`.results` — tables (markdown), JSON/CSV/markdown files and the environment record.
"""
