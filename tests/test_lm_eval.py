"""lm-evaluation-harness scores a saved model as the package does: the word perplexity of a rolling-loglikelihood
task (as wikitext is) over real APNEWS sentences equals ``evaluate_perplexity``'s, offline."""

import json
import math
import re

import pytest
import torch

from topic_lm_hf import LSTMLMConfig, LSTMLMForCausalLM, build_vocabularies, evaluate_perplexity, load_documents


pytest.importorskip("lm_eval", reason="lm_eval is not installed (pip install -e .[test])")

# A wikitext-like task over a local JSON lines file: one sentence per line, ending with the end-of-sentence token
# (the package predicts it; lm_eval predicts what the text holds).
TASK = """task: apnews_sentences
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
    aggregation: weighted_perplexity
    higher_is_better: false
"""


def test_lm_eval_word_perplexity_equals_evaluate_perplexity(tmp_path, monkeypatch):
    docs = load_documents("wikipedia-sample/validation", max_documents=2)
    tok, _ = build_vocabularies(docs, min_freq=2)
    torch.manual_seed(0)
    model = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), embedding_size=16, hidden_size=16)).eval()
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    sentences = [s for doc in docs["sentences"] for s in doc]
    lines = [" ".join(s) + " " + tok.eos_token for s in sentences]
    (tmp_path / "sentences.jsonl").write_text("".join(json.dumps({"text": line}) + "\n" for line in lines))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "apnews_sentences.yaml").write_text(TASK.format(data=tmp_path / "sentences.jsonl"))

    # The package: every sentence one chunk from <bos> (causal protocol), <eos> predicted.
    ours = evaluate_perplexity(model, [[s] for s in sentences], protocol="causal", tokenizer=tok,
                               max_sentence_length=1000)
    words = sum(len(re.split(r"\s+", line)) for line in lines)  # lm_eval's word count
    expected = math.exp(ours["nll"] / words)

    # lm_eval's Python API with add_bos_token=False (the README's model argument), offline.
    import datasets
    import huggingface_hub
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    out = simple_evaluate(model="hf", model_args={"pretrained": str(tmp_path / "model"), "add_bos_token": False},
                          tasks=["apnews_sentences"],
                          task_manager=TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False),
                          device="cpu", batch_size=1)
    measured = out["results"]["apnews_sentences"]["word_perplexity,none"]
    assert measured == pytest.approx(expected, rel=1e-4)
