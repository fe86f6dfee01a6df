"""Documents and vocabularies.

A *document* is a list of sentences and a sentence is a list of lower-cased tokens. Every loader
returns a :class:`datasets.Dataset` with a ``sentences`` column (``list[list[str]]``) and keeps
the source's other columns (labels, ids), so corpora larger than memory stay memory-mapped and
``Dataset.map(num_proc=...)`` parallelizes.

Two vocabularies are built from the training documents (Lau et al. 2017, used by every paper):

* the LM vocabulary: words with frequency >= ``min_freq`` plus ``<pad> <unk> <bos> <eos>``;
* the topic vocabulary: LM words minus a stop list, minus the top 0.1 % most frequent words,
  minus non-alphabetic tokens, optionally minus words in fewer than ``min_doc_freq`` documents.

Both are ``tokenizers`` WordLevel models wrapped in :class:`PreTrainedTokenizerFast`; the topic
tokenizer is saved to a ``topic_tokenizer/`` subfolder next to the model. Both split raw text with
the rule of :func:`tokenize_text` (:data:`WORD_PATTERN`, kept in their ``tokenizer.json``), so
``tok("The Senate, on Monday,")`` gives ``<bos> the senate , on monday ,``, and text already
tokenized like the corpora splits exactly at its spaces.

Streams (``datasets.IterableDataset``, or ``load_documents(path, streaming=True)``) are read lazily.

The package ships its data (``resources/``, see its ``NOTICE.md``): MALLET's English stop list, the default of
:func:`build_vocabularies`, and ``wikipedia-sample``, a small corpus of English Wikipedia articles that
:func:`load_documents` reads by name (:data:`EMBEDDED_CORPORA`). The full corpora of the benchmarks are wherever the
user put them: :func:`data_dir` is ``$TOPIC_LM_DATA``.
"""

from __future__ import annotations

import bisect
import codecs
import functools
import gzip
import hashlib
import json
import logging
import math
import os
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence

import datasets
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from .models.modeling_conditioning import TOPIC_TOKENIZER_SUBFOLDER, load_topic_tokenizer
from .protocols import describe_protocols

logger = logging.getLogger(__name__)

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<eos>"
SPECIAL_TOKENS = (PAD, UNK, BOS, EOS)  # ids 0, 1, 2, 3 in every LM vocabulary built here

RESOURCES = Path(__file__).resolve().parent / "resources"  # the package data (NOTICE.md: sources and licences)
MALLET_STOPWORDS = RESOURCES / "mallet_en.txt"
# The corpora that ship with the package, by name (scripts/make_wikipedia_sample.py wrote them; CC BY-SA 3.0,
# resources/wikipedia_sample/ATTRIBUTION.md): 1,000 English Wikipedia articles cut at about 500 tokens, 900 for
# training and 100 for validation, and an NPMI reference of 600 other articles. "wikipedia-sample" is its train split.
EMBEDDED_CORPORA = {
    "wikipedia-sample": RESOURCES / "wikipedia_sample" / "train.txt.gz",
    "wikipedia-sample/validation": RESOURCES / "wikipedia_sample" / "validation.txt.gz",
    "wikipedia-sample/npmi-reference": RESOURCES / "wikipedia_sample" / "npmi_reference.txt.gz",
}


def corpus_path(source: str | os.PathLike) -> Path:
    """The file of a corpus: an embedded corpus's (a name of :data:`EMBEDDED_CORPORA`), else ``source`` as a path."""
    if isinstance(source, str) and source in EMBEDDED_CORPORA:
        return EMBEDDED_CORPORA[source]
    return Path(source)


def data_dir(*parts: str, required: bool = True) -> Optional[Path]:
    """``$TOPIC_LM_DATA/<parts>``: the full corpora (APNEWS, Wikipedia, WSD sets, ...), where the user put them (the
    README lists them). When ``TOPIC_LM_DATA`` is unset or lacks them: a one-line ``FileNotFoundError`` naming it, or
    ``None`` with ``required=False``."""
    root = os.environ.get("TOPIC_LM_DATA")
    if not required:
        path = Path(root).joinpath(*parts) if root else None
        return path if path is not None and path.exists() else None
    if not root:
        raise FileNotFoundError(f"{'/'.join(parts) or 'the corpora'} not found: set TOPIC_LM_DATA to the folder "
                                f"where you put the corpora (README: Corpora)")
    path = Path(root).joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: TOPIC_LM_DATA={root} should be the folder where you put the "
                                f"corpora (README: Corpora)")
    return path


# ----------------------------------------------------------------------------------------------
# documents
# ----------------------------------------------------------------------------------------------


# How raw text becomes word tokens. One definition serves both tokenize_text (Python's ``regex``,
# hence load_documents and make_bow) and the tokenizers' normalizer / pre-tokenizer (Oniguruma), so
# that ``tok(text)`` and ``load_documents`` agree, and a tokenizer saved with a model keeps the rules
# without this package. The rules are those of the Lau et al. corpora (PTB-like): every APNEWS
# token stays one token, so already-tokenized text tokenizes as a plain split on spaces.

