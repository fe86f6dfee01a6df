"""Pre-training the topic model alone on bags of words (``pretrain_topic_model``) in every topic family, on real
APNEWS documents: the objective falls, the LM is untouched, early stopping on a development split keeps the best
topic model; and with the shared topic output prior a pre-trained topic model steers while an untrained one is at
chance."""

import pytest
import torch
from conftest import tiny_model, variants

from topic_lm_hf import TopicContextCollator, evaluate_steering, pretrain_topic_model
from topic_lm_hf.families import variant_of
from topic_lm_hf.pretraining import topic_model_objective

pytestmark = pytest.mark.usefixtures("one_thread")

# One variant per topic family; for NCLM its LETA without sentence-level topics (the document topics alone).
FAMILIES = variants(topic_only=True, representative=True, nclm="nclm-leta")
TOPICS = 10
# The sizes of this file's models besides conftest's, per model_type: TOPICS topics (rGBN-RNN: in its first layer).
SIZES = {"rgbn_rnn": {"topic_sizes": [TOPICS, 4]}, "nclm": {"num_topics": TOPICS, "encoder_hidden_size": 32,
                                                              "num_topic_samples": 1}}


def _model(family, tok, topic_tok, **overrides):
    sizes = SIZES.get(variant_of(family)[0].model_type, {"num_topics": TOPICS})
    return tiny_model(family, tok, topic_tok, **sizes, **overrides)


def _rows(model, wiki):
    collator = TopicContextCollator.for_model(model, wiki["tok"], wiki["topic_tok"], protocol="pretraining")
    return collator.prepare(wiki["train"]), collator.prepare(wiki["valid"]), collator


@pytest.mark.parametrize("family", FAMILIES)
def test_the_pretraining_batches_are_the_training_batches_or_whole_documents_bags(wiki, family):
    """rGBN-RNN declares whole documents' bags (one row per document, its whole bag of words); every other family
    is pre-trained on its training batches, under the training context a caller chooses."""
    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
    model = _model(family, tok, topic_tok)
    docs = wiki["valid"].select(range(5))
    pretraining = TopicContextCollator.for_model(model, tok, topic_tok, protocol="pretraining")
    if family == "rgbn":
        document = TopicContextCollator.for_model(model, tok, topic_tok, protocol="document")
        assert (pretraining.context, pretraining.layout) == ("document", "sequence")
        batch = pretraining([row for row in pretraining.prepare(docs)])
        assert batch["context_bow"].shape == (5, len(topic_tok))
        assert torch.equal(batch["context_bow"], document([row for row in document.prepare(docs)])["context_bow"])
        # the bag of a document is its topic words (the first max_context_tokens of them)
        words = [w for sentence in docs[0]["sentences"] for w in sentence]
        in_vocab = [topic_tok.convert_tokens_to_ids(w) for w in words if w in topic_tok.get_vocab()]
        assert batch["context_bow"][0].sum() == min(len(in_vocab), pretraining.max_context_tokens)
    else:
        for context in (None, "preceding"):
            chosen = TopicContextCollator.for_model(model, tok, topic_tok, protocol="pretraining", context=context)
            training = TopicContextCollator.for_model(model, tok, topic_tok, context=context)
            assert (chosen.context, chosen.layout, chosen.sentence_prefix) == \
                (training.context, training.layout, training.sentence_prefix)


def _topic_part(model):
    """Names of the parameters and buffers that pre-training may change."""
    topic = {id(p) for p in model.topic_model_parameters()}
    return {n for n, p in model.named_parameters() if id(p) in topic} | \
        {n for n, _ in model.named_buffers() if n.startswith("model.phi_") or n.startswith("model.pi_")
         or "tlasgr" in n}


@pytest.mark.parametrize("family", FAMILIES)
def test_pretraining_lowers_the_topic_objective_and_leaves_the_lm_alone(wiki, family):
    model = _model(family, wiki["tok"], wiki["topic_tok"])
    train, valid, collator = _rows(model, wiki)
    topic_part = _topic_part(model)
    before = {n: t.detach().clone() for n, t in model.state_dict().items()}
    start = topic_model_objective(model, valid, collator)
    result = pretrain_topic_model(model, train, collator, steps=60, batch_size=16, learning_rate=5e-3)
    assert result.steps == 60 and result.stopped_by == "steps" and result.best_step == 60
    assert topic_model_objective(model, valid, collator) < start - 0.1
    after = model.state_dict()
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and changed <= topic_part, changed - topic_part
    if family == "rgbn":  # Phi and Pi learnt by TLASGR-MCMC after each optimizer step
        assert {"model.phi_1", "model.pi_1"} <= changed
        assert torch.allclose(model.model.phi(1).sum(0).double(), torch.ones(TOPICS, dtype=torch.float64))


