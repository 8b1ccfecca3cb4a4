#!/usr/bin/env python
"""Benchmark OpenCLIP encoders stock vs ``clip_flash.patch``-ed, on the same weights and inputs.

    python scripts/bench_clip.py --model ViT-L-14::laion2b_s32b_b82k --times 100
    python scripts/bench_clip.py --model ViT-B-32 --device cpu          # random init, ~1 min on CPU
    python scripts/bench_clip.py --models --json results.json            # the five published models
    python scripts/bench_clip.py --plot-from benchmarks/results/h100/ViT-L-14-text.json --plot text.png  # no measuring

The first table of each model has exactly the shape of the published openclip-flashattn tables:
``baseline(s)``/``flash_attn(s)`` are total seconds of ``--times`` calls of the stock/patched model,
``speed up (x)`` their ratio, ``mean diff`` the mean |stock - patched| of the unnormalized
embeddings. A second table adds items/s, median ms, peak GPU memory, cosine similarity of both
against an fp32 reference of the same weights, and the backend that ran.

Models: ``NAME::TAG`` (OpenCLIP pretrained tag; needs the network), ``NAME::/path/to/checkpoint``,
or ``NAME`` alone for random-init weights (timings do not depend on the weights; tables say so).
"""
from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

# The script belongs to this checkout: import its clip_flash, not some other installed copy.
REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

from benchmarks.harness import results  # noqa: E402
from benchmarks.harness import plots  # noqa: E402
from clip_flash.models.model_spec import (  # noqa: E402
    DEFAULT_MODEL_SET,
    PRECISION_DTYPES,
    PUBLISHED_TAGS,
    ModelLoadError,
    ModelSpec,
    parse_model_spec,
    precision_warning,
)
from benchmarks.harness.runner import (  # noqa: E402
    BenchError,
    BenchSettings,
    ModelResult,
    RunObserver,
    ShapeResult,
    planned_shapes,
    run_model,
    units_per_model,
)
from benchmarks.harness.image_pipelines import PIPELINES  # noqa: E402
from benchmarks.harness.workloads import ImageFolderError, check_image_folder  # noqa: E402

# Defaults per device. CPU ones keep `--model ViT-B-32 --device cpu` at about a minute on 2 cores.
BASELINES = ("stock", "compile:default", "compile:max-autotune", "compile:max-autotune-no-cudagraphs")
CUDA_DEFAULTS = {"times": 100, "warmup": 5, "dtype": "fp16", "zero_shot_repeats": 3}
CPU_DEFAULTS = {"times": 3, "warmup": 1, "dtype": "fp32", "zero_shot_repeats": 1}
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16)

TEXT_INPUT_NOTES = {
    "random": "random token ids as published (no EOT token: argmax pooling picks the largest id)",
    "captions": "ImageNet captions (class names x prompt templates) timed from strings: the stock side "
                "tokenizes with OpenCLIP's tokenizer, the patched side with clip_flash.get_tokenizer (the same "
                "ids; OpenCLIP's with --pipeline stock), then each encodes",
    "caption-ids": "ImageNet captions tokenized once up front with the model's own tokenizer (the encoders alone)",
}


# ----- command line --------------------------------------------------------------------------
def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def template_count(text: str) -> int:
    """argparse type: how many of OpenAI's 80 ImageNet prompt templates to use (1-80)."""
    value = positive_int(text)
    if value > 80:
        raise argparse.ArgumentTypeError(f"OpenCLIP ships 80 ImageNet templates, got {value}")
    return value


