"""Write modeling_cards/: one model card per Hub configuration of hub_configs/, from the package's card template.

    python scripts/make_cards.py                       # rewrite modeling_cards/ from results/apnews-cpu
    python scripts/make_cards.py --check               # exit 1 when a card differs from what it would write

Each card says what the model is (paper, equation, departures), the configuration's sizes, how to load it by
repo id with and without the package, and the measured results: perplexity per protocol (in ``model-index``),
the mismatched-context ablation, the topic table with NPMI, and the steering figures. The numbers come from the
package's unified benchmark (``results/<corpus>-cpu/results.json``, written by ``scripts/benchmark_all.py``) for
the measured model nearest to the configuration; each card says which model, at which size and budget, and that
it is not the configuration itself. A configuration nothing measured yet says so. Rerun after a benchmark.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from transformers import AutoConfig

import topic_lm_hf  # noqa: F401 (registers the model types)
from topic_lm_hf.hub import render_card

ROOT = Path(__file__).resolve().parents[1]

# configuration -> (the benchmark's model measured for it, or None; why that one)
SOURCES = {
    "lstm-apnews-small": ("lstm", "the same architecture"),
    "lstm-apnews-large": ("lstm", "the same architecture"),
    "tcnlm-apnews-small": ("tcnlm", "the same architecture"),
    "tcnlm-apnews-large": ("tcnlm", "the same architecture"),
    "tcnlm-table6-tcnlm": ("tcnlm", "the same architecture"),
    "tcnlm-table6-naive-moe": (None, "the naive mixture of experts has not been benchmarked"),
    "nclm-apnews-small": ("nclm-leta", "NCLM LETA, without sentence-level topics (SDT)"),
    "nclm-apnews-large": ("nclm-leta", "NCLM LETA, without sentence-level topics (SDT)"),
    "rgbn-rnn-apnews-small": ("rgbn", "rGBN-RNN, one layer of topics"),
    "rgbn-rnn-apnews-paper": ("rgbn", "rGBN-RNN, one layer of topics"),
    "topicrnn-apnews": ("topic-lstm", "TopicRNN with an LSTM cell (this configuration's cell is a plain RNN)"),
    "topicgru-imdb": (None, "IMDB has not been benchmarked"),
}
LM_CLASSES = {"lstm_lm": "LSTMLMForCausalLM", "tcnlm": "TCNLMForCausalLM", "topic_rnn": "TopicRNNForCausalLM",
              "nclm": "NCLMForCausalLM", "rgbn_rnn": "RGBNRNNForCausalLM"}
TOPICS_SHOWN = 20


def card_inputs(name: str, config_dict: dict, benchmark: dict) -> dict:
    """What the card of configuration ``name`` reports from the benchmark's ``results.json``."""
    source, why = SOURCES[name]
    context, settings = benchmark["context"], benchmark["settings"]
    corpus = context["corpus_name"]
    if source is None or config_dict.get("model_type") is None:
        return dict(measured_note=f"Not measured yet: {why}.", results=[], training={}, topics=[], steering={})
    r = benchmark["results"][source]
    train = r["train"]
    dataset = f"{corpus} valid.txt ({context['valid_documents']} documents)"
    results = [{"dataset": dataset, "dataset_type": corpus.lower(), "dataset_split": "validation", "protocol": p,
                "perplexity": v["perplexity"], "tokens": v["tokens"]} for p, v in r["perplexity"].items()]
    if r.get("mismatched"):
        m = r["mismatched"]
        results.append({"dataset": dataset, "dataset_type": corpus.lower(), "dataset_split": "validation",
                        "protocol": f"{m['base_protocol']}, mismatched context", "perplexity": m["perplexity"],
                        "tokens": m["tokens"]})
    converged = "early stopping fired" if r["early_stopped"] else "not converged: development perplexity was still falling"
    note = (f"**Not measured on this configuration.** These numbers are the package's unified benchmark "
            f"(`results/{settings['corpus']}-cpu`) for {r['label']} ({why}) at the CPU size: E = "
            f"{settings['embedding_size']}, H = {settings['hidden_size']}, {settings['num_topics']} topics, "
            f"{r['steps_trained']:,} steps of {settings['batch_size']} documents on one CPU thread ({converged}). "
            "Trained weights at this configuration's size are not published yet; its own numbers will replace these.")
    training = {
        "data": f"{corpus} train.txt: {context['train_documents']:,} documents, {context['dev_documents']} more held "
                f"out for early stopping (seed {settings['dev_seed']})",
        "vocabulary": f"LM {context['vocab_size']:,} words (frequency >= {settings['min_freq']}), topic model "
                      f"{context['topic_vocab_size']:,} words",
        "budget": f"{r['steps_trained']:,} steps (best development perplexity at step {r['best_step']:,}), "
                  f"{train['train_seconds'] / 60:.0f} min on {context['device']}",
        "recipe": f"Adam, learning rate {settings['lr']} (warm-up, linear decay), gradient-norm clip {settings['clip']}, "
                  f"dropout {settings['dropout']}; training context `{r['training_context']}`"
                  + (", state carried across each document" if r["carry_state"] else ""),
    }
    topics = []
    if r.get("topics"):
        per_topic = r["topics"]["coherence"]["per_topic"]
        topics = [{"words": words[:10], "npmi": npmi} for words, npmi in
                  zip(r["topics"]["top_words"][:TOPICS_SHOWN], per_topic[:TOPICS_SHOWN])]
        note += (f" Topics: mean NPMI {r['topics']['npmi']:.3f} over {r['topics']['num_topics']} topics "
                 f"({r['topics']['coherence']['preset']} preset, Wikipedia reference), diversity "
                 f"{r['topics']['diversity']:.2f} (top {r['topics']['diversity_k']}); the table shows the first "
                 f"{min(TOPICS_SHOWN, len(topics))}.")
    return dict(measured_note=note, results=results, training=training, topics=topics,
                steering=r.get("steering") or {})


