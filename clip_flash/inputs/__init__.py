"""Inputs in: images and text turned into exactly what OpenCLIP's own transforms and tokenizer give."""
from .images import DecodedImages, ImagePreprocessor, PreparedImages

__all__ = ["ImagePreprocessor", "PreparedImages", "DecodedImages"]
