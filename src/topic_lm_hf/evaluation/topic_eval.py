"""Topic quality of a trained topic model: NPMI coherence and diversity in one call.

Works for every topic family of the package (``TopicFamilyForCausalLM.get_topics``: TCNLM,
TopicRNN, ...); the metrics themselves live in :mod:`topic_lm_hf.evaluation.topics`, and every
number comes back with the protocol that produced it.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ..models.modeling_topic_family import TopicFamilyForCausalLM
from .steering import LDAJudge
from .topics import PRESETS, load_reference_corpus, topic_coherence, topic_diversity


def evaluate_topics(model, reference: Any, top_n: Optional[int | Sequence[int]] = None, topic_tokenizer=None,
                    preset: str = "lau2014", diversity_k: int = 25, diversity_variant: str = "unique",
                    max_documents: Optional[int] = None, layer: Optional[int] = None,
                    **coherence_settings) -> dict[str, Any]:
    """NPMI coherence (against ``reference``) and diversity of a model's topics.

    Args:
        model: a topic family's causal LM, or an :class:`~topic_lm_hf.evaluation.steering.LDAJudge` (the same
            ``get_topics`` signature), which gives one word list per topic.
        reference: the reference corpus for NPMI: a path (e.g. ``$TOPIC_LM_DATA/wiki/articles.jsonl.gz``), the
            name of the shipped reference (``"wikipedia-sample/npmi-reference"``), documents, or a
            :class:`~topic_lm_hf.evaluation.topics.ReferenceCorpus` built once with
            ``load_reference_corpus`` (much faster when several models are scored).
        top_n: the N of "NPMI of the top-N words"; default: the preset's (5, 10, 15, 20 for
            ``lau2014``, averaged per topic as in Lau et al. 2014).
        topic_tokenizer: the topic vocabulary; default: ``topic_tokenizer/`` saved with the model.
        preset: the coherence protocol (``lau2014``, ``gensim_c_npmi``, ``etm`` or ``custom``).
        diversity_k: topic diversity is the fraction of unique words among all topics' top-k.
        diversity_variant: ``"unique"`` (ETM) or ``"exclusive"`` (TopMost).
        max_documents: use only the first N documents of the reference (quick checks; recorded).
        layer: for a model with a topic hierarchy (rGBN-RNN), the layer whose topics are scored
            (``get_topics(layer=...)``: projected down to words); ``None`` leaves it to the model (its bottom layer).
        **coherence_settings: ``window``, ``unseen_pair``, ``edge_windows`` overrides (see
            :func:`~topic_lm_hf.evaluation.topics.topic_coherence`).

    Returns:
        ``{"npmi", "npmi_median", "npmi_per_topic", "diversity", "diversity_k", "diversity_variant",
        "num_topics", "top_words", "coherence"}``, where ``coherence`` is the full
        :class:`~topic_lm_hf.evaluation.topics.CoherenceResult` as a dict (preset, window, top-N,
        unseen-pair rule, reference corpus and its hash) and ``top_words`` the top-10 words of
        every topic.
    """
    if not isinstance(model, (TopicFamilyForCausalLM, LDAJudge)):
        raise ValueError(f"{type(model).__name__} has no get_topics(): it is not a topic model")
    if preset != "custom" and preset not in PRESETS:
        raise ValueError(f"Unknown preset {preset!r}; use one of {sorted(PRESETS)} or 'custom'")
    if top_n is not None:
        coherence_settings["top_n"] = top_n
    effective_top_n = coherence_settings.get("top_n", PRESETS.get(preset, {}).get("top_n"))
    if effective_top_n is None:
        raise ValueError(f"preset={preset!r} needs top_n")
    largest_n = max(effective_top_n) if isinstance(effective_top_n, (list, tuple)) else int(effective_top_n)
    layer_kwargs = {} if layer is None else {"layer": layer}
    topics = model.get_topics(top_n=max(largest_n, diversity_k, 10), topic_tokenizer=topic_tokenizer, **layer_kwargs)
    reference = load_reference_corpus(reference, max_documents=max_documents)  # a ReferenceCorpus comes back as is
    coherence = topic_coherence(topics, reference, preset=preset, **coherence_settings)
    # A topic vocabulary smaller than diversity_k + 1 words cannot fill k slots per topic.
    k = min(diversity_k, min(len(words) for words in topics))
    return {
        "npmi": coherence.score,
        "npmi_median": coherence.median,
        "npmi_per_topic": coherence.per_topic,
        "diversity": topic_diversity(topics, k=k, variant=diversity_variant),
        "diversity_k": k,
        "diversity_variant": diversity_variant,
        "num_topics": len(topics),
        "layer": layer,
        "top_words": [words[:10] for words in topics],
        "coherence": coherence.as_dict(),
    }
