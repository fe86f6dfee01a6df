"""Document retrieval by cosine similarity, the NCLM paper's protocol (§4.4, after Gupta et al. 2019).

Queries are held-out documents, the corpus is the training documents; every query ranks the whole corpus by
descending cosine similarity of the document vectors (ties broken by corpus index, a stable sort; a zero vector
has cosine 0 with everything), and a retrieved document is relevant when it has the query's label.

* precision@k = (relevant documents among the top k) / k, averaged over queries;
* the fraction curve: precision at k = fraction x corpus size, with Gupta et al.'s two roundings of that cut-off
  (``int(N r + 0.5)`` in their single-label code, ``floor(N r)`` in the multi-label one; ``rounding=``);
* multi-label documents (a list of labels each): ``relevance="relaxed"`` counts a document sharing at least one
  label with the query, ``"strict"`` one holding all of the query's labels.

The vectors: :func:`evaluate_retrieval` reads ``model.document_representation`` ([o_N; c]: the top recurrent
output after the document's last token and the document topic vector). The paper concatenates the raw blocks,
so the larger block dominates the cosine; ``normalize="blocks"`` L2-normalises each block first (labelled in
the result). Baselines (scikit-learn): :func:`tfidf_retrieval` (tf-idf cosine) and :func:`lda_retrieval`
(cosine of LatentDirichletAllocation document-topic proportions, fitted on the corpus only).
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import datasets
import numpy as np

RELEVANCE = ("relaxed", "strict")
ROUNDINGS = ("half_up", "floor")
NORMALIZATIONS = ("none", "blocks")


def fraction_cutoff(n_corpus: int, fraction: float, rounding: str = "half_up") -> int:
    """The k of a corpus fraction: ``int(N r + 0.5)`` (``"half_up"``) or ``floor(N r)`` (``"floor"``), at least 1."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    k = int(n_corpus * fraction + 0.5) if rounding == "half_up" else math.floor(n_corpus * fraction)
    return max(k, 1)


def _as_label_sets(labels) -> Optional[list[frozenset]]:
    labels = list(labels)
    if labels and isinstance(labels[0], (list, tuple, set, frozenset, np.ndarray)):
        return [frozenset(np.asarray(list(x)).tolist()) for x in labels]
    return None


