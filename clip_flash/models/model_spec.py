"""Model specs (``NAME``, ``NAME::TAG``, ``NAME::/path/to/checkpoint``) and loading them.

``NAME::TAG`` is clip-as-service's spelling, used by the published table; OpenCLIP itself takes the
name and the tag as two arguments. Tags are accepted in either spelling (``laion2b-s32b-b82k`` or
``laion2b_s32b_b82k``, any case, as OpenCLIP does) and written in OpenCLIP's own: lower case, underscores.
A bare ``NAME`` builds the architecture with random-init weights: timings do not depend on the
weights, but embeddings made with them mean nothing, and every table and job says plainly when they are random.
"""
from __future__ import annotations

import contextlib
import copy
import difflib
import logging
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Callable, Iterator, Optional, Tuple

import torch

from .weights_fetch import HF_HUB_PREFIX, WeightsUnreachableError, prepared_fetch

logger = logging.getLogger(__name__)

SEPARATOR = "::"
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".ckpt")

# The five models of the published tables, by name: ``--models`` with no values runs these with
# random-init weights, which needs no network (the GPU machine has none).
DEFAULT_MODEL_SET = ("ViT-B-32", "ViT-B-16", "ViT-L-14", "ViT-H-14", "ViT-g-14")

# The pretrained tags the published tables name, for users who have the network to fetch them.
PUBLISHED_TAGS = {
    "ViT-B-32": "laion2b_s34b_b79k",
    "ViT-B-16": "laion400m_e31",
    "ViT-L-14": "laion2b_s32b_b82k",
    "ViT-H-14": "laion2b_s32b_b79k",
    "ViT-g-14": "laion2b_s12b_b42k",
}

PRECISION_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

RANDOM_INIT_NOTE = "(random init weights: no checkpoint)"


def precision_warning(device: torch.device, precision: str) -> Optional[str]:
    """Why ``precision`` on ``device`` is a poor choice, or None. fp16 on a CPU: most CPUs have no fp16
    arithmetic (torch emulates it), and clip_flash's kernels are for CUDA GPUs."""
    if device.type != "cpu" or precision != "fp16":
        return None
    return ("--dtype fp16 on the CPU is slow (most CPUs have no fp16 arithmetic, so torch emulates it; expect "
            "minutes) and is not what clip_flash is for: its fused kernels run on CUDA GPUs. On a CPU use fp32 "
            "(the default) to check that the patch computes the same thing.")


class ModelLoadError(Exception):
    """A model could not be built or its weights loaded; ``str()`` is the whole user-facing message."""


@dataclass(frozen=True)
class ModelSpec:
    """What the user asked for: an OpenCLIP model name and where its weights come from."""

    text: str
    name: str
    weights: Optional[str] = None  # a pretrained tag, a checkpoint path, or None for random init

    @property
    def kind(self) -> str:
        """``"random"``, ``"checkpoint"`` or ``"tag"``."""
        if self.weights is None:
            return "random"
        return "checkpoint" if looks_like_path(self.weights) else "tag"

    @property
    def weights_note(self) -> str:
        """The parenthesised note the table header shows after the model (empty for a tag)."""
        if self.kind == "random":
            return RANDOM_INIT_NOTE
        if self.kind == "checkpoint":
            return f"(weights from checkpoint `{self.weights}`)"
        return ""


def looks_like_path(weights: str) -> bool:
    """Whether a ``::`` suffix names a file rather than a pretrained tag."""
    return (
        os.sep in weights
        or "/" in weights
        or weights.lower().endswith(CHECKPOINT_SUFFIXES)
        or os.path.isfile(weights)
    )


def canonical_tag(tag: str) -> str:
    """OpenCLIP's own spelling of a pretrained tag: ``laion2b-s32b-b82k`` -> ``laion2b_s32b_b82k``.

    OpenCLIP looks tags up lower-cased with ``-`` read as ``_``; writing them that way everywhere keeps one
    spelling in specs, tables and results files.
    """
    return tag.strip().lower().replace("-", "_")


def parse_model_spec(text: str) -> ModelSpec:
    """Parse ``NAME``, ``NAME::TAG`` or ``NAME::/path``; raise ``ValueError`` on a malformed spec.

    A tag may be given in either spelling; the spec holds (and ``text`` shows) the canonical one.
    """
    name, separator, weights = text.strip().partition(SEPARATOR)
    name, weights = name.strip(), weights.strip()
    if not name:
        raise ValueError(f"model spec {text!r} has no model name (expected NAME, NAME::TAG or NAME::/path)")
    if separator and not weights:
        raise ValueError(f"model spec {text!r} ends in '::' with no tag or path after it")
    if weights and not looks_like_path(weights):
        weights = canonical_tag(weights)
    shown = f"{name}{SEPARATOR}{weights}" if weights else name
    return ModelSpec(text=shown, name=name, weights=weights or None)


