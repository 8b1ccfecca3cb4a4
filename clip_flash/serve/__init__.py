"""``clip-flash serve``: an OpenAI-compatible CLIP embedding server with dynamic batching across requests.

    clip-flash serve --model ViT-L-14::laion2b_s32b_b82k        # or: python -m clip_flash.serve ...
    curl localhost:8000/v1/embeddings -d '{"model": "ViT-L-14::laion2b_s32b_b82k", "input": ["a dog"]}'

Pieces: ``config`` (every setting), ``jobs`` (a request's items), ``inputs`` (decoding and tokenizing),
``batcher`` (one dynamic batcher per tower), ``engine`` (a model on a device; the pool of them), ``protocol``
(OpenAI's request and response shapes), ``app`` (the routes), ``metrics``, ``cli``, ``frontends`` (several HTTP
processes feeding one engine process), ``ray`` (a Ray Serve deployment). Needs the ``serve`` extra:
``pip install -e ".[serve]"`` in the checkout.
"""
from .config import ServeConfig

__all__ = ["ServeConfig"]
