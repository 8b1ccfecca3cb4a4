"""CUDA graphs for single-request latency: the public ``GraphedEncoder`` (``encoder``), the capture machinery
(``capture``) and the watch that drops graphs when the model changes (``staleness``)."""
from .encoder import GraphedEncoder, GraphStats

__all__ = ["GraphedEncoder", "GraphStats"]