# Text replacements, in order (the tokenizer's normalizer applies them, then lower-cases).
_TEXT_REPLACEMENTS = (
    (r"(?<=\p{Ll}[.!?])(?=\p{Lu})", " "),  # "the end.The next" -> "the end. The next" (a missing space)
    (r"(?i)<\s*br\s*/?\s*>", "\n"),  # HTML line breaks (IMDB's <br />)
    (r"&amp;", "&"), (r"&quot;", '"'), (r"&lt;", "<"), (r"&gt;", ">"), (r"&#0?39;", "'"), (r"&apos;", "'"),
    (r"&nbsp;", " "),  # the HTML entities that occur in the corpora
    ("\u2019", "'"),  # the typographic apostrophe: it’s -> it's
)

# Words that keep their final period, with single letters (initials, initialisms: "w." "u.s." "a.m.").
_ABBREVIATIONS = """
mr mrs ms messrs dr prof rev msgr sr jr st ste mt ft gen lt col maj capt cmdr adm brig sgt cpl pfc spc pvt
sen sens rep reps gov govs pres supt insp atty
jan feb mar apr jun jul aug sep sept oct nov dec
inc corp co cos ltd llc plc bros assn dept univ
ala ariz ark calif colo conn fla ga kan kans ky md mich minn mont neb nev okla penn tenn tex va vt wis wyo que ont
vs etc approx ave blvd hwy fig figs vol vols pp cf
""".split()
# Abbreviations that are also English words keep their period only after ", " or "-" ("springfield, ill."
# "d-ind.") or before a number ("no. 1"), so that "i felt ill." ends with "ill" ".".
_AMBIGUOUS_ABBREVIATIONS = "ill wash miss mass mo pa ind del ore la no".split()


def _word_pattern() -> str:
    """The pre-tokenizer's regular expression, for lower-cased text (alternatives are tried in order)."""
    alnum = r"[\p{L}\p{M}\p{N}]"
    not_alnum = r"(?![\p{L}\p{M}\p{N}])"
    clitic = r"(?:s|re|ve|ll|m|d)"
    # What may join two runs of letters/digits inside one token: 40-year-old bit.ly and/or at&t o'brien 1,000 9:30
    joiner = rf"(?:\.-|-|\.|/|&|@|_|\?|!|'(?!{clitic}{not_alnum})|(?<=\p{{N}})[,:](?=\p{{N}}))"
    abbreviations = "|".join(sorted(_ABBREVIATIONS, key=len, reverse=True))
    ambiguous = "|".join(sorted(_AMBIGUOUS_ABBREVIATIONS, key=len, reverse=True))
    period = r"\.(?![\p{L}\p{M}\p{N}]|\.\.)"  # a final period (not the first of "...")
    last_run = "|".join([
        rf"\p{{L}}{period}",  # an initial, or the last letter of an initialism: w. u.s. a.m.
        # gov. jan. d-calif. wyo.-based w.va. (but not healthcare.gov.)
        rf"(?=\p{{L}}{{2,7}}\.)(?<![\p{{L}}\p{{N}}]{{2}}\.)(?:{abbreviations}){period}",
        rf"(?:(?<=,\s)|(?<=-))(?:{ambiguous}){period}|(?:{ambiguous})\.(?=\s+\p{{N}})",
        rf"{alnum}+(?:"
        r"\.(?=\s+[.,;:!?](?!\S))"  # a period followed by the text's own punctuation: "st. cloud. ,"
        r"|(?<=\p{L})\$(?!\S)"  # currency prefixes: us$ au$
        r"|@[^\s\p{L}\p{M}\p{N}]?(?!\S)"  # markup artifacts: file@: energy@?
        r")?",
    ])
    word = rf"(?:(?<!\S)[-.,](?=\p{{N}})|(?<!\S)@(?=\p{{L}}))?(?:{alnum}+{joiner})*(?:{last_run})"
    return "|".join([
        r"(?<!\S)[^\s\p{L}\p{M}\p{N}]+(?!\S)",  # punctuation standing alone: -- ... '' $ ?!
        r"(?:https?://|www\.)\S*[\p{L}\p{N}/]",  # URLs
        rf"{alnum}[\p{{L}}\p{{M}}\p{{N}}._%+-]*@[\p{{L}}\p{{N}}-]+(?:\.[\p{{L}}\p{{N}}-]+)+",  # e-mail addresses
        rf"'(?:{clitic}|em|n'|\p{{N}}\p{{N}}s?){not_alnum}",  # it|'s we|'re, 'em, rock 'n' roll, the '90s
        rf"n't{not_alnum}|\p{{L}}+(?=n't{not_alnum})",  # do|n't ca|n't
        word,  # words and numbers: -18 .38 7.5 1,000 e-mail u.s. gov.
        r"\.{2,}|-{2,}|!{2,}|\?{2,}|'{2,}|`{2,}",  # runs of one mark: ... -- !!
        r"\S",  # any other character on its own: , ; : ( ) " ' $
    ])


WORD_PATTERN = _word_pattern()


@functools.lru_cache(maxsize=None)
def _compiled_text_rules():
    import regex

    # Case-insensitive: Python splits the original text (the tokenizer splits it lower-cased).
    return ([(regex.compile(p), r) for p, r in _TEXT_REPLACEMENTS], regex.compile(WORD_PATTERN, regex.IGNORECASE))


def normalize_text(text: str) -> str:
    """The text replacements of the tokenizers' normalizer (before lower-casing), in Python."""
    replacements, _ = _compiled_text_rules()
    for pattern, replacement in replacements:
        text = pattern.sub(lambda _m, r=replacement: r, text)
    return text


