"""What a ``GraphedEncoder`` derives from the model at one point in time (devices, watches, text plan, length
buckets, the capture space); rebuilt whole when the model changes."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ..patching.text_fast_path import FlashTextCLIP, FlashTextTransformer, TextPlan
from .capture import CapturedGraph, CaptureSpace, GraphKey
from .staleness import TowerWatch, tower_watches


@dataclass
class EncoderSetup:
    """Everything derived from the model at one point in time; replaced whole when the model changes."""

    device: torch.device
    watches: Dict[str, TowerWatch]
    no_graphs: Dict[str, Optional[str]]  # per tower: why it cannot be graphed (None: it can)
    image_dtype: Optional[torch.dtype]
    text_tower: Optional[nn.Module]  # set when the text tower skips padding: graphs run encode_pooled_text
    text_plan: Optional[TextPlan]
    context_length: Optional[int]
    length_for: Tuple[Optional[int], ...]  # longest pooled position + 1 -> length bucket
    space: Optional[CaptureSpace] = None  # None when no tower can be graphed
    graphs: Dict[GraphKey, Union[CapturedGraph, str]] = field(default_factory=dict)  # str: why capture failed


def bucket_table(buckets: Sequence[int]) -> Tuple[Optional[int], ...]:
    """table[n] = smallest bucket >= n, for n in 0..max(buckets); table[0] is None (an empty batch runs eager)."""
    table: List[Optional[int]] = [None]
    for n in range(1, max(buckets) + 1):
        table.append(min(b for b in buckets if b >= n))
    return tuple(table)


def validated(sizes: Sequence[int], what: str) -> Tuple[int, ...]:
    values = tuple(sorted({int(s) for s in sizes}))
    if not values or values[0] < 1 or any(int(s) != s for s in sizes):
        raise ValueError(f"{what} must be positive integers, got {tuple(sizes)!r}")
    return values


def _first_conv_dtype(visual: nn.Module) -> Optional[torch.dtype]:
    """The dtype images must have: the first convolution's (OpenCLIP keeps some fp32 embeddings in fp16 models)."""
    for module in visual.modules():
        if isinstance(module, nn.modules.conv._ConvNd):
            return module.weight.dtype
    param = next((p for p in visual.parameters() if p.is_floating_point()), None)
    return param.dtype if param is not None else None



def build_setup(model: nn.Module, text_lengths: Sequence[int],
                streams: Dict[torch.device, "torch.cuda.Stream"]) -> EncoderSetup:
    """What the encoder derives from ``model`` as it is now; ``streams`` holds one stream per device, reused
    across setups."""
    image_watch, text_watch = tower_watches(model)
    watches = {"image": image_watch, "text": text_watch}
    first = next(iter(image_watch.tensors or text_watch.tensors), None)
    device = first.device if first is not None else torch.device("cpu")
    no_graphs: Dict[str, Optional[str]] = {}
    for name, watch in watches.items():
        devices = {t.device for t in watch.tensors}
        if device.type != "cuda":
            no_graphs[name] = f"the model is on {device.type}: CUDA graphs need a CUDA model"
        elif devices - {device}:
            no_graphs[name] = f"the {name} tower spans devices {sorted(map(str, devices | {device}))}"
        else:
            no_graphs[name] = None

    text_tower, plan = None, None
    for candidate in (model, getattr(model, "text", None)):
        if isinstance(candidate, (FlashTextCLIP, FlashTextTransformer)) and \
                "_clip_flash_text" in candidate.__dict__:
            text_tower, plan = candidate, candidate._clip_flash_text
            break
    if text_tower is not None:
        context_length = int(text_tower.positional_embedding.shape[0])
    else:
        context_length = getattr(model, "context_length", None) or getattr(
            getattr(model, "text", None), "context_length", None)
    length_for: Tuple[Optional[int], ...] = ()
    if context_length:
        lengths = [length for length in text_lengths if length < context_length] + [context_length]
        length_for = bucket_table(lengths)

    visual = getattr(model, "visual", None)
    setup = EncoderSetup(
        device=device, watches=watches, no_graphs=no_graphs,
        image_dtype=_first_conv_dtype(visual) if isinstance(visual, nn.Module) else None,
        text_tower=text_tower, text_plan=plan, context_length=context_length, length_for=length_for,
    )
    if any(reason is None for reason in no_graphs.values()):
        # One stream per device for the encoder's lifetime: PyTorch keeps a cuBLAS workspace per stream, for
        # good, so a new stream per setup would leave one behind at every invalidation.
        stream = streams.get(device)
        if stream is None:
            stream = streams[device] = torch.cuda.Stream(device)
        setup.space = CaptureSpace(device, stream)  # a fresh pool: the previous one was freed with its graphs
    return setup
