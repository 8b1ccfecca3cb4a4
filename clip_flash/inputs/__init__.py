"""Inputs in: images (and text) turned into what OpenCLIP models take, exactly as OpenCLIP would."""
from .images import DecodedImages, ImagePreprocessor, PreparedImages

__all__ = ["ImagePreprocessor", "PreparedImages", "DecodedImages"]