def word_tokens(text: str, lowercase: bool = True) -> list[str]:
    """Raw text -> word tokens, as the LM and topic tokenizers' pre-tokenizer splits it."""
    _, words = _compiled_text_rules()
    text = normalize_text(text or "")
    return [m.group().lower() if lowercase else m.group() for m in words.finditer(text)]


def tokenize_text(text: str, lowercase: bool = True) -> list[list[str]]:
    """Split raw text into sentences of word tokens.

    Words are split by :data:`WORD_PATTERN`, the rule the tokenizers built by
    :func:`build_vocabularies` apply (so ``tok(text)`` sees the same words): lower-cased,
    punctuation split from words ("monday ,"), clitics split as in the Lau et al. corpora
    ("it 's", "do n't"), while hyphenated words, numbers, URLs and abbreviations stay whole
    ("40-year-old", "1,000", "u.s.", "gov."). HTML line breaks (IMDB's ``<br />``) and common
    entities are removed first. Sentences are split by ``syntok`` (rule-based, pure Python, no
    model download), which knows abbreviations ("Mr.", "U.S.").
    """
    import syntok.segmenter as segmenter

    _, words = _compiled_text_rules()
    text = normalize_text(text or "")
    tokens = [(m.start(), m.group().lower() if lowercase else m.group()) for m in words.finditer(text)]
    if not tokens:
        return []
    starts = [next(t.offset for t in sentence if t.value)
              for paragraph in segmenter.analyze(text) for sentence in paragraph if any(t.value for t in sentence)]
    sentences: list[list[str]] = []
    current = None
    for offset, token in tokens:
        index = max(bisect.bisect_right(starts, offset) - 1, 0)
        if index != current:
            sentences.append([])
            current = index
        sentences[-1].append(token)
    return sentences


def _split_lau_line(line: str) -> list[list[str]]:
    return [s.split() for s in line.split("\t") if s.strip()]


def dataset_columns(ds: datasets.Dataset | datasets.IterableDataset) -> list[str]:
    """The column names of a dataset or stream (a stream of unknown features is peeked at: its first row)."""
    if ds.column_names is not None:
        return list(ds.column_names)
    first = next(iter(ds), None)
    return list(first) if first is not None else []


def check_sentences(ds, source: str = "the documents", rows: int = 16) -> None:
    """A ``ValueError`` unless the first ``rows`` documents' ``sentences`` are lists of token lists: a sentence given
    as a string would be read one character per token."""
    for i, doc in enumerate(ds):
        if i >= rows:
            break
        sentences = doc.get("sentences") if isinstance(doc, dict) else None
        if isinstance(sentences, str):
            where, value = f"row {i}'s sentences", sentences
        else:
            j = next((j for j, x in enumerate(sentences or ()) if isinstance(x, str)), None)
            if j is None:
                token = next(((j, t) for j, x in enumerate(sentences or ()) for t in x if not isinstance(t, str)), None)
                if token is not None:
                    raise ValueError(f"{source}: row {i}, sentence {token[0]} holds {token[1]!r} "
                                     f"({type(token[1]).__name__}), where tokens are strings: give the words, not ids")
                continue
            where, value = f"row {i}, sentence {j}", sentences[j]
        raise ValueError(f"{source}: {where} is a string ({value!r:.40}), where a list of tokens is expected (it "
                         "would be read one character per token): pass raw text as a text column (text_column= / "
                         "--text_column), or tokenize it first with tokenize_text")


def _drop_empty(ds, on_empty: str, source: str):
    if on_empty not in ("skip", "error", "keep"):
        raise ValueError(f"on_empty must be 'skip', 'error' or 'keep', got {on_empty!r}")
    if on_empty == "keep":
        return ds
    if isinstance(ds, datasets.IterableDataset):
        # A stream is checked as it is read: each empty document is logged (or raises) when reached.
        def keep(example, index):
            if any(len(s) for s in example["sentences"]):
                return True
            if on_empty == "error":
                raise ValueError(f"Empty document in {source} (row index {index}). Remove it or pass "
                                 "on_empty='skip'.")
            logger.warning("Skipping an empty document in %s (row index %d)", source, index)
            return False

        return ds.filter(keep, with_indices=True)
    n_tokens = ds.map(lambda b: {"_n": [sum(len(s) for s in d) for d in b["sentences"]]},
                      batched=True, desc="counting tokens")["_n"]
    empty = [i for i, n in enumerate(n_tokens) if n == 0]
    if not empty:
        return ds
    if on_empty == "error":
        raise ValueError(
            f"{len(empty)} empty document(s) in {source} (row indices {empty[:10]}...). "
            "Remove them or pass on_empty='skip'.")
    logger.warning("Skipping %d empty document(s) in %s (row indices %s)", len(empty), source, empty[:10])
    keep = sorted(set(range(len(ds))) - set(empty))
    return ds.select(keep)


