"""Word sense disambiguation with document topics (NCLM paper §4.5, ``docs/nclm.md`` §5): one table.

F1 (the framework scorer's semantics, ``topic_lm_hf.tasks.score_wsd``) on SemEval-2007 (the
development set: the only set any choice is made on), Senseval-2, Senseval-3 and SE2+SE3 (the two
test sets' instances together, 4,132; *not* the published "ALL", which also holds SE07, SE13 and SE15):

* WN first sense and SemCor MFS (computed here; the published SemCor-MFS beside them);
* the BiLSTM sense tagger without topics (the paper's BiLSTM-LM baseline);
* the same tagger + each available topic representation c, from frozen topic models trained on
  APNEWS by ``scripts/benchmark_nclm.py`` (NCLM LTA / ETA / LETA: c = h, z or [z; h]) and
  ``scripts/benchmark_steering.py`` (TCNLM: its topic proportions t);
* every tagger in both output modes, labelled: ``candidates`` (argmax among the lemma's trained candidate
  senses, WordNet first sense for lemmas unseen in training) and ``all senses`` (the paper, literally).

Each tagger is trained on all of SemCor with ``Trainer`` (Adam, lr 1e-3, batch 32: the paper's), for
``--epochs`` epochs; after every epoch it is scored on SE07 and the epoch with the best SE07 F1 in the
candidates mode is kept (both modes are reported for that epoch). The topic models are frozen; c is
computed once per document from the document's whole bag of words (the sentence is not removed).

Resumable: each run's results are written to ``<output_dir>/runs/<name>.json`` and a run whose file
exists is skipped; the log goes to ``<output_dir>/benchmark.log`` and the table to ``table.md``.

    python scripts/benchmark_wsd.py --output_dir out/wsd                                  # the full table
    python scripts/benchmark_wsd.py --output_dir out/wsd-smoke --max_train_documents 20 --epochs 1   # a quick check
    python scripts/benchmark_wsd.py --output_dir out/wsd --only bilstm nclm-lta nclm-eta &    # two cores:
    python scripts/benchmark_wsd.py --output_dir out/wsd --only nclm-leta tcnlm               # share the runs
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import torch

from benchmarking import DATA, add_common_arguments

ROOT = Path(__file__).resolve().parents[1]
SETS = ("semeval2007", "senseval2", "senseval3")
COLUMNS = ("semeval2007", "senseval2", "senseval3", "SE2+SE3")
# Raganato et al. 2017's SemCor-MFS, from their SemCor conversion (226,036 instances; ours has 234,136)
PUBLISHED_MFS = {"semeval2007": 54.5, "senseval2": 65.6, "senseval3": 66.0}
# topic models trained by the package's benchmarks (paths relative to the repository root)
TOPIC_MODELS = {
    "nclm-lta": "out/nclm/lta/model",
    "nclm-eta": "out/nclm/eta/model",
    "nclm-leta": "out/nclm/leta/model",
    "tcnlm": "out/steering_256/tcnlm-pretrain-beta",
}

logger = logging.getLogger("benchmark_wsd")


def combined_f1(predictions: dict, golds: dict) -> float:
    """F1 over several sets together (instance ids are prefixed by their set: SE2 and SE3 share ids)."""
    from topic_lm_hf.tasks import score_wsd

    merged_predictions = {f"{name}:{i}": key for name in golds for i, key in predictions[name].items()}
    merged_gold = {f"{name}:{i}": keys for name, gold in golds.items() for i, keys in gold.items()}
    return score_wsd(merged_predictions, merged_gold).f1


def f1_row(predictions: dict, golds: dict) -> dict:
    from topic_lm_hf.tasks import score_wsd

    row = {name: score_wsd(predictions[name], golds[name]).f1 for name in SETS}
    row["SE2+SE3"] = combined_f1(predictions, {n: golds[n] for n in ("senseval2", "senseval3")})
    return row


def topic_tokenizer_for(path: Path):
    """The topic model's topic tokenizer: its ``topic_tokenizer/``, or, for the steering benchmark's TCNLM
    (saved without tokenizers), the vocabularies ``scripts/benchmark_steering.py`` built (APNEWS train,
    min_freq 10, MALLET stop list), checked against the model's ``topic_word_ids``."""
    from topic_lm_hf import build_vocabularies, load_documents
    from topic_lm_hf.models.configuration_common import topic_word_ids_from_tokenizers
    from topic_lm_hf.models.modeling_conditioning import load_topic_tokenizer
    from transformers import AutoConfig

    if (path / "topic_tokenizer" / "tokenizer.json").exists():
        return load_topic_tokenizer(path)
    config = AutoConfig.from_pretrained(path)
    tok, topic_tok = build_vocabularies(load_documents(DATA / "apnews" / "train.txt"), min_freq=10,
                                        stopwords="mallet")
    if len(topic_tok) != config.topic_vocab_size or \
            topic_word_ids_from_tokenizers(tok, topic_tok) != list(config.topic_word_ids):
        raise ValueError(f"{path} has no topic_tokenizer/ and the rebuilt APNEWS vocabulary does not match it")
    logger.info("%s: no topic_tokenizer/; rebuilt the APNEWS topic vocabulary (%d words, matches topic_word_ids)",
                path, len(topic_tok))
    return topic_tok


