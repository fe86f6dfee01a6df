"""The LSTM baseline: generation continued from a returned state, bad input. The save / load round trip, tied
embeddings, padding, state equivalence, cached generation and remote code are in test_model_contract.py."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from topic_lm_hf import LSTMLMConfig, LSTMLMForCausalLM, build_vocabularies, synthetic_documents


@pytest.fixture(scope="module")
def tok():
    tok, _ = build_vocabularies(synthetic_documents(60), min_freq=1)
    tok.padding_side = "left"
    return tok


def small_model(vocab_size, layers=2, **kw):
    torch.manual_seed(0)
    config = LSTMLMConfig(vocab_size=vocab_size, embedding_size=12, hidden_size=16, num_hidden_layers=layers,
                          dropout=0.1, initializer_range=0.5, **kw)
    return LSTMLMForCausalLM(config).eval()


def test_generation_can_continue_from_a_returned_state(tok):
    model = small_model(len(tok))
    prompt = tok(["the senate said"], return_tensors="pt")
    one_shot = model.generate(**prompt, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    first = model.generate(**prompt, max_new_tokens=3, min_new_tokens=3, do_sample=False,
                           return_dict_in_generate=True)
    rest = model.generate(input_ids=first.sequences[:, -1:], state=first.past_key_values, max_new_tokens=3,
                          min_new_tokens=3, do_sample=False)
    assert torch.equal(torch.cat([first.sequences, rest[:, 1:]], 1), one_shot)


def test_bad_input_is_a_clear_error(tmp_path, tok):
    model = small_model(len(tok))
    with pytest.raises(ValueError, match="input_ids must be in"):
        model(input_ids=torch.tensor([[2, len(tok) + 5]]))
    with pytest.raises(ValueError, match="not used by the model"):
        model.generate(**tok(["the"], return_tensors="pt"), topic_ids=[1], max_new_tokens=2)
    with pytest.raises(ValueError, match="hidden_size"):
        LSTMLMConfig(vocab_size=10, hidden_size=0)
    model.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes((tmp_path / "model.safetensors").read_bytes()[:200])
    with pytest.raises(OSError, match="corrupt or truncated"):
        AutoModelForCausalLM.from_pretrained(tmp_path)
