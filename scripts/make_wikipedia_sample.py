"""Carve the package's embedded corpus, ``wikipedia-sample``, out of a WikiExtractor dump of English Wikipedia.

The package ships a small real corpus so that ``topic-lm demo``, the quick start and the tests run on a fresh clone
with nothing beside it. This script writes it into ``src/topic_lm_hf/resources/wikipedia_sample/``:

* ``train.txt.gz`` / ``validation.txt.gz``: ``--train`` + ``--validation`` articles, each cut after the sentence that
  reaches ``--max-words`` tokens, in the Lau et al. format that :func:`topic_lm_hf.load_documents` reads (one
  document per line, sentences separated by a TAB, lower-cased tokens separated by a space), tokenized and
  sentence-split by the package's own :func:`topic_lm_hf.tokenize_text`;
* ``npmi_reference.txt.gz``: ``--reference`` OTHER articles (none of the sample's), in the same format, cut at
  ``--reference-max-words`` tokens: a reference corpus for NPMI that the topics were not trained on;
* ``ATTRIBUTION.md``: the source, the licence (CC BY-SA 3.0) and the title of every article used.

The selection is fixed: the articles with at least ``--min-words`` words, ordered by the SHA-1 of their Wikipedia
id; the first ``--train`` go to train, the next ``--validation`` to validation, the next ``--reference`` to the
NPMI reference. The same input gives byte-identical files (gzip without a timestamp).

    python scripts/make_wikipedia_sample.py --articles $TOPIC_LM_DATA/wiki/articles.jsonl.gz
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
from pathlib import Path

from topic_lm_hf.data import tokenize_text

OUT = Path(__file__).resolve().parents[1] / "src" / "topic_lm_hf" / "resources" / "wikipedia_sample"


def read_articles(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def lau_line(text: str, max_words: int) -> tuple[str, int]:
    """One article as a Lau et al. line: its sentences up to the one that reaches ``max_words`` tokens, and the
    number of tokens kept. Paragraphs are tokenized one at a time, and only as many as the cut needs."""
    sentences, words = [], 0
    for paragraph in text.split("\n"):
        for sentence in tokenize_text(paragraph):
            sentences.append(" ".join(sentence))
            words += len(sentence)
            if words >= max_words:
                return "\t".join(sentences), words
    return "\t".join(sentences), words


def write_gzip(path: Path, lines: list[str]) -> None:
    """gzip with mtime 0 and no file name in the header: the same lines give the same bytes."""
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as f:
        f.write("".join(line + "\n" for line in lines).encode("utf-8"))
    path.write_bytes(buffer.getvalue())


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--articles", type=Path, required=True, help="WikiExtractor JSON lines (id, title, text), .gz")
    p.add_argument("--train", type=int, default=900)
    p.add_argument("--validation", type=int, default=100)
    p.add_argument("--reference", type=int, default=600)
    p.add_argument("--min-words", type=int, default=600, help="articles shorter than this are not used")
    p.add_argument("--max-words", type=int, default=500, help="tokens kept per sample article (whole sentences)")
    p.add_argument("--reference-max-words", type=int, default=1500, help="tokens kept per reference article")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)

    articles = [a for a in read_articles(args.articles) if len(a["text"].split()) >= args.min_words]
    articles.sort(key=lambda a: hashlib.sha1(str(a["id"]).encode()).hexdigest())
    n_sample = args.train + args.validation
    if len(articles) < n_sample + args.reference:
        raise SystemExit(f"{args.articles} has {len(articles)} articles of >= {args.min_words} words; "
                         f"{n_sample + args.reference} are needed")
    parts = {"train": (articles[:args.train], args.max_words),
             "validation": (articles[args.train:n_sample], args.max_words),
             "npmi_reference": (articles[n_sample:n_sample + args.reference], args.reference_max_words)}

    args.out.mkdir(parents=True, exist_ok=True)
    summary = {}
    for name, (chosen, max_words) in parts.items():
        lines, tokens = zip(*(lau_line(a["text"], max_words) for a in chosen))
        write_gzip(args.out / f"{name}.txt.gz", list(lines))
        summary[name] = (len(chosen), sum(tokens))
        print(f"{name}: {len(chosen)} articles, {sum(tokens):,} tokens, "
              f"{(args.out / f'{name}.txt.gz').stat().st_size / 1e6:.2f} MB", flush=True)

    sections = []
    for name, (chosen, _) in parts.items():
        titles = "\n".join(f"- {a['title']} (id {a['id']})" for a in chosen)
        sections.append(f"## {name}.txt.gz: {summary[name][0]} articles, {summary[name][1]:,} tokens\n\n{titles}\n")
    (args.out / "ATTRIBUTION.md").write_text(
        "# wikipedia-sample: attribution and licence\n\n"
        "The files of this folder are text from English Wikipedia articles (a 2015 dump, extracted with "
        "WikiExtractor), written by Wikipedia's contributors. The article histories, with every author, are at "
        "`https://en.wikipedia.org/wiki/<title>` (`?action=history`).\n\n"
        "They are licensed under the Creative Commons Attribution-ShareAlike 3.0 Unported licence (CC BY-SA 3.0, "
        "https://creativecommons.org/licenses/by-sa/3.0/), as Wikipedia's text is. The changes made: each article "
        "is cut after a number of words, split into sentences, tokenized and lower-cased (by "
        "`scripts/make_wikipedia_sample.py` of this repository); tables, lists and markup had been removed by "
        "WikiExtractor. These files, changed as they are, are licensed under CC BY-SA 3.0 too; the rest of the "
        "package keeps its own licence.\n\n"
        f"Selection: the articles of at least {args.min_words} words, ordered by the SHA-1 of their Wikipedia id; "
        f"train and validation are cut at {args.max_words} tokens, the NPMI reference (disjoint from them) at "
        f"{args.reference_max_words}.\n\n" + "\n".join(sections), encoding="utf-8")


if __name__ == "__main__":
    main()
