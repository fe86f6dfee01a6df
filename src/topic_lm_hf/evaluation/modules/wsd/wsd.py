"""The WSD scorer of the unified evaluation framework: the ``evaluate`` module of ``topic_lm_hf.tasks.score_wsd``."""

import datasets
import evaluate

from topic_lm_hf.evaluation import metrics as package_metrics
from topic_lm_hf.tasks import wsd as package_wsd

_DESCRIPTION = """Precision, recall and F1 of word sense disambiguation with the semantics of the unified
evaluation framework's Scorer.java (Raganato et al. 2017): an answer that is any one of the gold keys is right;
several answers share the credit; an empty string is a (wrong) answer; an abstention lowers recall only; an
instance the gold lacks is ignored. F1 of P = R = 0 is NaN, as the Java scorer prints it."""

_KWARGS_DESCRIPTION = """
Args:
    predictions: per instance, the system's answer keys (an empty list: it abstained).
    references: per instance, its gold keys (an empty list: an id the gold lacks, ignored as the scorer does).
Returns:
    precision, recall, f1 (fractions), the scorer's printed percentages (P, R, F1), correct, wrong, num_gold,
    num_scored, num_ignored.
"""

_CITATION = """@inproceedings{raganato2017word,
  title={Word Sense Disambiguation: A Unified Evaluation Framework and Empirical Comparison},
  author={Raganato, Alessandro and Camacho-Collados, Jose and Navigli, Roberto},
  booktitle={EACL}, year={2017}}"""


class Wsd(package_metrics.CheckedInputs, evaluate.Metric):
    metric_name = "wsd"

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION, citation=_CITATION, inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Sequence(datasets.Value("string")),
                                        "references": datasets.Sequence(datasets.Value("string"))}))

    def _compute(self, predictions, references, **others):
        package_metrics.check_arguments("wsd", others)
        system = {str(i): list(answers) for i, answers in enumerate(predictions)}
        gold = {str(i): list(keys) for i, keys in enumerate(references) if len(keys)}
        score = package_wsd.score_wsd(system, gold)
        return {**score.as_dict(), **score.formatted()}