def run_tagger(name: str, topic_path, args, corpora, golds, inventory, out: Path) -> dict:
    from transformers import TrainingArguments

    from topic_lm_hf.tasks.wsd_tagger import (disambiguate, document_topic_representations, load_frozen_topic_model,
                                              train_sense_tagger)

    start = time.perf_counter()
    folder = out / "models" / f"{name}.{args.training_objective}"
    topic_model = topic_tokenizer = None
    if topic_path is not None:
        topic_model = load_frozen_topic_model(topic_path)
        topic_tokenizer = topic_tokenizer_for(Path(topic_path))
    training_args = TrainingArguments(
        output_dir=str(folder), learning_rate=args.lr, per_device_train_batch_size=args.batch_size,
        num_train_epochs=args.epochs, save_strategy="no", report_to="none", use_cpu=True, logging_steps=100,
        disable_tqdm=True, dataloader_pin_memory=False, seed=args.seed)
    model = train_sense_tagger(corpora["train"], folder, topic_model=topic_model,
                               topic_tokenizer=topic_tokenizer, topic_model_name_or_path=topic_path,
                               dev=corpora["semeval2007"], sense_inventory=args.senses, training_args=training_args,
                               train_corpus_path=str(DATA / "wsd" / "semcor"), embedding_size=args.embedding_size,
                               hidden_size=args.hidden_size, dropout=args.dropout,
                               training_objective=args.training_objective)
    train_seconds = time.perf_counter() - start
    c = {}
    if topic_model is not None:
        for set_name in SETS:
            c[set_name] = document_topic_representations(corpora[set_name], topic_model, topic_tokenizer)
    result = {"name": name, "training_objective": args.training_objective, "topic_model": topic_path,
              "topic_representation_size": model.config.topic_representation_size,
              "train_seconds": round(train_seconds, 1),
              "dev_history": json.loads((folder / "wsd_training.json").read_text())["dev_history"]}
    for mode in ("candidates", "all_senses") if args.training_objective == "all_senses" else ("candidates",):
        predictions = {set_name: disambiguate(model, corpora[set_name], mode=mode, inventory=inventory,
                                              topic_representations=c.get(set_name)) for set_name in SETS}
        result[mode] = f1_row(predictions, golds)
    return result


