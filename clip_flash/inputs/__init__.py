"""Inputs in: images and text turned into exactly what OpenCLIP's own transforms and tokenizer give."""