def model_spec_arg(text: str) -> ModelSpec:
    """argparse type: ``NAME``, ``NAME::TAG`` or ``NAME::/path``."""
    try:
        return parse_model_spec(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def patch_option_arg(text: str) -> tuple:
    """argparse type: ``KEY=VALUE`` with VALUE read as bool/None/int/float when it looks like one."""
    key, separator, raw = text.partition("=")
    key = key.strip()
    if not separator or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    if key == "backend":
        raise argparse.ArgumentTypeError("use --backend to choose the backend")
    lowered = raw.strip().lower()
    if lowered in ("true", "false"):
        return key, lowered == "true"
    if lowered in ("none", "null"):
        return key, None
    for number in (int, float):
        try:
            return key, number(raw)
        except ValueError:
            pass
    return key, raw


class DefaultsWhereSetFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows ``(default: X)`` only where the default is set: a None default is chosen at run time and its help
    says how (``[default: 100 on CUDA, 3 on CPU]``)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        return action.help if action.default is None else super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    published = ", ".join(f"{name}::{tag}" for name, tag in PUBLISHED_TAGS.items())
    parser = argparse.ArgumentParser(
        description="Time OpenCLIP encode_text/encode_image stock vs clip_flash.patch on the same weights.",
        formatter_class=DefaultsWhereSetFormatter,
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", type=model_spec_arg, metavar="SPEC",
                       help="NAME::TAG, NAME::/path/to/checkpoint, or NAME alone for random-init weights")
    which.add_argument("--models", type=model_spec_arg, nargs="*", metavar="SPEC",
                       help="several specs in one run; with no values: "
                            f"{' '.join(DEFAULT_MODEL_SET)} with random-init weights (no network "
                            f"needed). The published tables used {published}")
    which.add_argument("--plot-from", type=Path, nargs="+", metavar="JSON",
                       help="measure nothing: draw --plot from results files written earlier by --json")
    parser.add_argument("--times", type=positive_int, default=None,
                        help="calls timed per shape and side [default: 100 on CUDA, 3 on CPU]")
    parser.add_argument("--warmup", type=positive_int, default=None,
                        help="untimed calls per shape and side first; the last one also gives the "
                             "outputs compared and the peak memory [default: 5 on CUDA, 1 on CPU]")
    parser.add_argument("--batch-sizes", type=positive_int, nargs="+", default=list(DEFAULT_BATCH_SIZES),
                        metavar="B", help="batch sizes; sizes other than 1 2 4 8 16 appear only in the "
                                          "second table")
    parser.add_argument("--towers", choices=("text", "image"), nargs="+", default=["text", "image"],
                        help="which encoders to time")
    parser.add_argument("--dtype", choices=tuple(PRECISION_DTYPES), default=None,
                        help="OpenCLIP precision= to load with [default: fp16 on CUDA, fp32 on CPU]")
    parser.add_argument("--device", default=None,
                        help="torch device [default: cuda if available, else cpu]")
    parser.add_argument("--backend", default="auto", help="clip_flash.patch(model, backend=...)")
    parser.add_argument("--patch-option", type=patch_option_arg, action="append", default=[],
                        metavar="KEY=VALUE", help="extra keyword for clip_flash.patch (repeatable), "
                                                  "e.g. skip_padding=false")
    parser.add_argument("--text-input", choices=tuple(TEXT_INPUT_NOTES), default="random",
                        help="random: token ids as in the published table; captions: realistic "
                             "ImageNet prompts, timed from strings (tokenizer included); caption-ids: the same "
                             "prompts tokenized up front (encoders alone)")
    parser.add_argument("--images", type=Path, default=None, metavar="DIR",
                        help="use the pictures in DIR (Pillow + the model's own preprocess) instead "
                             "of random pixels")
    parser.add_argument("--pipeline", choices=PIPELINES, nargs="+", default=[], metavar="P",
                        help="with --images: also time files -> embeddings end to end per input pipeline, "
                             "images/s: stock (OpenCLIP preprocess in a DataLoader, one worker per core), exact "
                             "(clip_flash.ImagePreprocessor), gpu (ImagePreprocessor with nvJPEG, not exact), "
                             "gpu-nvjpeg-chroma (nvJPEG keeping its own chroma, further from exact); for text "
                             "(captions, zero-shot), 'stock' alone keeps OpenCLIP's tokenizer on the patched side")
    parser.add_argument("--pipeline-batch", type=positive_int, default=256, metavar="B",
                        help="images per batch in --pipeline runs")
    parser.add_argument("--pipeline-batches", type=positive_int, default=24, metavar="N",
                        help="timed batches per --pipeline (after its warm-up batches)")
    parser.add_argument("--pipeline-warmup", type=positive_int, default=None, metavar="N",
                        help="untimed batches before the timed ones [default: 6 for exact/gpu (their host buffers "
                             "are page-locked on first use), one per worker plus one for stock]")
    parser.add_argument("--pipeline-workers", type=positive_int, default=None, metavar="W",
                        help="CPU workers per --pipeline [default: every core of this host]")
    parser.add_argument("--pipeline-executor", choices=("auto", "native", "thread"), default="auto",
                        help="ImagePreprocessor's decoding in the exact/gpu pipelines (auto: the native batch "
                             "decoder where the extension is built, Python threads otherwise)")
    parser.add_argument("--seed", type=int, default=0, help="seed for random weights and inputs")
    parser.add_argument("--no-tables", action="store_true",
                        help="skip the per-shape tables (e.g. to run only --latency or --zero-shot-classifier)")
    parser.add_argument("--zero-shot-classifier", action="store_true",
                        help="also time building an ImageNet zero-shot classifier (classes x 80 "
                             "templates through the text tower) both ways")
    parser.add_argument("--zero-shot-classes", type=positive_int, default=1000, metavar="N",
                        help="classes in the zero-shot classifier (1000 x 80 = 80,000 prompts)")
    parser.add_argument("--zero-shot-templates", type=template_count, default=80, metavar="T",
                        help="the first T of OpenAI's 80 ImageNet prompt templates (1: 'a bad photo of a {}.')")
    parser.add_argument("--zero-shot-batch", type=positive_int, default=1000, metavar="B",
                        help="prompts per encode_text call when building the classifier")
    parser.add_argument("--zero-shot-repeats", type=positive_int, default=None, metavar="R",
                        help="builds per side, alternating; the median is reported "
                             "[default: 3 on CUDA, 1 on CPU]")
    parser.add_argument("--baseline", default="stock", choices=BASELINES,
                        help="what the patched model is compared with: the stock model (default) or the stock "
                             "model under torch.compile in the given mode (compiled per shape during warm-up)")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="run the patched side through clip_flash.GraphedEncoder (CUDA graphs, captured first)")
    parser.add_argument("--graph-batch-sizes", type=positive_int, nargs="+", default=None, metavar="N",
                        help="with --cuda-graphs: the GraphedEncoder's batch buckets (batches above the largest "
                             "run eager) [default: GraphedEncoder's own, 1 2 4 8 16 32]")
    parser.add_argument("--latency", type=positive_int, default=None, metavar="N",
                        help="also run a closed loop of N single requests (batch 1) per tower and "
                             "report p50/p99 both ways")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write all results as JSON")
    parser.add_argument("--csv", type=Path, default=None, metavar="PATH", help="write per-shape rows as CSV")
    parser.add_argument("--markdown", type=Path, default=None, metavar="PATH",
                        help="write the printed tables and the environment as markdown")
    parser.add_argument("--plot", type=Path, default=None, metavar="FILE.png",
                        help="draw stock vs patched per shape (time per call and speed-up) into FILE "
                             "(needs matplotlib; .png, .svg or .pdf)")
    return parser


