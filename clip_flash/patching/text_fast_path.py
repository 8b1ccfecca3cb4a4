"""Text towers that compute only real tokens.

In a causal text tower pooled at one token per row (OpenCLIP's ``argmax`` / ``eos`` / ``first`` pooling), no
position after a row's pooled token can change that row's output: causal attention never looks forward and
every other op is per token. So the tower may stop each row at its pooled token. Two ways, chosen per call:
- packed: only each row's real tokens, concatenated, with variable-length causal attention over cumulative
  offsets; every other op runs on the packed (tokens, width) matrix;
- cut: the padded batch truncated after the batch's longest pooled position, with a causal flag.
Either way the last block's out-projection, ln_2 and MLP run for the pooled tokens alone, since nothing reads
the other tokens' outputs (``run_blocks(pooled=...)``).
Both need the pooled positions' maximum (and sum) on the host: one small device-to-host copy per call,
which waits for everything queued before it. Token ids given on the host (CPU, ideally pinned) to a tower on
another device avoid that wait: the lengths are read on the host and the ids copied without blocking, so a
pipeline can queue the next batch while the device still runs the last one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import FrozenSet, List, Optional, Tuple

import torch
import torch.nn.functional as F
from open_clip.model import CLIP
from open_clip.transformer import TextTransformer
from torch import nn

from ..backends import AttentionBackend, AttentionNeeds
from ..backends.base import dtype_names
from ..ops.packed_attention import MAX_SEQLEN as PACKED_KERNEL_MAX_SEQLEN
from .context import PlanContext, Site
from .residual_block import is_standard_causal_mask, run_blocks

SKIPPABLE_POOLING = ("argmax", "eos", "first")
# Pack only when padding would be a real share of the cut batch; near-uniform lengths run faster cut.
PACK_WHEN_REAL_FRACTION_BELOW = 0.9


@dataclass
class TextPlan:
    """Per text tower: how to pool, and where packed (variable-length) attention can serve it."""

    pool_type: str
    eos_id: Optional[int]
    pack_devices: Optional[FrozenSet[str]] = frozenset()  # device types packed attention serves; None: any
    pack_dtypes: Optional[FrozenSet[torch.dtype]] = None  # dtypes it serves; None: any

    def packs(self, device_type: str, dtype: torch.dtype) -> bool:
        """Whether packed attention serves activations of this device and dtype (dtype-limited kernels
        not under autocast, which changes the dtypes the blocks compute in)."""
        if self.pack_devices is not None and device_type not in self.pack_devices:
            return False
        return self.pack_dtypes is None or (dtype in self.pack_dtypes and not torch.is_autocast_enabled(device_type))


def pooled_positions(text: torch.Tensor, pool_type: str, eos_id: Optional[int]) -> torch.Tensor:
    """The position OpenCLIP's ``text_global_pool`` reads for each row, computed the same way."""
    if pool_type == "argmax":
        return text.argmax(dim=-1)
    if pool_type == "eos":
        return (text == eos_id).int().argmax(dim=-1)
    if pool_type == "first":
        return torch.zeros(text.shape[0], dtype=torch.long, device=text.device)
    raise ValueError(f"pooling {pool_type!r} reads more than one position")


def _can_skip(tower: nn.Module, text: torch.Tensor) -> bool:
    if torch.jit.is_scripting() or torch.compiler.is_compiling():
        return False  # data-dependent shapes; the full-length causal path compiles cleanly instead
    if text.dim() != 2 or text.shape[1] != tower.positional_embedding.shape[0]:
        return False  # let the stock path handle (or reject) unusual shapes exactly as it would
    return not (tower.transformer.grad_checkpointing and torch.is_grad_enabled())


def tower_device(tower: nn.Module) -> torch.device:
    """Where the tower's token embedding (and so its computation) lives."""
    return tower.token_embedding.weight.device


def to_tower_device(tower: nn.Module, text: torch.Tensor) -> torch.Tensor:
    """Host token ids moved to the tower's device (without blocking when they are pinned); others as given."""
    device = tower_device(tower)
    if text.device.type == "cpu" and device.type != "cpu":
        return text.to(device, non_blocking=True)
    return text


