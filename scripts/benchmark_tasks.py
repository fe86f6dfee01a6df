"""Document classification and retrieval with every family's features, next to the baselines.

The NCLM paper's downstream protocols (``../shared/docs/nclm.md`` §3-4) on the corpora of ``../shared/data``,
all from the same splits in one run:

* **Data.** ``20ng/train.jsonl.gz`` (posts cleaned as ``fetch_20newsgroups(remove=("headers", "footers",
  "quotes"))``) and ``r8/train.jsonl.gz``; their test files are held back, so each training file is split
  80/20 with ``Dataset.train_test_split(seed=0, stratify_by_column="label")``
  (``topic_lm_hf.tasks.load_classification_splits``). Vocabularies (Lau et al.'s recipe, MALLET stop list)
  come from the 80 % only.
* **Feature extractors (a labelled deviation from the paper).** The paper's 20NS/R21578 features come from
  APNEWS models; the APNEWS here is ~1/25 of theirs and its vocabulary misses most newsgroup words, so every
  extractor is trained here, without labels, on the 80 % training documents (nclm.md's "in-domain extractor").
  Same sizes for every family (``--embedding-size``/``--hidden-size``, one layer, ``--num-topics``), the same
  batches (64 chunks of 30 tokens), steps, optimiser (Adam, lr 2e-3, linear schedule, clip 0.5, dropout 0.4)
  and seed. The context of a training chunk is its whole document (``context="document"``), the context the
  features are computed with; R8 documents are single sentences, so a context without the chunk's own
  sentence would be empty. No perplexity is reported from these models (that context would leak). NCLM first
  trains its NVDM alone for ``--topic-model-steps`` steps on whole documents with its own Adam at
  ``--topic-model-lr`` (``pretrain_topic_model_phase``), as the paper pre-trains it; in the joint run at the LM's
  learning rate its posterior collapsed (``results/README.md``).
  Models: ``lstm`` (the same-size LSTM LM: the papers' baseline features), ``tcnlm``, ``nclm-lta``,
  ``nclm-leta`` by default; ``topiclstm`` (TopicRNN with an LSTM cell) and ``nclm-eta`` with ``--models``.
* **Features.** ``document_representation``: [o_N; c], o_N the LSTM output after the document's last token
  (documents cut at ``--max-document-length`` tokens), c the document's topic vector from its first 300 topic
  words (NCLM h / z / [z; h], TCNLM t, TopicRNN [mu; log sigma]; none for the LSTM).
* **Classification** (accuracy on the 20 % split): frozen features + TopicRNN's MLP head (50 sigmoid units),
  ``AutoModelForSequenceClassification.from_pretrained(<LM folder>, num_labels=n)`` trained with ``Trainer``
  on precomputed features (``--head-epochs`` epochs, Adam lr ``--head-lr``, batch 50), mean and standard
  deviation over ``--head-seeds`` seeds. "mismatched c": the same trained head, tested with every test
  document's c replaced by another test document's (a fixed permutation): how much of the accuracy comes from
  the document's own topics. ``--cnn``: also the paper's Kim CNN over [o_m; c] (frozen body, ``--cnn-epochs``).
  Baselines: majority class; tf-idf uni+bigrams + logistic regression (scikit-learn).
* **Retrieval** (queries = the 20 % split, corpus = the 80 %, relevance = same label, cosine, ties by corpus
  index): precision@5/10 of [o_N; c] raw (the paper) and with each block L2-normalised (labelled), of o_N alone
  and of c alone (the paper's "NTM" row for NCLM). Baselines: tf-idf cosine and scikit-learn LDA proportions
  (``--num-topics`` topics, fitted on the corpus).

Resumable: ``--out`` (default ``out/tasks``) holds per dataset ``<dataset>/<model>/model`` (weights +
vocabularies), ``features.npz``, ``results.json``; finished pieces are skipped on a rerun. Prints one
classification table and one retrieval table per dataset and writes them to ``<out>/table.md``.

    python scripts/benchmark_tasks.py                          # both datasets, the default models (hours on 2 cores)
    python scripts/benchmark_tasks.py --datasets r8 --models lstm nclm-lta --steps 30 --topic-model-steps 10 \\
        --max-train-docs 300 --max-test-docs 100 --head-seeds 1 --out out/tasks-smoke     # a quick check
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForSequenceClassification, TrainingArguments, set_seed
from transformers.utils import logging as hf_logging

from topic_lm_hf import (LSTMLMConfig, NCLMConfig, TCNLMConfig, TopicContextCollator, TopicLMTrainer, TopicRNNConfig,
                         build_vocabularies, save_vocabularies)
from topic_lm_hf.data import MALLET_STOPWORDS
from topic_lm_hf.tasks import (FeatureCollator, bow_logistic_regression, classification_accuracy, document_collator,
                               extract_document_features, lda_retrieval, load_classification_splits,
                               majority_accuracy, normalize_blocks, retrieval_precision, tfidf_retrieval,
                               train_classifier)

from benchmark_training import fast_path, pretrain_topic_model_phase, warmup_for
from benchmarking import DATA, TRAINING_FLAGS, add_common_arguments, check_settings, read_json, write_json

DATASETS = {"r8": ("r8/train.jsonl.gz", None), "20ng": ("20ng/train.jsonl.gz", "newsgroups")}
MODELS = ("lstm", "tcnlm", "topiclstm", "nclm-lta", "nclm-eta", "nclm-leta")
DEFAULT_MODELS = ("lstm", "tcnlm", "nclm-lta", "nclm-leta")


def log(*args):
    print(time.strftime("%H:%M:%S"), *args, flush=True)


def build(name: str, args, tok, topic_tok):
    torch.manual_seed(args.seed)
    sizes = dict(embedding_size=args.embedding_size, hidden_size=args.hidden_size, dropout=args.dropout)
    if name == "lstm":
        config = LSTMLMConfig(vocab_size=len(tok), **sizes)
    elif name == "tcnlm":
        config = TCNLMConfig.from_tokenizers(tok, topic_tok, num_topics=args.num_topics, **sizes)
    elif name == "topiclstm":
        config = TopicRNNConfig.from_tokenizers(tok, topic_tok, cell="lstm", num_topics=args.num_topics, **sizes)
    else:
        config = NCLMConfig.from_tokenizers(tok, topic_tok, variant=name.split("-")[1], num_topics=args.num_topics,
                                            **sizes)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(config)


def train_lm(name, model, train_docs, tok, topic_tok, args, out: Path) -> dict:
    collator = TopicContextCollator.for_model(model, tok, topic_tok, context="document")  # the LSTM: no context
    rows = collator.prepare(train_docs)
    extra = 0
    if name.startswith("nclm") and args.topic_model_steps:
        # the NVDM alone first, on whole documents, with its own Adam at --topic-model-lr (as benchmark_nclm.py):
        # trained only inside the joint run, at the LM's learning rate, its posterior collapsed
        phase_args = argparse.Namespace(batch_size=64, topic_model_steps=args.topic_model_steps,
                                        topic_model_lr=args.topic_model_lr, seed=args.seed)
        pretrain_topic_model_phase(name, model, train_docs, phase_args, out, tok, topic_tok)
        extra = args.topic_model_steps
    targs = TrainingArguments(output_dir=str(out / "checkpoints"), max_steps=args.steps,
                              per_device_train_batch_size=64, learning_rate=2e-3, max_grad_norm=0.5,
                              lr_scheduler_type="linear", warmup_steps=warmup_for(args.steps),
                              logging_steps=max(1, args.steps // 5), save_strategy="steps", save_steps=200,
                              save_total_limit=1, report_to=[], use_cpu=True, disable_tqdm=True, seed=args.seed)
    targs, compile_output_layer = fast_path(targs, args)
    trainer = TopicLMTrainer(model=model, args=targs, train_dataset=rows, data_collator=collator,
                             compile_output_layer=compile_output_layer)
    last = None
    checkpoints = sorted((out / "checkpoints").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    if checkpoints:
        last = str(checkpoints[-1])
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=last)
    seconds = time.perf_counter() - start
    logs = [e for e in trainer.state.log_history if "loss" in e]
    model.save_pretrained(out / "model")
    save_vocabularies(tok, topic_tok, out / "model")
    import shutil

    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    return {"seconds": seconds, "chunks": len(rows), "steps": args.steps, "topic_model_steps": extra,
            "final_log": logs[-1] if logs else {}}


def features(model_dir: Path, train_docs, test_docs, args, cache: Path):
    if cache.exists():
        data = np.load(cache)
        return data["train"], data["test"], tuple(int(x) for x in data["sizes"])
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    collator = document_collator(model, max_document_length=args.max_document_length, label_column=None)
    train, _ = extract_document_features(model, train_docs, collator, batch_size=64)
    test, _ = extract_document_features(model, test_docs, collator, batch_size=64)
    sizes = model.document_representation_sizes
    np.savez(cache, train=train, test=test, sizes=np.asarray(sizes))
    return train, test, tuple(sizes)


def feature_rows(x, labels):
    import datasets

    return datasets.Dataset.from_dict({"document_features": x.tolist(), "labels": list(labels)})


def classify(model_dir: Path, n_labels, train_x, train_y, test_x, test_y, sizes, args, work: Path) -> dict:
    accuracies, mismatched = [], []
    h, c = sizes
    perm = np.random.default_rng(args.seed).permutation(len(test_x))
    shuffled = test_x.copy()
    shuffled[:, h:] = test_x[perm, h:]
    train_rows, test_rows = feature_rows(train_x, train_y), feature_rows(test_x, test_y)
    shuffled_rows = feature_rows(shuffled, test_y)
    for seed in range(args.head_seeds):
        set_seed(seed)
        clf = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=n_labels)
        train_classifier(clf, train_rows, FeatureCollator(), str(work), epochs=args.head_epochs,
                         learning_rate=args.head_lr, batch_size=50, seed=seed, logging_steps=10 ** 6)
        accuracies.append(classification_accuracy(clf, test_rows, FeatureCollator()))
        if c:
            mismatched.append(classification_accuracy(clf, shuffled_rows, FeatureCollator()))
    out = {"accuracy": statistics.mean(accuracies), "accuracy_sd": statistics.pstdev(accuracies),
           "accuracies": accuracies}
    if mismatched:
        out["mismatched_c_accuracy"] = statistics.mean(mismatched)
    return out


def classify_cnn(model_dir: Path, n_labels, train_docs, test_docs, args, work: Path) -> dict:
    set_seed(args.seed)
    clf = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=n_labels, classifier_head="cnn")
    collator = document_collator(clf, max_document_length=args.max_document_length)
    train_rows, test_rows = collator.prepare(train_docs), collator.prepare(test_docs)
    start = time.perf_counter()
    train_classifier(clf, train_rows, collator, str(work), epochs=args.cnn_epochs, learning_rate=args.head_lr,
                     batch_size=50, seed=args.seed, logging_steps=10 ** 6)
    return {"accuracy": classification_accuracy(clf, test_rows, collator), "seconds": time.perf_counter() - start}


def retrieve(train_x, train_y, test_x, test_y, sizes) -> dict:
    h, c = sizes
    out = {"[o_N; c] raw": retrieval_precision(test_x, test_y, train_x, train_y)}
    if c:
        out["[o_N; c] blocks normalised"] = retrieval_precision(normalize_blocks(test_x, sizes), test_y,
                                                                normalize_blocks(train_x, sizes), train_y)
        out["o_N only"] = retrieval_precision(test_x[:, :h], test_y, train_x[:, :h], train_y)
        out["c only"] = retrieval_precision(test_x[:, h:], test_y, train_x[:, h:], train_y)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), choices=list(MODELS))
    parser.add_argument("--embedding-size", type=int, default=128)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--num-topics", type=int, default=50)
    parser.add_argument("--max-vocab-size", type=int, default=10000)
    parser.add_argument("--max-document-length", type=int, default=400)
    parser.add_argument("--head-epochs", type=float, default=20)
    parser.add_argument("--head-lr", type=float, default=1e-3)
    parser.add_argument("--head-seeds", type=int, default=3)
    parser.add_argument("--cnn", action="store_true", help="also train the paper's CNN head (slow on CPU)")
    parser.add_argument("--cnn-epochs", type=float, default=3)
    parser.add_argument("--max-test-docs", type=int, default=None)
    parser.add_argument("--out", type=Path, default=Path("out/tasks"))
    add_common_arguments(parser, *TRAINING_FLAGS, "--dropout", "--steps", "--topic-model-steps", "--topic-model-lr", "--min-freq",
                         "--max-train-docs", "--threads", "--seed", steps=400, min_freq=5, threads=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()
    import datasets

    datasets.disable_progress_bars()
    args.out.mkdir(parents=True, exist_ok=True)
    check_settings(args.out, {k: v for k, v in vars(args).items()
                              if k not in ("datasets", "models", "threads", "out", "cnn", "cnn_epochs")})
    log(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {args.threads} threads")
    tables = []
    for dataset in args.datasets:
        path, clean = DATASETS[dataset]
        if not (DATA / path).exists():
            raise SystemExit(f"{DATA / path} is absent: set TOPIC_LM_DATA to the folder of the corpora")
        train_docs, test_docs = load_classification_splits(DATA / path, test_fraction=0.2, seed=args.seed, clean=clean,
                                                           max_train_documents=args.max_train_docs,
                                                           max_test_documents=args.max_test_docs)
        train_y, test_y = np.asarray(train_docs["label"]), np.asarray(test_docs["label"])
        n_labels = int(max(train_y.max(), test_y.max())) + 1
        assert not set(train_docs["id"]) & set(test_docs["id"]), "a document is in both splits"
        log(f"{dataset}: {len(train_docs)} train / {len(test_docs)} test documents, {n_labels} labels")
        dout = args.out / dataset
        dout.mkdir(exist_ok=True)
        tok, topic_tok = build_vocabularies(train_docs, min_freq=args.min_freq, stopwords="mallet",
                                            max_vocab_size=args.max_vocab_size)
        log(f"  vocabularies: LM {len(tok)}, topic {len(topic_tok)}")
        base = read_json(dout / "baselines.json")
        if base is None:
            start = time.perf_counter()
            base = {"majority": majority_accuracy(train_y, test_y),
                    "tfidf_lr": bow_logistic_regression(train_docs, test_docs),
                    "tfidf_retrieval": tfidf_retrieval(test_docs, train_docs),
                    "lda_retrieval": lda_retrieval(test_docs, train_docs, num_topics=args.num_topics, seed=args.seed,
                                                   stop_words=[w.strip() for w in open(MALLET_STOPWORDS)])}
            base["seconds"] = time.perf_counter() - start
            write_json(dout / "baselines.json", base)
        log(f"  baselines: majority {base['majority']:.4f}, tf-idf LR {base['tfidf_lr']['accuracy']:.4f}, "
            f"tf-idf P@10 {base['tfidf_retrieval']['precision@10']:.4f}, LDA P@10 "
            f"{base['lda_retrieval']['precision@10']:.4f}")
        results = {}
        for name in args.models:
            mout = dout / name
            mout.mkdir(exist_ok=True)
            result = read_json(mout / "results.json") or {}
            if not (mout / "model" / "config.json").exists():
                model = build(name, args, tok, topic_tok)
                log(f"  {name}: training the LM ({sum(p.numel() for p in model.parameters()):,} parameters)")
                result["train"] = train_lm(name, model, train_docs, tok, topic_tok, args, mout)
                write_json(mout / "results.json", result)
                log(f"    {result['train']['seconds']:.0f} s, last log {result['train']['final_log']}")
            train_x, test_x, sizes = features(mout / "model", train_docs, test_docs, args, mout / "features.npz")
            if "classification" not in result:
                result["classification"] = classify(mout / "model", n_labels, train_x, train_y, test_x, test_y, sizes,
                                                    args, mout / "head")
                write_json(mout / "results.json", result)
            if "retrieval" not in result:
                result["retrieval"] = retrieve(train_x, train_y, test_x, test_y, sizes)
                write_json(mout / "results.json", result)
            if args.cnn and "cnn" not in result:
                result["cnn"] = classify_cnn(mout / "model", n_labels, train_docs, test_docs, args, mout / "cnn")
                write_json(mout / "results.json", result)
            result["sizes"] = list(sizes)
            results[name] = result
            cls = result["classification"]
            log(f"  {name}: accuracy {cls['accuracy']:.4f} ± {cls['accuracy_sd']:.4f}"
                + (f" (mismatched c {cls['mismatched_c_accuracy']:.4f})" if "mismatched_c_accuracy" in cls else "")
                + f", P@10 raw {result['retrieval']['[o_N; c] raw']['precision@10']:.4f}")
        tables.append(format_tables(dataset, len(train_docs), len(test_docs), base, results, args))
        print(tables[-1], flush=True)
    (args.out / "table.md").write_text("\n\n".join(tables) + "\n")


def format_tables(dataset, n_train, n_test, base, results, args) -> str:
    lines = [f"### {dataset}: {n_train} training / {n_test} held-out documents (80/20 stratified split, seed "
             f"{args.seed}); extractors E=H={args.hidden_size}, {args.num_topics} topics, {args.steps} steps",
             "", "Classification (accuracy on the held-out 20 %)", "",
             "| features | head | accuracy | with mismatched c |", "|---|---|---|---|",
             f"| majority class | - | {base['majority']:.4f} | |",
             f"| tf-idf 1-2-grams ({base['tfidf_lr']['features']:,}) | logistic regression | "
             f"{base['tfidf_lr']['accuracy']:.4f} | |"]
    for name, r in results.items():
        cls = r["classification"]
        h, c = r["sizes"]
        mism = f"{cls['mismatched_c_accuracy']:.4f}" if "mismatched_c_accuracy" in cls else ""
        lines.append(f"| {name} [o_N; c] ({h} + {c}) | MLP(50) frozen, {len(cls['accuracies'])} seeds | "
                     f"{cls['accuracy']:.4f} ± {cls['accuracy_sd']:.4f} | {mism} |")
        if "cnn" in r:
            lines.append(f"| {name} [o_m; c] | Kim CNN frozen | {r['cnn']['accuracy']:.4f} | |")
    lines += ["", "Retrieval (queries = held-out documents, corpus = training documents, cosine, relevance = same "
              "label)", "", "| vectors | P@5 | P@10 |", "|---|---|---|",
              f"| tf-idf | {base['tfidf_retrieval']['precision@5']:.4f} | "
              f"{base['tfidf_retrieval']['precision@10']:.4f} |",
              f"| LDA proportions ({args.num_topics} topics) | {base['lda_retrieval']['precision@5']:.4f} | "
              f"{base['lda_retrieval']['precision@10']:.4f} |"]
    for name, r in results.items():
        for kind, ret in r["retrieval"].items():
            lines.append(f"| {name} {kind} | {ret['precision@5']:.4f} | {ret['precision@10']:.4f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
