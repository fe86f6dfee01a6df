"""NPMI topic coherence under a named protocol: the ``evaluate`` module of ``topic_lm_hf.topic_coherence``."""

import evaluate

from topic_lm_hf.evaluation import metrics as package_metrics
from topic_lm_hf.evaluation import topics as package_topics

_DESCRIPTION = """NPMI coherence of topics (their top words) against a reference corpus, counted in sliding
windows under a named preset: "lau2014" (Lau et al. 2014: window 20, partial edge windows, unseen pairs 0, the
mean over top-N in (5, 10, 15, 20)), "gensim_c_npmi" (gensim's CoherenceModel(coherence="c_npmi")), "etm"
(document co-occurrence, unseen pairs -1) or "custom" (every setting given). The result holds the protocol."""

_KWARGS_DESCRIPTION = """
Args:
    predictions: one topic per row, its words most probable first.
    reference: the reference corpus (a path: Lau-format .txt or JSON lines with "text", a datasets.Dataset, a
        list of documents, or a topic_lm_hf.ReferenceCorpus loaded once and reused). Required.
    preset: "lau2014" (default), "gensim_c_npmi", "etm" or "custom".
    window, top_n, unseen_pair, edge_windows: overrides of the preset's settings.
Returns:
    npmi: the mean over topics; npmi_median; npmi_per_topic; protocol: preset, window, top_n, unseen_pair,
    edge_windows, the reference's description and sha1, and the number of windows.
Examples:
    >>> npmi = topic_lm_hf.load_metric("npmi")
    >>> npmi.compute(predictions=[["court", "judge", "law"]], reference="wiki/articles.jsonl.gz")["npmi"]
"""

_CITATION = """@inproceedings{lau2014machine,
  title={Machine Reading Tea Leaves: Automatically Evaluating Topic Coherence and Topic Model Quality},
  author={Lau, Jey Han and Newman, David and Baldwin, Timothy},
  booktitle={EACL}, year={2014}}"""


class Npmi(package_metrics.CheckedInputs, evaluate.Metric):
    metric_name = "npmi"

    def _info(self):
        return evaluate.MetricInfo(description=_DESCRIPTION, citation=_CITATION, inputs_description=_KWARGS_DESCRIPTION,
                                   features=package_metrics.topic_features())

    def _compute(self, predictions, reference=None, preset="lau2014", **others):
        settings = {name: others.pop(name) for name in ("window", "top_n", "unseen_pair", "edge_windows")
                    if name in others}  # the preset's own unless given
        settings.update(package_metrics.check_arguments("npmi", others, {"top_n": settings.get("top_n")}))
        if reference is None:
            raise ValueError("npmi needs reference=: the reference corpus (a path, a dataset or a list of documents)")
        result = package_topics.topic_coherence([list(topic) for topic in predictions], reference, preset=preset,
                                                **settings).as_dict()
        return {"npmi": result.pop("score"), "npmi_median": result.pop("median"),
                "npmi_per_topic": result.pop("per_topic"), "protocol": {
                    key: result[key] for key in ("preset", "window", "top_n", "unseen_pair", "edge_windows",
                                                 "reference", "n_windows")}}
