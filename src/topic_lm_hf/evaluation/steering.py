"""Does ``generate(topic_ids=[k])`` write about topic k? The steering evaluation of every topic model.

The protocol is that of controllable generation (PPLM: Dathathri et al., ICLR 2020, Tables 3-4),
which reports topic accuracy next to fluency (perplexity under a separate LM) and Dist-1/2/3.
For each topic k of a sample of topics, ``num_samples`` texts are sampled from ``<bos>`` with
``topic_ids=[k]`` (nucleus sampling, top-p 0.9 by default), and ``num_samples`` texts with no
topic (the model's prior: TCNLM's prior-mean mixture, TopicRNN's empty-context theta). Reported:

* **topic accuracy**, the share of steered texts whose dominant topic is k,
  (a) by the model's own topic encoder: argmax of ``model.infer_topics(bag of words)`` (TCNLM's
  proportions t; TopicRNN's posterior mean theta, whose largest entry is the direction
  ``topic_ids`` steer along); chance is 1/T. An amortised encoder trained on 300-word contexts can
  be blind on a 20-word text (a TCNLM's encoder, given only "health public program", the top words
  of its own topic 2, answered topic 33 with t_max = 0.037), so
  (a') by the model's own topics: argmax_k sum_w n_w log p(w | topic k), the text's likelihood under
  each of the model's topic-word distributions (``topic_word_distributions()``), i.e. its topic
  posterior under a uniform prior when the text has one topic;
  (b) by an independent judge: scikit-learn's LDA with T topics fitted on the training corpus
  (:func:`fit_lda_judge`), its topics matched one-to-one to the model's by the cosine similarity
  of their word distributions (Hungarian assignment), so that LDA's dominant topic of a text
  names a model topic. A judge that knows nothing of the model.
  A text without any topic-vocabulary word has no dominant topic and counts as a miss.
* **topic-word share**: the share of generated tokens (every token but ``<eos>``) that are among
  topic k's ``top_words`` most probable words, steered and unconditioned, and their ratio (lift).
* **fluency**: perplexity of the generated tokens (``<eos>`` included when generated) under a
  separately trained LM over the same vocabulary (``fluency_model``; a same-size LSTM in the
  benchmarks), for steered and unconditioned texts, and their ratio; and Dist-n, the number of
  distinct n-grams over the number of n-grams in the texts of one condition (Li et al. 2016, as
  in PPLM), averaged over topics. Steering that turns text into word salad shows up here.

Where ours differs from PPLM: topics are judged automatically (the model's encoder and LDA)
rather than by human annotators; texts start from ``<bos>`` rather than from prefixes; the
fluency LM is a same-size LSTM trained on the same corpus, not GPT; and the steered model is the
topic model itself, not an attribute model on top of a frozen LM.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch

from ..collator import make_bow
from ..data import check_vocabularies, vocabulary_hash
from ..models.modeling_topic_family import TopicFamilyForCausalLM
from .perplexity import NLLTotal, chunk_nll, model_vocabularies


# ----------------------------------------------------------------------------------------------
# diversity of generated text
# ----------------------------------------------------------------------------------------------


def distinct_n(texts: Sequence[Sequence[str]], n: int) -> float:
    """Dist-n: distinct n-grams / all n-grams over a set of tokenized texts (0 when there are none)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a whole number >= 1 (an n-gram order), got {n!r}")
    grams = [tuple(text[i:i + n]) for text in texts for i in range(len(text) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


# ----------------------------------------------------------------------------------------------
# an independent judge: LDA fitted on the training corpus
# ----------------------------------------------------------------------------------------------


def bag_of_words_matrix(documents, topic_tokenizer):
    """Sparse (n, V_c) counts of every topic-vocabulary word of each document (no 300-word cap).

    ``documents``: a documents dataset (column ``sentences``) or lists of sentences of tokens or
    lists of tokens. ``<unk>`` (id 0) is never counted.
    """
    from scipy import sparse

    sentences_column = documents["sentences"] if hasattr(documents, "column_names") else documents
    tokens = [[w for s in doc for w in s] if doc and not isinstance(doc[0], str) else list(doc)
              for doc in sentences_column]
    return sparse.csr_matrix(make_bow(tokens, topic_tokenizer).numpy().astype(np.float64))


@dataclass
class LDAJudge:
    """scikit-learn LDA fitted on a corpus, used to name the dominant topic of a text.

    Attributes:
        lda: the fitted ``sklearn.decomposition.LatentDirichletAllocation``.
        topic_word: (T, V_c) its topic-word distributions (normalised ``components_``).
        description: what it was fitted on (documents, topics, iterations, seed).
        topic_vocab_hash: :func:`~topic_lm_hf.data.vocabulary_hash` of the topic vocabulary it was fitted over
            (None: not recorded); a judge is refused on another vocabulary (:meth:`check_vocabulary`).

    ``save`` and ``load`` keep a fitted judge in a safetensors file (arrays and JSON, no pickle).
    """

    lda: Any
    topic_word: np.ndarray
    description: str
    topic_vocab_hash: Optional[str] = None

    def check_vocabulary(self, topic_tokenizer) -> None:
        """Refuse a topic vocabulary other than the one the judge was fitted over (its word ids mean other words)."""
        if self.topic_vocab_hash is not None and topic_tokenizer is not None \
                and vocabulary_hash(topic_tokenizer) != self.topic_vocab_hash:
            raise ValueError("the LDA judge was fitted over another topic vocabulary: fit it again on this model's "
                             "topic tokenizer (fit_lda_judge)")

    def match(self, model_topic_word: np.ndarray) -> tuple[np.ndarray, float]:
        """One-to-one match of LDA topics to model topics by cosine similarity of their word distributions.

        Returns ``(lda_to_model (T_lda,), mean matched cosine)``; LDA topics left unmatched (when
        the model has fewer topics) map to -1.
        """
        from scipy.optimize import linear_sum_assignment

        a = self.topic_word / np.linalg.norm(self.topic_word, axis=1, keepdims=True)
        b = model_topic_word / np.maximum(np.linalg.norm(model_topic_word, axis=1, keepdims=True), 1e-12)
        similarity = a @ b.T  # (T_lda, T_model)
        lda_rows, model_cols = linear_sum_assignment(-similarity)
        lda_to_model = np.full(self.topic_word.shape[0], -1, dtype=np.int64)
        lda_to_model[lda_rows] = model_cols
        return lda_to_model, float(similarity[lda_rows, model_cols].mean())

    def get_topics(self, top_n: int = 10, *, layer=None, topic_tokenizer=None) -> list[list[str]]:
        """The ``top_n`` most probable words of every LDA topic (``topic_tokenizer``: the vocabulary it was fitted
        over; ``<unk>`` at id 0 never counts), with a topic model's signature: ``evaluate_topics(judge, reference,
        topic_tokenizer=...)`` scores LDA's topics on the same vocabulary as a model's. LDA has one layer."""
        if layer not in (None, 1):
            raise ValueError(f"LDA has one layer of topics: layer must be None or 1, got {layer!r}")
        if topic_tokenizer is None:
            raise ValueError("LDAJudge.get_topics needs the topic_tokenizer it was fitted over")
        self.check_vocabulary(topic_tokenizer)
        words = {i: w for w, i in topic_tokenizer.get_vocab().items()}
        order = np.argsort(-self.topic_word[:, 1:], axis=1)[:, :top_n] + 1
        return [[words[int(i)] for i in row] for row in order]

    def dominant_topics(self, bows) -> np.ndarray:
        """LDA's most probable topic for each row of a (n, V_c) count matrix; -1 for an empty row."""
        bows = bows.numpy() if isinstance(bows, torch.Tensor) else bows
        dominant = np.asarray(self.lda.transform(bows)).argmax(1)
        empty = np.asarray(bows.sum(1)).ravel() == 0
        dominant[empty] = -1
        return dominant

    def save(self, path) -> None:
        """Write the judge to the safetensors file ``path`` without pickle, so that reading it back runs no code: the
        fitted LDA's arrays as tensors; its settings, its fitted numbers, its random state (continued fitting draws
        from it), the description and the scikit-learn version that fitted it as JSON metadata."""
        import sklearn
        from safetensors.numpy import save_file

        settings = self.lda.get_params()
        arrays, numbers, random_states = {"topic_word": self.topic_word}, {}, {}
        for name, value in vars(self.lda).items():
            if name in settings:
                continue
            if isinstance(value, np.ndarray):
                arrays[f"lda.{name}"] = value
            elif isinstance(value, np.random.RandomState):
                kind, keys, position, has_gauss, cached_gaussian = value.get_state()
                arrays[f"lda.{name}"] = keys
                random_states[name] = [kind, int(position), int(has_gauss), float(cached_gaussian)]
            elif isinstance(value, (bool, int, float, np.number)):
                numbers[name] = value.item() if isinstance(value, np.generic) else value
            else:
                raise TypeError(f"LDAJudge.save cannot store the LDA's {name} ({type(value).__name__})")
        metadata = {"format": "topic_lm_hf.LDAJudge", "scikit_learn": sklearn.__version__,
                    "description": self.description, "settings": json.dumps(settings),
                    "numbers": json.dumps(numbers), "random_states": json.dumps(random_states),
                    "topic_vocab_hash": json.dumps(self.topic_vocab_hash)}
        save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(path), metadata=metadata)

    @classmethod
    def load(cls, path) -> "LDAJudge":
        """The judge ``save`` wrote to ``path``: an equivalent ``LatentDirichletAllocation`` (the same settings and
        fitted state, so the same judgements), rebuilt from arrays and JSON only. A file of another format, or
        written under another scikit-learn version (whose LDA may keep other state), raises ``ValueError``."""
        import sklearn
        from safetensors import SafetensorError, safe_open
        from sklearn.decomposition import LatentDirichletAllocation

        try:
            with safe_open(str(path), framework="numpy") as f:
                metadata = f.metadata() or {}
                arrays = {key: f.get_tensor(key) for key in f.keys()}
        except SafetensorError as e:
            raise ValueError(f"{path} is not a safetensors file ({e})") from e
        if metadata.get("format") != "topic_lm_hf.LDAJudge":
            raise ValueError(f"{path} is not a judge written by LDAJudge.save")
        if metadata.get("scikit_learn") != sklearn.__version__:
            raise ValueError(f"{path} was written under scikit-learn {metadata.get('scikit_learn')}, this is "
                             f"{sklearn.__version__}")
        try:
            return cls._from_arrays(arrays, metadata, LatentDirichletAllocation)
        except (KeyError, TypeError, ValueError, AttributeError) as e:  # json errors are ValueErrors
            raise ValueError(f"{path} is a damaged LDA judge ({type(e).__name__}: {e}): fit it again") from e

    @classmethod
    def _from_arrays(cls, arrays: dict, metadata: dict, lda_class) -> "LDAJudge":
        """The judge of :meth:`load`, its arrays checked against each other and against its settings."""
        lda = lda_class(**json.loads(metadata["settings"]))
        for name, value in json.loads(metadata["numbers"]).items():
            setattr(lda, name, value)
        random_states = json.loads(metadata["random_states"])
        for key, value in arrays.items():
            if not key.startswith("lda."):
                continue
            name = key[len("lda."):]
            if name in random_states:  # the generator's keys; the rest of its state is in the metadata
                kind, position, has_gauss, cached_gaussian = random_states[name]
                generator = np.random.RandomState()
                generator.set_state((kind, value, position, has_gauss, cached_gaussian))
                value = generator
            setattr(lda, name, value)
        topic_word = arrays["topic_word"]
        topics, words = lda.n_components, getattr(lda, "n_features_in_", None)
        shapes = {name: getattr(lda, name).shape for name in ("components_", "exp_dirichlet_component_")}
        if topic_word.ndim != 2 or topic_word.shape[0] != topics or any(shape != topic_word.shape
                                                                          for shape in shapes.values()) \
                or (words is not None and topic_word.shape[1] != words):
            raise ValueError(f"its arrays disagree: topic_word {topic_word.shape}, "
                             + ", ".join(f"{k} {v}" for k, v in shapes.items())
                             + f", {topics} topics over {words} words")
        if not (np.isfinite(topic_word).all() and (topic_word >= 0).all()
                and np.allclose(topic_word.sum(1), 1.0, atol=1e-6)
                and np.allclose(topic_word, lda.components_ / lda.components_.sum(1, keepdims=True), atol=1e-6)):
            raise ValueError("its topic_word is not the normalised components_ of its LDA")
        vocab_hash = json.loads(metadata.get("topic_vocab_hash", "null"))
        return cls(lda=lda, topic_word=topic_word, description=metadata["description"], topic_vocab_hash=vocab_hash)


def fit_lda_judge(documents, topic_tokenizer, num_topics: int, max_iter: int = 20, seed: int = 0,
                  restarts: int = 3, max_documents: Optional[int] = None) -> LDAJudge:
    """Fit scikit-learn's LDA (batch variational Bayes, priors 1/T) with ``num_topics`` topics on the
    bags of words of ``documents`` over the topic vocabulary: the independent steering judge.

    Variational LDA stops in local optima (on single-topic synthetic documents one seed merged two
    topics, another separated all six), so it is fitted ``restarts`` times (seeds ``seed``,
    ``seed + 1``, ...) and the fit with the highest approximate log-likelihood is kept.
    """
    from sklearn.decomposition import LatentDirichletAllocation

    if restarts < 1:
        raise ValueError(f"restarts must be >= 1, got {restarts}")
    if max_documents is not None and hasattr(documents, "select"):
        documents = documents.select(range(min(max_documents, len(documents))))
    counts = bag_of_words_matrix(documents, topic_tokenizer)
    if counts.shape[0] == 0 or counts.nnz == 0:
        raise ValueError("fit_lda_judge needs documents with topic-vocabulary words")
    best, best_score = None, -math.inf
    for restart in range(restarts):
        lda = LatentDirichletAllocation(n_components=num_topics, max_iter=max_iter, random_state=seed + restart,
                                        learning_method="batch", n_jobs=1).fit(counts)
        score = lda.score(counts)
        if score > best_score:
            best, best_score = lda, score
    topic_word = best.components_ / best.components_.sum(1, keepdims=True)
    return LDAJudge(lda=best, topic_word=topic_word,
                    description=f"sklearn LDA, {num_topics} topics, {counts.shape[0]} documents, {max_iter} batch-VB "
                                f"iterations, best of {restarts} restarts (seed {seed})",
                    topic_vocab_hash=vocabulary_hash(topic_tokenizer))


# ----------------------------------------------------------------------------------------------
# the evaluation
# ----------------------------------------------------------------------------------------------


def _words(ids: list[int], tokenizer, special: set[int], eos_id: int) -> tuple[list[str], bool]:
    """Generated ids after the prompt -> (words up to <eos>, whether <eos> ended the text)."""
    out, ended = [], False
    for i in ids:
        if i == eos_id:
            ended = True
            break
        if i not in special:
            out.append(i)
    return tokenizer.convert_ids_to_tokens(out), ended


@torch.no_grad()
def _fluency_nll(fluency_model, token_ids: list[list[int]], bos_id: int, pad_id: int,
                 batch_size: int = 64) -> tuple[float, int]:
    """Summed NLL and count of every token of each sequence after ``<bos>`` under ``fluency_model``."""
    device = next(fluency_model.parameters()).device
    total = NLLTotal(device)
    sequences = [[bos_id] + ids for ids in token_ids if ids]
    for start in range(0, len(sequences), batch_size):
        batch = sequences[start:start + batch_size]
        width = max(len(s) for s in batch)
        input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for i, s in enumerate(batch):
            input_ids[i, :len(s)] = torch.tensor(s)
            mask[i, :len(s)] = 1
        nll, n, _ = chunk_nll(fluency_model, input_ids.to(device), mask.to(device), None, None, use_cache=False)
        total.add(nll, n)
    return total.read()


def _sample(model, n: int, max_new_tokens: int, generation_kwargs: dict, seed: int, **conditioning) -> torch.Tensor:
    torch.manual_seed(seed)
    bos = torch.full((1, 1), model.config.bos_token_id, dtype=torch.long, device=model.device)
    return model.generate(input_ids=bos, num_return_sequences=n, max_new_tokens=max_new_tokens,
                          pad_token_id=model.config.pad_token_id, eos_token_id=model.config.eos_token_id,
                          **generation_kwargs, **conditioning)[:, 1:]


def evaluate_steering(model, topics: Optional[Sequence[int]] = None, num_topics_sampled: Optional[int] = None,
                      num_samples: int = 20, max_new_tokens: int = 30, tokenizer=None, topic_tokenizer=None,
                      judge: Optional[LDAJudge] = None, fluency_model=None, top_words: int = 50,
                      do_sample: bool = True, top_p: float = 0.9, top_k: Optional[int] = None,
                      temperature: float = 1.0, seed: int = 0, keep_texts: int = 3,
                      topic_guidance_scale: Optional[float] = None, topic_layer: Optional[int] = None,
                      generation_options: Optional[dict] = None) -> dict[str, Any]:
    """Steering evaluation of a topic model (see the module docstring for the protocol).

    Args:
        model: a topic model of the package: ``generate(topic_ids=...)``, ``infer_topics(bow)``,
            ``topic_word_distributions()`` and ``config.num_topics``.
        topics: the topic ids to steer towards; default: ``num_topics_sampled`` of them drawn
            without replacement with ``seed`` (None: 10, or all T topics when T is smaller; more than T is an
            error).
        num_samples: texts per topic, and unconditioned texts.
        max_new_tokens: the longest text (sampling stops earlier at ``<eos>``).
        tokenizer, topic_tokenizer: default to the ones saved with the model.
        judge: an :class:`LDAJudge` (:func:`fit_lda_judge` on the training corpus) for the
            independent topic accuracy; ``None`` skips it.
        fluency_model: a causal LM over the same vocabulary (a separately trained LSTM) for the
            fluency perplexity; ``None`` skips it.
        top_words: the N of "topic k's top-N words" for the topic-word share.
        do_sample, top_p, top_k, temperature: the decoding (nucleus sampling by default, as PPLM).
        seed: seeds the topic sample and each condition's sampling (reproducible).
        keep_texts: generated texts kept per topic in the result (for display).
        topic_guidance_scale: decode-time topic guidance of the steered texts (``generate(topic_ids=[k],
            topic_guidance_scale=s)``); None or 1: plain conditioned generation. The unconditioned texts are
            never guided.
        topic_layer: for a model with a topic hierarchy (rGBN-RNN): the layer whose topics are steered towards
            (``generate(topic_ids=[k], topic_layer=l)``; 1 = the bottom), judged by that layer's topics projected
            down to words (``topic_word_distributions(layer=l)``) and encoder (``infer_topics(bow, layer=l)``);
            chance is 1 / K_l. The LDA judge's topics are matched one-to-one to that layer's; a text whose
            dominant LDA topic is left unmatched (K_l below the judge's topics) counts as a miss, so the judge is
            stricter there than at the bottom layer. None: the model's own default (the bottom layer).
        generation_options: more ``generate`` keywords for every text, steered and unconditioned (e.g.
            ``{"no_repeat_ngram_size": 2}``, ``{"repetition_penalty": 1.2}``).

    Returns:
        ``{"accuracy_own", "accuracy_own_topics", "accuracy_lda", "chance", "share_steered", "share_unconditioned", "lift",
        "fluency_ppl_steered", "fluency_ppl_unconditioned", "fluency_ratio", "distinct_1/2/3"
        (steered, averaged over topics), "distinct_*_unconditioned", "per_topic" (one dict per topic,
        with its top words and example texts), "unconditioned_texts", "judge", "lda_match_cosine",
        "protocol"}``; LDA and fluency entries are None when skipped.
    """
    if not isinstance(model, TopicFamilyForCausalLM):
        raise ValueError(f"{type(model).__name__} has no topics to steer by: it is not a topic model")
    if num_samples < 1 or max_new_tokens < 1:
        raise ValueError(f"num_samples and max_new_tokens must be >= 1, got {num_samples}, {max_new_tokens}")
    layer = {}
    if topic_layer is not None:
        if "topic_layer" not in model.conditioning_options:
            raise ValueError(f"topic_layer is for a model with a topic hierarchy (rGBN-RNN); "
                             f"{type(model).__name__} has one layer of topics: leave it None")
        layer = {"layer": model.check_layer(topic_layer)}
    with torch.no_grad():
        topic_word = model.topic_word_distributions(**layer).float().cpu()  # (T, V_c) of the steered layer
    num_topics = topic_word.shape[0]
    if topics is None:
        rng = random.Random(seed)
        if num_topics_sampled is not None and num_topics_sampled > num_topics:
            raise ValueError(f"num_topics_sampled (--num_topics_sampled) is {num_topics_sampled}, but the model has "
                             f"{num_topics} topics" + (" at that layer" if layer else "") + f": give at most "
                             f"{num_topics}, or name them with topics (--topics)")
        topics = sorted(rng.sample(range(num_topics), min(num_topics_sampled or 10, num_topics)))
    topics = [int(k) for k in topics]
    if not topics or any(not 0 <= k < num_topics for k in topics):
        raise ValueError(f"topics must be non-empty ids in [0, {num_topics}), got {topics}")
    tokenizer, topic_tokenizer = model_vocabularies(model, tokenizer, topic_tokenizer)
    if judge is not None:
        judge.check_vocabulary(topic_tokenizer)
    if fluency_model is not None:
        check_vocabularies(tokenizer, None, fluency_model.config)
    was_training = model.training
    model.eval()
    if fluency_model is not None:
        fluency_model.eval()

    generation_kwargs = {"do_sample": do_sample, "temperature": temperature, **(generation_options or {})}
    if do_sample:
        # top_k=None is nucleus sampling alone: transformers would otherwise apply its default top_k = 50, which
        # on a near-uniform distribution keeps exactly the 50 words a topic favours most (a steering artefact).
        generation_kwargs["top_p"] = top_p
        generation_kwargs["top_k"] = 0 if top_k is None else top_k
    special = {tokenizer.pad_token_id, tokenizer.bos_token_id}
    eos_id = tokenizer.eos_token_id
    # Topic words as LM tokens: the topic vocabulary's words are LM words.
    topic_vocab = [""] * len(topic_tokenizer)
    for word, index in topic_tokenizer.get_vocab().items():
        topic_vocab[index] = word
    # A topic's top words never include the topic <unk> (id 0): rGBN-RNN's Phi gives it mass, and generated <unk>
    # tokens would count as topic words.
    ranked = topic_word.clone()
    ranked[:, 0] = -1.0
    top_ids = ranked.topk(min(top_words, topic_word.shape[1] - 1), dim=-1).indices  # (T, N)
    top_sets = [{topic_vocab[i] for i in row} for row in top_ids.tolist()]

    def decode(generated: torch.Tensor):
        texts, ids = [], []
        for row in generated.tolist():
            words, ended = _words(row, tokenizer, special, eos_id)
            texts.append(words)
            kept = [i for i in row if i not in special]
            ids.append(kept[:kept.index(eos_id) + 1] if ended else kept)
        return texts, ids

    def share(texts, k):
        tokens = [w for t in texts for w in t]
        return sum(w in top_sets[k] for w in tokens) / len(tokens) if tokens else 0.0

    def fluency(ids):
        if fluency_model is None:
            return None, None
        nll, n = _fluency_nll(fluency_model, ids, tokenizer.bos_token_id, tokenizer.pad_token_id)
        return nll, n

    try:
        base_texts, base_ids = decode(_sample(model, num_samples, max_new_tokens, generation_kwargs, seed))
        base_nll, base_n = fluency(base_ids)
        lda_to_model, match_cosine = (None, None)
        if judge is not None:
            lda_to_model, match_cosine = judge.match(topic_word.numpy())
        per_topic = []
        steer_nll, steer_n = 0.0, 0
        for k in topics:
            guidance = {} if topic_guidance_scale is None else {"topic_guidance_scale": topic_guidance_scale}
            if topic_layer is not None:
                guidance["topic_layer"] = topic_layer
            texts, ids = decode(_sample(model, num_samples, max_new_tokens, generation_kwargs, seed + 1 + k,
                                        topic_ids=[k], **guidance))
            bows = make_bow(texts, topic_tokenizer)  # (n, V_c)
            has_words = bows.sum(1) > 0
            own = model.infer_topics(bows.to(model.device), **layer).float().argmax(-1).cpu()
            own_correct = ((own == k) & has_words).float().mean().item()
            by_topics = (bows @ topic_word.clamp_min(1e-12).log().T).argmax(-1)  # (n,): most likely topic
            topics_correct = ((by_topics == k) & has_words).float().mean().item()
            lda_correct = None
            if judge is not None:
                dominant = judge.dominant_topics(bows.numpy())
                named = np.where(dominant >= 0, lda_to_model[np.maximum(dominant, 0)], -1)
                lda_correct = float(np.mean(named == k))
            nll, n = fluency(ids)
            if nll is not None:
                steer_nll, steer_n = steer_nll + nll, steer_n + n
            per_topic.append({
                "topic": k, "top_words": [topic_vocab[i] for i in top_ids[k, :10].tolist()],
                "accuracy_own": own_correct, "accuracy_own_topics": topics_correct, "accuracy_lda": lda_correct,
                "share_steered": share(texts, k), "share_unconditioned": share(base_texts, k),
                "fluency_ppl": math.exp(nll / n) if nll is not None and n else None,
                **{f"distinct_{m}": distinct_n(texts, m) for m in (1, 2, 3)},
                "mean_length": float(np.mean([len(t) for t in texts])),
                "texts": [" ".join(t) for t in texts[:keep_texts]],
            })
    finally:
        model.train(was_training)

    def mean(key):
        values = [row[key] for row in per_topic if row[key] is not None]
        return float(np.mean(values)) if values else None

    share_steered, share_base = mean("share_steered"), mean("share_unconditioned")
    ppl_steered = math.exp(steer_nll / steer_n) if fluency_model is not None and steer_n else None
    ppl_base = math.exp(base_nll / base_n) if fluency_model is not None and base_n else None
    return {
        "accuracy_own": mean("accuracy_own"),
        "accuracy_own_topics": mean("accuracy_own_topics"),
        "accuracy_lda": mean("accuracy_lda") if judge is not None else None,
        "chance": 1.0 / num_topics,
        "share_steered": share_steered,
        "share_unconditioned": share_base,
        "lift": share_steered / share_base if share_base else None,
        "fluency_ppl_steered": ppl_steered,
        "fluency_ppl_unconditioned": ppl_base,
        "fluency_ratio": ppl_steered / ppl_base if ppl_steered is not None and ppl_base else None,
        **{f"distinct_{m}": mean(f"distinct_{m}") for m in (1, 2, 3)},
        **{f"distinct_{m}_unconditioned": distinct_n(base_texts, m) for m in (1, 2, 3)},
        "per_topic": per_topic,
        "unconditioned_texts": [" ".join(t) for t in base_texts[:keep_texts]],
        "judge": judge.description if judge is not None else None,
        "lda_match_cosine": match_cosine,
        "protocol": {"topics": topics, "num_samples": num_samples, "max_new_tokens": max_new_tokens,
                     "decoding": ({"top_p": top_p, "top_k": top_k, "temperature": temperature} if do_sample
                                  else "greedy"),
                     "start": "<bos>", "top_words": top_words, "seed": seed,
                     "topic_guidance_scale": topic_guidance_scale, "topic_layer": topic_layer,
                     "generation_options": dict(generation_options or {}),
                     "own_judge": "argmax of model.infer_topics(bag of words)",
                     "own_topics_judge": "argmax_k sum_w n_w log p(w | topic k)",
                     "fluency_model": getattr(fluency_model, "name_or_path", None) or
                     (type(fluency_model).__name__ if fluency_model is not None else None)},
    }


def format_steering_table(results: dict[str, dict]) -> str:
    """A markdown table, one row per model (``{name: evaluate_steering(...)}``)."""

    def fmt(x, pattern="{:.3f}"):
        return "-" if x is None else pattern.format(x)

    n = next(iter(results.values()))["protocol"]["top_words"] if results else 50
    lines = [f"| model | topic acc. (own encoder) | topic acc. (own topics) | topic acc. (LDA judge) | chance "
             f"| top-{n} share steered | unconditioned | lift | fluency ppl steered | unconditioned | ratio "
             "| Dist-1 | Dist-2 | Dist-3 |",
             "|" + "---|" * 14]
    for name, r in results.items():
        lines.append(f"| {name} | {fmt(r['accuracy_own'])} | {fmt(r.get('accuracy_own_topics'))} | "
                     f"{fmt(r['accuracy_lda'])} | {fmt(r['chance'])} | "
                     f"{fmt(r['share_steered'])} | {fmt(r['share_unconditioned'])} | {fmt(r['lift'], '{:.2f}')} | "
                     f"{fmt(r['fluency_ppl_steered'], '{:.1f}')} | {fmt(r['fluency_ppl_unconditioned'], '{:.1f}')} | "
                     f"{fmt(r['fluency_ratio'], '{:.2f}')} | {fmt(r['distinct_1'])} | {fmt(r['distinct_2'])} | "
                     f"{fmt(r['distinct_3'])} |")
    return "\n".join(lines)
