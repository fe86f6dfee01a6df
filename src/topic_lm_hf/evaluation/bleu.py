"""Generation quality and diversity: test-BLEU and self-BLEU in the Texygen protocol, exact and fast.

TGVAE and rGBN-RNN report BLEU-n of generated sentences against test sentences (higher is better)
and self-BLEU-n of the generated sentences among themselves (lower is more diverse), "following
Texygen" (``geek-ai/Texygen``, ``utils/metrics/Bleu.py`` and ``SelfBleu.py``). Texygen computes, for n = 2, 3, 4, ...:

* **BLEU-n** = the mean over hypotheses of NLTK's ``sentence_bleu(references, hypothesis,
  weights=(1/n,) * n, smoothing_function=SmoothingFunction().method1)``, with *all* reference
  sentences as the references of every hypothesis: cumulative n-gram weights (BLEU-4 mixes the
  1- to 4-gram precisions), an average of sentence scores, not corpus BLEU.
* **self-BLEU-n**: the same, with each generated sentence scored against all the *other* generated
  sentences (``get_score(is_fast=False)`` runs ``get_bleu_parallel``, which leaves the hypothesis
  out).
* ``is_fast=True``, Texygen's default: test-BLEU keeps only the first 500 references (every
  hypothesis is still scored); self-BLEU keeps only the first 500 generated sentences, as both
  hypotheses and references. Pass ``fast=True`` to reproduce that; the default here is the full
  computation (``fast=False``), and the result's ``protocol`` says which one produced a number.

**The numbers are NLTK's, to the last bit.** For one hypothesis h of length L and order k,
``sentence_bleu`` with method1 computes

* p_k = sum over the k-grams g of h of min(count_h(g), max over references r of count_r(g)),
  divided by max(1, L - k + 1); a zero numerator becomes 0.1 / denominator (method1's epsilon),
  which includes every order k > L (0.1 / 1);
* BLEU-n = BP * exp(fsum over k = 1..n of (1/n) * log p_k), and 0 if no unigram matches at all;
* BP = 1 if L > r, 0 if L = 0, else exp(1 - r / L), where r is the reference length closest to L,
  ties going to the shorter reference.

NLTK recounts the n-grams of every reference for every hypothesis. Here the reference side is
counted once: for each n-gram its maximum count over all references, and the sorted reference
lengths (bisected for r). For self-BLEU, each n-gram keeps its largest count, the sentence that
holds it and the second-largest count over the other sentences, so leaving the hypothesis out is
exact (a sentence owning the maximum is clipped by the second-largest count, which equals the
maximum when another sentence ties), and one copy of the hypothesis' own length is left out of
the lengths. Arithmetic follows NLTK's order of operations, so each sentence score is bit-equal
to NLTK's; means are summed in hypothesis order, as Texygen does. On 300 APNEWS hypotheses against
800 references (BLEU-2..4) this takes about 0.07 s where the NLTK loop takes 20-30 s
(``tests/test_bleu.py`` prints both).

**Tokens.** Sentences are token lists, or strings split on whitespace. Texygen tokenised each line
with ``nltk.word_tokenize`` (needs NLTK's ``punkt`` data); that is *not* applied here: tokenise
hypotheses and references the same way before calling, e.g. with the tokenizer the model uses.

**Other BLEU implementations give other numbers** on the same sentences:

* sacrebleu computes corpus BLEU by default, with ``exp`` smoothing and effective order, and
  tokenises with 13a: different numbers. Sentence-level sacrebleu with ``floor`` smoothing 0.1,
  ``tokenize='none'`` and ``effective_order=False`` comes closest, but gives 0 to a hypothesis
  shorter than n, where NLTK's method1 fills the missing orders with 0.1 (so it is lower).
* Hugging Face ``evaluate``'s ``bleu`` wraps tensorflow/nmt's ``compute_bleu``: corpus level, the
  *shortest* reference length in the brevity penalty, optional add-one smoothing on every order,
  tokenizer_13a by default. Not a replacement for either number here.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

__all__ = ["TEXYGEN_SAMPLE_SIZE", "BleuResult", "texygen_bleu", "texygen_self_bleu"]

TEXYGEN_SAMPLE_SIZE = 500  # Texygen's ``sample_size``: what ``is_fast=True`` keeps
_EPSILON = 0.1  # nltk SmoothingFunction().method1's default epsilon


@dataclass
class BleuResult:
    """Mean sentence BLEU-n for n = 1 ... max_n, and the protocol that produced it."""

    scores: dict[int, float]  # {n: mean over hypotheses of BLEU-n}; papers report n = 2 ... max_n
    max_n: int
    num_hypotheses: int       # hypotheses scored
    num_references: int       # references of each hypothesis (self-BLEU: the other sentences)
    protocol: str             # e.g. "texygen (nltk sentence_bleu, method1, all references)"

    def __getitem__(self, n: int) -> float:
        return self.scores[n]

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


def _tokenize_all(sentences: Any, name: str) -> list[tuple[Hashable, ...]]:
    if isinstance(sentences, str) or not isinstance(sentences, Sequence):
        raise ValueError(f"{name} must be a list of sentences (token lists or strings), got {type(sentences).__name__}")
    out = []
    for i, sentence in enumerate(sentences):
        if isinstance(sentence, str):
            out.append(tuple(sentence.split()))
        elif isinstance(sentence, Sequence):
            if any(isinstance(token, str) and len(token.split()) > 1 for token in sentence):
                # evaluate's bleu takes a list of reference sentences per prediction; read as tokens, each whole
                # sentence would be one token and match nothing
                raise ValueError(f"{name}[{i}] is a list of sentences, not of tokens (evaluate's bleu form, one list "
                                 f"per prediction): pass one flat list of sentences, every one is scored against "
                                 f"all of them, e.g. [s for group in {name} for s in group]")
            out.append(tuple(sentence))
        else:
            raise ValueError(f"{name}[{i}] must be a token list or a string, got {type(sentence).__name__}")
    if not out:
        raise ValueError(f"{name} is empty: nothing to score")
    return out


def _check_max_n(max_n: int) -> None:
    if isinstance(max_n, bool) or not isinstance(max_n, int) or max_n < 1:
        raise ValueError(f"max_n must be an integer >= 1, got {max_n!r}")


def _ngram_counts(tokens: tuple, n: int) -> Counter:
    return Counter(tokens[i:i + n] for i in range(len(tokens) - n + 1))


class _Lengths:
    """A multiset of reference lengths, for NLTK's closest_ref_length (ties to the shorter length)."""

    def __init__(self, lengths: Sequence[int]):
        counts = Counter(lengths)
        self.values = sorted(counts)    # distinct lengths, ascending
        self.counts = counts

    def closest(self, hyp_len: int, exclude: int | None = None) -> int:
        """The length nearest ``hyp_len``, one copy of ``exclude`` left out (self-BLEU's own length)."""
        def present(j: int) -> bool:
            value = self.values[j]
            return self.counts[value] - (value == exclude) > 0

        hi = bisect.bisect_left(self.values, hyp_len)   # first length >= hyp_len
        while hi < len(self.values) and not present(hi):
            hi += 1
        lo = min(hi, len(self.values)) - 1              # last length < that one
        while lo >= 0 and not present(lo):
            lo -= 1
        candidates = [self.values[j] for j in (lo, hi) if 0 <= j < len(self.values)]
        if not candidates:
            raise ValueError("no reference left to compare with")
        return min(candidates, key=lambda r: (abs(r - hyp_len), r))