def format_table(baselines: dict, runs: dict) -> str:
    lines = ["| system | training loss | output mode | SE07 (dev) | SE2 | SE3 | SE2+SE3 |",
             "|---|---|---|---|---|---|---|"]

    def cells(row):
        return " | ".join("-" if row.get(c) is None else f"{100 * row[c]:.1f}" for c in COLUMNS)

    lines.append(f"| WN first sense | - | - | {cells(baselines['wn_first_sense'])} |")
    lines.append(f"| SemCor MFS (ours; WN-1st back-off) | - | - | {cells(baselines['semcor_mfs'])} |")
    lines.append("| SemCor MFS (published, Raganato's SemCor) | - | - | "
                 + " | ".join(f"{PUBLISHED_MFS[c]:.1f}" if c in PUBLISHED_MFS else "-" for c in COLUMNS) + " |")
    objectives = {"all_senses": "all training senses (paper)", "candidates": "the lemma's candidates"}
    for result in sorted(runs.values(), key=lambda r: (r["training_objective"] != "all_senses",
                                                       r["topic_model"] is not None, r["name"])):
        label = "BiLSTM (no topics)" if result["topic_model"] is None else \
            f"BiLSTM + {result['name']} (\\|c\\| = {result['topic_representation_size']})"
        modes = ("candidates", "all_senses") if result["training_objective"] == "all_senses" else ("candidates",)
        for mode in modes:  # a softmax trained over candidates only is not scored over every sense
            text = {"candidates": "candidates + WN-1st back-off", "all_senses": "all training senses"}[mode]
            # (F1 is NaN where P = R = 0, as Scorer.java prints it)
            lines.append(f"| {label} | {objectives[result['training_objective']]} | {text} | "
                         f"{cells(result[mode])} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="out/wsd", help="results folder (resumable)")
    parser.add_argument("--topic_models", nargs="*", default=None, metavar="NAME=PATH",
                        help=f"topic models for c (default: those of {sorted(TOPIC_MODELS)} that exist)")
    parser.add_argument("--no_topic_models", action="store_true", help="only the baselines and the plain BiLSTM")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME",
                        help="train only these runs (bilstm and/or topic model names); the table still shows every "
                             "finished run of --output_dir, so two processes can share the work on two cores")
    parser.add_argument("--epochs", type=int, default=5, help="training epochs over SemCor (best SE07 epoch kept)")
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (the paper's 1e-3)")
    parser.add_argument("--batch_size", type=int, default=32, help="sentences per batch (the paper's 32)")
    parser.add_argument("--training_objective", default="all_senses", choices=("all_senses", "candidates"),
                        help="the tagger's loss: softmax over every training sense (the paper) or over the instance's "
                             "own candidates (SenseTaggerConfig.training_objective)")
    parser.add_argument("--embedding_size", type=int, default=100)
    parser.add_argument("--hidden_size", type=int, default=100, help="BiLSTM units per direction (the paper's 100)")
    parser.add_argument("--dropout", type=float, default=0.2)
    parser.add_argument("--max_train_documents", type=int, default=None, help="first N SemCor documents (quick checks)")
    parser.add_argument("--senses", default=str(DATA / "wordnet" / "senses.tsv.gz"))
    add_common_arguments(parser, "--threads", "--seed")
    args = parser.parse_args()

    out = Path(args.output_dir)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        handlers=[logging.FileHandler(out / "benchmark.log"), logging.StreamHandler(sys.stdout)])
    for noisy in ("datasets", "transformers", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(args.threads)

    from topic_lm_hf.tasks import (first_sense_baseline, load_sense_inventory, load_wsd_corpus,
                                   most_frequent_sense_baseline, wsd_gold)

    if args.topic_models is not None:
        topic_models = dict(item.split("=", 1) for item in args.topic_models)
    else:
        topic_models = {name: str(ROOT / path) for name, path in TOPIC_MODELS.items() if (ROOT / path).is_dir()}
    if args.no_topic_models:
        topic_models = {}
    settings = {**vars(args), "topic_models": topic_models, "data": str(DATA), "torch": torch.__version__,
                "transformers": transformers.__version__}
    logger.info("settings: %s", json.dumps(settings))
    (out / "settings.json").write_text(json.dumps(settings, indent=1))

    corpora = {name: load_wsd_corpus(DATA / "wsd" / name) for name in SETS}
    semcor = load_wsd_corpus(DATA / "wsd" / "semcor")
    if args.max_train_documents is not None:
        keep = set(list(dict.fromkeys(semcor["document_id"]))[:args.max_train_documents])
        semcor = semcor.filter(lambda d: d in keep, input_columns="document_id")
    corpora["train"] = semcor
    golds = {name: wsd_gold(corpora[name]) for name in SETS}
    inventory = load_sense_inventory(args.senses, training=semcor)
    logger.info("SemCor: %d sentences; inventory: %s", len(semcor), inventory)

    baselines = {"wn_first_sense": f1_row({n: first_sense_baseline(corpora[n], inventory) for n in SETS}, golds),
                 "semcor_mfs": f1_row({n: most_frequent_sense_baseline(corpora[n], inventory) for n in SETS}, golds)}
    (out / "baselines.json").write_text(json.dumps(baselines, indent=1))

    runs = {}
    for name, path in [("bilstm", None), *topic_models.items()]:
        result_file = out / "runs" / f"{name}.{args.training_objective}.json"
        if result_file.exists():
            runs[result_file.stem] = json.loads(result_file.read_text())
            logger.info("%s: finished earlier, read from %s", name, result_file)
            continue
        if args.only is not None and name not in args.only:
            continue
        logger.info("%s: training (topic model: %s) ...", name, path or "none")
        result = run_tagger(name, path, args, corpora, golds, inventory, out)
        result["settings"] = settings
        result_file.write_text(json.dumps(result, indent=1))
        runs[result_file.stem] = result
        logger.info("%s: done in %.0f s: SE07 F1 %.1f (candidates)", name, result["train_seconds"],
                    100 * result["candidates"]["semeval2007"])
    for result_file in sorted((out / "runs").glob("*.json")):  # runs finished by another process
        runs.setdefault(result_file.stem, json.loads(result_file.read_text()))
    table = format_table(baselines, runs)
    (out / "table.md").write_text(table + "\n")
    print("\nsettings: " + json.dumps(settings) + "\n")
    print(table)


if __name__ == "__main__":
    main()
