"""``python -m clip_flash.serve [options]``: the same as ``clip-flash serve``."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