def _sentence_bleu(hyp_len: int, hyp_counts: Sequence[Counter], clip: Any, closest_len: int) -> list[float]:
    """NLTK's sentence_bleu with method1 for weights (1/n,)*n, n = 1 ... max_n, computed once.

    ``hyp_counts[k - 1]`` holds the k-gram counts of the hypothesis, ``clip(k, ngram)`` the
    maximum count of ``ngram`` (of order k) in any one reference.
    """
    max_n = len(hyp_counts)
    precisions = []
    for k, counts in enumerate(hyp_counts, start=1):
        numerator = sum(min(c, clip(k, g)) for g, c in counts.items())
        denominator = max(1, hyp_len - k + 1)
        if k == 1 and numerator == 0:       # no unigram matches: NLTK returns 0 for every n
            return [0.0] * max_n
        # Fraction(num, den) goes through float(num / den) in math.log; method1 adds epsilon to 0
        precisions.append(numerator / denominator if numerator else (numerator + _EPSILON) / denominator)
    if hyp_len > closest_len:
        bp = 1.0
    elif hyp_len == 0:
        bp = 0.0
    else:
        bp = math.exp(1 - closest_len / hyp_len)
    logs = [math.log(p) for p in precisions]
    scores = []
    for n in range(1, max_n + 1):
        w = 1.0 / n
        scores.append(bp * math.exp(math.fsum(w * logs[k] for k in range(n))))
    return scores


def _mean_scores(per_hypothesis: list[list[float]], max_n: int) -> dict[int, float]:
    means = {}
    for n in range(1, max_n + 1):
        total = 0.0
        for scores in per_hypothesis:   # summed in order, as Texygen does
            total += scores[n - 1]
        means[n] = total / len(per_hypothesis)
    return means


# ----------------------------------------------------------------------------------------------
# test-BLEU and self-BLEU
# ----------------------------------------------------------------------------------------------


