"""Accuracy and macro-F1 of a single-label classifier: the ``evaluate`` module of
``topic_lm_hf.tasks.classification_scores`` (computed by scikit-learn)."""

import datasets
import evaluate

from topic_lm_hf.evaluation import metrics as package_metrics
from topic_lm_hf.tasks import classification as package_classification

_DESCRIPTION = """Accuracy and macro-averaged F1 of single-label classification (scikit-learn's accuracy_score
and f1_score(average="macro", zero_division=0)): what the package reports for its document classifiers."""

_KWARGS_DESCRIPTION = """
Args:
    predictions: predicted class ids.
    references: gold class ids.
Returns:
    accuracy, macro_f1.
Examples:
    >>> metric = topic_lm_hf.load_metric("classification")
    >>> metric.compute(predictions=[0, 1, 1], references=[0, 1, 0])
    {'accuracy': 0.666..., 'macro_f1': 0.666...}
"""


class Classification(package_metrics.CheckedInputs, evaluate.Metric):
    metric_name = "classification"

    def _info(self):
        return evaluate.MetricInfo(description=_DESCRIPTION, citation="", inputs_description=_KWARGS_DESCRIPTION,
                                   features=datasets.Features({"predictions": datasets.Value("int64"),
                                                               "references": datasets.Value("int64")}))

    def _compute(self, predictions, references, **others):
        package_metrics.check_arguments("classification", others)
        return package_classification.classification_scores(predictions, references)
