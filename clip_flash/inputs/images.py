"""The image preparer's import path before the wings: kept for code written against it."""
from .image.preprocessor import DecodedImages, ImagePreprocessor, PreparedImages

__all__ = ["DecodedImages", "ImagePreprocessor", "PreparedImages"]