def texygen_bleu(hypotheses: Sequence[Sequence[str] | str], references: Sequence[Sequence[str] | str],
                 max_n: int = 4, fast: bool = False) -> BleuResult:
    """Texygen's BLEU-n: the mean over hypotheses of NLTK sentence BLEU against all references.

    Args:
        hypotheses: generated sentences, each a token list or a string (split on whitespace;
            Texygen's ``nltk.word_tokenize`` is not applied).
        references: the reference sentences (e.g. test sentences), same form. Every hypothesis is
            scored against all of them.
        max_n: the largest order; BLEU-n is computed for every n = 1 ... max_n (cumulative
            weights (1/n, ..., 1/n), method1 smoothing), in one pass.
        fast: Texygen's ``is_fast=True``: only the first 500 references are used (all
            hypotheses are still scored). Recorded in ``protocol``.

    Returns:
        A :class:`BleuResult`; ``result.scores[n]`` (or ``result[n]``) is BLEU-n.

    Example::

        >>> r = texygen_bleu(["the cat sat on the mat"], ["the cat sat on a mat", "a dog sat"], max_n=2)
        >>> round(r[2], 4)
        0.7071
    """
    _check_max_n(max_n)
    hyps = _tokenize_all(hypotheses, "hypotheses")
    refs = _tokenize_all(references, "references")
    if fast:
        refs = refs[:TEXYGEN_SAMPLE_SIZE]
    # per order: n-gram -> its maximum count in any one reference
    max_counts: list[dict] = [{} for _ in range(max_n + 1)]
    for ref in refs:
        for k in range(1, max_n + 1):
            table = max_counts[k]
            for g, c in _ngram_counts(ref, k).items():
                if c > table.get(g, 0):
                    table[g] = c
    lengths = _Lengths([len(r) for r in refs])

    def clip(k: int, g: tuple) -> int:
        return max_counts[k].get(g, 0)

    per_hyp = []
    for h in hyps:
        hyp_counts = [_ngram_counts(h, k) for k in range(1, max_n + 1)]
        per_hyp.append(_sentence_bleu(len(h), hyp_counts, clip, lengths.closest(len(h))))
    protocol = (f"texygen is_fast (first {TEXYGEN_SAMPLE_SIZE} references)" if fast
                else "texygen (nltk sentence_bleu, method1, all references)")
    return BleuResult(scores=_mean_scores(per_hyp, max_n), max_n=max_n, num_hypotheses=len(hyps),
                      num_references=len(refs), protocol=protocol)


def texygen_self_bleu(sentences: Sequence[Sequence[str] | str], max_n: int = 4, fast: bool = False) -> BleuResult:
    """Texygen's self-BLEU-n: each sentence scored against all the other sentences, averaged.

    Lower is more diverse. A sentence repeated elsewhere in the set matches its copy exactly.

    Args:
        sentences: generated sentences (token lists or whitespace-split strings); at least two.
        max_n: the largest order; self-BLEU-n for every n = 1 ... max_n.
        fast: Texygen's ``is_fast=True``: only the first 500 sentences are used, as hypotheses
            and as references. Recorded in ``protocol``.

    Returns:
        A :class:`BleuResult` with ``num_references`` = number of sentences used - 1.
    """
    _check_max_n(max_n)
    sents = _tokenize_all(sentences, "sentences")
    if fast:
        sents = sents[:TEXYGEN_SAMPLE_SIZE]
    if len(sents) < 2:
        raise ValueError(f"self-BLEU needs at least 2 sentences (each is scored against the others), got {len(sents)}")
    # per order: n-gram -> [largest count, index of a sentence holding it, largest count among the others]
    tables: list[dict] = [{} for _ in range(max_n + 1)]
    sentence_counts = [[_ngram_counts(s, k) for k in range(1, max_n + 1)] for s in sents]
    for i, per_order in enumerate(sentence_counts):
        for k, counts in enumerate(per_order, start=1):
            table = tables[k]
            for g, c in counts.items():
                entry = table.get(g)
                if entry is None:
                    table[g] = [c, i, 0]
                elif c > entry[0]:
                    entry[2] = entry[0]
                    entry[0], entry[1] = c, i
                elif c > entry[2]:
                    entry[2] = c
    lengths = _Lengths([len(s) for s in sents])

    per_hyp = []
    for i, s in enumerate(sents):
        def clip(k: int, g: tuple, i: int = i) -> int:
            best, owner, second = tables[k][g]  # every n-gram of s is in the table
            return second if owner == i else best

        per_hyp.append(_sentence_bleu(len(s), sentence_counts[i], clip, lengths.closest(len(s), exclude=len(s))))
    protocol = (f"texygen self-BLEU is_fast (first {TEXYGEN_SAMPLE_SIZE} sentences)" if fast
                else "texygen self-BLEU (nltk sentence_bleu, method1, each sentence against all others)")
    return BleuResult(scores=_mean_scores(per_hyp, max_n), max_n=max_n, num_hypotheses=len(sents),
                      num_references=len(sents) - 1, protocol=protocol)
