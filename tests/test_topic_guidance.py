"""Decode-time topic guidance, ``generate(topic_ids=[k], topic_guidance_scale=s)``: against a naive loop that runs
the model twice on the whole sequence at every step, s = 1 as plain generation (exactly), cached as uncached, with
beam search and several return sequences, for every topic family."""

import pytest
import torch
from conftest import topic_family_model, variants

FAMILIES = variants(topic_only=True, representative=True)


def _prompt(tok):
    tok.padding_side = "left"
    return tok(["the court", "police said the"], return_tensors="pt", padding=True)


def naive_guided_greedy(model, prompt, topic_ids, scale, steps):
    """At every step: the conditioned and the prior run on the whole sequence, their mix, the same suppressed
    tokens as generate() (and no end of sequence before ``steps`` tokens)."""
    ids, mask = prompt["input_ids"], prompt["attention_mask"]
    banned = [*(model.generation_config.suppress_tokens or []), model.config.eos_token_id]
    for _ in range(steps):
        with torch.no_grad():
            cond = model(input_ids=ids, attention_mask=mask, topic_ids=topic_ids).logits[:, -1].float()
            prior = model(input_ids=ids, attention_mask=mask).logits[:, -1].float()
        guided = cond + (scale - 1) * (cond - prior)
        guided[:, banned] = float("-inf")
        ids = torch.cat([ids, guided.argmax(-1, keepdim=True)], dim=1)
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
    return ids