@pytest.mark.parametrize("family", ["tcnlm", "rgbn"])
def test_early_stopping_keeps_the_best_topic_model(wiki, family):
    model = _model(family, wiki["tok"], wiki["topic_tok"])
    train, valid, collator = _rows(model, wiki)
    # A high learning rate on 300 documents: the development objective stops improving within 200 steps.
    result = pretrain_topic_model(model, train, collator, steps=200, batch_size=16, learning_rate=0.05,
                                  eval_dataset=valid, eval_every=5, patience=2)
    assert result.stopped_by == "patience" and result.steps < 200
    steps = [s for s, _ in result.dev_losses]
    assert steps[0] == 0 and steps == sorted(steps) and len(steps) >= 3
    assert [s for s, _ in result.dev_losses if s > result.best_step] == steps[-2:]
    assert topic_model_objective(model, valid, collator, batch_size=16) == pytest.approx(result.best_dev_loss,
                                                                                          rel=1e-6)


def test_pretraining_refuses_what_it_cannot_do(wiki):
    model = _model("tcnlm", wiki["tok"], wiki["topic_tok"])
    train, _, collator = _rows(model, wiki)
    with pytest.raises(ValueError, match="eval_dataset is empty"):
        pretrain_topic_model(model, train, collator, steps=1, eval_dataset=[])
    with pytest.raises(ValueError, match="steps must be an integer"):
        pretrain_topic_model(model, train, collator, steps=1.5)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_pretrained_topic_model_with_the_prior_steers_and_an_untrained_one_is_at_chance(wiki, family):
    """The LM is untrained in both: what steers is the topic model, through the shared topic output prior."""
    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
    settings = dict(topics=list(range(TOPICS)), num_samples=4, max_new_tokens=12, tokenizer=tok,
                    topic_tokenizer=topic_tok, seed=0)
    untrained = _model(family, tok, topic_tok).eval()
    chance = evaluate_steering(untrained, **settings)
    model = _model(family, tok, topic_tok, topic_output_bias="beta", topic_prior_weight_init=4.0)
    train, _, collator = _rows(model, wiki)
    # 300 steps: on these 300 Wikipedia articles (more subjects than news) NCLM's NVDM steered 0.275 after 150
    pretrain_topic_model(model, train, collator, steps=300, batch_size=32, learning_rate=1e-2)
    steered = evaluate_steering(model.eval(), **settings)
    # accuracy_own_topics: a text's topic is the most likely one under the model's topic-word distributions;
    # share: the share of generated words among the steered topic's top 50.
    assert chance["accuracy_own_topics"] <= 0.35, chance  # chance: 0.10
    assert steered["accuracy_own_topics"] >= 0.45, steered
    assert steered["share_steered"] >= 0.25 and steered["share_steered"] > 5 * chance["share_steered"], steered


def test_topic_rnn_bag_of_words_term_is_the_naive_likelihood_per_context_word(wiki):
    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
    plain = _model("topic_rnn-lstm", tok, topic_tok).eval()
    model = _model("topic_rnn-lstm", tok, topic_tok, bow_loss_weight=2.0).eval()
    model.load_state_dict(plain.state_dict())
    _, valid, collator = _rows(model, wiki)
    batch = collator([valid[i] for i in range(4)])
    with torch.no_grad():
        base, out = plain(**batch), model(**batch)
        theta = model.infer_topics(batch["context_bow"])  # eval mode: the posterior mean, as forward uses
        B = model.topic_head.weight.float()  # (V_c, K)
    usable = [i >= 0 for i in model.config.topic_word_ids]
    nll = words = 0.0
    for row in range(4):  # the naive loop: -sum_w n_w log softmax(B theta)_w over the usable topic words
        logits = (B @ theta[row].float()).tolist()
        norm = torch.logsumexp(torch.tensor([v for v, u in zip(logits, usable) if u]), 0).item()
        for w, count in enumerate(batch["context_bow"][row].tolist()):
            if count and usable[w]:
                nll += count * (norm - logits[w])
                words += count
    assert base.bow_loss is None
    assert float(out.bow_loss) == pytest.approx(nll / words, rel=1e-4)
    assert float(out.loss - base.loss) == pytest.approx(2.0 * float(out.bow_loss), rel=1e-4)


class _Killed(Exception):
    pass


