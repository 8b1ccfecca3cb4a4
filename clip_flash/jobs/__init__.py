"""Embedding jobs: a folder, WebDataset tar shards or a caption file in, clip-retrieval's layout out.

    summary = clip_flash.embed("photos/", "out/", model="ViT-L-14::laion2b_s32b_b82k")

- ``sources``: what a job reads and its fixed plan of numbered shards (``folder``, ``webdataset``,
  ``caption_file``; ``items`` the pieces they share);
- ``writer``: the output folder (clip-retrieval's files, atomic shards, settings check, failures);
  ``file_formats``: the bytes of its files; ``weights_identity``: a checkpoint identified by its SHA-256;
- ``pipeline``: one model on one device, reading/decoding in threads, the GPU kept busy;
- ``stock``: the baseline (OpenCLIP's preprocess in a DataLoader, unpatched model) for speed figures;
- ``record``: the summary and the JSON record of a run;
- ``job``: ``embed()``, which ties them together; ``ray_data``: the same over a Ray cluster;
- ``cli``: the command line (``add_arguments``, ``run``).
"""
from .job import DEFAULT_SHARD_SIZE, embed
from .record import JobSummary
from .sources import SourceError
from .writer import InputChangedError, OutputError, SettingsMismatchError

__all__ = ["embed", "JobSummary", "SourceError", "OutputError", "SettingsMismatchError", "InputChangedError",
           "DEFAULT_SHARD_SIZE"]
