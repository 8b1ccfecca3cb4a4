"""A random-init Hugging Face CLIP folder shaped like an OpenCLIP model, for servers that load only that format.

    python -m benchmarks.serve.hf_clip_folder --model ViT-L-14 --out /tmp/hf-clip

infinity-emb serves CLIP only from a Hugging Face folder, and the GPU host has no network: this writes one
offline with ``save_pretrained``. The towers take OpenCLIP's sizes for ``--model`` (widths, depths, heads of
64 channels, patch and image size, context length, projection size); the tokenizer's ``vocab.json`` and
``merges.txt`` are written from the BPE file OpenCLIP ships (the same vocabulary as OpenAI's CLIP), and the
fast tokenizer's ``tokenizer.json`` from them; the image processor is OpenAI CLIP's (resize shortest side,
centre crop, OpenAI mean/std). Weights are random (seeded): timings do not depend on them, and a results table
says they are random.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import List, Optional

OPENAI_MEAN = [0.48145466, 0.4578275, 0.40821073]
OPENAI_STD = [0.26862954, 0.26130258, 0.27577711]


def write_tokenizer(out: Path) -> None:
    """vocab.json and merges.txt from OpenCLIP's BPE file, as OpenAI's CLIP tokenizer has them."""
    import open_clip.tokenizer as openclip_tokenizer

    tokenizer = openclip_tokenizer.SimpleTokenizer()
    merges = gzip.open(openclip_tokenizer.default_bpe()).read().decode("utf-8").split("\n")
    merges = merges[1:49152 - 256 - 2 + 1]  # the slice SimpleTokenizer itself uses
    # OpenCLIP names the special tokens <start_of_text>/<end_of_text>; Hugging Face's CLIPTokenizer expects
    # OpenAI's <|startoftext|>/<|endoftext|> (same ids, 49406/49407).
    names = {"<start_of_text>": "<|startoftext|>", "<end_of_text>": "<|endoftext|>"}
    vocab = {names.get(token, token): index for token, index in tokenizer.encoder.items()}
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (out / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")


def write_folder(model: str, out: Path, dtype: str = "float16") -> None:
    import open_clip
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizerFast

    config = open_clip.get_model_config(model.partition("::")[0])
    if config is None:
        raise SystemExit(f"unknown OpenCLIP model {model!r}")
    vision, text = config["vision_cfg"], config["text_cfg"]
    image_size = vision["image_size"] if isinstance(vision["image_size"], int) else vision["image_size"][0]
    vision_width = vision["width"]
    text_width = text.get("width", 512)
    hf_config = CLIPConfig(
        projection_dim=config["embed_dim"],
        text_config={"hidden_size": text_width, "intermediate_size": int(text_width * text.get("mlp_ratio", 4.0)),
                     "num_hidden_layers": text.get("layers", 12), "num_attention_heads": text.get("heads", 8),
                     "max_position_embeddings": text.get("context_length", 77),
                     "vocab_size": text.get("vocab_size", 49408), "hidden_act": "gelu"},
        vision_config={"hidden_size": vision_width,
                       "intermediate_size": int(vision_width * vision.get("mlp_ratio", 4.0)),
                       "num_hidden_layers": vision["layers"],
                       "num_attention_heads": vision_width // vision.get("head_width", 64),
                       "image_size": image_size, "patch_size": vision["patch_size"], "hidden_act": "gelu"},
    )
    torch.manual_seed(0)
    model_hf = CLIPModel(hf_config).to(getattr(torch, dtype)).eval()
    out.mkdir(parents=True, exist_ok=True)
    model_hf.save_pretrained(out)
    write_tokenizer(out)
    # The fast (Rust) tokenizer, saved as tokenizer.json, as the Hub's CLIP folders ship it: a server loading
    # this folder tokenizes as it would a downloaded one.
    tokenizer = CLIPTokenizerFast(vocab_file=str(out / "vocab.json"), merges_file=str(out / "merges.txt"))
    processor = CLIPImageProcessor(size={"shortest_edge": image_size}, crop_size={"height": image_size,
                                   "width": image_size}, image_mean=OPENAI_MEAN, image_std=OPENAI_STD)
    CLIPProcessor(image_processor=processor, tokenizer=tokenizer).save_pretrained(out)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ViT-L-14", help="OpenCLIP model name whose shape to copy")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    args = parser.parse_args(argv)
    write_folder(args.model, args.out, args.dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
