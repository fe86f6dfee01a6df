"""TopicRNN / TopicLSTM / TopicGRU benchmark: (a) language modelling on APNEWS, (b) IMDB sentiment.

(a) Trains the three TopicRNN cells next to the plain LSTM of the same size (same data, steps,
batch, optimiser), then reports perplexity under every labelled protocol (``paper``: context =
document minus the sentence; ``causal``; ``causal-carry``; ``topicrnn-sliding-window``: theta
from the previous window of predicted words, the paper's own protocol), the topics' NPMI
(``lau2014`` preset against a reference corpus, Wikipedia by default) and diversity (top-25),
and training throughput (predicted tokens per second) with its ratio to the LSTM's.

(b) Trains a TopicGRU language model on the training split of IMDB (a fixed 20 % of
``train.jsonl.gz`` is held out as the test split), extracts the paper's frozen document features
(inference-network output + last GRU state, documents truncated to ``--max_length`` tokens),
trains the 50-unit MLP on them with ``Trainer`` and compares test accuracy with a tf-idf
bag-of-words logistic regression and the majority class.

The paper's objective is the ELBO (KL weight 1). Short CPU runs collapse the posterior
(KL/token -> 0, theta = the prior for every document), which the table shows in its "final
KL/token" column; one extra row per task trains with a KL weight of 0.1 (a beta-VAE objective,
labelled as such) to show what the topic part does when it is used.

Defaults are sized for a small CPU (one thread). Examples::

    python scripts/benchmark_topicrnn.py                        # both tables, default sizes
    python scripts/benchmark_topicrnn.py --task lm --steps 1000 --embedding_size 300 --hidden_size 600
    python scripts/benchmark_topicrnn.py --task imdb --imdb_lm_steps 1000

Trained models are saved under ``--output_dir`` (``topicgru-imdb`` among them, loadable with
``AutoModelForSequenceClassification.from_pretrained(..., num_labels=2)``).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, TrainingArguments, set_seed

from topic_lm_hf import (LSTMLMConfig, LSTMLMForCausalLM, TopicContextCollator, TopicLMTrainer, TopicRNNConfig,
                         TopicRNNForCausalLM, build_vocabularies, evaluate_perplexity, load_documents,
                         save_vocabularies)
from topic_lm_hf.evaluation.sliding_window import evaluate_perplexity_sliding_window
from topic_lm_hf.tasks.classification import (FeatureCollator, add_document_features, bow_logistic_regression,
                                              classification_accuracy, load_imdb_splits, majority_accuracy,
                                              train_classifier)

from benchmark_training import CountingCollator, fast_path
from benchmarking import DATA, TRAINING_FLAGS, add_common_arguments

NAMES = {"rnn": "TopicRNN", "lstm": "TopicLSTM", "gru": "TopicGRU"}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def train_lm(model, rows, collator, args, output_dir: Path, steps: int) -> dict:
    counting = CountingCollator(collator)
    training_args = TrainingArguments(
        output_dir=str(output_dir), max_steps=steps, per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate, max_grad_norm=args.max_grad_norm, lr_scheduler_type="constant",
        logging_steps=max(1, steps // 10), save_strategy="no", report_to=[], use_cpu=True, seed=args.seed,
        disable_tqdm=True, dataloader_num_workers=0)
    training_args, compile_output_layer = fast_path(training_args, args)
    trainer = TopicLMTrainer(model=model, args=training_args, train_dataset=rows, data_collator=counting,
                             compile_output_layer=compile_output_layer)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    last = [h for h in trainer.state.log_history if "loss" in h][-1]
    return {"tokens": counting.tokens, "seconds": seconds, "tokens_per_s": counting.tokens / seconds,
            "last_log": {k: v for k, v in last.items() if k.endswith("loss")}}


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------------------------
# (a) language modelling
# ----------------------------------------------------------------------------------------------


def language_modelling(args) -> list[dict]:
    train_docs = load_documents(args.apnews / "train.txt", max_documents=args.train_docs)
    valid_docs = load_documents(args.apnews / "valid.txt", max_documents=args.valid_docs)
    tok, topic_tok = build_vocabularies(train_docs, min_freq=args.min_freq, stopwords=args.stopwords)
    log(f"APNEWS: {len(train_docs)} train / {len(valid_docs)} valid documents, LM vocabulary {len(tok)}, "
        f"topic vocabulary {len(topic_tok)}")
    reference = None
    if not args.skip_topics:
        from topic_lm_hf.evaluation.topic_eval import evaluate_topics
        from topic_lm_hf.evaluation.topics import load_reference_corpus

        reference = load_reference_corpus(args.reference, max_documents=args.reference_max_documents)
        log(f"NPMI reference: {reference!r}")

    lm_collator = TopicContextCollator.for_model(LSTMLMForCausalLM, tok)
    topic_collator = TopicContextCollator.for_model(TopicRNNForCausalLM, tok, topic_tok, context=args.context)
    lm_rows = lm_collator.prepare(train_docs)
    topic_rows = topic_collator.prepare(train_docs)
    specs = [("LSTM (baseline)", None, {})] + [(NAMES[c], c, {}) for c in args.cells]
    for variant in args.extra_variants:
        cell, _, overrides = variant.partition(":")
        kwargs = {k: json.loads(v) for k, v in (item.split("=") for item in overrides.split(",") if item)}
        specs.append((f"{NAMES[cell]} ({overrides})", cell, kwargs))
    results = []
    for name, cell, overrides in specs:
        set_seed(args.seed)
        if cell is None:
            config = LSTMLMConfig(vocab_size=len(tok), embedding_size=args.embedding_size,
                                  hidden_size=args.hidden_size, num_hidden_layers=args.num_layers,
                                  dropout=args.dropout, pad_token_id=tok.pad_token_id,
                                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
            model, rows, collator = LSTMLMForCausalLM(config), lm_rows, lm_collator
        else:
            config = TopicRNNConfig.from_tokenizers(
                tok, topic_tok, cell=cell, embedding_size=args.embedding_size, hidden_size=args.hidden_size,
                num_hidden_layers=args.num_layers, num_topics=args.num_topics,
                inference_hidden_size=args.inference_hidden_size, dropout=args.dropout,
                **{"kl_weight": args.kl_weight, "kl_annealing_steps": args.kl_annealing_steps, **overrides})
            model, rows, collator = TopicRNNForCausalLM(config), topic_rows, topic_collator
        log(f"training {name} ({n_params(model):,} parameters) for {args.steps} steps")
        out_dir = args.output_dir / (name.split()[0].lower() + "".join(f"-{k}{v}" for k, v in overrides.items()))
        train = train_lm(model, rows, collator, args, out_dir, args.steps)
        model.save_pretrained(out_dir)
        save_vocabularies(tok, topic_tok, out_dir)
        log(f"  {train['tokens_per_s']:.0f} tokens/s, last log {train['last_log']}")
        row = {"model": name, "cell": cell or "lstm", "params": n_params(model), **train,
               "kl_loss": train["last_log"].get("kl_loss")}
        for protocol in args.protocols:
            start = time.perf_counter()
            if protocol == "sliding-window":
                r = evaluate_perplexity_sliding_window(model, valid_docs, window=args.window, tokenizer=tok,
                                                       topic_tokenizer=topic_tok)
            else:
                r = evaluate_perplexity(model, valid_docs, protocol, tokenizer=tok, topic_tokenizer=topic_tok)
            row[f"ppl_{protocol}"] = r["perplexity"]
            row["eval_tokens"] = r["tokens"]
            log(f"  {protocol}: perplexity {r['perplexity']:.2f} over {r['tokens']} tokens "
                f"({time.perf_counter() - start:.0f} s; context: {r['context']})")
        if cell is not None and "paper" in args.protocols:
            # Ablation: paper, but each chunk reads another document's context (what the document's own topics
            # are worth).
            r = evaluate_perplexity(model, valid_docs, "paper", tokenizer=tok, topic_tokenizer=topic_tok,
                                    mismatched_context=True)
            row["ppl_paper-mismatched"] = r["perplexity"]
            log(f"  paper, another document's context (ablation): perplexity {r['perplexity']:.2f}")
        if cell is not None and reference is not None:
            topics = evaluate_topics(model, reference, topic_tokenizer=topic_tok)
            row.update(npmi=topics["npmi"], diversity=topics["diversity"], diversity_k=topics["diversity_k"],
                       top_words=topics["top_words"][:5], coherence=topics["coherence"])
            log(f"  NPMI {topics['npmi']:.4f}, diversity {topics['diversity']:.3f}; "
                f"topic 0: {' '.join(topics['top_words'][0])}")
        results.append(row)
    baseline = results[0]["tokens_per_s"]
    for row in results:
        row["speed_ratio"] = row["tokens_per_s"] / baseline
    return results


def lm_table(rows: list[dict], args) -> str:
    protocols = args.protocols
    head = ["model", "params", "train tokens/s", "x LSTM speed", "final KL/token"] + [
        f"ppl {p}" if p != "sliding-window" else f"ppl sliding-window ({args.window})" for p in protocols] + [
        "ppl paper, another document's context", "NPMI", "diversity"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"], f"{r['params'] / 1e6:.2f}M", f"{r['tokens_per_s']:.0f}", f"{r['speed_ratio']:.2f}",
                 f"{r['kl_loss']:.4f}" if r.get("kl_loss") is not None else "-"]
        cells += [f"{r[f'ppl_{p}']:.2f}" for p in protocols]
        cells += [f"{r['ppl_paper-mismatched']:.2f}" if "ppl_paper-mismatched" in r else "-"]
        cells += [f"{r['npmi']:.4f}" if "npmi" in r else "-", f"{r['diversity']:.3f}" if "diversity" in r else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# (b) IMDB sentiment
# ----------------------------------------------------------------------------------------------


def sentiment(args) -> list[dict]:
    train_docs, test_docs = load_imdb_splits(args.imdb, test_fraction=0.2, seed=args.seed,
                                             max_train_documents=args.imdb_train_docs,
                                             max_test_documents=args.imdb_test_docs)
    tok, topic_tok = build_vocabularies(train_docs, min_freq=args.imdb_min_freq, stopwords=args.stopwords,
                                        max_vocab_size=args.imdb_vocab_size)
    log(f"IMDB: {len(train_docs)} train / {len(test_docs)} held-out test documents (fixed 20 % split, seed "
        f"{args.seed}), LM vocabulary {len(tok)}, topic vocabulary {len(topic_tok)}")
    results = []
    majority = majority_accuracy(train_docs["label"], test_docs["label"])
    results.append({"method": "majority class", "features": "-", "accuracy": majority})

    start = time.perf_counter()
    bow = bow_logistic_regression(train_docs, test_docs)
    log(f"BoW logistic regression: accuracy {bow['accuracy']:.4f} ({time.perf_counter() - start:.0f} s)")
    results.append({"method": "bag-of-words logistic regression", "features": f"{bow['features']:,} "
                    f"({bow['settings']})", "accuracy": bow["accuracy"]})

    doc_collator = TopicContextCollator.for_model(TopicRNNForCausalLM, tok, topic_tok, protocol="document",
                                                  max_document_length=args.max_length, label_column="label")
    train_doc_rows, test_doc_rows = doc_collator.prepare(train_docs), doc_collator.prepare(test_docs)
    collator = TopicContextCollator.for_model(TopicRNNForCausalLM, tok, topic_tok, context=args.imdb_context)
    lm_docs = train_docs.select(range(min(args.imdb_lm_docs, len(train_docs))))
    rows = collator.prepare(lm_docs)
    for kl_weight in args.imdb_kl_weights:
        # 1. The language model, trained without labels (the paper: X_c = the review's own words).
        set_seed(args.seed)
        config = TopicRNNConfig.from_tokenizers(
            tok, topic_tok, cell=args.imdb_cell, embedding_size=args.imdb_embedding_size,
            hidden_size=args.imdb_hidden_size, num_hidden_layers=args.imdb_num_layers,
            num_topics=args.imdb_num_topics, inference_hidden_size=args.imdb_inference_hidden_size, dropout=0.0,
            kl_weight=kl_weight)
        lm = TopicRNNForCausalLM(config)
        log(f"training {NAMES[args.imdb_cell]} LM (kl_weight={kl_weight}, {n_params(lm):,} parameters) on "
            f"{len(lm_docs)} reviews ({len(rows)} sentence chunks, context {args.imdb_context!r}) for "
            f"{args.imdb_lm_steps} steps")
        train = train_lm(lm, rows, collator, args, args.output_dir / "imdb-lm", args.imdb_lm_steps)
        log(f"  {train['tokens_per_s']:.0f} tokens/s, last log {train['last_log']}")
        suffix = "" if kl_weight == 1.0 else f"-kl{kl_weight:g}"
        lm_dir = args.output_dir / f"topic{args.imdb_cell}-imdb{suffix}"
        lm.save_pretrained(lm_dir)
        save_vocabularies(tok, topic_tok, lm_dir)

        # 2. Frozen features and the 50-unit MLP (the paper's recipe), through Trainer.
        clf = AutoModelForSequenceClassification.from_pretrained(lm_dir, num_labels=2)
        start = time.perf_counter()
        train_feats = add_document_features(clf, train_doc_rows, doc_collator, batch_size=64)
        test_feats = add_document_features(clf, test_doc_rows, doc_collator, batch_size=64)
        n_features = len(train_feats[0]["document_features"])
        log(f"features: {n_features} per document ({time.perf_counter() - start:.0f} s for "
            f"{len(train_feats) + len(test_feats)} documents)")
        set_seed(args.seed)
        train_classifier(clf, train_feats, FeatureCollator(), str(args.output_dir / "imdb-clf"),
                         epochs=args.head_epochs, learning_rate=args.head_learning_rate, batch_size=64,
                         seed=args.seed)
        accuracy = classification_accuracy(clf, test_feats, FeatureCollator())
        log(f"{NAMES[args.imdb_cell]} (kl_weight={kl_weight}) features + MLP(50): accuracy {accuracy:.4f}")
        clf.save_pretrained(args.output_dir / f"topic{args.imdb_cell}-imdb{suffix}-classifier")
        k, h = args.imdb_num_topics, args.imdb_hidden_size
        objective = "ELBO" if kl_weight == 1.0 else f"KL weight {kl_weight:g}, not the ELBO"
        results.append({"method": f"{NAMES[args.imdb_cell]} features ({objective}; final KL/token "
                                  f"{train['last_log'].get('kl_loss', float('nan')):.4f}) + MLP(50, sigmoid), frozen",
                        "features": f"{n_features} (mu {k} + log sigma {k} + last state {h}; first "
                                    f"{args.max_length} tokens; LM {args.imdb_lm_steps} steps on {len(lm_docs)} "
                                    "reviews)",
                        "accuracy": accuracy, "lm": train})

        # 3. Optionally, the fine-tunable variant: the same pretrained network, everything trained.
        if args.imdb_finetune_epochs > 0:
            set_seed(args.seed)
            tuned = AutoModelForSequenceClassification.from_pretrained(lm_dir, num_labels=2, freeze_backbone=False)
            start = time.perf_counter()
            train_classifier(tuned, train_doc_rows, doc_collator, str(args.output_dir / "imdb-finetune"),
                             epochs=args.imdb_finetune_epochs, learning_rate=args.imdb_finetune_learning_rate,
                             batch_size=32, seed=args.seed)
            accuracy = classification_accuracy(tuned, test_doc_rows, doc_collator)
            log(f"{NAMES[args.imdb_cell]} (kl_weight={kl_weight}) fine-tuned: accuracy {accuracy:.4f} "
                f"({time.perf_counter() - start:.0f} s)")
            tuned.save_pretrained(args.output_dir / f"topic{args.imdb_cell}-imdb{suffix}-finetuned")
            results.append({"method": f"{NAMES[args.imdb_cell]} ({objective}) + MLP(50, sigmoid), fine-tuned "
                                      f"{args.imdb_finetune_epochs:g} epoch(s)",
                            "features": f"same network, every weight trained; first {args.max_length} tokens",
                            "accuracy": accuracy})
    for r in results:
        r.update(train_documents=len(train_docs), test_documents=len(test_docs))
    return results


def imdb_table(rows: list[dict]) -> str:
    lines = ["| method | features | train docs | test docs | accuracy | error |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['features']} | {r['train_documents']} | {r['test_documents']} | "
                     f"{r['accuracy']:.4f} | {100 * (1 - r['accuracy']):.2f} % |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--task", choices=["lm", "imdb", "all"], default="all")
    p.add_argument("--output_dir", type=Path, default=Path("out/benchmark_topicrnn"))
    add_common_arguments(p, *TRAINING_FLAGS, "--threads", "--seed")
    p.add_argument("--stopwords", default="mallet")
    g = p.add_argument_group("(a) language modelling")
    g.add_argument("--apnews", type=Path, default=DATA / "apnews")
    g.add_argument("--train_docs", type=int, default=None, help="first N training documents (default all 1,800)")
    g.add_argument("--valid_docs", type=int, default=None, help="first N validation documents (default all 200)")
    g.add_argument("--min_freq", type=int, default=10)
    g.add_argument("--cells", default="rnn,lstm,gru", type=lambda s: s.split(","))
    g.add_argument("--embedding_size", type=int, default=128)
    g.add_argument("--hidden_size", type=int, default=128)
    g.add_argument("--num_layers", type=int, default=1)
    g.add_argument("--num_topics", type=int, default=50)
    g.add_argument("--inference_hidden_size", type=int, default=200)
    g.add_argument("--dropout", type=float, default=0.0)
    g.add_argument("--context", default="others", help="training context of the topic models")
    g.add_argument("--kl_weight", type=float, default=1.0, help="1 = the ELBO (the paper)")
    g.add_argument("--kl_annealing_steps", type=int, default=0)
    g.add_argument("--extra_variants", nargs="*", default=["gru:kl_weight=0.1"],
                   help="extra topic-model rows, 'cell:key=value,...' config overrides")
    g.add_argument("--steps", type=int, default=400)
    g.add_argument("--batch_size", type=int, default=64)
    g.add_argument("--learning_rate", type=float, default=2e-3)
    g.add_argument("--max_grad_norm", type=float, default=1.0)
    g.add_argument("--protocols", default="paper,causal,causal-carry,sliding-window", type=lambda s: s.split(","))
    g.add_argument("--window", type=int, default=30, help="sliding-window protocol: previous N predicted tokens")
    g.add_argument("--reference", default=str(DATA / "wiki" / "articles.jsonl.gz"), help="NPMI reference corpus")
    g.add_argument("--reference_max_documents", type=int, default=None)
    g.add_argument("--skip_topics", action="store_true")
    g = p.add_argument_group("(b) IMDB sentiment")
    g.add_argument("--imdb", type=Path, default=DATA / "imdb" / "train.jsonl.gz")
    g.add_argument("--imdb_train_docs", type=int, default=None, help="first N of the 80 %% training split")
    g.add_argument("--imdb_test_docs", type=int, default=None, help="first N of the 20 %% held-out split")
    g.add_argument("--imdb_min_freq", type=int, default=5)
    g.add_argument("--imdb_vocab_size", type=int, default=5000, help="LM vocabulary size (5,000 in the paper)")
    g.add_argument("--imdb_cell", choices=list(NAMES), default="gru")
    g.add_argument("--imdb_embedding_size", type=int, default=128)
    g.add_argument("--imdb_hidden_size", type=int, default=128)
    g.add_argument("--imdb_num_layers", type=int, default=1)
    g.add_argument("--imdb_num_topics", type=int, default=50)
    g.add_argument("--imdb_inference_hidden_size", type=int, default=200)
    g.add_argument("--imdb_context", default="document", help="LM training context (the paper: the review)")
    g.add_argument("--imdb_lm_docs", type=int, default=5000, help="reviews used to train the LM")
    g.add_argument("--imdb_lm_steps", type=int, default=400)
    g.add_argument("--max_length", type=int, default=400, help="tokens per review for the features")
    g.add_argument("--imdb_kl_weights", default="1.0,0.1", type=lambda s: [float(x) for x in s.split(",")],
                   help="one LM (and one row) per KL weight; 1 = the ELBO")
    g.add_argument("--imdb_finetune_epochs", type=float, default=0,
                   help="also fine-tune the whole network (freeze_backbone=False) for this many epochs")
    g.add_argument("--imdb_finetune_learning_rate", type=float, default=1e-3)
    g.add_argument("--head_epochs", type=float, default=20)
    g.add_argument("--head_learning_rate", type=float, default=1e-3)
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    log(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {args.threads} thread(s)")
    report = {"args": {k: str(v) for k, v in vars(args).items()}}
    if args.task in ("lm", "all"):
        rows = language_modelling(args)
        report["lm"] = rows
        print("\n(a) Language modelling, APNEWS valid.txt "
              f"({rows[0]['eval_tokens']} predicted tokens), E={args.embedding_size} H={args.hidden_size} "
              f"L={args.num_layers} K={args.num_topics}, {args.steps} steps x {args.batch_size} sentences, "
              f"training context {args.context!r}\n")
        print(lm_table(rows, args), flush=True)
    if args.task in ("imdb", "all"):
        rows = sentiment(args)
        report["imdb"] = rows
        print("\n(b) IMDB sentiment (fixed 20 % of train.jsonl.gz held out)\n")
        print(imdb_table(rows), flush=True)
    (args.output_dir / "results.json").write_text(json.dumps(report, indent=1, default=str))
    assert all(math.isfinite(r.get("accuracy", 0.0)) for r in report.get("imdb", []))


if __name__ == "__main__":
    main()
