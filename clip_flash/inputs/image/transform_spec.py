"""What OpenCLIP's eval image transform computes, read from the transform object itself.

``open_clip.create_model_and_transforms`` returns a torchvision ``Compose`` built by
``open_clip.transform.image_transform``. For evaluation it has one of three shapes:

- ``shortest``: ``Resize(S)`` + ``CenterCrop((S, S))`` for a square size, or
  ``ResizeKeepRatio((h, w), longest=0)`` + ``CenterCrop((h, w))`` for a non-square one (the two round the
  resized size differently, which ``resize_rule`` records);
- ``longest``: ``ResizeKeepRatio((h, w), longest=1)`` + ``CenterCropOrPad((h, w), fill)``;
- ``squash``: ``Resize((h, w))``;

each followed by the conversion to RGB, ``ToTensor`` and ``Normalize``. ``spec_from_preprocess`` accepts
exactly these shapes and refuses anything else with ``UnsupportedTransformError``: a transform we do not
reproduce bit for bit is never approximated.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import torch

RESIZE_MODES = ("shortest", "longest", "squash")
INTERPOLATIONS = ("bicubic", "bilinear")
# How the resized size is rounded: torchvision Resize(int) truncates int(S * long / short); timm-style
# ResizeKeepRatio rounds each side with round(side / ratio); Resize((h, w)) takes the size as given.
RESIZE_RULES = ("torchvision_short_side", "keep_ratio", "exact")


def _transforms() -> Any:
    """``torchvision.transforms``, imported when a transform is read (in the caller's process): decoding workers
    use the spec only, and importing torchvision costs seconds on some hosts."""
    import torchvision.transforms

    return torchvision.transforms


class UnsupportedTransformError(ValueError):
    """The transform is not one of OpenCLIP's eval shapes, so it cannot be reproduced exactly."""


@dataclass(frozen=True)
class ImageTransformSpec:
    """Everything OpenCLIP's eval transform does to an image, as plain values.

    ``size`` is the model input (height, width). ``resize_mode`` is OpenCLIP's name for the geometry;
    ``resize_rule`` says how the resized size is rounded (``None``: the rule OpenCLIP uses for that mode
    and size). ``fill`` is the pad value of ``CenterCropOrPad`` (``longest``); ``CenterCrop`` pads with 0.
    """

    size: Tuple[int, int]
    resize_mode: str
    interpolation: str
    mean: Tuple[float, float, float]
    std: Tuple[float, float, float]
    fill: int = 0
    resize_rule: Optional[str] = None

    def __post_init__(self) -> None:
        height, width = self.size
        if not (isinstance(height, int) and isinstance(width, int) and height > 0 and width > 0):
            raise ValueError(f"size must be two positive ints (height, width), got {self.size!r}")
        if self.resize_mode not in RESIZE_MODES:
            raise ValueError(f"resize_mode must be one of {RESIZE_MODES}, got {self.resize_mode!r}")
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, got {self.interpolation!r}")
        if len(self.mean) != 3 or len(self.std) != 3:
            raise ValueError(f"mean and std need 3 values each, got {self.mean!r} and {self.std!r}")
        if any(float(s) == 0.0 for s in self.std):
            raise ValueError(f"std has a zero: {self.std!r}")
        if not (isinstance(self.fill, int) and 0 <= self.fill <= 255):
            raise ValueError(f"fill must be an int in [0, 255], got {self.fill!r}")
        if self.resize_rule is None:
            object.__setattr__(self, "resize_rule", default_resize_rule(self.resize_mode, self.size))
        if self.resize_rule not in RESIZE_RULES:
            raise ValueError(f"resize_rule must be one of {RESIZE_RULES}, got {self.resize_rule!r}")
        if (self.resize_mode == "squash") != (self.resize_rule == "exact"):
            raise ValueError(f"resize_rule {self.resize_rule!r} does not go with resize_mode {self.resize_mode!r}")
        if self.resize_mode == "longest" and self.resize_rule != "keep_ratio":
            raise ValueError("resize_mode 'longest' resizes with the keep_ratio rule")

    @property
    def keep_ratio_longest(self) -> float:
        """ResizeKeepRatio's ``longest`` weight (1.0 for 'longest', 0.0 for 'shortest')."""
        return 1.0 if self.resize_mode == "longest" else 0.0


def default_resize_rule(resize_mode: str, size: Tuple[int, int]) -> str:
    """The rounding rule ``open_clip.transform.image_transform`` builds for this mode and size."""
    if resize_mode == "squash":
        return "exact"
    if resize_mode == "longest":
        return "keep_ratio"
    return "torchvision_short_side" if size[0] == size[1] else "keep_ratio"


def _describe(transform: Any) -> str:
    return repr(transform).replace("\n", " ")


def _interpolation_name(mode: Any, owner: Any) -> str:
    InterpolationMode = _transforms().InterpolationMode
    names = {InterpolationMode.BICUBIC: "bicubic", InterpolationMode.BILINEAR: "bilinear"}
    if isinstance(mode, int) and not isinstance(mode, InterpolationMode):
        # torchvision accepts Pillow's integer constants; only BILINEAR (2) and BICUBIC (3) are ours.
        mode = {2: InterpolationMode.BILINEAR, 3: InterpolationMode.BICUBIC}.get(mode, mode)
    if mode not in names:
        raise UnsupportedTransformError(
            f"{_describe(owner)}: interpolation {mode!r} is not bicubic or bilinear, which are the only ones "
            "OpenCLIP's eval transforms use and the only ones reproduced exactly"
        )
    return names[mode]


def _pair(size: Any, owner: Any) -> Tuple[int, int]:
    if isinstance(size, numbers.Integral) and not isinstance(size, bool):
        return int(size), int(size)
    if isinstance(size, Sequence) and len(size) in (1, 2) and all(
        isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in size
    ):
        return (int(size[0]), int(size[0])) if len(size) == 1 else (int(size[0]), int(size[1]))
    raise UnsupportedTransformError(f"{_describe(owner)}: size {size!r} is not an int or an (h, w) pair of ints")


def _is_convert_to_rgb(transform: Any) -> bool:
    """OpenCLIP's RGB conversion: ``MaybeConvertMode('RGB')`` (3.x) or the ``_convert_to_rgb`` function (2.x)."""
    module = getattr(transform, "__module__", "") or getattr(type(transform), "__module__", "")
    if not module.startswith("open_clip"):
        return False
    if type(transform).__name__ == "MaybeConvertMode":
        return getattr(transform, "mode", None) == "RGB"
    return getattr(transform, "__name__", None) == "_convert_to_rgb"


def _is_to_tensor(transform: Any) -> bool:
    if type(transform) is _transforms().ToTensor:
        return True
    return type(transform).__name__ == "MaybeToTensor" and type(transform).__module__.startswith("open_clip")


def _open_clip_class(transform: Any, name: str) -> bool:
    return type(transform).__name__ == name and type(transform).__module__.startswith("open_clip")


def _resize_step(resize: Any) -> Tuple[str, Tuple[int, int], str, Optional[float]]:
    """(rule, size, interpolation, keep-ratio ``longest``) of the resize step, or a refusal."""
    if type(resize) is _transforms().Resize:
        if resize.max_size is not None:
            raise UnsupportedTransformError(f"{_describe(resize)}: max_size={resize.max_size} is not supported")
        interpolation = _interpolation_name(resize.interpolation, resize)
        single = isinstance(resize.size, numbers.Integral) or len(resize.size) == 1
        rule = "torchvision_short_side" if single else "exact"
        return rule, _pair(resize.size, resize), interpolation, None
    if _open_clip_class(resize, "ResizeKeepRatio"):
        if resize.random_scale_prob > 0 or resize.random_aspect_prob > 0:
            raise UnsupportedTransformError(f"{_describe(resize)}: random scale/aspect is a training augmentation")
        if resize.longest not in (0.0, 1.0):
            raise UnsupportedTransformError(
                f"{_describe(resize)}: longest={resize.longest} is neither 0 (shortest) nor 1 (longest)"
            )
        interpolation = _interpolation_name(resize.interpolation, resize)
        return "keep_ratio", _pair(resize.size, resize), interpolation, float(resize.longest)
    raise UnsupportedTransformError(
        f"{_describe(resize)}: the first step must be torchvision's Resize or OpenCLIP's ResizeKeepRatio"
    )


def spec_from_preprocess(preprocess: Any) -> ImageTransformSpec:
    """The ``ImageTransformSpec`` of an OpenCLIP eval transform; ``UnsupportedTransformError`` otherwise.

    Accepts exactly the ``Compose`` objects ``open_clip.transform.image_transform(..., is_train=False)``
    builds (for every resize mode, bicubic or bilinear, square or (h, w) sizes); anything else (an extra or
    missing step, a subclass, ``max_size``, another interpolation, a training transform) is refused with
    an error that names the offending step.
    """
    if type(preprocess) is not _transforms().Compose:
        raise UnsupportedTransformError(
            f"expected the torchvision Compose OpenCLIP builds for evaluation, got {type(preprocess).__name__}"
        )
    if torch.get_default_dtype() != torch.float32:
        raise UnsupportedTransformError(
            f"ToTensor gives torch's default dtype, here {torch.get_default_dtype()}; only float32 is reproduced"
        )
    steps: List[Any] = list(preprocess.transforms)
    if len(steps) < 4:
        raise UnsupportedTransformError(
            f"expected resize, [crop,] convert-to-RGB, ToTensor, Normalize; got {len(steps)} steps: "
            + ", ".join(_describe(s) for s in steps)
        )
    *geometry, convert, to_tensor, normalize = steps
    # From the end, so an appended step is the one named.
    if type(normalize) is not _transforms().Normalize:
        raise UnsupportedTransformError(f"{_describe(normalize)}: expected Normalize as the last step")
    if not _is_to_tensor(to_tensor):
        raise UnsupportedTransformError(f"{_describe(to_tensor)}: expected ToTensor before Normalize")
    if not _is_convert_to_rgb(convert):
        raise UnsupportedTransformError(f"{_describe(convert)}: expected OpenCLIP's convert-to-RGB before ToTensor")
    mean, std = _channel_triple(normalize.mean, normalize), _channel_triple(normalize.std, normalize)
    if any(s == 0.0 for s in std):
        raise UnsupportedTransformError(f"{_describe(normalize)}: a zero std divides by zero")

    if len(geometry) not in (1, 2):
        raise UnsupportedTransformError(
            "expected a resize and at most one crop before the RGB conversion, got: "
            + ", ".join(_describe(s) for s in geometry)
        )
    rule, resize_size, interpolation, longest = _resize_step(geometry[0])
    common = dict(interpolation=interpolation, mean=mean, std=std, resize_rule=rule)
    if len(geometry) == 1:
        if rule != "exact":
            raise UnsupportedTransformError(
                f"{_describe(geometry[0])} without a crop is not an OpenCLIP eval shape (squash is Resize((h, w)))"
            )
        return ImageTransformSpec(size=resize_size, resize_mode="squash", **common)

    crop = geometry[1]
    if type(crop) is _transforms().CenterCrop:
        crop_size, fill, mode = _pair(crop.size, crop), 0, "shortest"
        if rule == "keep_ratio" and longest != 0.0:
            raise UnsupportedTransformError(
                f"{_describe(geometry[0])} with CenterCrop: OpenCLIP pairs longest=1 with CenterCropOrPad")
    elif _open_clip_class(crop, "CenterCropOrPad"):
        crop_size, fill, mode = _pair(crop.size, crop), _fill_value(crop), "longest"
        if rule != "keep_ratio" or longest != 1.0:
            raise UnsupportedTransformError(f"{_describe(crop)} follows ResizeKeepRatio(longest=1) in OpenCLIP")
    else:
        raise UnsupportedTransformError(f"{_describe(crop)}: expected CenterCrop or OpenCLIP's CenterCropOrPad")
    if crop_size != resize_size:
        raise UnsupportedTransformError(
            f"{_describe(geometry[0])} then {_describe(crop)}: OpenCLIP crops to the resize size; these differ"
        )
    if rule == "exact":
        raise UnsupportedTransformError(f"{_describe(geometry[0])} followed by a crop is not an OpenCLIP eval shape")
    if mode == "shortest" and rule != default_resize_rule("shortest", crop_size):
        shape = "square" if crop_size[0] == crop_size[1] else "non-square"
        raise UnsupportedTransformError(
            f"{_describe(geometry[0])}: OpenCLIP resizes a {shape} "
            "'shortest' target the other way (Resize(int) for square, ResizeKeepRatio for (h, w))"
        )
    return ImageTransformSpec(size=crop_size, resize_mode=mode, fill=fill, **common)


def _channel_triple(values: Any, owner: Any) -> Tuple[float, float, float]:
    if isinstance(values, torch.Tensor):
        values = values.tolist()
    if isinstance(values, numbers.Real):
        values = (values,) * 3
    if not isinstance(values, Sequence) or len(values) != 3 or not all(isinstance(v, numbers.Real) for v in values):
        raise UnsupportedTransformError(f"{_describe(owner)}: expected 3 per-channel numbers, got {values!r}")
    return tuple(float(v) for v in values)  # type: ignore[return-value]


def _fill_value(crop: Any) -> int:
    fill = crop.fill
    if isinstance(fill, numbers.Integral) and not isinstance(fill, bool) and 0 <= int(fill) <= 255:
        return int(fill)
    raise UnsupportedTransformError(f"{_describe(crop)}: fill {fill!r} is not one int in [0, 255]")
