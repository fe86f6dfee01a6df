"""Word sense disambiguation (WSD) on Raganato et al.'s unified evaluation framework (EACL 2017).

The pieces every WSD system here shares: the corpora, the sense inventory, the scorer and the two
reference baselines (the NCLM paper's protocol, Chaudhary et al. 2020, section 5, and its published figures).

**Corpora.** A set is a folder holding ``<name>.data.xml`` (``corpus/text/sentence`` with ``wf``
and ``instance`` tokens, each with ``lemma`` and a universal ``pos``) and ``<name>.gold.key.txt``
(``instance_id key [key ...]``), either possibly gzipped. :func:`load_wsd_corpus` reads any such
folder into a :class:`datasets.Dataset` with one row per sentence (sentences without instances
are kept: they are context)::

    document_id  "d000"
    sentence_id  "d000.s000"
    tokens       ["The", "art", "of", ...]         surface forms
    lemmas       ["the", "art", "of", ...]
    pos          ["DET", "NOUN", "ADP", ...]        universal POS, as in the XML
    instances    [{"id": "d000.s000.t000", "position": 1, "lemma": "art", "pos": "NOUN",
                   "gold": ["art%1:09:00::"]}, ...]   position indexes ``tokens``

**Sense inventory** (:class:`SenseInventory`, ``wordnet/senses.tsv.gz``: Open English WordNet
2021 with WordNet 3.0 sense keys). Senses are grouped by (lemma, WordNet POS). The POS of the
inventory is folded to ``n v a r``: homograph entries (``n-1``, ``n-2``, ...) join their POS, and
adjective satellites (``s``) join ``a``; universal tags map NOUN→n, VERB→v, ADJ→a, ADV→r.

* ``candidates(lemma, pos)`` = the OEWN senses of (lemma, pos) ∪ the training (SemCor) keys seen
  for (lemma, pos). A training key joins only the candidates of its own lemma and POS (the lemma
  and the synset type written in the key itself), so a candidate of another lemma never appears.
  Candidates are ordered as the first-sense rule orders them: OEWN rank, ties by training count
  (higher first), then by key; keys missing from OEWN come last (by count, then key).
* ``first_sense`` (WN-1st) = the first candidate among the OEWN senses: **lowest rank, ties broken
  by the training count (higher first), then by the smaller key**. OEWN numbers from rank 1 each
  homograph (``n-1``, ``n-2``: 54 pairs), head adjectives apart from satellites (2,030 pairs) and
  entries whose lemmas differ only in case (Holly / holly: 1,249 pairs), so 3,333 (lemma, pos)
  pairs have several rank-1 senses. This rule gives SE2 66.8, SE3 66.0, SE07 55.2 (published
  WN-1st: 66.8 / 66.2 / 55.2); the first rank-1 sense in the file's order gives 61.3 / 62.4 / 53.4.
  A lemma without OEWN senses takes its most frequent training key; one without either has no
  first sense (the baseline abstains).
* ``most_frequent_sense`` (SemCor-MFS) = the most frequent training key of (lemma, pos), ties by
  lower OEWN rank, then by the *larger* key; ``None`` for a pair never seen in training. The last
  tie only arises between keys of equal count and rank: a head adjective and a satellite (both
  rank 1 in OEWN, which numbers ``a`` and ``s`` entries separately), or two keys missing from OEWN.
  The larger key (so the satellite, ``%5`` > ``%3``) reproduces the NCLM paper's SemCor-MFS
  (66.0 / 64.7 / 55.4); the smaller key, as in WN-1st, gives 66.2 / 64.8 / 55.4.

**Scorer** (:func:`score_wsd`): the semantics of the framework's ``Scorer.java``.

* Both files map an id to a *set* of keys: a line is split on single spaces (Java's
  ``split(" ")``, which drops trailing empty fields); a line with fewer than two fields is skipped
  (so a TAB-separated line is an abstention), and repeated lines of one id merge their keys.
  A double space makes an empty answer, which counts as wrong.
* For each system id present in the gold: ok += |answers ∩ gold| / |answers|, notok += the rest.
  Any one gold key is enough (multiple gold keys), several answers share the credit, system ids
  absent from the gold are ignored, and an abstention lowers recall only.
* P = ok / (ok + notok), R = ok / |gold ids|, F1 = 2PR / (P + R), printed as ``%.1f`` of the
  percentage with Java's half-up rounding. P (and F1) are NaN when nothing is scored, F1 too when
  P = R = 0, as in Java.

**Baselines.** :func:`first_sense_baseline` (WN-1st) and :func:`most_frequent_sense_baseline`
(SemCor-MFS, WN-1st back-off for unseen (lemma, pos)) reproduce, on the WSD sets of ``$TOPIC_LM_DATA/wsd``:
WN-1st 66.8 / 66.0 / 55.2 and SemCor-MFS 66.0 / 64.7 / 55.4 (SE2 / SE3 / SE07). The published
SemCor-MFS (65.6 / 66.0 / 54.5) comes from Raganato's SemCor conversion (226,036 instances; the
one here has 234,136), so report ours beside it.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import logging
import math
import os
import re
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Optional, Union

import datasets
import datasets.table

logger = logging.getLogger(__name__)

__all__ = [
    "SenseInventory",
    "WSDScore",
    "as_corpus",
    "find_wsd_files",
    "first_sense_baseline",
    "iter_wsd_instances",
    "load_sense_inventory",
    "load_wsd_corpus",
    "most_frequent_sense_baseline",
    "read_key_file",
    "score_wsd",
    "wordnet_pos",
    "wsd_gold",
    "write_key_file",
]

PathLike = Union[str, os.PathLike]

# Universal POS of the Raganato XML -> WordNet POS. Other tags (DET, ADP, ...) have no senses.
UPOS_TO_WORDNET = {"NOUN": "n", "VERB": "v", "ADJ": "a", "ADV": "r"}
# The synset type written in a sense key (lemma%ss_type:...): 5 = adjective satellite.
SS_TYPE_TO_WORDNET = {"1": "n", "2": "v", "3": "a", "4": "r", "5": "a"}

WSD_CORPUS_FEATURES = datasets.Features({
    "document_id": datasets.Value("string"),
    "sentence_id": datasets.Value("string"),
    "tokens": datasets.Sequence(datasets.Value("string")),
    "lemmas": datasets.Sequence(datasets.Value("string")),
    "pos": datasets.Sequence(datasets.Value("string")),
    # a Python list of a dict = a list of structs (Sequence(dict) would give a dict of lists)
    "instances": [{
        "id": datasets.Value("string"),
        "position": datasets.Value("int32"),
        "lemma": datasets.Value("string"),
        "pos": datasets.Value("string"),
        "gold": datasets.Sequence(datasets.Value("string")),
    }],
})


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


def _open_text(path: Path):
    """A text file or its gzip, read as UTF-8 with universal newlines (as Java's ``readLine``)."""
    if path.name.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def _open_binary(path: Path):
    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")


def wordnet_pos(pos: str) -> Optional[str]:
    """The WordNet POS (``n v a r``) of a universal tag (``NOUN``), a WordNet tag (``n``, ``s``)
    or an OEWN homograph tag (``n-2``); ``None`` for tags without senses (``DET``, ``X``, ...)."""
    if pos in UPOS_TO_WORDNET:
        return UPOS_TO_WORDNET[pos]
    base = pos.split("-", 1)[0]  # OEWN homographs: n-1, n-2, s-1 ...
    if base in ("n", "v", "a", "r"):
        return base
    return "a" if base == "s" else None


def _normalize_lemma(lemma: str) -> str:
    # OEWN and sense keys write lemmas lower-cased, with "_" for spaces
    return lemma.strip().lower().replace(" ", "_")


def _key_lemma_pos(key: str) -> tuple[str, Optional[str]]:
    """(lemma, WordNet POS) written in a sense key ``lemma%ss_type:lex_filenum:lex_id:head:head_id``."""
    lemma, _, rest = key.partition("%")
    return lemma.lower(), SS_TYPE_TO_WORDNET.get(rest[:1])


# ----------------------------------------------------------------------------------------------
# key files
# ----------------------------------------------------------------------------------------------


def _java_split_space(line: str) -> list[str]:
    """``line.split(" ")`` as Java does it: trailing empty fields are dropped."""
    fields = line.split(" ")
    while fields and fields[-1] == "":
        fields.pop()
    return fields


def read_key_file(path: PathLike) -> dict[str, list[str]]:
    """Read a key file (gold or system) the way the framework's scorer reads it.

    Each line is ``id key [key ...]`` split on single spaces; lines with fewer than two fields are
    skipped (a TAB-separated line too); repeated ids merge their keys. Returns id -> distinct keys
    in file order (an empty string is an answer: a double space in the line). ``.gz`` is read
    transparently.
    """
    keys: dict[str, list[str]] = {}
    with _open_text(Path(path)) as f:
        for line in f:
            fields = _java_split_space(line.rstrip("\r\n"))
            if len(fields) < 2:
                continue
            seen = keys.get(fields[0])
            if seen is None:
                keys[fields[0]] = list(dict.fromkeys(fields[1:]))
            else:
                seen.extend(k for k in dict.fromkeys(fields[1:]) if k not in seen)
    return keys


def write_key_file(predictions: Mapping[str, Union[str, Iterable[str], None]], path: PathLike) -> None:
    """Write ``predictions`` (id -> key, or id -> several keys) as a key file, one ``id key [key ...]``
    line per id in the mapping's order. Ids mapped to ``None`` or to no key are left out
    (abstentions). Raises ``ValueError`` for an id or key that the scorer would read differently
    (empty, or containing whitespace)."""
    with open(path, "w", encoding="utf-8") as f:
        for instance_id, answer in predictions.items():
            answers = _answer_set(answer)
            if not answers:
                continue
            for field in (instance_id, *answers):
                if not isinstance(field, str) or not field or re.search(r"\s", field):
                    raise ValueError(f"cannot write id {instance_id!r} with answer {answer!r}: ids and keys must be "
                                     f"non-empty strings without whitespace, got {field!r}")
            f.write(" ".join((instance_id, *answers)) + "\n")


# ----------------------------------------------------------------------------------------------
# corpora
# ----------------------------------------------------------------------------------------------


def _find_one(folder: Path, patterns: tuple[str, ...], what: str) -> Optional[Path]:
    for pattern in patterns:  # patterns in order of preference
        found = sorted(folder.glob(pattern))
        if len(found) > 1:
            raise ValueError(f"several {what} files in {folder}: {[p.name for p in found]}; pass the file itself")
        if found:
            return found[0]
    return None


def find_wsd_files(path: PathLike) -> tuple[Path, Optional[Path]]:
    """The (data XML, gold key) files of a Raganato-format set: ``path`` is the set's folder or its
    XML file. ``<name>.data.xml`` and ``<name>.gold.key.txt`` (each possibly ``.gz``) are preferred,
    then any single ``*.xml`` / ``*.key.txt`` / ``*.key``. The gold file is ``None`` when absent."""
    path = Path(path)
    if path.is_dir():
        xml = _find_one(path, ("*.data.xml", "*.data.xml.gz", "*.xml", "*.xml.gz"), "data XML")
        if xml is None:
            raise FileNotFoundError(f"no Raganato data file (*.data.xml[.gz]) in {path}")
        folder = path
    elif path.exists():
        xml, folder = path, path.parent
    else:
        raise FileNotFoundError(f"{path} does not exist")
    stem = re.sub(r"\.data\.xml(\.gz)?$|\.xml(\.gz)?$", "", xml.name)
    for name in (f"{stem}.gold.key.txt", f"{stem}.gold.key.txt.gz"):
        if (folder / name).exists():
            return xml, folder / name
    return xml, _find_one(folder, ("*.gold.key.txt", "*.gold.key.txt.gz", "*.key.txt", "*.key.txt.gz", "*.key"),
                          "gold key")


def load_wsd_corpus(path: PathLike, gold_path: Optional[PathLike] = None) -> datasets.Dataset:
    """Read a Raganato-format WSD set (SemCor, Senseval-2, ...) into a ``datasets.Dataset`` with one
    row per sentence (columns ``document_id``, ``sentence_id``, ``tokens``, ``lemmas``, ``pos``,
    ``instances``; see the module docstring).

    Args:
        path: the set's folder (``<name>.data.xml[.gz]`` + ``<name>.gold.key.txt[.gz]``, detected)
            or its XML file.
        gold_path: the gold key file, if not the one found beside the XML. The gold file is
            required: an instance without a gold line gets ``gold = []`` (and a warning). A gold
            id that is no instance of the XML is an error: the dataset and the key file would
            give different recall denominators.

    The XML is parsed as a stream (``iterparse``), so SemCor (37,176 sentences, 234,136
    instances) takes a few seconds and little memory.
    """
    xml, found_gold = find_wsd_files(path)
    gold_file = Path(gold_path) if gold_path is not None else found_gold
    if gold_file is None:
        raise FileNotFoundError(f"no gold key file (*.gold.key.txt[.gz]) beside {xml}; pass gold_path")
    gold = read_key_file(gold_file)

    columns: dict[str, list] = {name: [] for name in WSD_CORPUS_FEATURES}
    seen_ids: set[str] = set()
    try:
        _parse_wsd_xml(xml, gold, columns, seen_ids)
    except ET.ParseError as error:
        raise ValueError(f"{xml} is not well-formed XML ({error}): the file may be truncated or not "
                         f"a Raganato-format data file") from None
    missing = sum(not instance["gold"] for row in columns["instances"] for instance in row)
    if len(columns["document_id"]) != len(columns["sentence_id"]):
        raise ValueError(f"{xml}: a <sentence> outside any <text>")
    if missing:
        logger.warning("%s: %d of %d instances have no gold key in %s", xml, missing, len(seen_ids), gold_file)
    if extra := sorted(gold.keys() - seen_ids):
        raise ValueError(f"{gold_file} has {len(extra)} id(s) that are no instance of {xml} (first: {extra[0]!r}): "
                         f"the key file does not match the data file; pass the matching gold_path")
    # straight to an Arrow table: Dataset.from_dict would re-check every nested value (4x slower on SemCor)
    table = datasets.table.InMemoryTable.from_pydict(columns, schema=WSD_CORPUS_FEATURES.arrow_schema)
    return datasets.Dataset(table, info=datasets.DatasetInfo(features=WSD_CORPUS_FEATURES))


def _parse_wsd_xml(xml: Path, gold: Mapping[str, list[str]], columns: dict[str, list], seen_ids: set[str]) -> None:
    """Stream ``xml`` into ``columns`` (one row per sentence), recording instance ids in ``seen_ids``."""
    tokens, lemmas, tags, instances, document_start = [], [], [], [], 0
    with _open_binary(xml) as f:
        # "end" events only (half the events of start+end): a sentence's row is complete at its end,
        # and its document id is filled in at the end of the enclosing <text>
        for _, element in ET.iterparse(f):
            tag = element.tag
            if tag == "wf" or tag == "instance":
                lemma, pos = element.get("lemma", ""), element.get("pos", "")
                if tag == "instance":
                    instance_id = element.get("id")
                    if instance_id in seen_ids:
                        raise ValueError(f"{xml}: instance id {instance_id!r} occurs twice")
                    seen_ids.add(instance_id)
                    keys = gold.get(instance_id, [])
                    instances.append({"id": instance_id, "position": len(tokens), "lemma": lemma, "pos": pos,
                                      "gold": keys})
                tokens.append(element.text or "")
                lemmas.append(lemma)
                tags.append(pos)
            elif tag == "sentence":
                columns["sentence_id"].append(element.get("id", ""))
                columns["tokens"].append(tokens)
                columns["lemmas"].append(lemmas)
                columns["pos"].append(tags)
                columns["instances"].append(instances)
                tokens, lemmas, tags, instances = [], [], [], []
                element.clear()  # keep memory flat: a parsed sentence is no longer needed
            elif tag == "text":
                n = len(columns["sentence_id"])
                columns["document_id"].extend([element.get("id", "")] * (n - document_start))
                document_start = n
                element.clear()


def as_corpus(corpus: Union[datasets.Dataset, PathLike]) -> datasets.Dataset:
    """``corpus`` as a dataset: a ``datasets.Dataset`` as it is, a path read with :func:`load_wsd_corpus`."""
    return corpus if isinstance(corpus, datasets.Dataset) else load_wsd_corpus(corpus)


def iter_wsd_instances(corpus: Union[datasets.Dataset, PathLike]) -> Iterator[dict]:
    """Every instance of a corpus (a :func:`load_wsd_corpus` dataset or a set's path), in order, as
    ``{"id", "position", "lemma", "pos", "gold", "document_id", "sentence_id"}``."""
    columns = ["document_id", "sentence_id", "instances"]
    # Arrow batches converted column-wise: twice as fast as formatting row by row
    for batch in as_corpus(corpus).select_columns(columns).with_format("arrow").iter(batch_size=4096):
        for document_id, sentence_id, instances in zip(*(batch.column(c).to_pylist() for c in columns)):
            for instance in instances:
                yield {**instance, "document_id": document_id, "sentence_id": sentence_id}


def wsd_gold(corpus: Union[datasets.Dataset, PathLike]) -> dict[str, list[str]]:
    """id -> gold keys of every instance of a corpus (instances without gold are left out, as the
    scorer's reading of the gold file would)."""
    return {instance["id"]: instance["gold"] for instance in iter_wsd_instances(corpus) if instance["gold"]}


# ----------------------------------------------------------------------------------------------
# sense inventory
# ----------------------------------------------------------------------------------------------


class SenseInventory:
    """Candidate senses per (lemma, WordNet POS): OEWN senses ∪ training keys (module docstring).

    Args:
        wordnet_senses: (lemma, pos) -> [(sense key, rank), ...] from WordNet; pos in ``n v a r``.
        training_counts: (lemma, pos) -> {sense key: count} in the training corpus (SemCor), or
            ``None``: then WN-1st ties are broken by key alone and there is no MFS.

    Lemmas are looked up lower-cased with ``_`` for spaces, POS through :func:`wordnet_pos`.
    """

    def __init__(self, wordnet_senses: Mapping[tuple[str, str], Iterable[tuple[str, int]]],
                 training_counts: Optional[Mapping[tuple[str, str], Mapping[str, int]]] = None):
        self._ranks: dict[tuple[str, Optional[str]], dict[str, int]] = {}
        for (lemma, pos), senses in wordnet_senses.items():
            ranks = self._ranks.setdefault(self._pair(lemma, pos), {})
            for key, rank in senses:
                ranks[key] = min(rank, ranks.get(key, rank))
        self._counts: dict[tuple[str, Optional[str]], Counter] = defaultdict(Counter)
        for (lemma, pos), counts in (training_counts or {}).items():
            self._counts[self._pair(lemma, pos)].update(counts)
        self._counts = dict(self._counts)
        self.has_training = training_counts is not None

    # -- lookups ---------------------------------------------------------------------------------

    @staticmethod
    def _pair(lemma: str, pos: str) -> tuple[str, Optional[str]]:
        return _normalize_lemma(lemma), wordnet_pos(pos)

    def wordnet_senses(self, lemma: str, pos: str) -> list[str]:
        """The OEWN senses of (lemma, pos), in first-sense order."""
        ranks = self._ranks.get(self._pair(lemma, pos), {})
        return [key for key in self.candidates(lemma, pos) if key in ranks]

    def candidates(self, lemma: str, pos: str) -> list[str]:
        """OEWN senses ∪ training keys of (lemma, pos): rank, then training count (higher first),
        then key; keys missing from OEWN last. Empty for an unknown pair or a POS without senses."""
        pair = self._pair(lemma, pos)
        ranks, counts = self._ranks.get(pair, {}), self._counts.get(pair, {})
        return sorted(ranks.keys() | counts.keys(),
                      key=lambda key: (ranks.get(key, math.inf), -counts.get(key, 0), key))

    def first_sense(self, lemma: str, pos: str) -> Optional[str]:
        """WN-1st: lowest OEWN rank, ties by training count, then key. Without OEWN senses, the most
        frequent training key; ``None`` when (lemma, pos) has no candidate at all."""
        candidates = self.candidates(lemma, pos)
        return candidates[0] if candidates else None

    def most_frequent_sense(self, lemma: str, pos: str) -> Optional[str]:
        """SemCor-MFS: the most frequent training key of (lemma, pos), ties by lower OEWN rank, then
        the larger key (module docstring); ``None`` when (lemma, pos) was never seen in training."""
        if not self.has_training:
            raise ValueError("this inventory was built without a training corpus: it has no most frequent sense")
        pair = self._pair(lemma, pos)
        counts, ranks = self._counts.get(pair), self._ranks.get(pair, {})
        if not counts:
            return None
        return max(counts, key=lambda key: (counts[key], -ranks.get(key, math.inf), key))

    def rank(self, lemma: str, pos: str, key: str) -> Optional[int]:
        """The OEWN rank of ``key`` among the senses of (lemma, pos), ``None`` if it is not one."""
        return self._ranks.get(self._pair(lemma, pos), {}).get(key)

    def training_count(self, lemma: str, pos: str, key: Optional[str] = None) -> int:
        """How often ``key`` (or, without a key, any sense of (lemma, pos)) occurs in training."""
        counts = self._counts.get(self._pair(lemma, pos), {})
        return counts.get(key, 0) if key is not None else sum(counts.values())

    def training_sense_keys(self) -> list[str]:
        """The distinct sense keys of the training corpus, sorted (the output classes of a softmax
        over all training senses)."""
        return sorted({key for counts in self._counts.values() for key in counts})

    def wordnet_sense_keys(self) -> set[str]:
        return {key for ranks in self._ranks.values() for key in ranks}

    def __repr__(self) -> str:
        return (f"SenseInventory({len(self._ranks)} WordNet (lemma, pos) pairs, "
                f"{len(self._counts)} seen in training)")


def _read_wordnet_senses(path: Path) -> dict[tuple[str, str], list[tuple[str, int]]]:
    senses: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
    with _open_text(path) as f:
        header = f.readline().rstrip("\r\n").split("\t")
        missing = {"sense_key", "lemma", "pos", "rank"} - set(header)
        if missing:
            raise ValueError(f"{path}: the header lacks {sorted(missing)} (has {header})")
        i_key, i_lemma, i_pos, i_rank = (header.index(c) for c in ("sense_key", "lemma", "pos", "rank"))
        for n, line in enumerate(f, start=2):
            fields = line.rstrip("\r\n").split("\t", len(header) - 1)
            if len(fields) < len(header):
                raise ValueError(f"{path}:{n}: expected {len(header)} TAB-separated fields, got {len(fields)}")
            pos = wordnet_pos(fields[i_pos])
            if pos is None:
                raise ValueError(f"{path}:{n}: unknown WordNet POS {fields[i_pos]!r}")
            senses[_normalize_lemma(fields[i_lemma]), pos].append((fields[i_key], int(fields[i_rank])))
    return dict(senses)


def _training_counts(corpus: datasets.Dataset) -> dict[tuple[str, str], Counter]:
    counts: dict[tuple[str, str], Counter] = defaultdict(Counter)
    dropped = 0
    for instance in iter_wsd_instances(corpus):
        pair = (_normalize_lemma(instance["lemma"]), wordnet_pos(instance["pos"]))
        for key in instance["gold"]:
            # a key of another lemma or POS (an annotation error) must not become a candidate here
            if _key_lemma_pos(key) != pair:
                dropped += 1
                continue
            counts[pair][key] += 1
    if dropped:
        logger.warning("%d training keys were not senses of their instance's (lemma, pos); they are ignored", dropped)
    return dict(counts)


def load_sense_inventory(path: PathLike, training: Union[datasets.Dataset, PathLike, None] = None) -> SenseInventory:
    """Build a :class:`SenseInventory` from ``senses.tsv[.gz]`` (columns ``sense_key``, ``lemma``,
    ``pos``, ``rank``, TAB-separated, with a header) and, optionally, a training corpus (a
    :func:`load_wsd_corpus` dataset or a set's path, e.g. SemCor) for the counts. Each gold key of a
    training instance counts once."""
    counts = _training_counts(as_corpus(training)) if training is not None else None
    return SenseInventory(_read_wordnet_senses(Path(path)), counts)


# ----------------------------------------------------------------------------------------------
# scorer
# ----------------------------------------------------------------------------------------------


def _answer_set(answer) -> list[str]:
    """The distinct keys of one answer (a key, several keys, or None), in order."""
    if answer is None:
        return []
    if isinstance(answer, str):
        return [answer]
    keys = list(dict.fromkeys(answer)) if hasattr(answer, "__iter__") else [answer]
    if not all(isinstance(key, str) for key in keys):
        raise TypeError(f"an answer is a sense key (a string), several keys or None; got {answer!r}")
    return keys


def _as_key_sets(keys, role: str) -> dict[str, set[str]]:
    if isinstance(keys, (str, os.PathLike)):
        return {i: set(k) for i, k in read_key_file(keys).items()}
    if isinstance(keys, datasets.Dataset):
        return {i: set(k) for i, k in wsd_gold(keys).items()}
    if isinstance(keys, Mapping):
        sets = {i: set(_answer_set(a)) for i, a in keys.items()}
        return {i: s for i, s in sets.items() if s}  # no key = no line in a key file
    raise TypeError(f"{role} must be a key file path or a mapping id -> key(s), got {type(keys).__name__}")


def _java_percent(value: float) -> str:
    """``String.format("%.1f", 100 * value)`` as Java prints it: the shortest decimal digits of the
    double, rounded half up (Python's ``%.1f`` rounds the exact binary value half-even)."""
    value = 100 * value
    if math.isnan(value) or math.isinf(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return str(Decimal(repr(value)).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))


@dataclass(frozen=True)
class WSDScore:
    """Micro P / R / F1 of a WSD system as the framework's scorer computes them (fractions in
    [0, 1]; NaN where the scorer divides by zero). ``str()`` prints the scorer's three lines;
    :meth:`formatted` gives its ``%.1f`` percentages."""

    precision: float
    recall: float
    f1: float
    correct: float  # "ok": summed (fractional) credit
    wrong: float  # "notok"
    num_gold: int  # gold ids: the recall denominator
    num_scored: int  # system ids found in the gold
    num_ignored: int  # system ids absent from the gold

    def formatted(self) -> dict[str, str]:
        return {"P": _java_percent(self.precision), "R": _java_percent(self.recall), "F1": _java_percent(self.f1)}

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        return "\n".join(f"{name}=\t{value}%" for name, value in self.formatted().items())


def score_wsd(predictions, gold) -> WSDScore:
    """Score WSD answers with the semantics of the unified framework's ``Scorer.java``.

    Args:
        predictions: a system key file (path) or a mapping id -> key / several keys / ``None``
            (abstain). Several keys share the credit; an empty-string key is an answer, wrong.
        gold: a gold key file, a mapping id -> key(s), or a :func:`load_wsd_corpus` dataset.

    Returns:
        a :class:`WSDScore`; ``str(score)`` prints like the Java scorer.
    """
    system, gold_sets = _as_key_sets(predictions, "predictions"), _as_key_sets(gold, "gold")
    ok = notok = 0.0
    scored = 0
    for instance_id, answers in system.items():
        gold_keys = gold_sets.get(instance_id)
        if gold_keys is None:
            continue
        scored += 1
        hits = len(answers & gold_keys)
        ok += hits / len(answers)
        notok += (len(answers) - hits) / len(answers)
    precision = _divide(ok, ok + notok)
    recall = _divide(ok, len(gold_sets))
    f1 = _divide(2 * precision * recall, precision + recall)
    return WSDScore(precision, recall, f1, ok, notok, len(gold_sets), scored, len(system) - scored)


def _divide(a: float, b: float) -> float:
    # Java's double division: x / 0.0 is NaN for x = 0 (and NaN propagates)
    if math.isnan(a) or math.isnan(b):
        return math.nan
    if b == 0:
        return math.nan if a == 0 else math.copysign(math.inf, a)
    return a / b


# ----------------------------------------------------------------------------------------------
# baselines
# ----------------------------------------------------------------------------------------------


def first_sense_baseline(corpus: Union[datasets.Dataset, PathLike], inventory: SenseInventory) -> dict[str, str]:
    """WN-1st: every instance gets :meth:`SenseInventory.first_sense` of its (lemma, pos); instances
    without any candidate are left out (abstentions). Returns id -> key."""
    predictions = {}
    for instance in iter_wsd_instances(corpus):
        key = inventory.first_sense(instance["lemma"], instance["pos"])
        if key is not None:
            predictions[instance["id"]] = key
    return predictions


def most_frequent_sense_baseline(corpus: Union[datasets.Dataset, PathLike], inventory: SenseInventory,
                                 back_off: bool = True) -> dict[str, str]:
    """SemCor-MFS: the most frequent training key of each instance's (lemma, pos); ties by lower
    OEWN rank, then the larger key (:meth:`SenseInventory.most_frequent_sense`). With ``back_off``
    a (lemma, pos) never seen in training takes WN-1st, otherwise it is left out (an abstention).
    Returns id -> key."""
    predictions = {}
    for instance in iter_wsd_instances(corpus):
        key = inventory.most_frequent_sense(instance["lemma"], instance["pos"])
        if key is None and back_off:
            key = inventory.first_sense(instance["lemma"], instance["pos"])
        if key is not None:
            predictions[instance["id"]] = key
    return predictions