def resolve_device(requested: Optional[str]) -> torch.device:
    """The requested device, or cuda when available, else cpu."""
    if requested is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BenchError(f"error: --device {requested} asked for, but this machine has no usable CUDA GPU")
    return device


def make_settings(args: argparse.Namespace, device: torch.device) -> BenchSettings:
    """Command-line arguments plus per-device defaults."""
    defaults = CUDA_DEFAULTS if device.type == "cuda" else CPU_DEFAULTS
    return BenchSettings(
        device=device,
        precision=args.dtype or defaults["dtype"],
        times=args.times or defaults["times"],
        warmup=args.warmup or defaults["warmup"],
        batch_sizes=list(dict.fromkeys(args.batch_sizes)),  # keep order, drop repeats
        towers=[tower for tower in ("text", "image") if tower in args.towers],
        text_input=args.text_input,
        images_dir=args.images,
        backend=args.backend,
        patch_options=dict(args.patch_option),
        seed=args.seed,
        tables=not args.no_tables,
        zero_shot_classes=args.zero_shot_classes if args.zero_shot_classifier else None,
        zero_shot_templates=args.zero_shot_templates,
        zero_shot_batch=args.zero_shot_batch,
        zero_shot_repeats=args.zero_shot_repeats or defaults["zero_shot_repeats"],
        latency_requests=args.latency,
        cuda_graphs=args.cuda_graphs,
        graph_batch_sizes=tuple(args.graph_batch_sizes) if args.graph_batch_sizes else None,
        baseline=args.baseline,
        pipelines=tuple(args.pipeline) if args.images is not None else (),
        # Text is timed from strings; --pipeline stock alone keeps OpenCLIP's tokenizer on the patched side.
        text_tokenizer="openclip" if tuple(args.pipeline) == ("stock",) else "clip_flash",
        pipeline_batch=args.pipeline_batch,
        pipeline_batches=args.pipeline_batches,
        pipeline_warmup=args.pipeline_warmup,
        pipeline_workers=args.pipeline_workers,
        pipeline_executor=args.pipeline_executor,
    )


