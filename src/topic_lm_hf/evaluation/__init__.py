"""Evaluation: perplexity under explicit context protocols, topic quality (NPMI, diversity), and
generation quality and diversity (Texygen BLEU and self-BLEU)."""

from ..protocols import PROTOCOLS
from .bleu import BleuResult, texygen_bleu, texygen_self_bleu
from .perplexity import evaluate_perplexity
from .sliding_window import evaluate_perplexity_sliding_window
from .steering import LDAJudge, distinct_n, evaluate_steering, fit_lda_judge, format_steering_table
from .topics import CoherenceResult, ReferenceCorpus, load_reference_corpus, topic_coherence, topic_diversity

__all__ = ["PROTOCOLS", "evaluate_perplexity", "evaluate_perplexity_sliding_window", "CoherenceResult", "ReferenceCorpus", "load_reference_corpus",
           "topic_coherence", "topic_diversity", "LDAJudge", "distinct_n", "evaluate_steering", "fit_lda_judge",
           "format_steering_table", "BleuResult", "texygen_bleu", "texygen_self_bleu"]