@dataclass
class LoadedModel:
    """An OpenCLIP model in eval mode with what the benchmark needs to feed it."""

    spec: ModelSpec
    model: torch.nn.Module
    preprocess: Callable
    precision: str

    @property
    def dtype(self) -> torch.dtype:
        """The floating dtype inputs are given in (images are cast to it)."""
        return PRECISION_DTYPES[self.precision]

    @property
    def image_size(self) -> Tuple[int, int]:
        """The vision tower's own input size (height, width)."""
        return image_size_of(self.model)

    @property
    def embedding_width(self) -> Optional[int]:
        """Floats per embedding (``embedding_width``)."""
        return embedding_width(self.model, self.image_size)

    @property
    def context_length(self) -> int:
        """The text tower's context length (77 for CLIP)."""
        return int(self.model.context_length)

    @property
    def vocab_size(self) -> int:
        """Number of token ids the text tower embeds."""
        vocab = getattr(self.model, "vocab_size", None)
        return int(vocab if vocab is not None else self.model.token_embedding.num_embeddings)

    def tokenizer(self) -> Callable:
        """The model's own tokenizer (built on demand: some models fetch theirs from the hub)."""
        import open_clip

        return open_clip.get_tokenizer(self.spec.name)


def image_size_of(model: torch.nn.Module) -> Tuple[int, int]:
    """(height, width) the vision tower expects, from its preprocess config or its attribute."""
    visual = model.visual
    size = getattr(visual, "preprocess_cfg", {}).get("size") or getattr(visual, "image_size")
    if isinstance(size, int):
        return (size, size)
    height, width = size
    return (int(height), int(width))


def embedding_width(model: torch.nn.Module, image_size: Optional[Tuple[int, int]] = None) -> Optional[int]:
    """How many floats the model's embeddings have (its joint space's width), as OpenCLIP built it: the text
    projection's output (``CLIP``), else the text or vision tower's ``output_dim`` (``CustomTextCLIP``, ViT and
    ResNet towers); failing those, the width of one eager image embedding of zeros (``image_size``); None if
    even that fails."""
    projection = getattr(model, "text_projection", None)
    if isinstance(projection, torch.nn.Linear):
        return int(projection.out_features)
    if isinstance(projection, torch.Tensor) and projection.dim() == 2:
        return int(projection.shape[1])
    for tower in ("text", "visual"):
        width = getattr(getattr(model, tower, None), "output_dim", None)
        if isinstance(width, int) and width > 0:
            return width
    if image_size is None:
        return None
    try:
        parameter = next(model.parameters())
        with torch.inference_mode():
            zeros = torch.zeros((1, 3, *image_size), dtype=parameter.dtype, device=parameter.device)
            return int(model.encode_image(zeros).shape[-1])
    except Exception:  # noqa: BLE001 - unknown: 'dimensions' is then refused as not checkable
        logger.warning("could not tell the model's embedding width", exc_info=True)
        return None


@contextmanager
def _quiet_open_clip_logging() -> Iterator[None]:
    """Mute library log records while loading: OpenCLIP and the hub log each failure (and each
    retry) before raising, and the user should see one message, ours, not four."""
    logging.disable(logging.ERROR)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def _root_cause(error: BaseException) -> BaseException:
    """The innermost exception of a chain (usually the most specific: DNS failure, offline mode)."""
    seen = {id(error)}
    while True:
        inner = error.__cause__ or error.__context__
        if inner is None or id(inner) in seen:
            return error
        seen.add(id(inner))
        error = inner


def _one_line(error: BaseException, limit: int = 300) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    text = f"{type(error).__name__}: {text}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _alternatives(name: str) -> str:
    return (
        f"  Either run with random-init weights (for timing only: their embeddings mean nothing): --model {name}\n"
        f"  or fetch the checkpoint elsewhere and pass its path:  --model {name}::/path/to/open_clip_model.safetensors"
    )