def settings_note(args: argparse.Namespace, settings: BenchSettings) -> str:
    """One line saying how the numbers were taken (device and defaults, dtype, inputs, timing)."""
    device = settings.device
    if args.device is None and device.type == "cpu":
        where = "device `cpu` (no CUDA GPU found; CPU defaults for options not given)"
    else:
        where = f"device `{device}`"
    options = "".join(f", {key}={value!r}" for key, value in settings.patch_options.items())
    images = f"pictures from {settings.images_dir}" if settings.images_dir else "random normal pixels"
    baseline = "" if settings.baseline == "stock" else \
        f"baseline: torch.compile(stock, mode={settings.baseline.split(':', 1)[1]!r}) (the 'stock' columns); "
    if settings.cuda_graphs:
        buckets = settings.graph_batch_sizes or "GraphedEncoder defaults"
        baseline += f"patched side through clip_flash.GraphedEncoder (CUDA graphs; batch buckets: {buckets}); "
    return (
        f"Settings: {where}, dtype {settings.precision}, clip_flash.patch(backend={settings.backend!r}{options}); "
        f"{baseline}"
        f"text: {TEXT_INPUT_NOTES[settings.text_input]}; images: {images}; "
        f"{settings.warmup} warm-up call(s) per side, then {settings.times} timed call(s) per side in "
        f"alternating blocks; baseline(s)/flash_attn(s) are total seconds, mean diff is mean "
        f"|stock - patched| of unnormalized embeddings"
    )