def encode_pooled_text(tower: nn.Module, text: torch.Tensor, plan: TextPlan,
                       cut_length: Optional[int] = None) -> torch.Tensor:
    """Pooled, projected text features of ``text`` computed on real tokens only.

    ``tower`` is a CLIP model or a TextTransformer (they name their parts alike). ``text`` may be on the
    tower's device, or on the host for a tower elsewhere: then the lengths are read there (no device sync)
    and the ids copied to the device. ``cut_length``, when given, must be at least the longest pooled
    position + 1; it skips the host sync and forces the cut path (used by CUDA-graph capture, which cannot
    read device values).
    """
    transformer = tower.transformer
    cast_dtype = transformer.get_cast_dtype()
    batch = text.shape[0]
    host_lengths = None
    if text.device.type == "cpu" and tower_device(tower).type != "cpu":
        host_lengths = pooled_positions(text, plan.pool_type, plan.eos_id) + 1
        text = to_tower_device(tower, text)
    pool_at = pooled_positions(text, plan.pool_type, plan.eos_id)
    lengths = pool_at + 1

    packed = False
    if cut_length is None:
        if host_lengths is not None:
            longest, total = int(host_lengths.max()), int(host_lengths.sum())
        else:
            longest, total = torch.stack([lengths.max(), lengths.sum()]).tolist()  # the one host sync
        cut_length = longest
        can_pack = plan.packs(text.device.type, cast_dtype)
        packed = can_pack and total < PACK_WHEN_REAL_FRACTION_BELOW * batch * longest

    if packed:
        cu_seqlens = F.pad(lengths.cumsum(0), (1, 0))
        row = torch.repeat_interleave(torch.arange(batch, device=text.device), lengths, output_size=total)
        position = torch.arange(total, device=text.device) - cu_seqlens[row]
        return encode_packed_tokens(tower, text[row, position], position, cu_seqlens.to(torch.int32),
                                    cu_seqlens[1:] - 1, cut_length)
    x = tower.token_embedding(text[:, :cut_length]).to(cast_dtype)
    x = x + tower.positional_embedding[:cut_length].to(cast_dtype)
    return _project_pooled(tower, run_blocks(transformer.resblocks, x, causal=True, pooled=pool_at))


def encode_packed_tokens(tower: nn.Module, ids: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor,
                         last: torch.Tensor, max_seqlen: int) -> torch.Tensor:
    """Pooled, projected features of packed sequences: ``ids`` and ``positions`` (T,) the tokens one sequence
    after another, ``cu_seqlens`` (int32) where each starts, ``last`` the index of each row's pooled token,
    ``max_seqlen`` at least the longest sequence. Host-free: what a CUDA graph of packed tokens captures."""
    cast_dtype = tower.transformer.get_cast_dtype()
    x = tower.token_embedding(ids).to(cast_dtype)
    x = x + tower.positional_embedding[positions].to(cast_dtype)
    return _project_pooled(tower, run_blocks(tower.transformer.resblocks, x, causal=True,
                                             packing=(cu_seqlens, max_seqlen), pooled=last))


def _project_pooled(tower: nn.Module, pooled: torch.Tensor) -> torch.Tensor:
    # ln_final is per token, so normalizing only the pooled rows equals stock's normalize-then-pool.
    pooled = tower.ln_final(pooled)
    projection = tower.text_projection
    if projection is not None:
        pooled = projection(pooled) if isinstance(projection, nn.Linear) else pooled @ projection
    return pooled