@pytest.mark.parametrize("family", FAMILIES)
def test_guided_greedy_equals_the_naive_loop_and_cached_equals_uncached(tiny_vocabularies, family):
    tok, topic_tok = tiny_vocabularies
    model, prompt = topic_family_model(family, tok, topic_tok), _prompt(tok)
    topic_ids = [[1], [2]]
    expected = naive_guided_greedy(model, prompt, torch.tensor(topic_ids), 4.0, steps=6)
    kwargs = dict(topic_ids=topic_ids, topic_guidance_scale=4.0, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    cached = model.generate(**prompt, **kwargs)
    assert torch.equal(cached, expected)
    assert torch.equal(model.generate(**prompt, **kwargs, use_cache=False), expected)
    first = dict(topic_ids=topic_ids, max_new_tokens=1, do_sample=False, output_scores=True, return_dict_in_generate=True)
    guided_scores = model.generate(**prompt, **first, topic_guidance_scale=4.0).scores[0]
    plain_scores = model.generate(**prompt, **first).scores[0]
    finite = torch.isfinite(plain_scores)
    assert not torch.allclose(guided_scores[finite], plain_scores[finite])  # the guidance moves the scores


@pytest.mark.parametrize("family", FAMILIES)
def test_scale_one_is_plain_generation_exactly(tiny_vocabularies, family):
    tok, topic_tok = tiny_vocabularies
    model, prompt = topic_family_model(family, tok, topic_tok), _prompt(tok)
    kwargs = dict(topic_ids=[3], max_new_tokens=5, do_sample=False, output_scores=True, return_dict_in_generate=True)
    guided, plain = model.generate(**prompt, **kwargs, topic_guidance_scale=1.0), model.generate(**prompt, **kwargs)
    assert torch.equal(guided.sequences, plain.sequences)
    assert all(torch.equal(a, b) for a, b in zip(guided.scores, plain.scores))


@pytest.mark.parametrize("family", ["tcnlm", "rgbn"])
def test_beam_search_and_return_sequences_follow_the_beams(tiny_vocabularies, family):
    tok, topic_tok = tiny_vocabularies
    model, prompt = topic_family_model(family, tok, topic_tok), _prompt(tok)
    kwargs = dict(topic_ids=[1], topic_guidance_scale=3.0, max_new_tokens=5, num_beams=3, num_return_sequences=2)
    cached = model.generate(**prompt, **kwargs)
    assert cached.shape == (4, prompt["input_ids"].shape[1] + 5)
    assert torch.equal(cached, model.generate(**prompt, **kwargs, use_cache=False))  # the prior state follows beams
    torch.manual_seed(0)
    sampled = model.generate(**prompt, topic_ids=[1], topic_guidance_scale=3.0, max_new_tokens=5, do_sample=True,
                             num_return_sequences=3, top_k=5)
    assert sampled.shape[0] == 6


def test_guidance_needs_a_conditioning_and_a_scale(tiny_vocabularies):
    tok, topic_tok = tiny_vocabularies
    model, prompt = topic_family_model("tcnlm", tok, topic_tok), _prompt(tok)
    with pytest.raises(ValueError, match=r"topic_guidance_scale guides towards a conditioning: give one of"):
        model.generate(**prompt, topic_guidance_scale=2.0, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"topic_guidance_scale must be a number in \[0, 100\]"):
        model.generate(**prompt, topic_ids=[1], topic_guidance_scale=-1.0, max_new_tokens=2)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("first_guided", [True, False])
def test_guided_generation_continued_from_its_cache_equals_one_run_in_both_conventions(tiny_vocabularies, family,
                                                                                     first_guided):
    """Continuing a guided generation from the returned cache (``past_key_values=``) gives the tokens and the scores
    of one longer run, whether the continuation is given the tokens after what the cache read (the package's short
    form, ``out.sequences[:, -1:]``) or the whole sequence (the transformers convention, ``out.sequences``): the
    guidance's prior continues from the prefix too, and no token is read twice. The first part may be unguided."""
    tok, topic_tok = tiny_vocabularies
    model, prompt = topic_family_model(family, tok, topic_tok), _prompt(tok)
    topic_ids = [[1], [2]]
    go = dict(do_sample=False, output_scores=True, return_dict_in_generate=True)
    one = model.generate(**prompt, topic_ids=topic_ids, topic_guidance_scale=3.0, max_new_tokens=7,
                         min_new_tokens=7, **go)
    first = model.generate(**prompt, topic_ids=topic_ids, topic_guidance_scale=3.0 if first_guided else None,
                           max_new_tokens=3, min_new_tokens=3, **go)
    if first_guided:
        assert torch.equal(first.sequences, one.sequences[:, :first.sequences.shape[1]])
    rest = dict(topic_guidance_scale=3.0, max_new_tokens=4, min_new_tokens=4, **go)
    short = model.generate(first.sequences[:, -1:], past_key_values=first.past_key_values, **rest)
    whole = model.generate(first.sequences, past_key_values=first.past_key_values,
                           attention_mask=torch.cat([prompt["attention_mask"],
                                                     torch.ones(2, 3, dtype=torch.long)], 1), **rest)
    if first_guided:
        assert torch.equal(short.sequences[:, 1:], one.sequences[:, -4:])
        for a, b in zip(short.scores, one.scores[3:]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)  # the prefix read in other pieces: rounding
    assert torch.equal(whole.sequences[:, :first.sequences.shape[1]], first.sequences)  # the convention: all of it
    assert torch.equal(whole.sequences[:, -4:], short.sequences[:, 1:])
    full_mask = torch.cat([prompt["attention_mask"], torch.ones(2, 3, dtype=torch.long)], 1)
    expected = naive_guided_greedy(model, {"input_ids": first.sequences, "attention_mask": full_mask},
                                   torch.tensor(topic_ids), 3.0, steps=4)
    assert torch.equal(whole.sequences, expected)
    for a, b in zip(whole.scores, short.scores):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    # and again from the continuation's own cache
    again = model.generate(whole.sequences, past_key_values=whole.past_key_values, max_new_tokens=1,
                           min_new_tokens=1, topic_guidance_scale=3.0, do_sample=False)
    longer = model.generate(**prompt, topic_ids=topic_ids, topic_guidance_scale=3.0, max_new_tokens=8,
                            min_new_tokens=8, do_sample=False) if first_guided else None
    if first_guided:
        assert torch.equal(again, longer)