def check_text_file(path: str | os.PathLike, whole: bool = True) -> None:
    """Raise ``ValueError`` naming ``path`` when it is empty or not UTF-8 (with the byte position and
    line of the first bad byte; in the decompressed text for ``.gz``). ``whole=False`` only checks
    that it is not empty (streams: their bytes are checked as they are read)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    decoder = codecs.getincrementaldecoder("utf-8")()
    position = lines = 0
    has_text = False
    with opener(path, "rb") as f:
        while True:
            block = f.read(1 << 20)
            if not block:
                break
            pending = len(decoder.getstate()[0])  # bytes of a character cut by the previous block
            try:
                decoder.decode(block)
            except UnicodeDecodeError as error:
                at = position - pending + error.start
                data = decoder.getstate()[0] + block
                line = lines + data[:error.start].count(b"\n") + 1
                where = " of the decompressed text" if path.suffix == ".gz" else ""
                raise ValueError(f"{path} is not UTF-8 text: byte 0x{data[error.start]:02x} at byte position {at}"
                                 f"{where} (line {line}) cannot be decoded ({error.reason}). Convert the file "
                                 "to UTF-8.") from None
            has_text = has_text or bool(block.strip())
            position += len(block)
            lines += block.count(b"\n")
            if not whole and has_text:
                return
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError as error:
        raise ValueError(f"{path} is not UTF-8 text: it ends inside a character (byte position "
                         f"{position - len(error.object) + error.start}). Convert the file to UTF-8.") from None
    if not has_text:
        raise ValueError(f"{path} is empty: it holds no document")


def _check_stream_bytes(ds: datasets.IterableDataset, path: Path) -> datasets.IterableDataset:
    """The stream ``ds`` read from ``path``, whose decoding errors name the file and the byte position."""
    def rows():
        try:
            yield from ds
        except UnicodeDecodeError:
            check_text_file(path)  # raises the error with the position
            raise

    return datasets.IterableDataset.from_generator(rows, features=ds.features)


def _text(value, column: str, source: str, row: int) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""  # a missing text is an empty document
    raise ValueError(f"Column {column!r} of {source} must hold text, but row {row} holds the "
                     f"{type(value).__name__} {value!r:.60}: pass text_column= the column with the raw text")


_SENTENCES_FEATURE = {"sentences": datasets.Sequence(datasets.Sequence(datasets.Value("string")))}
STREAM_BATCH_SIZE = 64  # documents per batch when a stream is mapped (a Dataset uses datasets' default, 1000)


def load_documents(
    source: str | os.PathLike | datasets.Dataset | datasets.IterableDataset,
    text_column: str | None = None,
    format: str | None = None,
    lowercase: bool = True,
    on_empty: str = "skip",
    num_proc: int | None = None,
    max_documents: int | None = None,
    streaming: bool = False,
) -> datasets.Dataset | datasets.IterableDataset:
    """Load a corpus as a ``datasets.Dataset`` of documents (column ``sentences``).

    Args:
        source: a path, the name of a corpus that ships with the package (:data:`EMBEDDED_CORPORA`:
            ``"wikipedia-sample"``, its train split, and ``"wikipedia-sample/validation"``), a
            ``datasets.Dataset`` or a ``datasets.IterableDataset``. Paths ending in ``.txt`` (or
            ``.txt.gz``) are read in the Lau et al. format (one document per line, sentences separated
            by TAB, tokens by spaces, already tokenized and lower-cased). ``.json``/``.jsonl``
            (optionally ``.gz``) and ``.parquet`` files, and datasets, need ``text_column``: raw
            text that is sentence-split and tokenized with :func:`tokenize_text`.
        text_column: the raw-text column; required for anything but the Lau format.
        format: force ``"lau"``, ``"json"`` or ``"parquet"`` instead of guessing from the suffix;
            a dataset with ``format="lau"`` holds Lau et al. lines in its ``text`` column.
        lowercase: lower-case raw text (the Lau format is already lower-case).
        on_empty: documents with no token: ``"skip"`` (logged with their row indices),
            ``"error"`` (raise) or ``"keep"``.
        num_proc: processes for ``Dataset.map``.
        max_documents: keep only the first N documents (quick experiments).
        streaming: read a path as a stream (``datasets.load_dataset(..., streaming=True)``).

    A stream (an ``IterableDataset`` given, or ``streaming=True``) gives an ``IterableDataset``:
    nothing is read until it is iterated, documents are tokenized as they are read (in batches of
    :data:`STREAM_BATCH_SIZE`), and empty documents are skipped (logged) or raise when reached. It
    is never loaded as a whole: pass it to :meth:`TopicContextCollator.prepare` and train with
    ``max_steps``.
    """
    if isinstance(source, (datasets.Dataset, datasets.IterableDataset)):
        ds, name = source, "the given dataset"
        if format not in (None, "lau"):
            raise ValueError(f"A dataset is read as raw text (text_column=) or, with format='lau', as Lau et al. "
                             f"lines in its 'text' column; got format={format!r}")
        format = format or "dataset"
        if format == "lau" and "text" not in dataset_columns(ds):
            raise ValueError(f"format='lau' reads the 'text' column, which {name} lacks (columns: {dataset_columns(ds)})")
    else:
        path = corpus_path(source)
        if not path.exists():
            raise FileNotFoundError(f"No corpus at {path}")
        if path.is_dir():
            raise IsADirectoryError(f"{path} is a folder: give one corpus file in it (a Lau .txt, .jsonl[.gz] or "
                                    ".parquet file)")
        name = str(path)
        suffixes = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
        if format is None:
            format = {".txt": "lau", ".txt.gz": "lau", ".json": "json", ".jsonl": "json", ".json.gz": "json",
                      ".jsonl.gz": "json", ".parquet": "parquet"}.get(suffixes)
            if format is None:
                raise ValueError(f"Cannot tell the format of {path} from its suffix {suffixes or '(none)'}: a corpus "
                                 f"is a Lau .txt[.gz], JSON lines (.jsonl[.gz], .json[.gz], with --text_column) or "
                                 f".parquet file (in Python, load_documents(..., format='lau'|'json'|'parquet') "
                                 f"reads another name)")
        if format not in ("lau", "json", "parquet"):
            raise ValueError(f"Unknown format {format!r}")
        if format != "parquet":  # text files: not empty, and UTF-8 (a stream's bytes are checked as read)
            check_text_file(path, whole=not streaming)
        # utf-8-sig: a byte-order mark (Windows editors write one) is not part of the first word
        ds = datasets.load_dataset("text" if format == "lau" else format, data_files=str(path), split="train",
                                   streaming=streaming, **({"encoding": "utf-8-sig"} if format == "lau" else {}))
        if streaming and format != "parquet":
            ds = _check_stream_bytes(ds, path)
        elif not streaming and len(ds) == 0:
            raise ValueError(f"{path} is empty: it holds no document")
    stream = isinstance(ds, datasets.IterableDataset)
    if max_documents is not None:
        from .models.configuration_common import check_integers

        check_integers(1, max_documents=max_documents)  # 0 or -1 selected nothing and failed later, unclearly
        ds = ds.take(max_documents) if stream else ds.select(range(min(max_documents, len(ds))))
    # A stream is mapped lazily (no processes, no progress bar); its output features are declared.
    map_kwargs = {"batch_size": STREAM_BATCH_SIZE} if stream else {"num_proc": num_proc}

    if format == "lau":
        if stream:
            map_kwargs["features"] = datasets.Features(_SENTENCES_FEATURE)
        else:
            map_kwargs["desc"] = "splitting documents"
        ds = ds.map(lambda b: {"sentences": [_split_lau_line(x) for x in b["text"]]},
                    batched=True, remove_columns=["text"], **map_kwargs)
    else:
        columns = dataset_columns(ds)
        if "sentences" in columns and text_column is None:
            check_sentences(ds, name)
            return _drop_empty(ds, on_empty, name)
        if text_column is None:
            raise ValueError(f"{name} is not in the Lau format: pass text_column= (columns: {columns})")
        if text_column not in columns:
            raise ValueError(f"No column {text_column!r} in {name} (columns: {columns})")
        feature = ds.features[text_column] if ds.features is not None else None
        if feature is not None and not (isinstance(feature, datasets.Value)
                                        and feature.dtype in ("string", "large_string")):
            raise ValueError(f"Column {text_column!r} of {name} must hold text, but it holds {feature}: pass "
                             f"text_column= the column with the raw text (columns: {columns})")
        if stream:
            if ds.features is not None:
                map_kwargs["features"] = datasets.Features({**ds.features, **_SENTENCES_FEATURE})
        else:
            map_kwargs["desc"] = "tokenizing documents"
        ds = ds.map(lambda b, rows: {"sentences": [tokenize_text(_text(x, text_column, name, row), lowercase)
                                                   for x, row in zip(b[text_column], rows)]},
                    batched=True, with_indices=True, **map_kwargs)
    return _drop_empty(ds, on_empty, name)


def documents_from_lists(documents: Sequence[Sequence[Sequence[str]]], **columns) -> datasets.Dataset:
    """A documents dataset from Python lists (tests, small experiments): each document a list of sentences, each a
    list of tokens. A string where a list is expected is refused (it would be read one character per sentence or
    token); raw text is tokenized with :func:`tokenize_text` first."""
    where = "documents" if isinstance(documents, str) else next(
        (f"documents[{i}]" + (f"[{j}]" if j is not None else "") for i, d in enumerate(documents)
         for j in ([None] if isinstance(d, str) else [j for j, s in enumerate(d) if isinstance(s, str)][:1])), None)
    if where is not None:
        raise ValueError(f"{where} is a string, where a list is expected: documents are lists of sentences, each a "
                         f"list of tokens; tokenize raw text first, e.g. [tokenize_text(text) for text in texts]")
    return datasets.Dataset.from_dict({"sentences": [[list(s) for s in d] for d in documents], **columns})


# ----------------------------------------------------------------------------------------------
# vocabularies
# ----------------------------------------------------------------------------------------------


def read_stopwords(stopwords: str | os.PathLike | Iterable[str] | None = "mallet") -> frozenset[str]:
    """``"mallet"``: MALLET's English stop list (523 words, shipped with the package: :data:`MALLET_STOPWORDS`),
    the list Lau et al. 2017 and every later paper build the topic vocabulary with; ``None`` or ``"none"``: no stop
    list; a path to a file with one word per line; or an iterable of words."""
    if stopwords is None or (isinstance(stopwords, str) and stopwords == "none"):
        return frozenset()
    if isinstance(stopwords, str) and stopwords == "mallet":
        stopwords = MALLET_STOPWORDS
    if isinstance(stopwords, (str, os.PathLike)):
        path = Path(stopwords)
        if not path.exists():
            raise FileNotFoundError(f"Stop list {path} does not exist")
        return frozenset(w.strip().lower() for w in path.read_text(encoding="utf-8").splitlines() if w.strip())
    return frozenset(w.lower() for w in stopwords)


# Tokens written without a space before them when decoding: closing punctuation and clitics.
_ATTACHED_TOKENS = r"[.,;:!?)\]}%]|\.\.\.|n't|'(?:s|re|ve|ll|m|d)"


def _word_level_tokenizer(words: Sequence[str], add_bos: bool) -> PreTrainedTokenizerFast:
    """A WordLevel tokenizer over ``words`` that splits raw text like :func:`tokenize_text`.

    * normalizer: the replacements of :data:`_TEXT_REPLACEMENTS` (HTML breaks and entities, a
      missing space after a sentence, the typographic apostrophe), then lower-casing;
    * pre-tokenizer: :data:`WORD_PATTERN` (punctuation and clitics split off, abbreviations,
      numbers and hyphenated words kept), so text that is already tokenized like the corpora, one
      token between spaces, splits exactly at its spaces;
    * decoder: a space before every token except closing punctuation and clitics, so that a
      decoded continuation reads "police said the senate, on monday." and joins its prompt (the
      text-generation pipeline appends it to the prompt text; like GPT-2's tokens it starts with
      a space; ``.strip()`` a decoded whole text if needed). Every token decodes on its own the
      same way, which ``generate(stop_strings=...)`` relies on.
    """
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.normalizer = normalizers.Sequence(
        [normalizers.Replace(Regex(p), r) for p, r in _TEXT_REPLACEMENTS] + [normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(WORD_PATTERN), behavior="isolated"),
                                                 pre_tokenizers.WhitespaceSplit()])
    tok.decoder = decoders.Replace(Regex(f"^(?!(?:{_ATTACHED_TOKENS})$)"), " ")
    if add_bos:
        # A prompt starts like a training sentence, with <bos>; <eos> is never added to prompts.
        tok.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])])
        return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, unk_token=UNK, bos_token=BOS,
                                       eos_token=EOS, model_max_length=100_000)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=UNK, model_max_length=100_000)


def build_vocabularies(
    documents: datasets.Dataset | datasets.IterableDataset | Sequence[Sequence[Sequence[str]]],
    min_freq: int = 10,
    stopwords: str | os.PathLike | Iterable[str] | None = "mallet",
    top_fraction: float = 0.001,
    min_doc_freq: int = 0,
    max_vocab_size: int | None = None,
) -> tuple[PreTrainedTokenizerFast, PreTrainedTokenizerFast]:
    """Build the LM tokenizer and the topic tokenizer from training documents.

    LM vocabulary: ``<pad> <unk> <bos> <eos>`` (ids 0-3), then words with frequency >= min_freq,
    most frequent first (ties alphabetical), at most ``max_vocab_size`` words.

    Topic vocabulary: ``<unk>`` at id 0 (never counted in a bag of words, so ``len(topic_tok)``
    is the bag-of-words width), then the LM words that are alphabetic, not in the stop list, not
    among the ``top_fraction`` most frequent LM words and in at least ``min_doc_freq`` documents.
    ``stopwords``: see :func:`read_stopwords` (default: MALLET's list, as in the papers).
    """
    if min_freq < 1:
        raise ValueError(f"min_freq must be >= 1, got {min_freq}")
    stop = read_stopwords(stopwords)
    freq: Counter = Counter()
    doc_freq: Counter = Counter()
    if isinstance(documents, datasets.Dataset):
        sentences_iter = documents["sentences"]
    elif isinstance(documents, datasets.IterableDataset):  # one pass over a stream
        sentences_iter = (row["sentences"] for row in documents)
    else:
        sentences_iter = documents
    n_docs = 0
    for doc in sentences_iter:
        n_docs += 1
        words = [w for s in doc for w in s]
        freq.update(words)
        doc_freq.update(set(words))
    if n_docs == 0 or not freq:
        raise ValueError("Cannot build vocabularies from an empty corpus")
    lm_words = sorted((w for w, c in freq.items() if c >= min_freq and w not in SPECIAL_TOKENS),
                      key=lambda w: (-freq[w], w))
    if max_vocab_size is not None:
        lm_words = lm_words[:max_vocab_size]
    if not lm_words:
        raise ValueError(f"No word occurs at least min_freq={min_freq} times (--min_freq of topic-lm train): "
                         "lower it, or give more text")
    n_top = int(math.ceil(top_fraction * len(lm_words))) if top_fraction > 0 else 0
    top = set(lm_words[:n_top])
    topic_words = [w for w in lm_words
                   if w.isalpha() and w not in stop and w not in top and doc_freq[w] >= min_doc_freq]
    if not topic_words:
        raise ValueError("The topic vocabulary is empty: every word was a stop word, too frequent, "
                         "non-alphabetic or too rare")
    tok = _word_level_tokenizer(list(SPECIAL_TOKENS) + lm_words, add_bos=True)
    topic_tok = _word_level_tokenizer([UNK] + sorted(topic_words), add_bos=False)
    logger.info("LM vocabulary %d words, topic vocabulary %d words (%d stop words, %d top words removed)",
                len(tok), len(topic_tok) - 1, len(stop), n_top)
    return tok, topic_tok


def save_vocabularies(tokenizer, topic_tokenizer, directory: str | os.PathLike) -> None:
    """Save the LM tokenizer to ``directory`` and the topic tokenizer (if not None) to ``directory/topic_tokenizer``."""
    tokenizer.save_pretrained(directory)
    if topic_tokenizer is not None:
        topic_tokenizer.save_pretrained(os.path.join(directory, TOPIC_TOKENIZER_SUBFOLDER))


def load_vocabularies(name_or_path: str | os.PathLike, **kwargs):
    """Load ``(tokenizer, topic_tokenizer)`` saved by :func:`save_vocabularies` (local folder or Hub id).

    A local folder without them is an ``OSError`` that says which one is missing."""
    if os.path.isdir(name_or_path) and not os.path.isfile(os.path.join(name_or_path, "tokenizer.json")):
        raise OSError(f"{name_or_path} has no LM tokenizer (no tokenizer.json in it): save one there with "
                      "topic_lm_hf.save_vocabularies(tokenizer, topic_tokenizer, folder)")
    tok = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    return tok, load_topic_tokenizer(name_or_path, **kwargs)


def vocabulary_hash(tokenizer) -> str:
    """A fingerprint of a tokenizer's vocabulary (every token and its id): 16 hex digits of SHA-256.

    Two vocabularies of the same size from different corpora (or the same words in another order)
    get different hashes, so a model config can tell its own tokenizers from look-alikes."""
    entries = sorted(tokenizer.get_vocab().items(), key=lambda item: (item[1], item[0]))
    return hashlib.sha256(json.dumps(entries, ensure_ascii=False).encode("utf-8")).hexdigest()[:16]


def record_vocabularies(config, tokenizer, topic_tokenizer=None) -> None:
    """Store :func:`vocabulary_hash` of the tokenizers in a model config (``vocab_hash``, and
    ``topic_vocab_hash`` for models with a topic vocabulary), for :func:`check_vocabularies`.
    :class:`~topic_lm_hf.TopicLMTrainer` does this with its collator's tokenizers."""
    check_vocabularies(tokenizer, topic_tokenizer, config)
    config.vocab_hash = vocabulary_hash(tokenizer)
    if topic_tokenizer is not None and getattr(config, "topic_vocab_size", None) is not None:
        config.topic_vocab_hash = vocabulary_hash(topic_tokenizer)


def check_vocabularies(tokenizer, topic_tokenizer=None, config=None) -> None:
    """Raise ``ValueError`` when tokenizers and a model config do not belong together.

    Sizes are always compared; contents too when the config records their hashes
    (:func:`record_vocabularies`; configs saved before the hashes existed get the size check only)."""
    vocab = tokenizer.get_vocab()
    for name in SPECIAL_TOKENS:
        if name not in vocab:
            raise ValueError(f"The LM tokenizer lacks the special token {name!r}")
    if topic_tokenizer is not None:
        missing = [w for w in topic_tokenizer.get_vocab() if w != UNK and w not in vocab]
        if missing:
            raise ValueError(f"{len(missing)} topic words are not in the LM vocabulary (e.g. {missing[:5]}): "
                             "the two tokenizers come from different corpora")
    if config is not None:
        if getattr(config, "vocab_size", None) is not None and config.vocab_size != len(tokenizer):
            raise ValueError(f"The model's vocab_size is {config.vocab_size} but the tokenizer has "
                             f"{len(tokenizer)} tokens: mismatched vocabularies")
        tvs = getattr(config, "topic_vocab_size", None)
        if tvs is not None and topic_tokenizer is not None and tvs != len(topic_tokenizer):
            raise ValueError(f"The model's topic_vocab_size is {tvs} but the topic tokenizer has "
                             f"{len(topic_tokenizer)} entries: mismatched vocabularies")
        for name, key, tok in (("LM tokenizer", "vocab_hash", tokenizer),
                               ("topic tokenizer", "topic_vocab_hash", topic_tokenizer)):
            expected = getattr(config, key, None)
            if expected is not None and tok is not None and vocabulary_hash(tok) != expected:
                raise ValueError(f"The {name} is not the one the model was trained with: its vocabulary hash is "
                                 f"{vocabulary_hash(tok)} but the model's config records {key}={expected} (same "
                                 "size, other words or ids): mismatched vocabularies. Use the tokenizers saved "
                                 "with the model.")


# ----------------------------------------------------------------------------------------------
# synthetic corpus (the main job's fallback when no corpus is available)
# ----------------------------------------------------------------------------------------------

_SYNTHETIC_TOPICS = {
    "politics": "senate vote bill president congress election campaign governor law policy".split(),
    "sports": "game team season coach player score win league championship fans".split(),
    "business": "company market shares profit investors bank prices stock sales economy".split(),
    "crime": "police court judge prison charges trial officers arrested jury attorney".split(),
    "weather": "storm rain snow winds flooding forecast temperatures hurricane coast damage".split(),
    "health": "hospital doctors patients disease vaccine health virus treatment study care".split(),
}
_SYNTHETIC_FRAMES = [
    "the {a} said the {b} was {c} .", "officials say the {a} and the {b} will {c} .",
    "a {a} in the {b} is expected to {c} on monday .", "the {a} has been {c} by the {b} .",
    "he said that the {a} is {c} for the {b} .", "it was the {a} that made the {b} {c} .",
]
_SYNTHETIC_FILLERS = "important new bigger different expected reported growing".split()


def synthetic_documents(n_documents: int = 400, seed: int = 0, min_sentences: int = 3,
                        max_sentences: int = 8) -> datasets.Dataset:
    """A small synthetic corpus with known topics (labelled SYNTHETIC wherever it is used).

    Each document draws one or two topics; every sentence fills a frame with words of those
    topics, so a topic model can find the six topics and an LM can learn the frames. Column
    ``topic`` holds the main topic of each document.
    """
    rng = random.Random(seed)
    names = sorted(_SYNTHETIC_TOPICS)
    docs, labels = [], []
    for _ in range(n_documents):
        doc_topics = rng.sample(names, rng.choice((1, 2)))
        sentences = []
        for _ in range(rng.randint(min_sentences, max_sentences)):
            words = _SYNTHETIC_TOPICS[rng.choice(doc_topics)]
            frame = rng.choice(_SYNTHETIC_FRAMES)
            sentences.append(frame.format(a=rng.choice(words), b=rng.choice(words),
                                          c=rng.choice(_SYNTHETIC_FILLERS + words)).split())
        docs.append(sentences)
        labels.append(doc_topics[0])
    return documents_from_lists(docs, topic=labels)


# ----------------------------------------------------------------------------------------------
# the corpora of `topic-lm train` and of the demo
# ----------------------------------------------------------------------------------------------

# Help texts of the data flags that several `topic-lm` subcommands share.
HELP = {
    "validation_file": "Validation corpus: a Lau et al. .txt file (one document per line, sentences separated by "
                       "TAB), or .jsonl / .jsonl.gz / .parquet raw text (with --text_column).",
    "text_column": "Raw-text column of JSON / Parquet corpora (then sentence-split and tokenized by syntok).",
    "max_sentence_length": "Predicted tokens per chunk: longer sentences are cut into chunks of this length.",
    "max_context_tokens": "Topic tokens kept in a context bag of words (the first N of the context, in document "
                          "order).",
    "max_eval_documents": "Use only the first N validation documents.",
    "protocols": f"Comma-separated perplexity protocols to report: {describe_protocols()}.",
    "empty_context": "Every context empty: a topic model reads the same uninformative topics for every document. "
                     "Trained (and stopped on its validation perplexity) this way, it is the matched topic-free "
                     "twin of the topic model trained alike: its architecture and training without the document's "
                     "topics, the baseline its topics are measured against; evaluate it the same way.",
}


@dataclass
class DataArguments:
    train_file: Optional[str] = field(default=None, metadata={
        "help": "Training corpus: a Lau et al. .txt[.gz] file, .jsonl / .jsonl.gz / .parquet raw text (with "
                "--text_column), or wikipedia-sample (the English Wikipedia sample that ships with the package). "
                "Default: wikipedia-sample."})
    validation_file: Optional[str] = field(default=None, metadata={
        "help": HELP["validation_file"] + " Default: wikipedia-sample/validation with the default training "
                "corpus, else 10%% of the training documents."})
    text_column: Optional[str] = field(default=None, metadata={"help": HELP["text_column"]})
    min_freq: int = field(default=10, metadata={"help": "LM vocabulary: minimum word frequency."})
    stopwords: str = field(default="mallet", metadata={
        "help": "Stop list removed from the topic vocabulary: 'mallet' (MALLET's 523-word English list that the "
                "papers use, shipped with the package), 'none', or a file with one word per line."})
    min_doc_freq: int = field(default=0, metadata={"help": "Topic vocabulary: minimum document frequency."})
    max_sentence_length: int = field(default=30, metadata={"help": HELP["max_sentence_length"]})
    max_context_tokens: int = field(default=300, metadata={"help": HELP["max_context_tokens"]})
    context: str = field(default="others", metadata={
        "help": "Training context of topic models: 'others' (the document minus the sentence, as in the papers), "
                "'preceding' (causal) or 'document'. Models without a context ignore it."})
    max_train_documents: Optional[int] = field(default=None, metadata={"help": "Use only the first N training documents."})
    max_eval_documents: Optional[int] = field(default=None, metadata={"help": HELP["max_eval_documents"]})
    synthetic: bool = field(default=False, metadata={"help": "Use the package's synthetic corpus (not real text)."})
    empty_context: bool = field(default=False, metadata={"help": HELP["empty_context"]})


def check_positive_flags(**flags) -> None:
    """Each given (not None) command-line value must be a positive integer: a ``ValueError`` naming its flag
    (``--max_eval_documents 0`` would select nothing, and fail later in another library's words)."""
    from .models.configuration_common import check_integers

    check_integers(1, **{f"--{name}": value for name, value in flags.items() if value is not None})


def load_corpora(data_args: DataArguments):
    """(train documents, validation documents, a label naming their source)."""
    check_positive_flags(max_train_documents=data_args.max_train_documents,
                         max_eval_documents=data_args.max_eval_documents)
    if data_args.synthetic:
        docs = synthetic_documents(600, seed=0)
        split = docs.train_test_split(test_size=0.15, seed=0)
        return split["train"], split["test"], "SYNTHETIC corpus generated by topic_lm_hf (not real text)"
    train_file = data_args.train_file or "wikipedia-sample"
    valid_file = data_args.validation_file
    if valid_file is None and data_args.train_file is None:
        valid_file = "wikipedia-sample/validation"
    kw = {"text_column": data_args.text_column}
    train = load_documents(train_file, max_documents=data_args.max_train_documents, **kw)
    if valid_file:
        valid = load_documents(valid_file, max_documents=data_args.max_eval_documents, **kw)
    else:
        split = train.train_test_split(test_size=0.1, seed=0)
        train, valid = split["train"], split["test"]
    return train, valid, f"{train_file} ({len(train)} docs) / {valid_file or '10% of train'} ({len(valid)} docs)"
