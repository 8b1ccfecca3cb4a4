"""``clip-flash``: one installed command, a subcommand per job.

    clip-flash embed --model ViT-L-14::laion2b_s32b_b82k --input photos/ --out emb/
    clip-flash serve --model ViT-L-14::laion2b_s32b_b82k
    clip-flash bench --model ViT-L-14::laion2b-s32b-b82k --times 100
    clip-flash info
    clip-flash measure-attention

Each subcommand's options live with its wing: a module with ``add_arguments(parser)`` and ``run(args) -> int``,
or (for the benchmark, which is not shipped) ``main(argv) -> int``. ``clip-flash SUBCOMMAND --help`` lists them.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence


@dataclass(frozen=True)
class Subcommand:
    module: str
    summary: str


SUBCOMMANDS: Dict[str, Subcommand] = {
    "embed": Subcommand("clip_flash.jobs.cli", "embed a folder, WebDataset tars or a caption file into "
                        "clip-retrieval's layout, resumably"),
    "serve": Subcommand("clip_flash.serve.cli", "an OpenAI-compatible embedding server (needs the serve extra)"),
    "bench": Subcommand("benchmarks.bench_clip", "time stock vs patched OpenCLIP on your model and batch sizes "
                        "(from a source checkout)"),
    "info": Subcommand("clip_flash.info", "which kernels and attention backends this machine runs, and why"),
    "measure-attention": Subcommand("clip_flash.backends.measure_attention",
                                    "time every attention backend on this GPU; write the table backend='auto' reads"),
}


def _checkout_root() -> Optional[Path]:
    """The source checkout this package runs from (``pip install -e .``), where ``benchmarks/`` is; None for an
    installed wheel, which does not ship the benchmarks."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "benchmarks" / "bench_clip.py").is_file() else None


def _entry(name: str) -> Callable[[List[str]], int]:
    if name == "bench":
        root = _checkout_root()
        if root is None:
            raise SystemExit("clip-flash bench runs the benchmarks of a source checkout, which a wheel does not ship: "
                             "git clone the project, `pip install -e .` there, and run it again")
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
    try:
        module = importlib.import_module(SUBCOMMANDS[name].module)
    except ImportError as error:
        hint = ' (pip install -e ".[serve]" in the checkout)' if name == "serve" else ""
        raise SystemExit(f"clip-flash {name} cannot start: {error}{hint}") from None
    if hasattr(module, "add_arguments"):
        def run_with_parser(argv: List[str]) -> int:
            parser = argparse.ArgumentParser(prog=f"clip-flash {name}",
                                             description=getattr(module, "DESCRIPTION", module.__doc__),
                                             formatter_class=argparse.RawDescriptionHelpFormatter)
            module.add_arguments(parser)
            return module.run(parser.parse_args(argv))
        return run_with_parser

    def run_main(argv: List[str]) -> int:
        # These build their own parser, which names the program after sys.argv[0]: "clip-flash NAME" in its usage.
        program = sys.argv[0]
        sys.argv[0] = f"clip-flash {name}"
        try:
            return module.main(argv)
        finally:
            sys.argv[0] = program
    return run_main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="clip-flash", description=__doc__.split("\n\n")[0].replace("``", ""),
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(f"  {name:<18} {sub.summary}"
                                                       for name, sub in SUBCOMMANDS.items()))
    parser.add_argument("subcommand", choices=sorted(SUBCOMMANDS), metavar="SUBCOMMAND",
                        help="one of: " + ", ".join(SUBCOMMANDS))
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the subcommand's options (SUBCOMMAND --help)")
    from . import __version__
    parser.add_argument("--version", action="version", version=f"clip_flash {__version__}")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):
        parser.error("a subcommand is needed: " + ", ".join(SUBCOMMANDS) + " (clip-flash SUBCOMMAND --help)")
    args = parser.parse_args(argv)
    return int(_entry(args.subcommand)(list(args.args)) or 0)


if __name__ == "__main__":
    sys.exit(main())
