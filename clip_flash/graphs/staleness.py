"""What a tower's CUDA graphs read, and the cheap per-call test that none of it changed.

Never replay stale. At setup the encoder records, per tower, every parameter and buffer tensor object and its
``data_ptr``, and keeps an alias of each one's storage alive. ``.to()``, ``.half()``, ``.cuda()`` and
``.data = ...`` all put new storage under the parameter; since the old storage cannot be freed while pinned,
the new one can never sit at the old address, so one ``data_ptr`` comparison per tensor detects every move,
dtype change or data swap (in-place updates such as ``load_state_dict`` keep the storage: graphs read them
correctly and nothing is invalidated). A parameter, buffer or submodule reassigned on a module of the model
(``module.weight = nn.Parameter(...)``, ``load_state_dict(assign=True)``) is caught by PyTorch's global
registration hooks. ``clip_flash.patch``/``unpatch`` is caught by the identity of the patch report. On any of
these the encoder drops every graph, returns the pool's memory (``torch.cuda.empty_cache()``: a private pool
is only handed back to the device that way) and captures again lazily, for the model as it now is (eager, with
the reason logged, if the model went to the CPU). A model in training mode (root or tower root) raises
``RuntimeError``: the encoder encodes for inference; ``model.eval()`` makes it usable again. The check costs
one C call per tensor of the tower being encoded (ViT-L-14 image tower: 296 tensors; see the tests), or one call in
all where the extension's ``TensorPointers`` makes it (a CUDA tower).
The pinned storage means a converted model's old weights stay allocated until the next call or
``release()``. Not detected: ``del`` of a parameter, writes to ``module._parameters`` directly, class swaps
other than clip_flash's own, and changes made while a call is running (a race in the caller's code).
"""
from __future__ import annotations

import threading
import weakref
from typing import Iterable, List, Optional, Sequence, Tuple

import torch
from torch import nn

from ..ops._extension import load_extension
from ..patching.patching import patch_report

_data_ptr = torch.Tensor.data_ptr

_watch_lock = threading.Lock()
_live_watches: "weakref.WeakSet[TowerWatch]" = weakref.WeakSet()
_hooks_installed = False


def _note_reassignment(module: nn.Module, name: str, value: object) -> None:
    """Global registration hook (parameters, buffers, submodules): marks the watches of ``module`` stale."""
    if not _live_watches:  # every module in the process pays this call; keep it one test when nothing is watched
        return None
    with _watch_lock:
        watches = list(_live_watches)
    key = id(module)
    for watch in watches:
        if (key in watch.module_ids and (key, name) not in watch.excluded) or (key, name) in watch.links:
            watch.reassigned = f"{type(module).__name__}.{name}"
    return None


def _install_hooks() -> None:
    global _hooks_installed
    with _watch_lock:
        if _hooks_installed:
            return
        from torch.nn.modules import module as module_mod
        module_mod.register_module_parameter_registration_hook(_note_reassignment)
        module_mod.register_module_buffer_registration_hook(_note_reassignment)
        module_mod.register_module_module_registration_hook(_note_reassignment)
        _hooks_installed = True


