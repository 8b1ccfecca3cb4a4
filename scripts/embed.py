#!/usr/bin/env python
"""Embed a collection into clip-retrieval's layout (img_emb/, text_emb/, metadata/), resumably.

The command line of :mod:`clip_flash.jobs.cli` (``--help`` lists the options).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, Sequence

# The script belongs to this checkout: import its clip_flash, not some other installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clip_flash.jobs import cli  # noqa: E402


def main(argv: Optional[Sequence[str]] = None) -> int:
    return cli.main(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
