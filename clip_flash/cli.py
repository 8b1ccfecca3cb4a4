"""The ``clip-flash`` command: one subcommand per wing, each wing owning its arguments
(``add_arguments(parser)``) and its work (``run(args) -> int``)."""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional, Sequence

# subcommand -> (module with add_arguments/run, one-line help)
SUBCOMMANDS = {
    "serve": ("clip_flash.serve.cli", "an OpenAI-compatible CLIP embedding server"),
}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="clip-flash", description="OpenCLIP models, same embeddings, sooner.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)  # light: each wing imports torch only when it runs
        modules[name] = module
        module.add_arguments(commands.add_parser(name, help=help_text, description=help_text))
    args = parser.parse_args(argv)
    return modules[args.command].run(args)


if __name__ == "__main__":
    sys.exit(main())