# ----- progress and printing -----------------------------------------------------------------
class ConsoleObserver(RunObserver):
    """Prints each published row to stdout as it finishes; a progress bar (or lines) on stderr."""

    def __init__(self, total_units: int, device_label: str, settings: BenchSettings) -> None:
        self.device_label = device_label
        self.settings = settings
        self.done = 0
        self.total = total_units
        self.bar = None
        self.table: Optional[results.PublishedTable] = None
        self.stdout_closed = False
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total_units, file=sys.stderr, unit="shape", dynamic_ncols=True)
            except ImportError:
                pass
        self.published_batches = set(results.published_batch_sizes(settings.batch_sizes))

    def print(self, text: str) -> None:
        """Print to stdout without tearing the progress bar."""
        if self.stdout_closed:
            return
        try:
            if self.bar is not None:
                self.bar.write(text, file=sys.stdout)
            else:
                print(text, flush=True)
        except BrokenPipeError:
            # The reader went away (`... | head`): keep measuring and still write the files.
            self.stdout_closed = True
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())

    def step(self, description: str) -> None:
        if self.bar is not None:
            self.bar.set_description(description)
        else:
            print(f"[bench {self.done}/{self.total}] {description}", file=sys.stderr, flush=True)

    def model_started(self, result: ModelResult) -> None:
        if not planned_shapes(self.settings):
            self.print(results.plain_header(result, self.device_label))
            return
        shapes = [(batch, result.context_length) if tower == "text" else (batch, 3, *result.image_size)
                  for tower, batch in planned_shapes(self.settings) if batch in self.published_batches]
        self.table = results.PublishedTable(results.shape_width(shapes))
        self.print(results.published_header(result, self.device_label, self.settings.times))
        self.print(self.table.header())

    def row_done(self, result: ModelResult, row: ShapeResult) -> None:
        if row.batch in self.published_batches:
            self.print(self.table.row(row))

    def unit_done(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        """Remove the progress bar."""
        if self.bar is not None:
            self.bar.close()


# ----- main ----------------------------------------------------------------------------------
def show_library_notes() -> None:
    """clip_flash's log records on stderr: its warnings, and the benchmark's own notes (such as "fetching
    pretrained weights ...") as they happen, so a slow step is never silent."""
    library = logging.getLogger("clip_flash")
    if any(getattr(handler, "_bench_clip", False) for handler in library.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("bench_clip: %(message)s"))
    handler._bench_clip = True
    library.addHandler(handler)
    library.setLevel(logging.WARNING)
    logging.getLogger("clip_flash.models").setLevel(logging.INFO)  # says when it fetches pretrained weights


def draw_plot(records: Sequence[Dict[str, Any]], path: Path) -> int:
    """Write the stock-vs-patched figure; 0, or 2 with one message when it cannot be drawn."""
    try:
        plots.plot_records(records, path)
    except plots.PlotUnavailableError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {path}", file=sys.stderr)
    return 0


def command_line(argv: Optional[Sequence[str]]) -> str:
    """The exact command that ran (the interpreter's own argv when called as a script)."""
    if argv is None:
        return shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
    return shlex.join([sys.executable, str(Path(__file__)), *argv])


def write_outputs(args: argparse.Namespace, record: Dict[str, Any], markdown: str, announce: bool = True) -> None:
    """The --json/--csv/--markdown files requested (rewritten after every model, so a crash or
    Ctrl-C in a long multi-model run keeps what was finished)."""
    if args.json:
        results.write_json(args.json, record)
    if args.csv:
        results.write_csv(args.csv, record)
    if args.markdown:
        results.write_markdown(args.markdown, markdown + "\n\n" + results.format_environment(record["environment"]))
    for path in (args.json, args.csv, args.markdown):
        if path and announce:
            print(f"wrote {path}", file=sys.stderr)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the benchmark; returns the process exit code (0 ok, 2 usage/load error, 130 interrupted)."""
    args = build_parser().parse_args(argv)
    show_library_notes()
    if args.plot_from:
        if args.plot is None:
            print("error: --plot-from needs --plot FILE.png (where to draw)", file=sys.stderr)
            return 2
        try:
            records = plots.load_records(args.plot_from)
        except plots.PlotUnavailableError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        return draw_plot(records, args.plot)
    if args.plot is not None:
        try:  # before minutes of measuring, not after
            plots.require_matplotlib()
        except plots.PlotUnavailableError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    specs: List[ModelSpec] = [args.model] if args.model else (
        args.models or [parse_model_spec(name) for name in DEFAULT_MODEL_SET])
    try:
        device = resolve_device(args.device)
        text_strings = args.zero_shot_classifier or args.text_input == "captions"
        if args.pipeline and args.images is None and not text_strings:
            raise BenchError("error: --pipeline times files -> embeddings and needs --images DIR (or, for "
                             "text, --text-input captions or --zero-shot-classifier)")
        if args.images is not None:
            check_image_folder(args.images)
    except (BenchError, ImageFolderError) as error:
        print(error, file=sys.stderr)
        return 2
    settings = make_settings(args, device)
    if args.device is None and device.type == "cpu":
        print(f"bench_clip: no CUDA GPU found, running on CPU (--times {settings.times}, --warmup "
              f"{settings.warmup}, --dtype {settings.precision}; CPU defaults for any not given)",
              file=sys.stderr)
    warning = precision_warning(settings.device, settings.precision)
    if warning:
        print(f"bench_clip: warning: {warning}", file=sys.stderr)
    note = settings_note(args, settings)
    environment = results.environment_record(device, command_line(argv))
    device_label = environment["device_name"]
    record: Dict[str, Any] = {
        "schema": "clip_flash.bench_clip/1",
        "environment": environment,
        "settings": {**vars(args), "model": args.model.text if args.model else None,
                     "models": [spec.text for spec in specs],
                     "resolved": {"device": str(device), "dtype": settings.precision, "times": settings.times,
                                  "warmup": settings.warmup, "zero_shot_repeats": settings.zero_shot_repeats}},
        "models": [],
        "complete": False,
    }
    markdown_blocks: List[str] = []
    observer = ConsoleObserver(units_per_model(settings) * len(specs), device_label, settings)
    exit_code = 0
    try:
        for spec in specs:
            result = run_model(spec, settings, observer)
            # The published table was streamed row by row; the rest prints once the model is done.
            observer.print("\n" + results.format_after_published(result, note) + "\n")
            record["models"].append(result.to_dict())
            markdown_blocks.append(results.format_model(result, device_label, settings.times, note))
            write_outputs(args, record, "\n\n".join(markdown_blocks), announce=False)
        record["complete"] = True
    except (ModelLoadError, BenchError, ImageFolderError) as error:
        print(error, file=sys.stderr)
        exit_code = 2
    except KeyboardInterrupt:
        print("bench_clip: interrupted; writing the results finished so far", file=sys.stderr)
        exit_code = 130
    finally:
        observer.close()
    if record["models"] or exit_code == 0:
        write_outputs(args, record, "\n\n".join(markdown_blocks))
    if args.plot is not None and record["models"]:
        exit_code = exit_code or draw_plot([record], args.plot)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
