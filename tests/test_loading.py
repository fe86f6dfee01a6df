"""Loading saved folders: what the Auto classes report, with and without the package imported."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM

from topic_lm_hf import (LSTMLMConfig, LSTMLMForCausalLM, TCNLMConfig, TCNLMForCausalLM, TopicRNNConfig,
                         TopicRNNForCausalLM, build_vocabularies, save_vocabularies, synthetic_documents)


@pytest.fixture(scope="module")
def vocabularies():
    return build_vocabularies(synthetic_documents(40), min_freq=1)


def _model(family, tok, topic_tok, **sizes):
    sizes = {"embedding_size": 8, "hidden_size": 8, **sizes}
    if family == "lstm_lm":
        return LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), **sizes))
    if family == "tcnlm":
        return TCNLMForCausalLM(TCNLMConfig(vocab_size=len(tok), topic_vocab_size=len(topic_tok), num_topics=3,
                                            **sizes))
    return TopicRNNForCausalLM(TopicRNNConfig.from_tokenizers(tok, topic_tok, num_topics=3, **sizes))


@pytest.mark.parametrize("family, sizes", [("lstm_lm", {}), ("lstm_lm", {"tie_word_embeddings": True, "hidden_size": 12}),
                                           ("tcnlm", {}), ("tcnlm", {"tie_word_embeddings": True, "hidden_size": 12}),
                                           ("topic_rnn", {})])
def test_automodel_loads_the_body_of_a_causal_lm_without_unexpected_keys(family, sizes, vocabularies, tmp_path):
    tok, topic_tok = vocabularies
    lm = _model(family, tok, topic_tok, **sizes)
    lm.save_pretrained(tmp_path)
    body, info = AutoModel.from_pretrained(tmp_path, output_loading_info=True)
    assert info["unexpected_keys"] == set() and info["missing_keys"] == set()
    for name, tensor in body.state_dict().items():  # the body's weights are the causal LM's model.* weights
        assert torch.equal(tensor, lm.state_dict()[f"model.{name}"]), name
    # the ignore list only hides what the body lacks: a causal LM still reports keys it does not know
    state = {**lm.state_dict(), "lm_head.extra": torch.zeros(1)}
    assert set(lm.load_state_dict(state, strict=False).unexpected_keys) == {"lm_head.extra"}


def test_every_save_writes_the_code_and_auto_map_for_trust_remote_code(vocabularies, tmp_path):
    tok, topic_tok = vocabularies
    _model("tcnlm", tok, topic_tok).save_pretrained(tmp_path)
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    assert auto_map == {"AutoConfig": "configuration_tcnlm.TCNLMConfig",
                        "AutoModelForCausalLM": "modeling_tcnlm.TCNLMForCausalLM"}
    assert {"configuration_tcnlm.py", "modeling_tcnlm.py", "modeling_recurrent.py"} <= {p.name for p in tmp_path.iterdir()}
    # with the package imported, its registered class is used, not the copied code
    assert type(AutoModelForCausalLM.from_pretrained(tmp_path)) is TCNLMForCausalLM


def test_without_the_package_transformers_asks_for_trust_remote_code_not_an_upgrade(vocabularies, tmp_path):
    tok, topic_tok = vocabularies
    torch.manual_seed(0)
    model = _model("topic_rnn", tok, topic_tok).eval()
    model.save_pretrained(tmp_path / "m")
    save_vocabularies(tok, topic_tok, tmp_path / "m")
    ids = tok(["the senate said"], return_tensors="pt")["input_ids"]
    script = textwrap.dedent(f"""
        import json, os, sys
        # neither this checkout nor an editable install of the package (a .pth path) stays on the path
        sys.path = [p for p in sys.path if not os.path.isdir(os.path.join(p or ".", "topic_lm_hf"))]
        import importlib.util
        assert importlib.util.find_spec("topic_lm_hf") is None, "the package must not be importable here"
        from transformers import AutoModelForCausalLM
        try:
            AutoModelForCausalLM.from_pretrained({str(tmp_path / 'm')!r})
            message = None
        except ValueError as error:
            message = str(error)
        model = AutoModelForCausalLM.from_pretrained({str(tmp_path / 'm')!r}, trust_remote_code=True).eval()
        print()  # transformers' prompt ("Do you wish to run the custom code? [y/N]") ends without a newline
        print(json.dumps({{"message": message, "logits": model(input_ids=__import__("torch").tensor({ids.tolist()}))
                          .logits[0, -1, :5].tolist()}}))
    """)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules"), "PYTHONPATH": ""}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path,
                          stdin=subprocess.DEVNULL, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "trust_remote_code=True" in result["message"] and "upgrade" not in result["message"]
    expected = model(input_ids=ids).logits[0, -1, :5]
    assert torch.allclose(torch.tensor(result["logits"]), expected, atol=1e-6)
