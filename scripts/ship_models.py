"""The models that ship with the repository (``hub_models/``): trained on the Wikipedia sample that ships with the
package by ``topic-lm train``, measured, and saved as Hub-ready folders with their cards.

Four models, each trained by the command in ``COMMANDS`` (the card repeats it): the carried LSTM (``wiki-lstm-carry``),
the carried rGBN-RNN started from it by the steering recipe with its topic prior held at full weight
(``wiki-rgbn-rnn-carry``), that model's topic-free twin, trained alike with every context empty
(``wiki-rgbn-rnn-carry-twin``: the strongest baseline it is measured against), and the carried TCNLM by the steering
recipe (``wiki-tcnlm-carry``: tied embeddings and narrower topic parts than the benchmark's, to fit the folder in
8 MB). Each stops when its development perplexity stops improving. Each folder holds the weights (safetensors), both
tokenizers, the remote code, a card (``README.md``) with the measured results and the exact command, and
``results.json``. The rGBN-RNN and its twin start from the shipped LSTM's folder.

The measurements, on the sample's 100 validation articles: perplexity under ``causal-carry`` (the state carried
through each document, each sentence's context the sentences before it); for the topic model also with another
document's topics (the mismatched-context ablation: what the document's own topics are worth) and with empty contexts
(uninformative topics, the same for every document); the topics' NPMI (``lau2014``, against the shipped reference
articles) and diversity; for a twin, its perplexity with every context empty, as it was trained. They are measured
on the folders as written (reloaded from them).

    python scripts/ship_models.py --train --work out/ship      # trains (resumes) each, then writes hub_models/
    python scripts/ship_models.py --work out/ship              # only measures and writes, from trained runs
    python scripts/ship_models.py --only wiki-tcnlm-carry      # one folder (a topic model's card then reads the
                                                               # LSTM it is compared with from its shipped folder)

A folder must stay at most ``MAX_BYTES``: float64 tensors (rGBN-RNN's topic-word matrix) are stored in float32 and
loaded back into the model's float64 (the card says so; the perplexities are those of the stored weights).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from topic_lm_hf.demo import SHIPPED_TOPIC_MODELS, SHIPPED_TWINS

ROOT = Path(__file__).resolve().parent.parent
MAX_BYTES = 8_000_000


def schedule(halve_after: int, stop_after: int) -> list[str]:
    """The carried rows' schedule of ``scripts/benchmark_all.py --corpus wiki`` on the command line (4 documents per
    step, lr 2e-3, clipping 0.5, a 60-epoch cap, an evaluation every 200 steps): the rate halved at the
    ``halve_after``-th evaluation in a row without improvement, training stopped at the ``stop_after``-th."""
    return ["--carry_state", "true", "--per_device_train_batch_size", "4", "--learning_rate", "2e-3",
            "--max_grad_norm", "0.5", "--num_train_epochs", "60", "--lr_scheduler_type", "reduce_lr_on_plateau",
            "--lr_scheduler_kwargs", json.dumps({"factor": 0.5, "patience": halve_after - 1}), "--eval_strategy",
            "steps", "--eval_steps", "200", "--early_stopping_patience", str(stop_after), "--seed", "0",
            "--disable_tqdm", "true"]


# the rGBN-RNN and its twin as the benchmark's held prior I and its matched twin (rate halved after 3 misses,
# patience 10), started from the shipped LSTM's folder
RGBN = "embedding_size=128,topic_sizes=[50],hidden_sizes=[128],dropout=0.4"
LSTM_FOLDER = "{out}/wiki-lstm-carry"
COMMANDS = {
    "wiki-lstm-carry": ["--model_type", "lstm_lm", "--config_overrides",
                        "embedding_size=128,hidden_size=128,dropout=0.4", *schedule(1, 3), "--output_dir",
                        "{work}/lstm-carry"],
    "wiki-rgbn-rnn-carry-twin": ["--model_type", "rgbn_rnn", "--language_model", LSTM_FOLDER, "--config_overrides",
                                 f"{RGBN},train_theta=mean", "--empty_context", "true", *schedule(3, 10),
                                 "--output_dir", "{work}/rgbn-carry-twin"],
    "wiki-rgbn-rnn-carry": ["--model_type", "rgbn_rnn", "--language_model", LSTM_FOLDER, "--config_overrides",
                            f"{RGBN},topic_prior_weight_trainable=false", *schedule(3, 10), "--output_dir",
                            "{work}/rgbn-carry"],
    "wiki-tcnlm-carry": ["--model_type", "tcnlm", "--config_overrides",
                         "embedding_size=128,hidden_size=128,num_topics=50,num_factors=128,encoder_hidden_size=128,"
                         "topic_embedding_size=64,tie_word_embeddings=true,dropout=0.4", *schedule(1, 3),
                         "--output_dir", "{work}/tcnlm-carry"],
}
TITLES = {"wiki-lstm-carry": "LSTM language model, carried state",
          "wiki-rgbn-rnn-carry-twin": "rGBN-RNN, carried state, started from the carried LSTM by the steering recipe, "
                                      "its topics held uninformative: the topic-free twin of wiki-rgbn-rnn-carry",
          "wiki-rgbn-rnn-carry": "rGBN-RNN, carried state, started from the carried LSTM by the steering recipe, its "
                                 "topic prior held at full weight",
          "wiki-tcnlm-carry": "TCNLM, carried state, by the steering recipe"}
# the topic models among them: the ones the demo shows beside the LSTM (one list for both), and their twins
TOPIC_MODELS = tuple(SHIPPED_TOPIC_MODELS)
TWINS = {twin: model for model, twin in SHIPPED_TWINS.items()}


def arguments(name: str, work: str, out: str) -> list[str]:
    """``name``'s command-line arguments, with the runs in ``work`` and the shipped folders in ``out`` (relative to
    the repository root where it is inside it, as a user of the clone would write it)."""
    out_path = Path(out).resolve()
    shown = str(out_path.relative_to(ROOT)) if out_path.is_relative_to(ROOT) else out
    return [a.replace("{work}", work).replace("{out}", shown) for a in COMMANDS[name]]


def command_line(name: str, work: str, out: str = str(ROOT / "hub_models")) -> str:
    quoted = [f"'{a}'" if any(c in a for c in ' {}[]"') else a for a in arguments(name, work, out)]
    return "OMP_NUM_THREADS=1 topic-lm train " + " ".join(quoted)


def train(name: str, work: str, out: str) -> None:
    subprocess.run([sys.executable, "-m", "topic_lm_hf.cli", "train", *arguments(name, work, out)], check=True,
                   cwd=ROOT)


def stopped(run: Path) -> dict:
    """Steps trained, the step whose weights were kept, its development perplexity and the metric that stopped the
    run, from the run's last checkpoint and its training arguments."""
    import torch

    last = max(run.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    state = json.loads((last / "trainer_state.json").read_text())
    metric = torch.load(last / "training_args.bin", weights_only=False).metric_for_best_model
    kept = int(state["best_model_checkpoint"].rsplit("-", 1)[1])
    at = next(e for e in state["log_history"] if e.get("step") == kept and "eval_lm_loss" in e)
    return {"steps_trained": state["global_step"], "max_steps": state["max_steps"], "best_step": kept,
            "best_dev_perplexity": at.get("eval_perplexity"), "metric": metric,
            "stopped_by": "development perplexity" if state["global_step"] < state["max_steps"] else "max_steps"}


def store_float64_as_float32(folder: Path) -> list[str]:
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(path)
    wide = [k for k, v in tensors.items() if v.dtype.is_floating_point and v.element_size() == 8]
    if wide:
        save_file({k: v.float() if k in wide else v for k, v in tensors.items()}, path, metadata={"format": "pt"})
    return wide


def kind(name: str) -> str:
    """What a shipped folder holds: ``"lstm"``, a ``"topic"`` model, or a topic model's topic-free ``"twin"``."""
    return "twin" if name in TWINS else "topic" if name in TOPIC_MODELS else "lstm"


def measure(folder: Path, what: str) -> dict:
    """The folder's figures on the sample's validation articles; a twin's as it was trained, every context empty."""
    from transformers import AutoModelForCausalLM

    from topic_lm_hf import evaluate_perplexity, evaluate_topics, load_documents
    from topic_lm_hf.evaluation import load_reference_corpus

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    valid = load_documents("wikipedia-sample/validation")
    result = {"parameters": sum(p.numel() for p in model.parameters()),
              "causal-carry": evaluate_perplexity(model, valid, protocol="causal-carry",
                                                  empty_context=what == "twin")}
    if what == "topic":
        result["mismatched"] = evaluate_perplexity(model, valid, protocol="causal-carry", mismatched_context=True)
        result["empty_context"] = evaluate_perplexity(model, valid, protocol="causal-carry", empty_context=True)
        topics = evaluate_topics(model, load_reference_corpus("wikipedia-sample/npmi-reference"))
        result["topics"] = {k: topics[k] for k in ("npmi", "npmi_median", "diversity", "diversity_k", "num_topics")}
        result["topics"]["coherence"] = {k: topics["coherence"][k] for k in ("preset", "reference")
                                         if k in topics["coherence"]}
        result["top_words"] = model.get_topics(top_n=10)
    return json.loads(json.dumps(result, default=str))


def against_lstm(base: float, ppl: float, mismatched: float) -> str:
    """The card's sentence comparing a topic model with the carried LSTM, ahead of it or behind."""
    own = mismatched - ppl
    if ppl <= base:
        return (f"Against the carried LSTM: {100 * (base - ppl) / base:.1f} % lower perplexity ({base - ppl:.2f} "
                f"points); the document's own topics are worth {own:.2f} of them (the ablation).")
    return (f"Against the carried LSTM: {100 * (ppl - base) / base:.1f} % higher perplexity ({ppl - base:.2f} points "
            f"behind it); the document's own topics are worth {own:.2f} points (the ablation): without them it would "
            "be further behind. Its topics are for steering and reading, not for a lower perplexity.")


def against_twin(twin: float, ppl: float, mismatched: float) -> str:
    """The card's sentence comparing a topic model with its topic-free twin, the strongest baseline."""
    own, lead = mismatched - ppl, twin - ppl
    side = (f"{100 * lead / twin:.1f} % lower perplexity ({lead:.2f} points)" if lead >= 0 else
            f"{100 * -lead / twin:.1f} % higher perplexity ({-lead:.2f} points behind it)")
    return (f"Against its topic-free twin (the same model trained alike with every context empty, the strongest "
            f"baseline): {side}; another document's topics cost it {own:.2f} points, "
            + ("more than its lead: the lead is its document's topics'." if own > lead >= 0 else
               "not more than its lead." if lead >= 0 else "so its topics do not pay for their cost here."))


def stopping(name: str) -> str:
    """How ``name``'s command stops and halves the rate, in words, from its flags."""
    args = COMMANDS[name]
    stop = int(args[args.index("--early_stopping_patience") + 1])
    halve = json.loads(args[args.index("--lr_scheduler_kwargs") + 1])["patience"] + 1
    rate = "at every evaluation without improvement" if halve == 1 else f"after {halve} evaluations in a row without it"
    return f"{stop} evaluations without improvement, every 200 steps; the rate halved {rate}"


def card(name: str, measured: dict, stop: dict, command: str, wide: list[str], baseline: dict | None,
         twin: dict | None = None) -> str:
    ppl, what = measured["causal-carry"]["perplexity"], kind(name)
    lines = ["---", "library_name: transformers", "license: cc-by-sa-4.0", "language: en",
             "tags: [topic-lm-hf, topic-guided-language-model, text-generation]", "---", "",
             f"# {name}: {TITLES[name]}", "",
             "Trained with topic-lm-hf on the English Wikipedia sample that ships with the "
             "package (900 training articles, CC BY-SA; the sample's NOTICE names the sources). Small (E = H = 128"
             + (", 50 topics" if what != "lstm" else "") + ") and trained on a 2-core CPU: a demonstration of "
             "the package's result, not a general-purpose language model.", "",
             "```python", "from transformers import AutoModelForCausalLM",
             f'model = AutoModelForCausalLM.from_pretrained("hub_models/{name}", trust_remote_code=True)', "```", ""]
    if what == "twin":
        lines += [f"The topic-free twin of `{TWINS[name]}`: the same model, started and trained the same way (its "
                  "topic model pre-trained on the documents' words as usual), but every context it read in training "
                  "and in its development evaluations was empty, so its topics are the same uninformative ones for "
                  "every document. What its architecture and training bring without the document's topics: the "
                  f"baseline `{TWINS[name]}` is measured against. Evaluate it the same way (`evaluate_perplexity(..., "
                  "empty_context=True)`, `topic-lm evaluate --empty_context true`).", ""]
    lines += ["## Results", "",
              "Validation perplexity on the sample's 100 validation articles, protocol `causal-carry` (the state "
              "carried through each document, each sentence's context only the sentences before it):", "",
              "| model | perplexity |", "|---|---|",
              f"| this model{' (every context empty, as it was trained)' if what == 'twin' else ''} | {ppl:.2f} |"]
    started = " it started from" if "--language_model" in COMMANDS[name] else ""
    if what == "twin" and baseline:
        base = baseline["causal-carry"]["perplexity"]
        lines += [f"| the carried LSTM{started} (`wiki-lstm-carry`) | {base:.2f} |", "",
                  f"Against the carried LSTM: {100 * (base - ppl) / base:+.1f} % ({base - ppl:+.2f} points) in its "
                  "favour, with no information from the document's topics: architecture and training alone."]
    if "mismatched" in measured:
        mis, empty = measured["mismatched"]["perplexity"], measured["empty_context"]["perplexity"]
        lines += [f"| this model, another document's topics (ablation) | {mis:.2f} |",
                  f"| this model, empty contexts (the same uninformative topics for every document) | {empty:.2f} |"]
        if twin:
            lines += [f"| its topic-free twin (`{SHIPPED_TWINS[name]}`), trained alike with every context empty | "
                      f"{twin['causal-carry']['perplexity']:.2f} |"]
        if baseline:
            base = baseline["causal-carry"]["perplexity"]
            lines += [f"| the carried LSTM{started} (`wiki-lstm-carry`) | {base:.2f} |"]
        lines += [""]
        if twin:
            lines += [against_twin(twin["causal-carry"]["perplexity"], ppl, mis), ""]
        if baseline:
            lines += [against_lstm(baseline["causal-carry"]["perplexity"], ppl, mis)]
        npmi = measured["topics"].get("npmi")
        if npmi is not None:
            lines += ["", f"Topics: NPMI {npmi:.3f} (`lau2014`, against the shipped reference articles), diversity "
                      f"{measured['topics'].get('diversity', float('nan')):.2f}. The first five:", ""]
            lines += [f"- {' '.join(words)}" for words in measured["top_words"][:5]]
    lines += ["", "## Training", "",
              f"{stop['steps_trained']} steps (4 documents each), stopped on the development documents "
              f"({stopping(name)}); the weights are those of step {stop['best_step']} "
              f"(development perplexity {stop['best_dev_perplexity']:.2f}). "
              + ("" if stop["metric"] in ("eval_lm_loss", "lm_loss") else
                 f"This run stopped and kept its weights on the whole development loss ({stop['metric']}: the language "
                 "model's plus the topic model's terms); `topic-lm train` now stops on the development perplexity "
                 "(`eval_lm_loss`), so the same command today may train a little longer. ")
              + "The development documents are the sample's 100 validation articles (the command line's default "
              "for this corpus), the ones the results above are measured on, so the figures are a little "
              "optimistic; every shipped model stopped the same way. The command (from the repository root; the runs "
              "resume "
              "where they stopped):", "",
              "```bash", command, "```", "",
              "`python scripts/ship_models.py --train --work out/ship` runs it, measures the result and writes this "
              "folder."]
    if wide:
        lines += ["", f"Stored in float32 and loaded into the model's float64: {', '.join(wide)} (to keep the folder "
                  "under 8 MB); the results above are those of the stored weights."]
    return "\n".join(lines) + "\n"


def measured_of(name: str, results: dict, out: Path) -> dict | None:
    """``name``'s measurements: from this run, else from its written folder, else None."""
    if name in results:
        return results[name]["measured"]
    written = out / name / "results.json"
    return json.loads(written.read_text())["measured"] if written.exists() else None


def baseline(results: dict, out: Path) -> dict | None:
    """What a topic model's card compares it with: the carried LSTM measured in this run, else its written folder."""
    return measured_of("wiki-lstm-carry", results, out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="out/ship", help="the folder of the training runs")
    parser.add_argument("--out", default=str(ROOT / "hub_models"), help="where the model folders are written")
    parser.add_argument("--train", action="store_true", help="train (or resume) the runs first")
    parser.add_argument("--only", nargs="+", choices=list(COMMANDS), default=list(COMMANDS),
                        help="write only these folders (default: all)")
    args = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM

    from topic_lm_hf import load_vocabularies, save_vocabularies

    results = {}
    for name in args.only:
        if args.train:
            train(name, args.work, args.out)
        run = Path(arguments(name, args.work, args.out)[-1])
        run = run if run.is_absolute() else ROOT / run
        folder = Path(args.out) / name
        shutil.rmtree(folder, ignore_errors=True)
        model = AutoModelForCausalLM.from_pretrained(run)
        model.save_pretrained(folder)
        save_vocabularies(*load_vocabularies(run), folder)
        wide = store_float64_as_float32(folder)
        measured = measure(folder, kind(name))
        stop = stopped(run)
        command = command_line(name, args.work, args.out)
        results[name] = {"measured": measured, "training": stop, "command": command, "stored_in_float32": wide}
        (folder / "results.json").write_text(json.dumps(results[name], indent=1) + "\n")
        twin = measured_of(SHIPPED_TWINS[name], results, Path(args.out)) if name in SHIPPED_TWINS else None
        (folder / "README.md").write_text(card(name, measured, stop, command, wide, baseline(results, Path(args.out)),
                                               twin))
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        print(f"{name}: causal-carry {measured['causal-carry']['perplexity']:.2f}, {size / 1e6:.2f} MB", flush=True)
        if size > MAX_BYTES:
            raise SystemExit(f"{folder} is {size / 1e6:.2f} MB, over {MAX_BYTES / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