def _check_spec(spec: ModelSpec) -> None:
    """Reject unknown model names and tags before anything slow happens."""
    import open_clip

    if spec.name.startswith(("hf-hub:", "local-dir:")):
        return
    known = open_clip.list_models()
    if spec.name not in known:
        close = difflib.get_close_matches(spec.name, known, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else " See open_clip.list_models()."
        raise ModelLoadError(f"error: unknown OpenCLIP model {spec.name!r}.{hint}")
    if spec.kind == "tag" and not open_clip.get_pretrained_cfg(spec.name, spec.weights):
        tags = ", ".join(open_clip.list_pretrained_tags_by_model(spec.name)) or "none"
        raise ModelLoadError(
            f"error: {spec.name} has no pretrained tag {spec.weights!r} (known tags: {tags}).\n"
            + _alternatives(spec.name)
        )
    if spec.kind == "checkpoint" and not os.path.isfile(spec.weights):
        raise ModelLoadError(
            f"error: checkpoint file not found: {spec.weights}\n"
            f"  Pass an existing .pt/.bin/.safetensors file, a pretrained tag, or --model {spec.name} for random init."
        )


@dataclass(frozen=True)
class ExpectedInputs:
    """What a model's inputs will be prepared with, known before the model is built: OpenCLIP's eval image
    transform and the text tower's context length."""

    preprocess: Callable
    context_length: int


def inputs_before_load(spec: ModelSpec) -> Optional[ExpectedInputs]:
    """The eval transform and context length OpenCLIP gives ``spec``'s model, read from the configurations
    ``open_clip.create_model_and_transforms`` reads (the built-in model's and its pretrained tag's) without building
    the model; None where the model itself says (a hub or local-dir model, an unknown name or tag). Until the model
    has loaded it is an expectation: compare it with the loaded model's before relying on it."""
    import open_clip
    from open_clip.transform import PreprocessCfg, image_transform_v2, merge_preprocess_dict

    if spec.name not in open_clip.list_models():
        return None
    config = open_clip.get_model_config(spec.name) or {}
    preprocess_cfg = asdict(PreprocessCfg())
    if spec.kind == "tag":
        tag_cfg = open_clip.get_pretrained_cfg(spec.name, spec.weights)
        if not tag_cfg:
            return None
        preprocess_cfg = merge_preprocess_dict(preprocess_cfg, tag_cfg)
    # OpenCLIP sets the size from the built vision tower, whose image_size comes from this configuration
    preprocess_cfg["size"] = (config.get("vision_cfg") or {}).get("image_size", 224)
    context_length = (config.get("text_cfg") or {}).get("context_length", 77)
    return ExpectedInputs(image_transform_v2(PreprocessCfg(**preprocess_cfg), is_train=False), int(context_length))


def import_model_library() -> None:
    """Import OpenCLIP, and torchvision with it, on the calling thread. Call it before starting threads that import
    either: torchvision's subpackages import each other, so two threads entering it at once by different modules
    (OpenCLIP's ``from torchvision.ops import ...`` on one, ``import torchvision`` on another) can find a module
    half made and fail (``ImportError: cannot import name 'StochasticDepth' from partially initialized module
    'torchvision.ops'``). Free where they are imported already, as in a script that imports OpenCLIP at the top."""
    import open_clip  # noqa: F401 - imports torchvision whole


def load_model(spec: ModelSpec, device: torch.device, precision: str, seed: int = 0) -> LoadedModel:
    """Build ``spec`` on ``device`` in ``precision`` through OpenCLIP, in eval mode.

    Random-init weights are seeded so repeated runs use the same weights. A tag's weights come from the
    local cache when they are there; otherwise the fetch is announced (logged) and the host probed first,
    so no network, or ``HF_HUB_OFFLINE=1`` without cached weights, fails in seconds. Raises
    :class:`ModelLoadError` (one readable message, no traceback needed) when the name or tag is
    unknown, the checkpoint is missing, or the tag's weights cannot be fetched.
    """
    import open_clip

    _check_spec(spec)
    torch.manual_seed(seed)
    from_hub = spec.kind == "tag" or (spec.kind == "random" and spec.name.startswith(HF_HUB_PREFIX))
    fetch = prepared_fetch(spec.name, spec.weights) if from_hub else contextlib.nullcontext()
    try:
        with fetch, _quiet_open_clip_logging():
            model, _, preprocess = open_clip.create_model_and_transforms(
                spec.name, pretrained=spec.weights, precision=precision, device=device
            )
    except WeightsUnreachableError as error:
        what = f"tag {spec.weights!r} of {spec.name}" if spec.weights else spec.name
        raise ModelLoadError(
            f"error: cannot fetch pretrained weights for {what}: {error}\n" + _alternatives(spec.name)
        ) from None
    except Exception as error:  # OpenCLIP raises RuntimeError, the hub OSError subclasses
        cause = _one_line(_root_cause(error))
        if spec.kind == "tag":
            raise ModelLoadError(
                f"error: cannot fetch pretrained weights for tag {spec.weights!r} of {spec.name} "
                f"({spec.text}): {cause}\n" + _alternatives(spec.name)
            ) from None
        raise ModelLoadError(f"error: cannot build {spec.text}: {cause}") from None
    return LoadedModel(spec=spec, model=model.eval(), preprocess=preprocess, precision=precision)


def fp32_reference(loaded: LoadedModel) -> torch.nn.Module:
    """The same weights in fp32 on the same device: the yardstick for both stock and patched error.

    For an fp32 model the stock model is its own reference (no copy).
    """
    if loaded.precision == "fp32":
        return loaded.model
    return copy.deepcopy(loaded.model).float().eval()