def _unit_rows(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


def retrieval_precision(query_vectors, query_labels, corpus_vectors, corpus_labels,
                        k: Sequence[int] = (5, 10), fractions: Sequence[float] = (), relevance: str = "relaxed",
                        rounding: str = "half_up", batch_size: int = 512) -> dict[str, Any]:
    """Mean precision of cosine retrieval at each ``k`` and corpus ``fraction``.

    ``*_vectors``: (n, d) dense arrays or scipy sparse matrices; ``*_labels``: one label per document, or a list
    of labels per document (multi-label, see ``relevance``). Returns ``{"precision@5": .., "precision@10": ..,
    "precision@fraction=0.02": .., "queries", "corpus", "relevance", "rounding"}``."""
    if relevance not in RELEVANCE:
        raise ValueError(f"relevance must be one of {RELEVANCE}, got {relevance!r}")
    ks = [int(x) for x in ([k] if isinstance(k, (int, np.integer)) else k)]  # k=5 is k=(5,)
    fractions = [fractions] if isinstance(fractions, (int, float)) else fractions
    n_q, n_c = query_vectors.shape[0], corpus_vectors.shape[0]
    if n_q == 0 or n_c == 0:
        raise ValueError(f"Retrieval needs queries and a corpus, got {n_q} queries and {n_c} corpus documents")
    if query_vectors.shape[1] != corpus_vectors.shape[1]:
        raise ValueError(f"Query and corpus vectors differ in width: {query_vectors.shape[1]} vs "
                         f"{corpus_vectors.shape[1]}")
    if len(query_labels) != n_q or len(corpus_labels) != n_c:
        raise ValueError("There must be one label (or label list) per query and per corpus document")
    cutoffs = {f"precision@{x}": x for x in ks}
    for r in fractions:
        cutoffs[f"precision@fraction={r:g}"] = fraction_cutoff(n_c, r, rounding)
    bad = [name for name, x in cutoffs.items() if not 1 <= x <= n_c]
    if bad:
        raise ValueError(f"Cut-offs must be in [1, corpus size = {n_c}] (k and fractions; --k and --fractions of "
                         f"topic-lm retrieve): {bad}")
    deepest = max(cutoffs.values())

    import scipy.sparse as sp

    def unit(x):
        if sp.issparse(x):
            from sklearn.preprocessing import normalize

            return normalize(sp.csr_matrix(x, dtype=np.float64))  # zero rows stay zero
        return _unit_rows(np.asarray(x, dtype=np.float64))

    q, c = unit(query_vectors), unit(corpus_vectors)
    q_sets, c_sets = _as_label_sets(query_labels), _as_label_sets(corpus_labels)
    multi = q_sets is not None or c_sets is not None
    if multi:
        q_sets = q_sets or [frozenset([x]) for x in np.asarray(query_labels).tolist()]
        c_sets = c_sets or [frozenset([x]) for x in np.asarray(corpus_labels).tolist()]
    else:
        q_lab, c_lab = np.asarray(query_labels), np.asarray(corpus_labels)
    sums = {name: 0.0 for name in cutoffs}
    for start in range(0, n_q, batch_size):
        stop = min(start + batch_size, n_q)
        sims = q[start:stop] @ c.T
        sims = sims.toarray() if sp.issparse(sims) else np.asarray(sims)
        # stable descending order: ties keep the corpus order
        order = np.argsort(-sims, axis=1, kind="stable")[:, :deepest]
        if multi:
            hits = np.array([[(q_sets[start + i] & c_sets[j]) != frozenset() if relevance == "relaxed"
                              else q_sets[start + i] <= c_sets[j] for j in row] for i, row in enumerate(order)])
        else:
            hits = c_lab[order] == q_lab[start:stop, None]
        cumulative = np.cumsum(hits, axis=1)
        for name, cut in cutoffs.items():
            sums[name] += float((cumulative[:, cut - 1] / cut).sum())
    result: dict[str, Any] = {name: total / n_q for name, total in sums.items()}
    result.update(queries=n_q, corpus=n_c, relevance=relevance if multi else "label equality",
                  rounding=rounding if fractions else None)
    return result


def normalize_blocks(vectors: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    """Each block of columns (widths ``sizes``, in order) scaled to unit L2 norm per row (zero blocks stay zero)."""
    if sum(sizes) != vectors.shape[1]:
        raise ValueError(f"Block widths {list(sizes)} do not add up to the vectors' width {vectors.shape[1]}")
    out, start = [], 0
    for size in sizes:
        if size:
            out.append(_unit_rows(np.asarray(vectors[:, start:start + size], dtype=np.float64)))
        start += size
    return np.concatenate(out, axis=1)


def evaluate_retrieval(model, queries: datasets.Dataset, corpus: datasets.Dataset, k: Sequence[int] = (5, 10),
                       fractions: Sequence[float] = (), normalize: str = "none", label_column: str = "label",
                       batch_size: int = 64, collator=None, **kwargs) -> dict[str, Any]:
    """Cosine retrieval with ``model.document_representation`` ([o_N; c]): queries (held-out documents) against
    the corpus (training documents), labels as relevance. ``normalize="blocks"`` L2-normalises o_N and c
    separately first. Other arguments go to :func:`retrieval_precision` and
    :func:`~topic_lm_hf.tasks.classification.extract_document_features` (e.g. ``tokenizer``)."""
    from .classification import document_collator, extract_document_features

    if normalize not in NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {NORMALIZATIONS}, got {normalize!r}")
    retrieval_kwargs = {key: kwargs.pop(key) for key in ("relevance", "rounding") if key in kwargs}
    for name, docs in (("queries", queries), ("corpus", corpus)):
        if label_column not in docs.column_names:
            raise ValueError(f"The {name} need a {label_column!r} column (relevance = same label)")
    if collator is None:
        collator = document_collator(model, label_column=None, **kwargs)
    q, _ = extract_document_features(model, queries, collator, batch_size)
    c, _ = extract_document_features(model, corpus, collator, batch_size)
    if normalize == "blocks":
        sizes = model.document_representation_sizes
        q, c = normalize_blocks(q, sizes), normalize_blocks(c, sizes)
    result = retrieval_precision(q, queries[label_column], c, corpus[label_column], k, fractions,
                                 **retrieval_kwargs)
    result["representation"] = "[o_N; c]" + (" (each block L2-normalised)" if normalize == "blocks" else " (raw)")
    return result


def tfidf_retrieval(queries: datasets.Dataset, corpus: datasets.Dataset, k: Sequence[int] = (5, 10),
                    fractions: Sequence[float] = (), label_column: str = "label", min_df: int = 2,
                    **kwargs) -> dict[str, Any]:
    """Baseline: tf-idf (sublinear tf, unigrams, fitted on the corpus) cosine retrieval (scikit-learn)."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    from .classification import document_texts

    vectorizer = TfidfVectorizer(tokenizer=str.split, token_pattern=None, lowercase=False, min_df=min_df,
                                 sublinear_tf=True)
    c = vectorizer.fit_transform(document_texts(corpus))
    q = vectorizer.transform(document_texts(queries))
    result = retrieval_precision(q, queries[label_column], c, corpus[label_column], k, fractions, **kwargs)
    result["representation"] = f"tf-idf (sublinear, min_df={min_df}, fitted on the corpus)"
    return result


def lda_retrieval(queries: datasets.Dataset, corpus: datasets.Dataset, k: Sequence[int] = (5, 10),
                  fractions: Sequence[float] = (), label_column: str = "label", num_topics: int = 50,
                  min_df: int = 2, max_df: float = 0.5, max_iter: int = 20, seed: int = 0,
                  stop_words: Optional[Sequence[str]] = None, **kwargs) -> dict[str, Any]:
    """Baseline: cosine of scikit-learn ``LatentDirichletAllocation`` document-topic proportions (online
    variational Bayes, fitted on the corpus' word counts only; the queries are transformed)."""
    from sklearn.decomposition import LatentDirichletAllocation
    from sklearn.feature_extraction.text import CountVectorizer

    from .classification import document_texts

    vectorizer = CountVectorizer(tokenizer=str.split, token_pattern=None, lowercase=False, min_df=min_df,
                                 max_df=max_df, stop_words=list(stop_words) if stop_words else None)
    counts = vectorizer.fit_transform(document_texts(corpus))
    lda = LatentDirichletAllocation(n_components=num_topics, max_iter=max_iter, learning_method="online",
                                    random_state=seed)
    c = lda.fit_transform(counts)
    q = lda.transform(vectorizer.transform(document_texts(queries)))
    result = retrieval_precision(q, queries[label_column], c, corpus[label_column], k, fractions, **kwargs)
    result["representation"] = (f"LDA proportions (scikit-learn, {num_topics} topics, online VB, {max_iter} "
                                f"iterations, fitted on the corpus)")
    return result
