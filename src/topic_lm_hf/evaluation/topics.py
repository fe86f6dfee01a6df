"""Topic quality: NPMI coherence under named, recorded protocols, and topic diversity.

Published NPMI numbers move a lot with unstated choices (window size, edge windows, the rule for
pairs never seen together, top-N), so every score computed here comes back as a
:class:`CoherenceResult` that carries its protocol and a hash of the reference corpus
(the protocol is part of the result). Three presets reproduce the three families of published numbers:

=================  =========  ===============  ================  =================  ==============
preset             window     edge windows     unseen pair       top-N              reproduces
=================  =========  ===============  ================  =================  ==============
``lau2014``        20         ``partial``      ``zero``          (5, 10, 15, 20)    Lau et al. 2014
``gensim_c_npmi``  10         ``full``         ``epsilon``       (10,)              gensim c_npmi
``etm``            document   (one window)     ``minus_one``     (10,)              ETM's TC
=================  =========  ===============  ================  =================  ==============

**Windows.** Windows never cross documents; non-topic tokens keep their positions, so the width
is measured in raw reference tokens.

* ``partial`` (the Lau et al. toolkit, ``jhlau/topic_interpretability``): windows slide one token
  at a time and include partial windows at both edges; a document of L tokens yields L + w - 1
  windows, the window ending at ``end`` = 1 ... L + w - 1 covering tokens [max(0, end - w), end).
  An empty document still yields w - 1 (empty) windows, as in the toolkit.
* ``full`` (gensim >= 4.1): only full windows, L - w + 1 per document; a document shorter than w
  (an empty one included) counts as one window. Every window counts towards N, also windows
  without any topic word.
* ``window=None``: the whole document is the window (N = number of documents), as in ETM's TC and
  the toolkit's ``window_size = 0``.

**Counts.** For each window, the *set* of topic words present adds 1 to each word's count and 1
to each pair's count. Counting is exact: gensim's ``WordOccurrenceAccumulator`` updates windows
incrementally and loses a word's presence when the token leaving the window still occurs inside
it, so its counts are too low for words repeated within w tokens; we do not copy that.

**NPMI** of a pair with counts c_i, c_j, c_ij over N windows (natural logs; the base cancels):

* ``zero`` (Lau 2014): log(c_ij N / (c_i c_j)) / -log(c_ij / N); 0.0 if c_i, c_j or c_ij is 0.
  No smoothing.
* ``minus_one`` (ETM): the same formula, -1.0 if c_i, c_j or c_ij is 0.
* ``epsilon`` (gensim): log((c_ij/N + eps) / ((c_i/N)(c_j/N))) / -log(c_ij/N + eps) with
  eps = 1e-12, so an unseen pair scores about -1 + log(1/(p_i p_j))/27.6 instead of 0. gensim
  raises ``KeyError`` for a topic word missing from the reference; here such a pair scores -1.0.

For ``zero`` and ``minus_one``, a pair present in *every* window (c_ij = N, so the denominator is
0) scores 1.0 (perfect association; the toolkit would divide by zero). Under ``epsilon`` the
formula is kept as is and gives -1.0 there, exactly what gensim computes.

**Topic score.** For each N in ``top_n``, the mean over unordered pairs i < j of the topic's first
N words (identical words skipped; a topic with fewer than N words uses all of its words, as the
toolkit does); the topic's score is the mean over ``top_n`` (Lau & Baldwin 2016's average over
5/10/15/20). The result reports the mean and the median over topics, like the toolkit.

**Not reproduced.** The toolkit matches collocations joined by ``_`` ("new_york") as n-grams in
the reference; here a word containing ``_`` is looked up as a single token (it is usually absent
and then follows the unseen-pair rule). ETM's code takes ``argsort()[-11:]``, i.e. 11 words
although it says top-10: pass ``top_n=(11,)`` to reproduce that quirk. ETM computes TC on the
training documents, so pass those as the reference for ETM-comparable numbers.

**Overrides.** Explicit ``window``/``top_n``/``unseen_pair``/``edge_windows`` arguments override
the preset's values. If the effective settings differ from the preset's, the result's ``preset``
is ``"custom"`` (so a number labelled ``lau2014`` always means exactly the Lau settings); the
result always records the effective settings. ``preset="custom"`` requires all four settings.

Words missing from the reference never raise: their counts are 0 and the unseen-pair rule applies
(a warning lists them).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import logging
import os
import re
from array import array
from collections import Counter, defaultdict
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

logger = logging.getLogger(__name__)

__all__ = [
    "PRESETS",
    "CoherenceResult",
    "ReferenceCorpus",
    "load_reference_corpus",
    "topic_coherence",
    "topic_diversity",
]

GENSIM_EPSILON = 1e-12  # gensim.topic_coherence.direct_confirmation_measure.EPSILON

PRESETS: dict[str, dict[str, Any]] = {
    "lau2014": {"window": 20, "edge_windows": "partial", "unseen_pair": "zero", "top_n": (5, 10, 15, 20)},
    "gensim_c_npmi": {"window": 10, "edge_windows": "full", "unseen_pair": "epsilon", "top_n": (10,)},
    "etm": {"window": None, "edge_windows": "full", "unseen_pair": "minus_one", "top_n": (10,)},
}
_UNSEEN_RULES = ("zero", "epsilon", "minus_one")
_EDGE_RULES = ("partial", "full")

# Raw text -> word tokens: maximal runs of letters (Unicode letters, no digits, no underscore).
_WORD_RE = re.compile(r"[^\W\d_]+")
_TOKENIZATION = "runs of letters ([^\\W\\d_]+)"


class _Unset:
    def __repr__(self) -> str:
        return "<preset value>"


_UNSET: Any = _Unset()


# ----------------------------------------------------------------------------------------------
# reference corpus
# ----------------------------------------------------------------------------------------------


class ReferenceCorpus:
    """A tokenized reference corpus, built once and reused across :func:`topic_coherence` calls.

    The token stream of all documents is stored flat: ``token_ids[offsets[d]:offsets[d + 1]]`` are
    the ids of document ``d`` and ``words[i]`` is the word of id ``i`` (ids are assigned in order
    of first occurrence, so they depend only on the token stream). Empty documents are kept: they
    still count windows (see the module docstring).
    """

    def __init__(self, token_ids: np.ndarray, offsets: np.ndarray, words: Sequence[str], source: str):
        token_ids = np.asarray(token_ids, dtype=np.int32)
        offsets = np.asarray(offsets, dtype=np.int64)
        if offsets.ndim != 1 or len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(token_ids):
            raise ValueError(f"offsets must run from 0 to {len(token_ids)}, got {offsets[:3]}...{offsets[-3:]}")
        if np.any(np.diff(offsets) < 0):
            raise ValueError("offsets must be non-decreasing")
        self.token_ids = token_ids      # (n_tokens,) int32
        self.offsets = offsets          # (n_documents + 1,) int64
        self.words = list(words)        # id -> word
        self.vocab = {w: i for i, w in enumerate(self.words)}  # word -> id
        self.source = source
        self._sha1: str | None = None

    @classmethod
    def from_documents(cls, documents: Iterable[Any], lowercase: bool = True,
                       source: str = "in-memory documents") -> "ReferenceCorpus":
        """Build from documents; each is raw text (a ``str``), a list of tokens, or a list of
        sentences (lists of tokens, flattened)."""
        vocab: defaultdict[str, int] = defaultdict()
        vocab.default_factory = vocab.__len__  # an unseen word gets the next id
        ids = array("i")
        offsets = array("q", [0])
        for doc in documents:
            ids.extend(map(vocab.__getitem__, _document_tokens(doc, lowercase)))
            offsets.append(len(ids))
        words = [""] * len(vocab)
        for word, i in vocab.items():
            words[i] = word
        return cls(np.frombuffer(ids, dtype=np.int32) if ids else np.zeros(0, np.int32),
                   np.frombuffer(offsets, dtype=np.int64), words, source)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def n_documents(self) -> int:
        return len(self)

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def document_lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def sha1(self) -> str:
        """SHA-1 of the token stream (words in id order, token ids, document offsets)."""
        if self._sha1 is None:
            h = hashlib.sha1()
            h.update("\n".join(self.words).encode("utf-8"))
            h.update(b"\0")
            h.update(self.token_ids.astype("<i4", copy=False).tobytes())
            h.update(self.offsets.astype("<i8", copy=False).tobytes())
            self._sha1 = h.hexdigest()
        return self._sha1

    @property
    def description(self) -> str:
        return (f"{self.source}: {self.n_documents:,} documents, {self.n_tokens:,} tokens, "
                f"sha1 {self.sha1[:12]}")

    def __repr__(self) -> str:
        return f"ReferenceCorpus({self.description})"


def _document_tokens(doc: Any, lowercase: bool) -> list[str]:
    """One document as a flat token list: raw text is tokenized, sentences are flattened."""
    if isinstance(doc, str):
        return _WORD_RE.findall(doc.lower() if lowercase else doc)
    tokens: list[str] = []
    for item in doc:
        if isinstance(item, str):
            tokens.append(item)
        else:  # a sentence
            for tok in item:
                if not isinstance(tok, str):
                    raise ValueError(f"a token must be a str, got {type(tok).__name__}: {tok!r}")
                tokens.append(tok)
    return [t.lower() for t in tokens] if lowercase else tokens


def _iter_jsonl(path: Path, text_column: str) -> Iterator[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if text_column not in row:
                raise ValueError(f"{path}, line {line_no}: no column {text_column!r} (columns: {sorted(row)})")
            yield row[text_column] or ""


def _iter_lau(paths: Sequence[Path], lowercase: bool) -> Iterator[list[str]]:
    # one document per line, sentences separated by TAB, tokens by spaces: split() flattens both
    for path in paths:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as f:
            for line in f:
                yield line.lower().split() if lowercase else line.split()


def load_reference_corpus(path_or_docs: Any, max_documents: int | None = None, lowercase: bool = True,
                          text_column: str = "text") -> ReferenceCorpus:
    """Tokenize a reference corpus once, for repeated :func:`topic_coherence` calls.

    Args:
        path_or_docs: one of

            * ``"wikipedia-sample/npmi-reference"``: the reference that ships with the package, 600 English
              Wikipedia articles (Lau format) that ``wikipedia-sample`` does not hold;
            * a path to JSON lines (``.jsonl``/``.json``, optionally ``.gz``) with a raw-text column
              ``text_column``; raw text is lower-cased (if ``lowercase``) and split into runs of
              letters (``[^\\W\\d_]+``: "don't" -> "don", "t"; digits and punctuation dropped);
            * a path to a Lau-format ``.txt`` file (optionally ``.gz``: one document per line,
              sentences separated by TAB, tokens by spaces), or a directory of such files (read in
              sorted order, like the toolkit's corpus partitions);
            * a ``datasets.Dataset`` with a ``sentences`` column (list of lists of tokens per row),
              or else a ``text_column`` of raw text;
            * a sequence of documents, each raw text (``str``), a list of tokens, or a list of
              sentences (lists of tokens, flattened);
            * a :class:`ReferenceCorpus` (returned as is; ``max_documents`` must then be None).
        max_documents: keep only the first N documents (quick experiments, tests).
        lowercase: lower-case every token (topic words are not lower-cased).
        text_column: the raw-text column of JSON lines files and datasets.
    """
    if max_documents is not None and (not isinstance(max_documents, int) or max_documents < 0):
        raise ValueError(f"max_documents must be a non-negative int or None, got {max_documents!r}")
    if isinstance(path_or_docs, ReferenceCorpus):
        if max_documents is not None:
            raise ValueError("max_documents cannot be applied to an already built ReferenceCorpus")
        return path_or_docs
    case = "" if lowercase else ", case kept"
    subset = f", first {max_documents:,} documents" if max_documents is not None else ""

    if isinstance(path_or_docs, (str, os.PathLike)):
        from ..data import corpus_path

        path = corpus_path(path_or_docs)
        if not path.exists():
            raise FileNotFoundError(f"No reference corpus at {path}")
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
            if not files:
                raise ValueError(f"No files in the reference corpus directory {path}")
            docs: Iterable[Any] = _iter_lau(files, lowercase)
            source = f"{path.name}/ (Lau format, {len(files)} files{case}{subset})"
        else:
            suffixes = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
            if suffixes in (".jsonl", ".json", ".jsonl.gz", ".json.gz"):
                docs = _iter_jsonl(path, text_column)
                source = f"{path.name} (column {text_column!r}, {_TOKENIZATION}{case}{subset})"
            elif suffixes in (".txt", ".txt.gz"):
                docs = _iter_lau([path], lowercase)
                source = f"{path.name} (Lau format{case}{subset})"
            else:
                raise ValueError(f"Cannot tell the format of {path}: expected .jsonl[.gz], .json[.gz] "
                                 f"or .txt[.gz] (Lau format), or a directory of .txt files")
    elif hasattr(path_or_docs, "column_names") and hasattr(path_or_docs, "iter"):  # datasets.Dataset
        ds = path_or_docs
        if max_documents is not None:
            ds = ds.select(range(min(max_documents, len(ds))))
        column = "sentences" if "sentences" in ds.column_names else text_column
        if column not in ds.column_names:
            raise ValueError(f"The dataset has neither a 'sentences' nor a {text_column!r} column "
                             f"(columns: {ds.column_names})")
        docs = (doc for batch in ds.iter(batch_size=1000) for doc in batch[column])
        how = "sentences" if column == "sentences" else f"column {text_column!r}, {_TOKENIZATION}"
        source = f"datasets.Dataset ({how}{case}{subset})"
        max_documents = None  # already applied
    elif isinstance(path_or_docs, Iterable):
        docs = path_or_docs
        notes = [note for note in (case.lstrip(", "), subset.lstrip(", ")) if note]
        source = "in-memory documents" + (f" ({', '.join(notes)})" if notes else "")
    else:
        raise ValueError(f"Cannot use {type(path_or_docs).__name__} as a reference corpus: pass a path, "
                         "a datasets.Dataset, a list of documents or a ReferenceCorpus")
    try:
        return ReferenceCorpus.from_documents(islice(docs, max_documents), lowercase=lowercase, source=source)
    except UnicodeDecodeError as error:  # a binary file under a text suffix
        raise ValueError(f"The reference corpus {path_or_docs} is not UTF-8 text (byte {error.start} of a line): "
                         "give a text corpus (Lau-format .txt[.gz] or JSON lines)") from None


# ----------------------------------------------------------------------------------------------
# exact window counting
# ----------------------------------------------------------------------------------------------


def _windows_per_document(lengths: np.ndarray, window: int | None, edge_windows: str) -> np.ndarray:
    if window is None:
        return np.ones_like(lengths)
    if edge_windows == "partial":
        return lengths + (window - 1)
    return np.maximum(lengths - window + 1, 1)


def _count_windows(corpus: ReferenceCorpus, word_ids: np.ndarray, pairs: np.ndarray,
                   window: int | None, edge_windows: str, max_queries: int = 1_000_000
                   ) -> tuple[np.ndarray, np.ndarray, int]:
    """Exact window counts.

    Args:
        word_ids: (m,) reference ids of the needed words (each >= 0, distinct).
        pairs: (P, 2) indices into ``word_ids`` of the pairs to count.
    Returns:
        (word_counts (m,), pair_counts (P,), N): windows containing each word, each pair, and
        the total number of windows.

    Windows are numbered globally: document d owns the window indices [W_d, W_d + n_d). A token at
    position p of a document of length L lies in a contiguous run of windows of its document:

    * partial: windows ending at p + 1 ... p + w, i.e. local indices [p, p + w);
    * full:    windows starting at max(0, p - w + 1) ... min(p, L - w), i.e. that range + 1
               (a document shorter than w has the single window 0);
    * document: the single window of its document.

    So a word's presence set is a union of intervals of window indices. Its count is the length
    of that union, and a pair's count is the length of the intersection of two unions, which we
    get from cumulative lengths with a binary search (never by materializing windows).
    """
    m = len(word_ids)
    lengths = corpus.document_lengths
    n_windows_doc = _windows_per_document(lengths, window, edge_windows)
    window_offsets = np.concatenate([[0], np.cumsum(n_windows_doc)])  # (D + 1,)
    n_total = int(window_offsets[-1])

    # occurrences of the needed words: global position and index into word_ids
    lookup = np.full(len(corpus.words), -1, dtype=np.int32)
    lookup[word_ids] = np.arange(m, dtype=np.int32)
    sub = lookup[corpus.token_ids]                       # (n_tokens,) index into word_ids or -1
    pos = np.flatnonzero(sub >= 0)                       # (n_occ,) sorted positions
    occ_word = sub[pos]
    order = np.argsort(occ_word, kind="stable")          # group by word, positions stay sorted
    pos, occ_word = pos[order], occ_word[order].astype(np.int64)

    doc = np.searchsorted(corpus.offsets, pos, side="right") - 1
    p = pos - corpus.offsets[doc]                        # position within its document
    base = window_offsets[doc]
    if window is None:
        lo, hi = base, base + 1
    elif edge_windows == "partial":
        lo, hi = base + p, base + p + window
    else:
        last_start = np.maximum(lengths[doc] - window, 0)
        lo = base + np.maximum(p - window + 1, 0)
        hi = base + np.minimum(p, last_start) + 1

    # merge each word's intervals into disjoint blocks (lo and hi are non-decreasing per word)
    if len(pos):
        new_block = np.ones(len(pos), dtype=bool)
        new_block[1:] = (occ_word[1:] != occ_word[:-1]) | (lo[1:] > hi[:-1])
        first = np.flatnonzero(new_block)
        last = np.append(first[1:] - 1, len(pos) - 1)
        b_word, b_start, b_end = occ_word[first], lo[first], hi[last]
    else:
        b_word = b_start = b_end = np.zeros(0, dtype=np.int64)
    b_len = b_end - b_start
    word_counts = np.bincount(b_word, weights=b_len, minlength=m).round().astype(np.int64)

    # per-word cumulative length of the blocks before each block
    blocks_per_word = np.bincount(b_word, minlength=m)
    word_first_block = np.concatenate([[0], np.cumsum(blocks_per_word)])
    cum = np.concatenate([[0], np.cumsum(b_len)])
    cum_before = cum[:-1] - cum[word_first_block[b_word]]
    big = n_total + 1
    keys = b_word * big + b_start                        # sorted: blocks ordered by (word, start)

    def covered_before(word: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Length of word's presence set within window indices [0, x)."""
        if not len(keys):
            return np.zeros(len(x), dtype=np.int64)
        idx = np.searchsorted(keys, word * big + x, side="right") - 1  # last block starting <= x
        idx_c = np.maximum(idx, 0)
        valid = (idx >= 0) & (b_word[idx_c] == word)
        inside = cum_before[idx_c] + np.minimum(x - b_start[idx_c], b_len[idx_c])
        return np.where(valid, inside, 0)

    # pair count = sum over the blocks of the word with fewer blocks of the other word's coverage
    pair_counts = np.zeros(len(pairs), dtype=np.int64)
    if len(pairs):
        a, b = pairs[:, 0].astype(np.int64), pairs[:, 1].astype(np.int64)
        swap = blocks_per_word[a] > blocks_per_word[b]
        small, other = np.where(swap, b, a), np.where(swap, a, b)
        n_queries = blocks_per_word[small]
        start = 0
        while start < len(pairs):  # batches of pairs with at most ~max_queries blocks
            csum = np.cumsum(n_queries[start:])
            stop = start + max(1, int(np.searchsorted(csum, max_queries, side="right")))
            sel = np.arange(start, stop)
            counts = n_queries[sel]
            if counts.sum():
                pair_of_query = np.repeat(np.arange(len(sel)), counts)
                offsets_in = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
                block = word_first_block[small[sel]][pair_of_query] + offsets_in
                target = other[sel][pair_of_query]
                overlap = covered_before(target, b_end[block]) - covered_before(target, b_start[block])
                pair_counts[sel] = np.bincount(pair_of_query, weights=overlap,
                                               minlength=len(sel)).round().astype(np.int64)
            start = stop
    return word_counts, pair_counts, n_total


def _npmi(c_i: np.ndarray, c_j: np.ndarray, c_ij: np.ndarray, n: int, unseen_pair: str) -> np.ndarray:
    """NPMI of each pair from its counts (natural logs); see the module docstring for the rules."""
    c_i, c_j, c_ij = (np.asarray(c, dtype=np.float64) for c in (c_i, c_j, c_ij))
    with np.errstate(divide="ignore", invalid="ignore"):
        if unseen_pair == "epsilon":  # gensim's log_ratio_measure(normalize=True), term for term
            p_ij = c_ij / n
            numerator = np.log((p_ij + GENSIM_EPSILON) / ((c_i / n) * (c_j / n)))
            value = numerator / -np.log(p_ij + GENSIM_EPSILON)
            return np.where((c_i == 0) | (c_j == 0), -1.0, value)
        value = np.log(c_ij * n / (c_i * c_j)) / -np.log(c_ij / n)
        value = np.where(c_ij == n, 1.0, value)
        seen = (c_i > 0) & (c_j > 0) & (c_ij > 0)
        return np.where(seen, value, 0.0 if unseen_pair == "zero" else -1.0)


# ----------------------------------------------------------------------------------------------
# coherence
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CoherenceResult:
    """NPMI coherence of a set of topics and the exact protocol that produced it."""

    score: float                            # mean over topics of the per-topic score
    median: float                           # median over topics
    per_topic: list[float]                  # per topic: mean over top_n of the per-N scores
    per_topic_per_n: list[dict[int, float]]  # per topic: {N: mean NPMI over pairs of the top-N} (a topic shorter
    #                                          than an N: that N is its length, once)
    preset: str                             # "lau2014" | "gensim_c_npmi" | "etm" | "custom"
    window: int | None                      # None = whole document as window
    top_n: tuple[int, ...]
    unseen_pair: str                        # "zero" | "epsilon" | "minus_one"
    edge_windows: str                       # "partial" | "full"
    reference: str                          # reference corpus description + short sha1
    n_windows: int                          # N, the total number of windows

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["top_n"] = list(self.top_n)
        return d


def _check_topics(top_words: Sequence[Sequence[str]]) -> list[list[str]]:
    if isinstance(top_words, str) or not isinstance(top_words, Iterable):
        raise ValueError(f"top_words must be a list of topics (lists of words), got {top_words!r}")
    topics = []
    for k, topic in enumerate(top_words):
        if isinstance(topic, str) or not isinstance(topic, Iterable):
            raise ValueError(f"topic {k} must be a list of words, got {topic!r}")
        topic = list(topic)
        for word in topic:
            if not isinstance(word, str):
                raise ValueError(f"topic {k}: words must be str, got {type(word).__name__} {word!r}")
        topics.append(topic)
    if not topics:
        raise ValueError("top_words is empty: no topic to score")
    return topics


def _resolve_settings(preset: str, window: Any, top_n: Any, unseen_pair: Any, edge_windows: Any
                      ) -> tuple[str, int | None, tuple[int, ...], str, str]:
    given = {"window": window, "top_n": top_n, "unseen_pair": unseen_pair, "edge_windows": edge_windows}
    if preset == "custom":
        missing = [name for name, value in given.items() if value is _UNSET]
        if missing:
            raise ValueError(f"preset='custom' needs every setting; missing: {missing}")
        base: dict[str, Any] = {}
    elif preset in PRESETS:
        base = PRESETS[preset]
    else:
        raise ValueError(f"Unknown preset {preset!r}; use one of {sorted(PRESETS)} or 'custom'")
    settings = {name: base[name] if value is _UNSET else value for name, value in given.items()}

    window = settings["window"]
    if window is not None and (isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1):
        raise ValueError(f"window must be a positive int or None (whole document; the toolkit's 0), got {window!r}")
    window = None if window is None else int(window)

    top_n = settings["top_n"]
    if isinstance(top_n, (int, np.integer)) and not isinstance(top_n, bool):
        top_n = (top_n,)
    try:
        top_n = tuple(top_n)
    except TypeError:
        raise ValueError(f"top_n must be an int or a sequence of ints, got {top_n!r}") from None
    if not top_n or any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2 for n in top_n):
        raise ValueError(f"top_n must be a non-empty sequence of ints >= 2, got {settings['top_n']!r}")
    top_n = tuple(int(n) for n in top_n)
    if len(set(top_n)) != len(top_n):
        raise ValueError(f"top_n has repeated values: {top_n!r}")

    unseen = settings["unseen_pair"]
    if unseen not in _UNSEEN_RULES:
        raise ValueError(f"unseen_pair must be one of {_UNSEEN_RULES}, got {unseen!r}")
    edge = settings["edge_windows"]
    if edge not in _EDGE_RULES:
        raise ValueError(f"edge_windows must be one of {_EDGE_RULES}, got {edge!r}")
    if window is None:
        if edge_windows is not _UNSET and edge == "partial":
            raise ValueError("edge_windows='partial' needs a finite window; with window=None every "
                             "document is a single window (recorded as 'full')")
        edge = "full"

    effective = {"window": window, "top_n": top_n, "unseen_pair": unseen, "edge_windows": edge}
    if preset != "custom" and effective != {**PRESETS[preset], "top_n": tuple(PRESETS[preset]["top_n"])}:
        preset = "custom"
    return preset, window, top_n, unseen, edge


