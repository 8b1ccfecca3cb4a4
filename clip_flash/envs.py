"""Every environment variable clip_flash reads, in one typed, documented table.

Configuration is arguments and dataclasses; these variables are for what happens before a user's code can pass
an argument (building the extension at install or on first use) or where one setting must reach every process
of a deployment. ``python -m clip_flash.envs`` prints the table (the README's copy is checked against it).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Mapping, Optional, Union

Value = Union[bool, str, Path, None]


@dataclass(frozen=True)
class EnvironmentVariable:
    """One variable: its name, how its text is read, its default and what it does."""

    name: str
    kind: str  # "switch" (0/1; unset: the default), "path" or "text"
    default: Value
    doc: str

    def raw(self, environ: Mapping[str, str] = os.environ) -> Optional[str]:
        text = environ.get(self.name, "").strip()
        return text or None

    def read(self, environ: Mapping[str, str] = os.environ) -> Value:
        """The variable's value, typed; the default when it is unset or empty."""
        text = self.raw(environ)
        if text is None:
            return self.default
        if self.kind == "switch":
            if text.upper() in ("1", "ON", "YES", "TRUE"):
                return True
            if text.upper() in ("0", "OFF", "NO", "FALSE"):
                return False
            raise ValueError(f"{self.name}={text!r}: use 1 or 0")
        if self.kind == "path":
            return Path(text).expanduser()
        return text


BUILD_EXT = EnvironmentVariable(
    "CLIP_FLASH_BUILD_EXT", "switch", None,
    "At `pip install`: 1 builds the CUDA extension `clip_flash._C` or fails, 0 never builds it; unset: build when "
    "torch is a CUDA build, a CUDA toolkit is found and there is a target GPU.")
JIT = EnvironmentVariable(
    "CLIP_FLASH_JIT", "switch", True,
    "0: never compile `clip_flash._C` on first use (where it was not built at install); the fused ops then run in "
    "plain PyTorch.")
CACHE = EnvironmentVariable(
    "CLIP_FLASH_CACHE", "path", None,
    "Where extensions compiled on first use are kept (default `$XDG_CACHE_HOME/clip_flash`, else "
    "`~/.cache/clip_flash`).")
ATTENTION_TABLE = EnvironmentVariable(
    "CLIP_FLASH_ATTENTION_TABLE", "path", None,
    "A measured attention table (`clip-flash measure-attention --out FILE`) for `backend=\"auto\"`, ahead of the "
    "shipped ones; `clip_flash.backends.load_attention_table(path)` does the same from code.")
GIT_REVISION = EnvironmentVariable(
    "CLIP_FLASH_GIT_REVISION", "text", None,
    "The source revision run records name, where the code runs from a copy of a checkout without its `.git`.")
HF_HUB_OFFLINE = EnvironmentVariable(
    "HF_HUB_OFFLINE", "switch", False,
    "Hugging Face's own switch, honoured when loading `NAME::TAG`: 1 uses only the local cache and fails at once "
    "when the weights are not there.")

VARIABLES: Dict[str, EnvironmentVariable] = {
    variable.name: variable for variable in (BUILD_EXT, JIT, CACHE, ATTENTION_TABLE, GIT_REVISION, HF_HUB_OFFLINE)
}


def markdown_table() -> str:
    """The table as the README shows it."""
    lines = ["| variable | default | what it does |", "|---|---|---|"]
    for variable in VARIABLES.values():
        default = "unset" if variable.default is None else {True: "1", False: "0"}.get(variable.default,
                                                                                         str(variable.default))
        lines.append(f"| `{variable.name}` | {default} | {variable.doc} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
