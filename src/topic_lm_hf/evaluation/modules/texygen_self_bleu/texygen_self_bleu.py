"""Texygen self-BLEU: the ``evaluate`` module of ``topic_lm_hf.texygen_self_bleu``."""

import evaluate

from topic_lm_hf.evaluation import bleu as package_bleu
from topic_lm_hf.evaluation import metrics as package_metrics

_DESCRIPTION = """Texygen's self-BLEU-n (Zhu et al. 2018), the diversity of a set of generated sentences (lower
is more diverse): the mean over sentences of NLTK's sentence BLEU (method1) of each sentence against all the
others, for n = 1 ... max_n."""

_KWARGS_DESCRIPTION = """
Args:
    predictions: the generated sentences (at least 2), each a string (split on whitespace) or a list of tokens.
    max_n: the largest order (default 4).
    fast: Texygen's is_fast=True: only the first 500 sentences.
Returns:
    self_bleu_1 ... self_bleu_{max_n}, num_hypotheses, protocol.
"""

class TexygenSelfBleu(package_metrics.CheckedInputs, evaluate.Metric):
    metric_name = "texygen_self_bleu"

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION, citation=package_metrics.TEXYGEN_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=package_metrics.text_features())

    def _compute(self, predictions, max_n=None, fast=False, **others):
        package_metrics.check_arguments("texygen_self_bleu", others, {"max_n": max_n})
        max_n = 4 if max_n is None else max_n
        result = package_bleu.texygen_self_bleu(package_metrics.token_lists(predictions), max_n=max_n, fast=fast)
        return {**{f"self_bleu_{n}": value for n, value in result.scores.items()},
                "num_hypotheses": result.num_hypotheses, "protocol": result.protocol}