def topic_coherence(
    top_words: Sequence[Sequence[str]],
    reference: Any,
    *,
    preset: str = "lau2014",
    window: int | None = _UNSET,
    top_n: int | Sequence[int] = _UNSET,
    unseen_pair: str = _UNSET,
    edge_windows: str = _UNSET,
) -> CoherenceResult:
    """NPMI coherence of topics against a reference corpus, under a named protocol.

    Args:
        top_words: one list of words per topic, most probable first.
        reference: a :class:`ReferenceCorpus` (build it once with :func:`load_reference_corpus`
            and reuse it), or anything :func:`load_reference_corpus` accepts (a path, a
            ``datasets.Dataset``, a list of documents), which is then tokenized on every call.
        preset: ``"lau2014"`` (default), ``"gensim_c_npmi"``, ``"etm"`` or ``"custom"`` (then all
            four settings below are required). See the module docstring.
        window: window width in reference tokens, or None for the whole document.
        top_n: the N values; a topic's score is the mean of its top-N scores.
        unseen_pair: ``"zero"``, ``"epsilon"`` or ``"minus_one"``.
        edge_windows: ``"partial"`` or ``"full"``.

    Returns:
        a :class:`CoherenceResult`; its ``preset`` is ``"custom"`` when the overrides change the
        preset's settings.

    Raises:
        ValueError: no topic, a topic with fewer than 2 distinct words among its top-N, or a bad
            setting.
    """
    preset, window, top_n, unseen_pair, edge_windows = _resolve_settings(
        preset, window, top_n, unseen_pair, edge_windows)
    topics = _check_topics(top_words)
    corpus = load_reference_corpus(reference)
    if corpus.n_tokens == 0:
        raise ValueError(f"the reference corpus {corpus.description} has no tokens: NPMI needs word counts from a "
                         "non-empty reference (check the path, its format and text_column)")

    # every (topic, N): its pairs as indices into `needed` (identical words skipped)
    needed: dict[str, int] = {}
    pair_index: dict[tuple[int, int], int] = {}
    topic_pairs: list[dict[int, np.ndarray]] = []
    for k, topic in enumerate(topics):
        per_n = {}
        for n in top_n:
            # a topic shorter than N is scored on all its words, labelled with their number (never twice)
            n = min(n, len(topic))
            if n in per_n:
                continue
            words = topic[:n]
            idx = [needed.setdefault(w, len(needed)) for w in words]
            pairs = [pair_index.setdefault((min(a, b), max(a, b)), len(pair_index))
                     for i, a in enumerate(idx) for b in idx[i + 1:] if a != b]
            if not pairs:
                raise ValueError(f"topic {k} has fewer than 2 distinct words among its top-{n}: {words!r}")
            per_n[n] = np.asarray(pairs, dtype=np.int64)
        topic_pairs.append(per_n)

    # count the needed words that occur in the reference; the others keep count 0
    needed_words = list(needed)
    ref_ids = np.array([corpus.vocab.get(w, -1) for w in needed_words], dtype=np.int64)
    present = np.flatnonzero(ref_ids >= 0)
    all_pairs = np.array(list(pair_index), dtype=np.int64).reshape(-1, 2)
    # pairs of two present words, re-indexed into `present`
    position = np.full(len(needed_words), -1, dtype=np.int64)
    position[present] = np.arange(len(present))
    both = (position[all_pairs[:, 0]] >= 0) & (position[all_pairs[:, 1]] >= 0)
    counts_present, pair_counts_present, n_windows = _count_windows(
        corpus, ref_ids[present], position[all_pairs[both]], window, edge_windows)
    word_counts = np.zeros(len(needed_words), dtype=np.int64)
    word_counts[present] = counts_present
    pair_counts = np.zeros(len(all_pairs), dtype=np.int64)
    pair_counts[both] = pair_counts_present

    short = [k for k, topic in enumerate(topics) if len(topic) < max(top_n)]
    if short:
        logger.warning("%d topic(s) have fewer than top_n=%d words (topics %s): each is scored on the N it has, "
                       "its per_topic_per_n keys say which", len(short), max(top_n), short[:20])
    missing = [w for w, c in zip(needed_words, word_counts) if c == 0]
    if missing:
        logger.warning("%d topic word(s) never occur in the reference corpus (%s), their pairs score "
                       "by the unseen-pair rule %r: %s", len(missing), corpus.source, unseen_pair,
                       missing[:20])

    npmi = _npmi(word_counts[all_pairs[:, 0]], word_counts[all_pairs[:, 1]], pair_counts, n_windows,
                 unseen_pair)
    per_topic_per_n = [{n: float(npmi[pairs].mean()) for n, pairs in per_n.items()} for per_n in topic_pairs]
    per_topic = [float(np.mean(list(d.values()))) for d in per_topic_per_n]
    return CoherenceResult(
        score=float(np.mean(per_topic)),
        median=float(np.median(per_topic)),
        per_topic=per_topic,
        per_topic_per_n=per_topic_per_n,
        preset=preset,
        window=window,
        top_n=top_n,
        unseen_pair=unseen_pair,
        edge_windows=edge_windows,
        reference=corpus.description,
        n_windows=n_windows,
    )


