"""The tokenizer's import path before the wings: kept for code written against it."""
from .text.tokenizer import FastCLIPTokenizer, get_tokenizer

__all__ = ["FastCLIPTokenizer", "get_tokenizer"]
