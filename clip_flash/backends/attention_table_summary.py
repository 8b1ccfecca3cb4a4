"""A measured attention table's markdown summary: the GPU, versions and command, then per shape each backend's
milliseconds and what ``backend="auto"`` runs there (``shape_timings.choose``, the rule ``auto`` itself applies)."""
from __future__ import annotations

from typing import Any, Dict, Optional

from clip_flash.backends import shape_timings


def format_ms(ms: Optional[float]) -> str:
    """Milliseconds as the summary writes them (four decimals; "-" where the backend did not run)."""
    return "-" if ms is None else f"{ms:.4f}"


def _auto_cell(timings: Dict[str, Optional[float]]) -> str:
    chosen = shape_timings.choose({name: ms for name, ms in timings.items() if ms is not None})
    return f"**{chosen}**" if chosen else "-"


def render_markdown(table: Dict[str, Any]) -> str:
    """The summary: header (GPU, versions, command), then per shape each backend's ms and what ``auto`` runs."""
    entries = table["entries"]
    names = []
    for entry in entries:
        names += [name for name in entry["ms"] if name not in names]
    replayed = any(entry.get("device_ms") for entry in entries)
    lines = [
        f"# Attention timings: {table['gpu']}",
        "",
        f"- GPU: {table['gpu']} (capability {'.'.join(map(str, table.get('capability') or [])) or '?'})",
        f"- torch {table.get('torch')}, CUDA {table.get('cuda')}, cuDNN {table.get('cudnn')}, "
        f"flash-attn {table.get('flash_attn') or 'not installed'}",
        f"- command: `{table.get('command')}`",
        f"- created: {table.get('created')}; median of {table.get('repeats')} CUDA-event-timed calls per backend "
        f"after {table.get('warmup')} warm-up calls, backends in alternating order",
        "- packed (varlen) rows: batch = sequences, seq = the longest; `sdpa` there is torch's varlen_attn",
        "- ms: eager calls (the launch included); device ms: the kernel alone, the device kept busy ahead of it "
        "(what a CUDA graph's replay pays; `auto` chooses by these while capturing a graph)" if replayed else
        "- ms: eager calls (the launch included)",
        f"- auto: what `backend=\"auto\"` runs at this shape: the fastest, unless one of torch's own kernels is "
        f"within {shape_timings.TIE_MARGIN:.0%} of it (`clip_flash/backends/shape_timings.py`)",
        "",
        "| dtype | kind | models | batch | seq | tokens | heads | head_dim | " + " | ".join(names) + " | auto |"
        + ("".join(f" {name} device ms |" for name in names) + " auto replayed |" if replayed else ""),
        "|---" * (9 + len(names) + (len(names) + 1 if replayed else 0)) + "|",
    ]
    for entry in entries:
        kind = "varlen causal" if entry["varlen"] else ("causal" if entry["causal"] else "full")
        tokens = entry.get("tokens", entry["batch"] * entry["seq"])
        cells = [entry["dtype"], kind, " ".join(entry.get("models", [])), str(entry["batch"]), str(entry["seq"]),
                 str(tokens), str(entry["heads"]), str(entry["head_dim"])]
        cells += [format_ms(entry["ms"].get(name)) for name in names]
        cells.append(_auto_cell(entry["ms"]))
        if replayed:
            cells += [format_ms(entry.get("device_ms", {}).get(name)) for name in names]
            cells.append(_auto_cell(entry.get("device_ms", {})))
        lines.append("| " + " | ".join(cells) + " |")
    skipped = [(entry, name, why) for entry in entries for name, why in entry.get("errors", {}).items()]
    if skipped:
        lines += ["", "## Skipped", ""]
        for entry, name, why in skipped:
            lines.append(f"- {entry['dtype']} {'varlen ' if entry['varlen'] else ''}b{entry['batch']} "
                         f"s{entry['seq']} h{entry['heads']} d{entry['head_dim']}: {name}: {why}")
    notes = table.get("notes") or []
    if notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


__all__ = ["format_ms", "render_markdown"]
