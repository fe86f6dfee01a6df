"""The LSTM baseline: Auto classes, safetensors, cached / padded / beam generation, bad input."""

import pytest
import torch
from transformers import AutoModel, AutoModelForCausalLM

from topic_lm_hf import LSTMLMConfig, LSTMLMForCausalLM, build_vocabularies, synthetic_documents


@pytest.fixture(scope="module")
def tok():
    tok, _ = build_vocabularies(synthetic_documents(60), min_freq=1)
    tok.padding_side = "left"
    return tok


def small_model(vocab_size, layers=2, tie=False, **kw):
    torch.manual_seed(0)
    config = LSTMLMConfig(vocab_size=vocab_size, embedding_size=12, hidden_size=16, num_hidden_layers=layers,
                          dropout=0.1, tie_word_embeddings=tie, initializer_range=0.5, **kw)
    return LSTMLMForCausalLM(config).eval()


def test_save_auto_load_gives_identical_logits_and_safetensors(tmp_path, tok):
    model = small_model(len(tok))
    batch = tok(["the senate said", "police"], return_tensors="pt", padding=True)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists() and not list(tmp_path.glob("*.bin"))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is LSTMLMForCausalLM
    # identical weights; CPU kernels may differ in the last bits between module instances
    torch.testing.assert_close(model(**batch).logits, loaded(**batch).logits, rtol=1e-5, atol=1e-8)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    base = AutoModel.from_pretrained(tmp_path).eval()
    hidden = base(**batch).last_hidden_state
    torch.testing.assert_close(hidden, model.model(**batch)[0], rtol=1e-5, atol=1e-8)


def test_tied_embeddings_store_one_matrix(tmp_path, tok):
    model = small_model(len(tok), tie=True)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    model.save_pretrained(tmp_path)
    from safetensors import safe_open

    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert "model.embed_tokens.weight" in keys and "lm_head.weight" not in keys
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()


def test_running_in_two_chunks_with_the_state_equals_one_pass(tok):
    model = small_model(len(tok))
    ids = tok(["the senate said the company will vote on monday"], return_tensors="pt")["input_ids"]
    full = model(input_ids=ids, use_cache=True)
    first = model(input_ids=ids[:, :4], use_cache=True)
    rest = model(input_ids=ids[:, 4:], state=first.state, use_cache=True)
    torch.testing.assert_close(torch.cat([first.logits, rest.logits], 1), full.logits, rtol=1e-5, atol=1e-5)
    for a, b in zip(rest.state, full.state):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_right_padding_does_not_change_real_positions_or_state(tok):
    model = small_model(len(tok))
    tok.padding_side = "right"
    batch = tok(["the senate said the bill", "police"], return_tensors="pt", padding=True)
    tok.padding_side = "left"
    alone = model(**tok(["police"], return_tensors="pt"), use_cache=True)
    both = model(**batch, use_cache=True)
    n = alone.logits.shape[1]
    torch.testing.assert_close(both.logits[1, :n], alone.logits[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(both.state[0][1], alone.state[0][0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs", [dict(do_sample=False), dict(num_beams=3, do_sample=False),
                                    dict(num_beams=3, num_return_sequences=2, do_sample=False)],
                         ids=["greedy", "beam", "beam-nrs"])
def test_cached_equals_uncached_and_batch_equals_one_by_one(tok, kwargs):
    model = small_model(len(tok))
    prompts = ["the senate said", "police", "a storm in the coast is"]
    batch = tok(prompts, return_tensors="pt", padding=True)
    cached = model.generate(**batch, max_new_tokens=8, min_new_tokens=8, **kwargs)
    uncached = model.generate(**batch, max_new_tokens=8, min_new_tokens=8, use_cache=False, **kwargs)
    assert torch.equal(cached, uncached)
    n = kwargs.get("num_return_sequences", 1)
    for i, prompt in enumerate(prompts):
        single = model.generate(**tok([prompt], return_tensors="pt"), max_new_tokens=8, min_new_tokens=8, **kwargs)
        assert torch.equal(cached[i * n:(i + 1) * n, -8:], single[:, -8:])


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
