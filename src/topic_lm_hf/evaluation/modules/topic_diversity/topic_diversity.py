"""Topic diversity: the ``evaluate`` module of ``topic_lm_hf.topic_diversity``."""

import evaluate

from topic_lm_hf.evaluation import metrics as package_metrics
from topic_lm_hf.evaluation import topics as package_topics

_DESCRIPTION = """Topic diversity (Dieng et al. 2020): the share of unique words among the top-k words of all
topics ("unique", the default), or the mean over topics of the share of their top-k words that no other topic
has among its top k ("exclusive")."""

_KWARGS_DESCRIPTION = """
Args:
    predictions: one topic per row, its words most probable first.
    k: the top words of each topic (default 25).
    variant: "unique" (default) or "exclusive".
Returns:
    topic_diversity, and the k and variant it was computed with.
"""

_CITATION = """@article{dieng2020topic,
  title={Topic Modeling in Embedding Spaces}, author={Dieng, Adji B. and Ruiz, Francisco J. R. and Blei, David M.},
  journal={TACL}, year={2020}}"""


class TopicDiversity(package_metrics.CheckedInputs, evaluate.Metric):
    metric_name = "topic_diversity"

    def _info(self):
        return evaluate.MetricInfo(description=_DESCRIPTION, citation=_CITATION, inputs_description=_KWARGS_DESCRIPTION,
                                   features=package_metrics.topic_features())

    def _compute(self, predictions, k=None, variant="unique", **others):
        k = package_metrics.check_arguments("topic_diversity", others, {"k": k}).get("k", 25 if k is None else k)
        value = package_topics.topic_diversity([list(topic) for topic in predictions], k=k, variant=variant)
        return {"topic_diversity": value, "k": k, "variant": variant}
