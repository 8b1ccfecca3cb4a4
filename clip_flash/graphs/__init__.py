"""CUDA graphs for single-request latency: the public ``GraphedEncoder`` (``encoder``), packed text graphs for
caption batches of mixed lengths (``packed_text``), the capture machinery (``capture``) and the watch that drops
graphs when the model changes (``staleness``)."""
from .encoder import GraphedEncoder, GraphStats
from .packed_text import PackedTextGraphs

__all__ = ["GraphedEncoder", "GraphStats", "PackedTextGraphs"]
