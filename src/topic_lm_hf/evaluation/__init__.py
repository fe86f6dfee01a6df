"""Evaluation: perplexity under explicit context protocols (and, later, topic quality)."""

from .perplexity import PROTOCOLS, evaluate_perplexity

__all__ = ["PROTOCOLS", "evaluate_perplexity"]
