"""Fixed-seed parity figures of every family, computed through the public API only.

A small model of each family is trained for a few steps on real APNEWS documents with
``TopicLMTrainer``, then evaluated: perplexity under every protocol (the sliding window and the
mismatched-context ablation included), the steering figures of ``evaluate_steering`` and greedy
generated tokens with and without topic conditioning. ``tests/parity_reference.json`` holds the
figures recorded before the family-contract refactor; ``tests/test_parity.py`` recomputes them.

Regenerate the reference (only when a change is *meant* to change results, and say so):
``python tests/parity.py --write``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch

REFERENCE = Path(__file__).with_name("parity_reference.json")
# (config class name, config kwargs, training context, training layout, reads the sentence prefix)
FAMILIES = {
    "lstm_lm": ("LSTMLMConfig", {}, "none", "sentences", False),
    "tcnlm": ("TCNLMConfig", {"num_topics": 4, "num_factors": 8, "encoder_hidden_size": 16,
                              "topic_embedding_size": 8}, "others", "sentences", False),
    "topic_rnn-lstm": ("TopicRNNConfig", {"cell": "lstm", "num_topics": 4, "inference_hidden_size": 16},
                       "others", "sentences", False),
    "nclm-leta-sdt": ("NCLMConfig", {"variant": "leta", "sentence_topics": True, "num_topics": 4,
                                     "encoder_hidden_size": 16, "etr_top_n": 5, "num_topic_samples": 2},
                      "others", "sentences", True),
    "rgbn_rnn": ("RGBNRNNConfig", {"topic_sizes": [4, 3], "hidden_sizes": [16, 16]}, "preceding", "documents",
                 False),
}


def build(family: str, tok, topic_tok):
    import topic_lm_hf

    config_name, kwargs, *_ = FAMILIES[family]
    config_class = getattr(topic_lm_hf, config_name)
    sizes = {"embedding_size": 16, "dropout": 0.0}
    if family != "rgbn_rnn":
        sizes["hidden_size"] = 16
    torch.manual_seed(0)
    if family == "lstm_lm":
        config = config_class(vocab_size=len(tok), pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                              eos_token_id=tok.eos_token_id, unk_token_id=tok.unk_token_id, **sizes)
    else:
        config = config_class.from_tokenizers(tok, topic_tok, **sizes, **kwargs)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(config)


def training_collator(family: str, model, tok, topic_tok):
    from topic_lm_hf import TopicContextCollator

    _, _, context, layout, prefix = FAMILIES[family]
    if hasattr(TopicContextCollator, "for_model"):
        return TopicContextCollator.for_model(model, tok, topic_tok, max_sentence_length=15)
    return TopicContextCollator(tok, topic_tok, context=context, layout=layout, sentence_prefix=prefix,
                                max_sentence_length=15)


def _generate(model, prompt, **conditioning) -> dict:
    """Greedy tokens, sampled tokens (seed 0) and the five largest log-probabilities of the first step."""
    greedy = model.generate(**prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False, output_scores=True,
                            return_dict_in_generate=True, **conditioning)
    torch.manual_seed(0)
    sampled = model.generate(**prompt, max_new_tokens=12, min_new_tokens=12, do_sample=True, top_k=0,
                             **conditioning)
    first = torch.log_softmax(greedy.scores[0][0].double(), -1)  # suppressed tokens: -inf
    top = first.topk(5).values.tolist()
    return {"greedy": greedy.sequences[0].tolist(), "sampled": sampled[0].tolist(), "top_log_probs": top}


def figures(family: str, train_docs, valid_docs, tok, topic_tok, steps: int = 30) -> dict:
    """Train ``family`` for ``steps`` steps from seed 0 and return its parity figures."""
    from transformers import TrainingArguments

    from topic_lm_hf import TopicLMTrainer, evaluate_perplexity, evaluate_steering
    from topic_lm_hf.evaluation import evaluate_perplexity_sliding_window

    model = build(family, tok, topic_tok)
    collator = training_collator(family, model, tok, topic_tok)
    rows = collator.prepare(train_docs)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=steps, learning_rate=1e-2,
                                 report_to=[], use_cpu=True, seed=0, disable_tqdm=True, save_strategy="no",
                                 logging_steps=1, dataloader_num_workers=0, eval_strategy="no")
        trainer = TopicLMTrainer(model=model, args=args, data_collator=collator, train_dataset=rows)
        trainer.train()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    model.eval()
    kw = dict(tokenizer=tok, topic_tokenizer=topic_tok, batch_size=16, max_sentence_length=15)
    result = {"losses": losses, "perplexity": {}}
    for protocol in ("paper", "causal", "causal-carry"):
        result["perplexity"][protocol] = evaluate_perplexity(model, valid_docs, protocol, **kw)["perplexity"]
        if family != "lstm_lm":
            result["perplexity"][protocol + " mismatched"] = evaluate_perplexity(
                model, valid_docs, protocol, mismatched_context=True, **kw)["perplexity"]
    result["perplexity"]["sliding-window"] = evaluate_perplexity_sliding_window(
        model, valid_docs, window=20, **kw)["perplexity"]
    prompt = tok(["the senate said"], return_tensors="pt")
    result["generated"] = {"plain": _generate(model, prompt)}
    if family != "lstm_lm":
        bow = collator([rows[0]])["context_bow"]
        bow = bow.reshape(-1, bow.shape[-1])[:1]
        result["generated"]["context_bow"] = _generate(model, prompt, context_bow=bow)
        result["generated"]["topic_ids"] = _generate(model, prompt, topic_ids=[1])
        steering = evaluate_steering(model, topics=[0, 1], num_samples=3, max_new_tokens=8, tokenizer=tok,
                                     topic_tokenizer=topic_tok, seed=0)
        result["steering"] = {k: steering[k] for k in ("accuracy_own", "share_steered", "share_unconditioned",
                                                       "distinct_1", "distinct_2")}
    return result


def all_figures(data: Path) -> dict:
    from topic_lm_hf import build_vocabularies, load_documents

    torch.set_num_threads(1)
    train = load_documents(data / "apnews" / "train.txt", max_documents=40)
    valid = load_documents(data / "apnews" / "valid.txt", max_documents=6)
    tok, topic_tok = build_vocabularies(train, min_freq=3, stopwords="mallet")
    return {family: figures(family, train, valid, tok, topic_tok) for family in FAMILIES}


if __name__ == "__main__":
    import os

    found = all_figures(Path(os.environ.get("TOPIC_LM_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")))
    text = json.dumps(found, indent=1)
    if "--write" in sys.argv:
        REFERENCE.write_text(text + "\n")
    print(text)
