"""The clip_flash server with its model and image decoding replaced by no-ops, to measure what the HTTP side,
the batchers and the hand-offs between them cost per request (on any machine, no GPU).

    python -m benchmarks.serve.overhead_server --port 8000 [any clip-flash serve option, e.g. --workers 2]

Everything but the model and the JPEG decoder is the real server: routes, parsing, queues, the three batcher
threads per tower, the tokenizer, result scatter, response encoding, ``--workers N`` frontends. An image item
becomes a zero tensor (no decoding); every embedding is ``--dim`` zeros plus one. Drive it with ``wrk`` or the
bench's load generator, and profile it with py-spy.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, List, Sequence, Tuple

import torch


class NoDecodeImageInputs:
    """Image payloads counted, not decoded: each one becomes a row of zeros (an empty payload fails its item)."""

    def __init__(self, size: int = 8) -> None:
        self.size = size

    def host(self, payloads: Sequence[bytes]) -> Any:
        return [position for position, payload in enumerate(payloads) if payload], \
            [(position, "empty image") for position, payload in enumerate(payloads) if not payload]

    def device(self, host: Any) -> Tuple[List[Tuple[List[int], torch.Tensor]], List[Tuple[int, str]]]:
        positions, failures = host
        groups = [(positions, torch.zeros((len(positions), self.size)))] if positions else []
        return groups, failures

    def close(self) -> None:
        pass


def install(dim: int) -> None:
    """Make ``Engine`` load the no-op model in place of an OpenCLIP one (this process only)."""
    from clip_flash.inputs.text.tokenizer import get_tokenizer
    from clip_flash.serve import engine as engine_module
    from clip_flash.serve.batcher import TowerBatcher
    from clip_flash.serve.inputs import TextInputs
    from clip_flash.serve.jobs import IMAGE, TEXT

    def encode(x: torch.Tensor) -> torch.Tensor:
        return torch.ones((x.shape[0], dim))

    def load_on(self, device) -> None:
        config = self.config
        text_inputs = TextInputs(get_tokenizer("ViT-B-32"), 77, group_by_length=True, name="ViT-B-32")
        self.batchers = {
            IMAGE: TowerBatcher(IMAGE, NoDecodeImageInputs(), encode, config.max_batch, config.max_wait_ms / 1e3,
                                self.lock, self._dequeued, self.metrics, None, not config.wait_when_idle,
                                config.max_batches_in_flight),
            TEXT: TowerBatcher(TEXT, text_inputs, encode, config.max_text_batch, config.max_wait_ms / 1e3,
                               self.lock, self._dequeued, self.metrics, None, not config.wait_when_idle,
                               config.max_batches_in_flight),
        }
        self.description = f"no-op model ({dim} zeros), no image decoding: overhead only"

    engine_module.Engine._load_on = load_on


def main(argv: Sequence[str] = None) -> int:
    from clip_flash.serve import cli

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=768, help="embedding width (default: %(default)s)")
    cli.add_arguments(parser)
    args = parser.parse_args(argv)
    install(args.dim)
    args.device = "cpu"
    return cli.run(args)


if __name__ == "__main__":
    sys.exit(main())