class TowerWatch:
    """What one tower's graphs read, and a cheap test, run on every call, that none of it changed.

    Args:
        model: the whole model (its patch report and ``training`` flag are watched).
        roots: the tower's top modules (``model.visual``; ``model`` / ``model.text``): their ``training`` flags
            and patch reports are watched.
        tensors: every parameter and buffer the tower's graphs read.
        modules: every module whose parameter, buffer or submodule reassignment invalidates the tower.
        links: (parent module, attribute) pairs whose reassignment replaces the tower (``(model, "visual")``).
        excluded: (module, attribute) pairs of ``modules`` that belong to another tower.
    """

    def __init__(self, model: nn.Module, roots: Sequence[nn.Module], tensors: Sequence[torch.Tensor],
                 modules: Iterable[nn.Module], links: Iterable[Tuple[nn.Module, str]] = (),
                 excluded: Iterable[Tuple[nn.Module, str]] = ()):
        modules = list(modules)
        _install_hooks()
        self.roots = tuple(dict.fromkeys([model, *roots]))  # ordered, without duplicates
        self.tensors = tuple(tensors)
        self.pointers = tuple(map(_data_ptr, self.tensors))
        self._native = native_pointers(self.tensors)
        # Aliases keep the watched storages allocated, so replaced storage can never reuse a watched address.
        self._pins: Optional[List[torch.Tensor]] = [t.detach() for t in self.tensors]
        self.reports = tuple(patch_report(m) for m in self.roots)
        # Where each tensor is registered: only read when conversions replace parameter objects (below).
        watched = {id(t) for t in self.tensors}
        self._slots = [(slots, name, tensor) for module in modules for slots in (module._parameters, module._buffers)
                       for name, tensor in slots.items() if id(tensor) in watched]
        self.module_ids = frozenset(id(m) for m in modules)
        self.links = frozenset((id(m), name) for m, name in links)
        self.excluded = frozenset((id(m), name) for m, name in excluded)
        self.reassigned: Optional[str] = None
        with _watch_lock:
            _live_watches.add(self)

    @property
    def training(self) -> bool:
        return any(m.training for m in self.roots)

    def stale_reason(self) -> Optional[str]:
        """None while everything the graphs read is as it was at setup; otherwise what changed."""
        if self.reassigned is not None:
            return f"{self.reassigned} was reassigned"
        for module, report in zip(self.roots, self.reports):
            if patch_report(module) is not report:
                return "the clip_flash patch state changed"
        if self._pointers_moved():
            return "parameters or buffers were moved, converted or replaced (.to(), .half(), .data = ...)"
        # With this (non-default) flag .to()/.half() put new Parameter objects straight into module._parameters,
        # which neither moves the old objects' storage nor fires the registration hooks.
        if torch.__future__.get_overwrite_module_params_on_conversion() and \
                not all(slots.get(name) is tensor for slots, name, tensor in self._slots):
            return "parameters were replaced by a conversion (overwrite_module_params_on_conversion)"
        return None

    def _pointers_moved(self) -> bool:
        if self._native is not None:
            return self._native.changed()
        return tuple(map(_data_ptr, self.tensors)) != self.pointers

    def close(self) -> None:
        """Stop watching and release the pinned storages."""
        with _watch_lock:
            _live_watches.discard(self)
        self._pins = None


def native_pointers(tensors: Sequence[torch.Tensor]) -> Optional[object]:
    """The extension's ``TensorPointers`` over ``tensors`` (the pointer test in one call), where the tower is on a
    CUDA device (graphs exist only there, and so does the extension) and the extension has it; else None."""
    if not any(tensor.is_cuda for tensor in tensors):
        return None
    extension = load_extension()
    if extension is None or not hasattr(extension, "TensorPointers"):
        return None
    return extension.TensorPointers(list(tensors))


def _tensors_of(module: nn.Module) -> List[torch.Tensor]:
    return list(module.parameters()) + list(module.buffers())


def tower_watches(model: nn.Module) -> Tuple[TowerWatch, TowerWatch]:
    """(image watch, text watch): the vision tower is ``model.visual``; the text tower is everything else."""
    visual = getattr(model, "visual", None)
    if not isinstance(visual, nn.Module):
        everything = _tensors_of(model)
        modules = list(model.modules())
        return (TowerWatch(model, [], everything, modules), TowerWatch(model, [], everything, modules))
    visual_tensors = _tensors_of(visual)
    visual_ids = {id(t) for t in visual_tensors}
    visual_modules = {id(m) for m in visual.modules()}
    text_tensors = [t for t in _tensors_of(model) if id(t) not in visual_ids]
    text_modules = [m for m in model.modules() if id(m) not in visual_modules]
    text_root = getattr(model, "text", None)
    if not isinstance(text_root, nn.Module):
        text_root = getattr(model, "transformer", None)
    text_roots = [text_root] if isinstance(text_root, nn.Module) else []
    return (TowerWatch(model, [visual], visual_tensors, visual.modules(), links=[(model, "visual")]),
            TowerWatch(model, text_roots, text_tensors, text_modules, excluded=[(model, "visual")]))
