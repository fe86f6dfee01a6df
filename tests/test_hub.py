"""Hub sharing: remote code loads without the package; the card names its protocols; push uploads."""

import json
from pathlib import Path

import torch
from huggingface_hub import ModelCard

from topic_lm_hf import LSTMLMConfig, LSTMLMForCausalLM, build_vocabularies, synthetic_documents
from topic_lm_hf.hub import push_to_hub, save_for_hub

from conftest import run_without_package


def test_saved_folder_loads_with_remote_code_in_a_process_without_the_package(tmp_path):
    tok, topic_tok = build_vocabularies(synthetic_documents(40), min_freq=1)
    torch.manual_seed(0)
    model = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), embedding_size=8, hidden_size=8)).eval()
    save_for_hub(model, tmp_path / "repo", tok, topic_tok,
                 results=[{"protocol": "causal", "perplexity": 123.456, "tokens": 99, "dataset": "apnews valid"}])
    files = {p.name for p in (tmp_path / "repo").iterdir()}
    assert {"modeling_lstm_lm.py", "configuration_lstm_lm.py", "modeling_common.py", "model.safetensors",
            "tokenizer.json", "topic_tokenizer", "README.md"} <= files
    auto_map = json.loads((tmp_path / "repo" / "config.json").read_text())["auto_map"]
    assert auto_map["AutoModelForCausalLM"] == "modeling_lstm_lm.LSTMLMForCausalLM"
    assert auto_map["AutoModel"] == "modeling_lstm_lm.LSTMLMModel"
    card = ModelCard.load(tmp_path / "repo" / "README.md")
    assert "| apnews valid | causal | 123.46 | 99 |" in card.text and "custom_code" in card.data.tags

    ids = tok(["the senate said"], return_tensors="pt")["input_ids"]
    expected = model(input_ids=ids).logits[0, -1, :5].tolist()
    result = run_without_package(f"""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        model = AutoModelForCausalLM.from_pretrained({str(tmp_path / 'repo')!r}, trust_remote_code=True).eval()
        tok = AutoTokenizer.from_pretrained({str(tmp_path / 'repo')!r}, trust_remote_code=True)
        ids = tok(["the senate said"], return_tensors="pt")["input_ids"]
        out = model.generate(input_ids=ids, max_new_tokens=3, min_new_tokens=3, do_sample=False)
        print(json.dumps({{"cls": type(model).__module__, "logits": model(input_ids=ids).logits[0, -1, :5].tolist(),
                          "generated": out.shape[1]}}))
    """, tmp_path)
    assert result["cls"].startswith("transformers_modules")
    assert torch.allclose(torch.tensor(result["logits"]), torch.tensor(expected), atol=1e-6)
    assert result["generated"] == ids.shape[1] + 3


def test_push_to_hub_uploads_the_saved_folder(monkeypatch, tmp_path):
    uploaded = {}

    class FakeApi:
        def __init__(self, token=None):
            pass

        def create_repo(self, repo_id, private=False, exist_ok=True):
            uploaded["repo"] = repo_id

        def upload_folder(self, repo_id, folder_path, commit_message):
            uploaded["files"] = sorted(str(p.relative_to(folder_path)) for p in Path(folder_path).rglob("*") if p.is_file())

    monkeypatch.setattr("topic_lm_hf.hub.HfApi", FakeApi)
    tok, topic_tok = build_vocabularies(synthetic_documents(20), min_freq=1)
    model = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), embedding_size=4, hidden_size=4))
    push_to_hub(model, "me/lstm-test", tok, topic_tok)
    assert uploaded["repo"] == "me/lstm-test"
    assert "model.safetensors" in uploaded["files"] and "topic_tokenizer/tokenizer.json" in uploaded["files"]
