"""Caption sets for timing tokenizers and text embedding: short prompts and longer, varied web-style text.

- ``imagenet_captions``: ImageNet class names x OpenAI's 80 prompt templates (shipped by OpenCLIP),
  about a dozen tokens each, all plain ASCII.
- ``web_captions``: longer alt-text-like captions (roughly 10 to 60 tokens), composed from fixed word
  lists with a seeded generator: mixed case, digits, punctuation, file names, hashtags, and in about one
  caption in six a character that is not plain ASCII or an ``&`` (curly quotes, accents, dashes, emoji,
  HTML entities), the share that takes OpenCLIP's slow cleaning path. Synthetic, stated as such.
"""
from __future__ import annotations

import random
from typing import List

from .workloads import caption_prompts

_SUBJECTS = ["dog", "golden retriever", "tabby cat", "red fox", "old man", "young woman", "group of friends",
             "child", "vintage car", "mountain bike", "sailboat", "steam locomotive", "wooden table",
             "bowl of ramen", "cup of coffee", "city skyline", "lighthouse", "field of sunflowers", "bridge",
             "pair of sneakers", "leather handbag", "smartphone", "laptop", "guitar", "birthday cake"]
_ADJECTIVES = ["small", "large", "bright", "dark", "colorful", "old", "modern", "rustic", "shiny", "fluffy",
               "wet", "snowy", "sunlit", "blurry", "close-up", "aerial", "black and white", "minimalist"]
_ACTIONS = ["sitting on", "running across", "standing next to", "parked in front of", "floating on",
            "lying under", "displayed on", "hanging above", "reflected in", "waiting near"]
_PLACES = ["a sandy beach", "the kitchen counter", "a busy street in Tokyo", "a forest trail", "the old harbor",
           "a white background", "a wooden floor", "the living room", "a snowy mountain", "Central Park",
           "a farmers market", "the train station", "a rooftop terrace", "a quiet lake at sunset"]
_EXTRAS = ["stock photo", "high resolution", "free download", "royalty free image", "editorial use only",
           "photo by John Smith", "shot on 35mm film", "4K wallpaper", "Getty Images", "vector illustration",
           "for sale", "new arrival", "best seller", "limited edition", "DSC_0042.JPG", "IMG 2034", "#travel",
           "#nature #photography", "Size: 1024 x 768", "(2019)", "Part 2 of 3", "Model No. XJ-900",
           "it's a beautiful day", "don't miss it!", "we'll be back"]
_NOT_PLAIN = ["caf\u00e9", "\u201cfree\u201d", "it\u2019s", "na\u00efve", "\u2014", "\u00a9 2020",
              "Tom & Jerry", "R&amp;D", "&quot;new&quot;", "\u00bd price", "\u2764\ufe0f", "\U0001F4F7",
              "M\u00fcnchen", "S\u00e3o Paulo", "\u00e9t\u00e9", "\u2026", "50\u00b0C"]


def imagenet_captions(count: int, seed: int) -> List[str]:
    """``count`` ImageNet prompts (classes x templates), shuffled with ``seed``."""
    return caption_prompts(count, seed)


def web_caption(rng: random.Random) -> str:
    """One alt-text-like caption (see the module docstring)."""
    subject = f"{rng.choice(['A', 'a', 'The', 'Two', 'Three', 'Some'])} {rng.choice(_ADJECTIVES)} " \
              f"{rng.choice(_SUBJECTS)}"
    parts = [subject, rng.choice(_ACTIONS), rng.choice(_PLACES)]
    for _ in range(rng.randint(0, 4)):
        parts[-1] += rng.choice([",", ";", " -", " |", "."])
        parts.append(rng.choice(_EXTRAS))
    if rng.random() < 0.3:
        parts.append(f"and {rng.choice(_ADJECTIVES)} {rng.choice(_SUBJECTS)} {rng.choice(_ACTIONS)} "
                     f"{rng.choice(_PLACES)}")
    text = " ".join(parts)
    if rng.random() < 0.2:
        text = text.upper() if rng.random() < 0.3 else text.title()
    if rng.random() < 1 / 6:
        words = text.split(" ")
        words.insert(rng.randrange(len(words) + 1), rng.choice(_NOT_PLAIN))
        text = " ".join(words)
    return text


def web_captions(count: int, seed: int) -> List[str]:
    """``count`` web-style captions from a generator seeded with ``seed``."""
    rng = random.Random(seed)
    return [web_caption(rng) for _ in range(count)]


CAPTION_SETS = {"imagenet": imagenet_captions, "web": web_captions}