@pytest.mark.parametrize("family", FAMILIES)
def test_an_interrupted_pretraining_resumes_from_its_last_checkpoint_and_equals_an_uninterrupted_one(family, tmp_path):
    """Checkpoints every 2 steps; a run killed after step 4 (its last checkpoint: step 2, a file cut short beside it
    is skipped) resumes and ends as the uninterrupted run, weights, losses and development record alike; a finished
    run's checkpoint returns at once."""
    from topic_lm_hf import build_vocabularies, synthetic_documents

    docs = synthetic_documents(24)
    tok, topic_tok = build_vocabularies(docs, min_freq=1)

    def run(folder, callback=None):
        torch.manual_seed(0)
        model = tiny_model(family, tok, topic_tok)
        collator = TopicContextCollator.for_model(model, tok, topic_tok, protocol="pretraining")
        rows = collator.prepare(docs)
        result = pretrain_topic_model(model, rows, collator, steps=6, batch_size=4, seed=0,
                                      eval_dataset=rows.select(range(4)), eval_every=3, patience=5,
                                      callback=callback, checkpoint_dir=str(folder), save_every=2)
        return model, result

    def killed_after_step_4(step, loss):
        if step == 3:
            raise _Killed

    full, full_result = run(tmp_path / "full")
    with pytest.raises(_Killed):
        run(tmp_path / "cut", killed_after_step_4)
    assert sorted(p.name for p in (tmp_path / "cut").iterdir()) == ["pretraining-2.pt"]
    (tmp_path / "cut" / "pretraining-4.pt").write_bytes(b"PK\x03\x04 cut short")
    steps = []
    resumed, result = run(tmp_path / "cut", lambda step, loss: steps.append(step))
    assert steps == [2, 3, 4, 5]
    assert result.losses == full_result.losses and result.dev_losses == full_result.dev_losses
    for (name, a), b in zip(full.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    steps.clear()
    again, again_result = run(tmp_path / "cut", lambda step, loss: steps.append(step))
    assert steps == [] and again_result.losses == full_result.losses
    for (name, a), b in zip(full.state_dict().items(), again.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("family", ["tcnlm", "rgbn"])
def test_a_checkpoint_of_another_configuration_or_other_data_is_refused_not_resumed(family, tmp_path):
    """A finished or interrupted pre-training run's checkpoint is reused only by the same run: another model
    configuration (e.g. another diversity weight), other training rows, another development set or another
    collator setting is refused with the differing field named (the run used to return the old weights at once)."""
    from topic_lm_hf import build_vocabularies, synthetic_documents

    docs = synthetic_documents(24)
    tok, topic_tok = build_vocabularies(docs, min_freq=1)

    def run(n_docs=24, dev=4, max_context_tokens=None, **overrides):
        torch.manual_seed(0)
        model = tiny_model(family, tok, topic_tok, **overrides)
        collator = TopicContextCollator.for_model(model, tok, topic_tok, protocol="pretraining")
        if max_context_tokens is not None:
            collator.max_context_tokens = max_context_tokens
        rows = collator.prepare(docs.select(range(n_docs)))
        return pretrain_topic_model(model, rows, collator, steps=4, batch_size=4, seed=0,
                                    eval_dataset=rows.select(range(dev)), eval_every=2, patience=5,
                                    checkpoint_dir=str(tmp_path), save_every=2)

    first = run()
    assert run().losses == first.losses  # the same run: the finished checkpoint, at once
    field = "dropout"
    with pytest.raises(ValueError, match=rf"other settings \(model\.{field}: .* there, 0\.3 now"):
        run(**{field: 0.3})
    with pytest.raises(ValueError, match=r"\(rows: '\d+:\w+' there, '\d+:\w+' now[;)]"):
        run(n_docs=20)
    with pytest.raises(ValueError, match=r"\(dev_rows: '4:\w+' there, '3:\w+' now\)"):
        run(dev=3)
    with pytest.raises(ValueError, match=r"collator\.max_context_tokens: 300 there, 7 now"):
        run(max_context_tokens=7)


def test_a_file_that_is_not_a_pretraining_checkpoint_or_has_non_finite_weights_is_one_clear_error(tmp_path):
    """A torch file that is not a pre-training checkpoint (e.g. a state dict saved under the same name), or a
    checkpoint whose weights are not finite, is a ValueError naming it (it used to be a KeyError traceback, or a
    resumed run that failed later)."""
    from topic_lm_hf import build_vocabularies, synthetic_documents

    docs = synthetic_documents(12)
    tok, topic_tok = build_vocabularies(docs, min_freq=1)

    def run():
        torch.manual_seed(0)
        model = tiny_model("tcnlm", tok, topic_tok)
        collator = TopicContextCollator.for_model(model, tok, topic_tok, protocol="pretraining")
        return pretrain_topic_model(model, collator.prepare(docs), collator, steps=2, batch_size=4,
                                    checkpoint_dir=str(tmp_path), save_every=1)

    run()
    path = tmp_path / "pretraining-2.pt"
    state = torch.load(path, weights_only=True)
    name = next(k for k, v in state["model"].items() if v.is_floating_point())
    state["model"][name] = torch.full_like(state["model"][name], float("nan"))
    torch.save(state, path)
    with pytest.raises(ValueError, match=f"its weights are not finite \\({name}"):
        run()
    torch.save(state["model"], path)
    with pytest.raises(ValueError, match="is not a topic-model pre-training checkpoint of this package"):
        run()
    a_file = tmp_path / "pretraining-2.pt"
    model = tiny_model("tcnlm", tok, topic_tok)
    collator = TopicContextCollator.for_model(model, tok, topic_tok, protocol="pretraining")
    with pytest.raises(ValueError, match="is a file: give a folder"):  # it used to fail at the first save
        pretrain_topic_model(model, collator.prepare(docs), collator, steps=2, batch_size=4,
                             checkpoint_dir=str(a_file), save_every=1)