# ----------------------------------------------------------------------------------------------
# diversity
# ----------------------------------------------------------------------------------------------


def topic_diversity(top_words: Sequence[Sequence[str]], k: int = 25, variant: str = "unique") -> float:
    """Topic diversity of the top-``k`` words of K topics, in [0, 1].

    * ``"unique"`` (ETM, Dieng et al. 2020; OCTIS and CTM): the number of distinct words among
      all topics' top-k words divided by k * K.
    * ``"exclusive"`` (TopMost's TD): the number of words that occur exactly once in all the
      top-k lists together, divided by k * K; i.e. the fraction of (topic, word) slots whose word
      appears in no other slot (a word repeated within one topic counts as not exclusive).
      Unlike TopMost's ``CountVectorizer``, words are not lower-cased.

    Every topic must have at least ``k`` words (as in OCTIS), so that the denominator k * K is the
    number of slots: pass ``k`` explicitly for shorter topics.
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    if variant not in ("unique", "exclusive"):
        raise ValueError(f"variant must be 'unique' or 'exclusive', got {variant!r}")
    topics = _check_topics(top_words)
    for i, topic in enumerate(topics):
        if len(topic) < k:
            raise ValueError(f"topic {i} has {len(topic)} words, fewer than k={k}; pass a smaller k")
    slots = [word for topic in topics for word in topic[:k]]
    if variant == "unique":
        return len(set(slots)) / (k * len(topics))
    frequency = Counter(slots)
    return sum(1 for c in frequency.values() if c == 1) / (k * len(topics))