class FlashTextCLIP(CLIP):
    """``CLIP`` whose ``encode_text`` skips padding (patch() swaps an existing model's class to this)."""

    _clip_flash_text: TextPlan

    def encode_text(self, text: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        """Stock ``encode_text`` on real tokens only; ``text`` may also be host ids for a model on a GPU."""
        if not _can_skip(self, text):
            return super().encode_text(to_tower_device(self, text), normalize)
        pooled = encode_pooled_text(self, text, self._clip_flash_text)
        return F.normalize(pooled, dim=-1) if normalize else pooled


class FlashTextTransformer(TextTransformer):
    """``TextTransformer`` (CustomTextCLIP's text tower) whose forward skips padding."""

    _clip_flash_text: TextPlan

    def forward(self, text: torch.Tensor) -> torch.Tensor:
        """Stock ``forward`` on real tokens only; ``text`` may also be host ids for a tower on a GPU."""
        if not _can_skip(self, text):
            return super().forward(to_tower_device(self, text))
        return encode_pooled_text(self, text, self._clip_flash_text)


def _intersection(sets: List[Optional[FrozenSet]]) -> Optional[FrozenSet]:
    known = [s for s in sets if s is not None]
    return frozenset.intersection(*known) if known else None


def packing_limits(backend: AttentionBackend, needs: AttentionNeeds) -> TextPlan:
    """Where ``backend`` serves the tower's packed attention (a TextPlan's ``pack_devices``/``pack_dtypes``):
    the devices and dtypes both its limits allow, when it serves ``needs`` (a packed call on one of them)."""
    if not backend.supports_varlen:
        return TextPlan("", None)
    limits = [backend.limits] + ([backend.varlen_limits] if backend.varlen_limits is not None else [])
    devices = _intersection([limit.device_types for limit in limits])
    dtypes = _intersection([limit.dtypes for limit in limits])
    probe = AttentionNeeds(
        device_type=min(devices) if devices else needs.device_type,
        dtype=min(dtypes, key=str) if dtypes else needs.dtype,
        head_dim=needs.head_dim, causal=True, varlen=True, capability=needs.capability,
    )
    if devices == frozenset() or dtypes == frozenset() or backend.unsupported_reasons(probe):
        return TextPlan("", None)
    return TextPlan("", None, pack_devices=devices, pack_dtypes=dtypes)


def plan_text_tower(tower: nn.Module, site: Site, context: PlanContext) -> None:
    """Skip padding where it is exact; say why not elsewhere (after every block of the tower was planned)."""
    if not hasattr(tower, "transformer"):
        return
    if isinstance(tower, CLIP):
        pool_type, eos_id, new_class = tower.text_pool_type, getattr(tower, "text_eos_id", None), FlashTextCLIP
        blockers = [] if type(tower) is CLIP else [f"{type(tower).__name__} is not plain CLIP"]
    else:
        pool_type, eos_id, new_class = tower.pool_type, tower.eos_id, FlashTextTransformer
        blockers = [] if type(tower) is TextTransformer else [f"{type(tower).__name__} is not TextTransformer"]
        if tower.cls_emb is not None:
            blockers.append("class token appended after all positions (CoCa)")
        if tower.output_tokens:
            blockers.append("output_tokens=True needs every position")
    if not context.options.skip_padding:
        blockers.insert(0, "padding skipping turned off")
    if pool_type not in SKIPPABLE_POOLING:
        blockers.append(f"pooling {pool_type!r} reads more than one position")
    if tower.attn_mask is None:
        blockers.append("bidirectional (no causal mask)")
    elif not is_standard_causal_mask(tower.attn_mask):
        blockers.append("non-standard attention mask")
    plans = [context.patched_blocks.get(id(block)) for block in tower.transformer.resblocks]
    if not all(plan is not None and plan.causal_mask_owner is tower for plan in plans):
        blockers.append("not every text block runs a patched causal kernel")
    if blockers:
        context.report.towers["text"] = "full length (" + "; ".join(blockers) + ")"
        return
    backend = plans[0].backend
    weight = tower.transformer.resblocks[0].attn.in_proj_weight
    packing = packing_limits(backend, context.needs(weight, head_dim=plans[0].head_dim, causal=True, varlen=True))
    text_plan = TextPlan(pool_type, eos_id, pack_devices=packing.pack_devices, pack_dtypes=packing.pack_dtypes)
    context.swap(tower, new_class, {"_clip_flash_text": text_plan})
    where = []
    if packing.pack_devices is not None:
        where.append("/".join(sorted(device.upper() for device in packing.pack_devices)))
    if packing.pack_dtypes is not None:
        where.append(dtype_names(packing.pack_dtypes))
    where = f" on {' '.join(where)}" if where else ""
    kernels = f"clip_flash's kernel up to {PACKED_KERNEL_MAX_SEQLEN} tokens, else {backend.name}" \
        if plans[0].packed_kernel else backend.name
    how = f"packed variable-length attention ({kernels}){where}, else " if packing.pack_devices != frozenset() \
        else ""
    context.report.towers["text"] = (f"skips padding: {how}cut at the batch's longest pooled token "
                                     f"(exact: causal tower pooled at one token, {pool_type!r}); "
                                     "last block at the pooled token alone")


def text_tower_plan(model: nn.Module) -> Tuple[Optional[nn.Module], Optional[TextPlan]]:
    """The text tower that skips padding and its plan (``model`` itself for CLIP, ``model.text`` for CustomTextCLIP),
    or (None, None) when ``patch`` did not make it skip padding."""
    if isinstance(model, FlashTextCLIP):
        return model, model._clip_flash_text
    text = getattr(model, "text", None)
    if isinstance(text, FlashTextTransformer):
        return text, text._clip_flash_text
    return None, None


def takes_host_token_ids(model: nn.Module) -> bool:
    """Whether ``model.encode_text`` (patched: it skips padding) accepts token ids still on the host and
    moves them to its device itself, without a device sync."""
    return isinstance(model, FlashTextCLIP) or isinstance(getattr(model, "text", None), FlashTextTransformer)