def render_all(configs_dir: Path, benchmark_file: Path) -> dict[str, str]:
    """``{file name: card text}`` for every configuration of ``configs_dir``."""
    benchmark = json.loads(benchmark_file.read_text())
    cards = {}
    for path in sorted(configs_dir.glob("*.json")):
        name = path.stem
        if name not in SOURCES:
            raise SystemExit(f"{path}: add the configuration to SOURCES in {Path(__file__).name} (which measured "
                             "model its card reports, or None)")
        config_dict = json.loads(path.read_text())
        config = AutoConfig.for_model(**config_dict)
        inputs = card_inputs(name, config_dict, benchmark)
        if inputs["results"]:  # the vocabulary the numbers were measured with
            config.vocab_size = benchmark["context"]["vocab_size"]
            if hasattr(config, "topic_vocab_size"):
                config.topic_vocab_size = benchmark["context"]["topic_vocab_size"]
        description = (f"The `{name}` configuration of topic-lm-hf (`hub_configs/{name}.json`): "
                       f"`topic-lm train --config_file hub_configs/{name}.json` trains it, and "
                       "`topic-lm export` writes it with this card's sections filled from its own evaluation.")
        card = render_card(config, LM_CLASSES[config.model_type], f"topic-lm-hf/{name}", description=description,
                           **inputs)
        text = str(card)
        if not inputs["results"]:  # sizes that depend on a corpus not chosen yet
            text = "\n".join(line for line in text.splitlines()
                             if not line.startswith(("| vocab_size |", "| topic_vocab_size |"))) + "\n"
        cards[f"{name}.md"] = text if text.endswith("\n") else text + "\n"
    return cards


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", type=Path, default=ROOT / "hub_configs")
    parser.add_argument("--results", type=Path, default=ROOT / "results" / "apnews-cpu" / "results.json")
    parser.add_argument("--out", type=Path, default=ROOT / "modeling_cards")
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    args = parser.parse_args(argv)
    cards = render_all(args.configs, args.results)
    if args.check:
        stale = sorted(name for name, text in cards.items()
                       if not (args.out / name).is_file() or (args.out / name).read_text() != text)
        extra = sorted(p.name for p in args.out.glob("*.md") if p.name not in cards and p.name != "README.md")
        if stale or extra:
            print(f"modeling_cards/ is out of date: {', '.join(stale + extra)} (run python scripts/make_cards.py)")
            sys.exit(1)
        print(f"{len(cards)} cards up to date")
        return
    args.out.mkdir(exist_ok=True)
    for name, text in cards.items():
        (args.out / name).write_text(text)
    print(f"wrote {len(cards)} cards to {args.out}")


if __name__ == "__main__":
    main()
