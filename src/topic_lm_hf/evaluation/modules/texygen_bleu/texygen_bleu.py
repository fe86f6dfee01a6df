"""Texygen BLEU: the ``evaluate`` module of ``topic_lm_hf.texygen_bleu``."""

import evaluate

from topic_lm_hf.evaluation import bleu as package_bleu
from topic_lm_hf.evaluation import metrics as package_metrics

_DESCRIPTION = """Texygen's BLEU-n (Zhu et al. 2018), as the topic-guided LM papers report it: the mean over
generated sentences of NLTK's sentence BLEU (cumulative weights, smoothing method1) of each sentence against ALL
the reference sentences (e.g. the test set), for n = 1 ... max_n. Not corpus BLEU: sacrebleu and evaluate's
"bleu" compute another quantity."""

_KWARGS_DESCRIPTION = """
Args:
    predictions: the generated sentences, each a string (split on whitespace) or a list of tokens.
    reference_texts: the reference sentences, same form; every prediction is scored against all of them.
    max_n: the largest order (default 4).
    fast: Texygen's is_fast=True: only the first 500 references.
Returns:
    bleu_1 ... bleu_{max_n}, num_hypotheses, num_references, protocol.
"""

class TexygenBleu(package_metrics.CheckedInputs, evaluate.Metric):
    metric_name = "texygen_bleu"

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION, citation=package_metrics.TEXYGEN_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=package_metrics.text_features())

    def _compute(self, predictions, reference_texts=None, max_n=None, fast=False, **others):
        package_metrics.check_arguments("texygen_bleu", others, {"max_n": max_n})
        max_n = 4 if max_n is None else max_n
        if reference_texts is None:
            raise ValueError("texygen_bleu needs reference_texts=: the reference sentences each prediction is "
                             "scored against")
        result = package_bleu.texygen_bleu(package_metrics.token_lists(predictions), reference_texts,
                                           max_n=max_n, fast=fast)
        return {**{f"bleu_{n}": value for n, value in result.scores.items()},
                "num_hypotheses": result.num_hypotheses, "num_references": result.num_references,
                "protocol": result.protocol}
