"""Distinct-n: the ``evaluate`` module of ``topic_lm_hf.distinct_n``."""

import evaluate

from topic_lm_hf.evaluation import metrics as package_metrics
from topic_lm_hf.evaluation import steering as package_steering

_DESCRIPTION = """Distinct-n (Li et al. 2016): distinct n-grams divided by all n-grams over a set of generated
texts (0 when there are none). N-grams do not cross texts."""

_KWARGS_DESCRIPTION = """
Args:
    predictions: the generated texts, each a string (split on whitespace) or a list of tokens.
    n: an order or a list of orders (default [1, 2]).
Returns:
    distinct_1, distinct_2, ... for each order.
"""

_CITATION = """@inproceedings{li2016diversity,
  title={A Diversity-Promoting Objective Function for Neural Conversation Models},
  author={Li, Jiwei and Galley, Michel and Brockett, Chris and Gao, Jianfeng and Dolan, Bill},
  booktitle={NAACL}, year={2016}}"""


class DistinctN(package_metrics.CheckedInputs, evaluate.Metric):
    metric_name = "distinct_n"

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION, citation=_CITATION, inputs_description=_KWARGS_DESCRIPTION,
            features=package_metrics.text_features())

    def _compute(self, predictions, n=None, **others):
        package_metrics.check_arguments("distinct_n", others, {"n": n})
        n = (1, 2) if n is None else n
        tokens = package_metrics.token_lists(predictions)
        orders = list(n) if isinstance(n, (list, tuple)) else [n]
        if not orders:
            raise ValueError("distinct_n: n is empty: give an order (e.g. n=2) or a list of orders (n=[1, 2])")
        return {f"distinct_{order}": package_steering.distinct_n(tokens, order) for order in orders}
