"""The steering evaluation: a model whose topics are known to steer scores high, an untrained one
near chance; its metrics against hand computation; and a run on real data as a user would do it."""

import math

import numpy as np
import pytest
import torch

from topic_lm_hf import (LSTMLMConfig, LSTMLMForCausalLM, TCNLMConfig, TCNLMForCausalLM, TopicContextCollator,
                         TopicRNNConfig, TopicRNNForCausalLM, build_vocabularies, save_vocabularies,
                         synthetic_documents)
from topic_lm_hf.data import _SYNTHETIC_TOPICS
from topic_lm_hf.evaluation.steering import (LDAJudge, bag_of_words_matrix, distinct_n, evaluate_steering,
                                             fit_lda_judge, format_steering_table)

TOPIC_NAMES = sorted(_SYNTHETIC_TOPICS)


@pytest.fixture(scope="module")
def synthetic():
    """Documents about one synthetic topic each (40 per topic, three 8-word sentences of its words):
    topics that LDA separates reliably, so that the judge's machinery can be checked exactly."""
    import random

    from topic_lm_hf import documents_from_lists

    rng = random.Random(0)
    docs = [[rng.choices(_SYNTHETIC_TOPICS[name], k=8) + ["."] for _ in range(3)]
            for name in TOPIC_NAMES for _ in range(40)]
    docs = documents_from_lists(docs)
    tok, topic_tok = build_vocabularies(docs, min_freq=1)
    return docs, tok, topic_tok


def topic_words(topic_tok, name):
    """Synthetic topic ``name``'s words that are in the topic vocabulary (a stop list may remove some)."""
    return [w for w in _SYNTHETIC_TOPICS[name] if w in topic_tok.get_vocab()]


def steering_topic_rnn(tok, topic_tok):
    """A TopicRNN whose weights are set by hand so that topic k is synthetic topic k: its topic
    bias favours exactly that topic's ten words, and its inference network counts them."""
    topic_vocab = topic_tok.get_vocab()
    V_c = len(topic_tok)
    config = TopicRNNConfig.from_tokenizers(tok, topic_tok, cell="gru", embedding_size=8, hidden_size=8,
                                            num_topics=len(TOPIC_NAMES), inference_num_layers=1,
                                            inference_hidden_size=V_c)
    model = TopicRNNForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.lm_head.bias[tok.eos_token_id] = -20.0  # texts run to max_new_tokens
        model.stop_head.bias.fill_(-20.0)  # the indicator says "topic word" (l = 0)
        model.model.inference_net.layers[0].weight.copy_(torch.eye(V_c))
        for k, name in enumerate(TOPIC_NAMES):
            for word in topic_words(topic_tok, name):
                model.topic_head.weight[topic_vocab[word], k] = 4.0  # B[w, k]
                model.model.inference_net.mean.weight[k, topic_vocab[word]] = 1.0
    return model.eval()


def test_distinct_n_by_hand():
    texts = [["a", "b", "a", "b"], ["a", "c"]]
    assert distinct_n(texts, 1) == 3 / 6  # a b c over 6 tokens
    assert distinct_n(texts, 2) == 3 / 4  # (a b) (b a) (a b) (a c): 3 distinct of 4
    assert distinct_n(texts, 3) == 2 / 2
    assert distinct_n([["a"]], 2) == 0.0
    with pytest.raises(ValueError):
        distinct_n(texts, 0)


def test_bag_of_words_matrix_counts_every_topic_word(synthetic):
    _, _, topic_tok = synthetic
    counts = bag_of_words_matrix([[["senate", "vote", "the", "senate"]], [["zzz"]]], topic_tok).toarray()
    vocab = topic_tok.get_vocab()
    assert counts[0, vocab["senate"]] == 2 and counts[0, vocab["vote"]] == 1 and counts[0].sum() == 3
    assert counts[1].sum() == 0 and counts[:, 0].sum() == 0  # <unk> is never counted


JUDGE_TOPICS = len(TOPIC_NAMES)
# With MALLET's stop list every synthetic topic keeps its ten words; on these documents the first three restarts of LDA
# all stop in an optimum that merges two topics (cosine to the truth 0.85), the fourth finds the six (0.996).
JUDGE_RESTARTS = 5


def test_lda_judge_recovers_the_synthetic_topics(synthetic):
    docs, _, topic_tok = synthetic
    judge = fit_lda_judge(docs, topic_tok, num_topics=JUDGE_TOPICS, seed=0, restarts=JUDGE_RESTARTS)
    vocab = topic_tok.get_vocab()
    truth = np.zeros((len(TOPIC_NAMES), len(topic_tok)))
    for k, name in enumerate(TOPIC_NAMES):
        for word in topic_words(topic_tok, name):
            truth[k, vocab[word]] = 1.0
    lda_to_model, cosine = judge.match(truth)
    assert sorted(lda_to_model.tolist()) == list(range(len(TOPIC_NAMES)))  # one-to-one
    assert cosine > 0.7  # sampled word frequencies are uneven; unrelated topics have cosine ~0
    bows = bag_of_words_matrix([[topic_words(topic_tok, name)[:5]] for name in TOPIC_NAMES] + [[["zzz"]]], topic_tok)
    dominant = judge.dominant_topics(bows)
    assert dominant[-1] == -1  # no topic word: no dominant topic
    assert lda_to_model[dominant[:-1]].tolist() == list(range(len(TOPIC_NAMES)))
    # its topics as a model's get_topics: the synthetic topics' words, most probable first, <unk> never
    topics = judge.get_topics(top_n=4, topic_tokenizer=topic_tok)
    assert len(topics) == JUDGE_TOPICS and all(len(t) == 4 for t in topics)
    words = {i: w for w, i in vocab.items()}
    for k, topic in enumerate(topics):
        assert topic == [words[int(i)] for i in np.argsort(-judge.topic_word[k, 1:])[:4] + 1]
        assert "<unk>" not in topic
        # ... and they are the words of the synthetic topic it was matched to
        assert set(topic) <= set(topic_words(topic_tok, TOPIC_NAMES[lda_to_model[k]]))


def test_a_saved_judge_loads_as_the_same_judge(synthetic, tmp_path):
    """LDAJudge.save / load (safetensors, no pickle): the same settings, fitted state and random state, so the same
    judgements and the same continued fit; a file of another format or scikit-learn version is refused."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    docs, _, topic_tok = synthetic
    judge = fit_lda_judge(docs, topic_tok, num_topics=JUDGE_TOPICS, seed=0, max_iter=5, restarts=1)
    path = tmp_path / "judge.safetensors"
    judge.save(path)
    loaded = LDAJudge.load(path)
    assert loaded.description == judge.description and np.array_equal(loaded.topic_word, judge.topic_word)
    assert loaded.lda.get_params() == judge.lda.get_params() and vars(loaded.lda).keys() == vars(judge.lda).keys()
    bows = bag_of_words_matrix(docs, topic_tok)
    assert np.array_equal(loaded.lda.transform(bows), judge.lda.transform(bows))
    assert np.array_equal(loaded.dominant_topics(bows), judge.dominant_topics(bows))
    model_topic_word = np.random.default_rng(0).random((JUDGE_TOPICS, len(topic_tok)))
    assert np.array_equal(loaded.match(model_topic_word)[0], judge.match(model_topic_word)[0])
    assert loaded.get_topics(5, topic_tokenizer=topic_tok) == judge.get_topics(5, topic_tokenizer=topic_tok)
    # continued fitting starts from the restored random state
    assert np.array_equal(loaded.lda.partial_fit(bows).components_, judge.lda.partial_fit(bows).components_)

    with safe_open(str(path), framework="numpy") as f:
        arrays, metadata = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    save_file(arrays, str(tmp_path / "old.safetensors"), metadata={**metadata, "scikit_learn": "0.1"})
    with pytest.raises(ValueError, match="scikit-learn 0.1"):
        LDAJudge.load(tmp_path / "old.safetensors")
    save_file(arrays, str(tmp_path / "weights.safetensors"))
    with pytest.raises(ValueError, match="not a judge"):
        LDAJudge.load(tmp_path / "weights.safetensors")
    (tmp_path / "text.safetensors").write_text("not a safetensors file")
    with pytest.raises(ValueError, match="not a safetensors file"):
        LDAJudge.load(tmp_path / "text.safetensors")


def test_a_model_known_to_steer_scores_high_and_an_untrained_one_near_chance(synthetic):
    docs, tok, topic_tok = synthetic
    judge = fit_lda_judge(docs, topic_tok, num_topics=JUDGE_TOPICS, seed=0, restarts=JUDGE_RESTARTS)
    fluency = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), embedding_size=8, hidden_size=8)).eval()
    steering = steering_topic_rnn(tok, topic_tok)
    good = evaluate_steering(steering, num_samples=12, max_new_tokens=10, tokenizer=tok, topic_tokenizer=topic_tok, top_words=10,
                             judge=judge, fluency_model=fluency)
    assert good["protocol"]["topics"] == list(range(6)) and good["chance"] == pytest.approx(1 / 6)
    assert good["accuracy_own"] == 1.0 and good["accuracy_own_topics"] == 1.0
    assert good["accuracy_lda"] >= 0.9
    assert good["share_steered"] > 0.9 and good["lift"] > 3
    for row in good["per_topic"]:
        words = topic_words(topic_tok, TOPIC_NAMES[row["topic"]])
        assert set(row["top_words"][:len(words)]) == set(words)
        assert all(w in words for text in row["texts"] for w in text.split())
    assert math.isfinite(good["fluency_ppl_steered"]) and math.isfinite(good["fluency_ppl_unconditioned"])
    assert good["fluency_ratio"] == pytest.approx(good["fluency_ppl_steered"] / good["fluency_ppl_unconditioned"])

    torch.manual_seed(0)
    untrained = TCNLMForCausalLM(TCNLMConfig(vocab_size=len(tok), topic_vocab_size=len(topic_tok), num_topics=6,
                                             embedding_size=16, hidden_size=16)).eval()
    bad = evaluate_steering(untrained, num_samples=12, max_new_tokens=10, tokenizer=tok, topic_tokenizer=topic_tok, top_words=10,
                            judge=judge, fluency_model=fluency)
    assert bad["accuracy_own"] <= 0.4 and bad["accuracy_own_topics"] <= 0.4 and bad["accuracy_lda"] <= 0.4
    assert bad["lift"] < 2
    table = format_steering_table({"steers": good, "untrained": bad})
    assert "| steers | 1.000 | 1.000 |" in table and "untrained" in table


def test_steering_rejects_what_it_cannot_measure(synthetic):
    _, tok, topic_tok = synthetic
    lstm = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), embedding_size=8, hidden_size=8))
    with pytest.raises(ValueError, match="not a topic model"):
        evaluate_steering(lstm, tokenizer=tok, topic_tokenizer=topic_tok)
    model = steering_topic_rnn(tok, topic_tok)
    with pytest.raises(ValueError, match="topics must be"):
        evaluate_steering(model, topics=[6], tokenizer=tok, topic_tokenizer=topic_tok)
    other_tok, _ = build_vocabularies(synthetic_documents(300, seed=3), min_freq=1)
    wrong = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(other_tok), embedding_size=8, hidden_size=8))
    with pytest.raises(ValueError, match="mismatched vocabularies"):
        evaluate_steering(model, tokenizer=tok, topic_tokenizer=topic_tok, fluency_model=wrong)


def test_steering_evaluation_from_a_saved_folder(wiki, tmp_path, capsys):
    """The way a user runs it: a trained TCNLM saved to a folder, reloaded with the Auto classes,
    judged by an LDA fitted on the training corpus, fluency under a separately trained LSTM."""
    from transformers import AutoModelForCausalLM

    from topic_lm_hf import TopicLMTrainer
    from transformers import TrainingArguments

    tok, topic_tok, train = wiki["tok"], wiki["topic_tok"], wiki["train"]
    models = {}
    for name, model in (("lstm", LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), embedding_size=32,
                                                                hidden_size=32, dropout=0.0))),
                        ("tcnlm", TCNLMForCausalLM(TCNLMConfig(vocab_size=len(tok), topic_vocab_size=len(topic_tok),
                                                               num_topics=8, embedding_size=32, hidden_size=32,
                                                               dropout=0.0)))):
        collator = TopicContextCollator(tok, topic_tok, context="none" if name == "lstm" else "others")
        args = TrainingArguments(str(tmp_path / name), max_steps=15, per_device_train_batch_size=32,
                                 learning_rate=3e-3, report_to=[], use_cpu=True, save_strategy="no",
                                 disable_tqdm=True)
        TopicLMTrainer(model=model, args=args, train_dataset=collator.prepare(train), data_collator=collator).train()
        model.save_pretrained(tmp_path / name)
        save_vocabularies(tok, topic_tok, tmp_path / name)
        models[name] = AutoModelForCausalLM.from_pretrained(tmp_path / name)
    judge = fit_lda_judge(train, topic_tok, num_topics=8, max_iter=5)
    result = evaluate_steering(models["tcnlm"], topics=[0, 5], num_samples=4, max_new_tokens=8, judge=judge,
                               fluency_model=models["lstm"], top_words=20)
    assert [row["topic"] for row in result["per_topic"]] == [0, 5]
    assert result["chance"] == 1 / 8 and "8 topics, 300 documents" in result["judge"]
    for key in ("accuracy_own", "accuracy_own_topics", "accuracy_lda", "share_steered", "share_unconditioned", "distinct_1"):
        assert 0.0 <= result[key] <= 1.0, key
    assert result["fluency_ppl_steered"] > 1 and result["fluency_ppl_unconditioned"] > 1
    assert all("<unk>" not in text.split() for row in result["per_topic"] for text in row["texts"])
    assert len(result["per_topic"][0]["top_words"]) == 10
    # The same from the command line: topic-lm steer, with the LDA judge fitted on the corpus file.
    import json

    from topic_lm_hf.cli import main

    main(["steer", "--model_name_or_path", str(tmp_path / "tcnlm"), "--fluency_model", str(tmp_path / "lstm"),
          "--judge_corpus", "wikipedia-sample", "--judge_documents", "100", "--topics", "0,5",
          "--num_samples", "3", "--max_new_tokens", "6", "--json", str(tmp_path / "steer.json")])
    out = capsys.readouterr().out
    assert "| topic acc. (own encoder) |" in out and "topic 5 (" in out
    saved = json.loads((tmp_path / "steer.json").read_text())
    assert [row["topic"] for row in saved["per_topic"]] == [0, 5] and "100 documents" in saved["judge"]
    assert saved["fluency_ppl_steered"] > 1
    assert saved["protocol"]["topic_guidance_scale"] is None
    # with decode-time guidance (NCLM's recipe steers at 0.75): the scale reaches the steered texts
    main(["steer", "--model_name_or_path", str(tmp_path / "tcnlm"), "--topics", "0,5", "--num_samples", "3",
          "--max_new_tokens", "6", "--topic_guidance_scale", "0.75", "--json", str(tmp_path / "guided.json")])
    guided = json.loads((tmp_path / "guided.json").read_text())
    assert guided["protocol"]["topic_guidance_scale"] == 0.75
    assert guided["unconditioned_texts"] == saved["unconditioned_texts"]


def test_guided_steering_is_measured_with_the_scale_it_names(wiki):
    """evaluate_steering(topic_guidance_scale=s) generates the steered texts with guidance s (the unconditioned ones
    without), and records s in its protocol."""
    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
    torch.manual_seed(0)
    model = TCNLMForCausalLM(TCNLMConfig.from_tokenizers(tok, topic_tok, num_topics=4, embedding_size=16,
                                                         hidden_size=16, encoder_hidden_size=16,
                                                         topic_embedding_size=8,
                                                         initializer_range=0.5)).eval()  # topics that matter
    settings = dict(topics=[1, 2], num_samples=2, max_new_tokens=6, tokenizer=tok, topic_tokenizer=topic_tok)
    plain = evaluate_steering(model, **settings)
    same = evaluate_steering(model, **settings, topic_guidance_scale=1.0)
    guided = evaluate_steering(model, **settings, topic_guidance_scale=8.0)
    assert same["per_topic"][0]["texts"] == plain["per_topic"][0]["texts"]
    assert guided["unconditioned_texts"] == plain["unconditioned_texts"]
    assert guided["per_topic"][0]["texts"] != plain["per_topic"][0]["texts"]
    assert guided["protocol"]["topic_guidance_scale"] == 8.0 and plain["protocol"]["topic_guidance_scale"] is None


def test_generation_options_reach_every_text(wiki):
    """evaluate_steering(generation_options=...) decodes every text, steered and unconditioned, with them: with
    no_repeat_ngram_size=1 no text repeats a word, where the same model repeats words without it."""
    tok, topic_tok = wiki["tok"], wiki["topic_tok"]
    torch.manual_seed(0)
    model = TCNLMForCausalLM(TCNLMConfig.from_tokenizers(tok, topic_tok, num_topics=4, embedding_size=16,
                                                         hidden_size=16, encoder_hidden_size=16,
                                                         topic_embedding_size=8)).eval()
    settings = dict(topics=[1, 2], num_samples=6, max_new_tokens=40, tokenizer=tok, topic_tokenizer=topic_tok,
                    temperature=0.3)

    def texts(result):
        return [t.split() for row in result["per_topic"] for t in row["texts"]] + \
            [t.split() for t in result["unconditioned_texts"]]

    plain = evaluate_steering(model, **settings)
    assert any(len(set(t)) < len(t) for t in texts(plain))  # a cold untrained model repeats itself
    once = evaluate_steering(model, **settings, generation_options={"no_repeat_ngram_size": 1})
    assert all(len(set(t)) == len(t) for t in texts(once))
    assert once["protocol"]["generation_options"] == {"no_repeat_ngram_size": 1}


def test_steering_towards_an_upper_layer_of_a_topic_hierarchy(tiny_vocabularies):
    """evaluate_steering(topic_layer=l) on rGBN-RNN generates with generate(topic_ids=[k], topic_layer=l) and judges
    the texts by layer l's topics (projected down to words) and encoder; chance is 1 / K_l. A family with one layer
    of topics refuses it in one line."""
    from conftest import topic_family_model

    tok, topic_tok = tiny_vocabularies
    model = topic_family_model("rgbn", tok, topic_tok)  # topic layers of 4 and 2 topics
    settings = dict(num_samples=3, max_new_tokens=5, tokenizer=tok, topic_tokenizer=topic_tok, seed=1)
    upper = evaluate_steering(model, topic_layer=2, **settings)
    assert upper["protocol"]["topics"] == [0, 1] and upper["chance"] == 0.5
    assert upper["protocol"]["topic_layer"] == 2
    for row in upper["per_topic"]:
        assert row["top_words"] == model.get_topics(layer=2, top_n=10, topic_tokenizer=topic_tok)[row["topic"]]
    # the texts are generate(topic_ids=[k], topic_layer=2)'s, seeded as evaluate_steering seeds them
    torch.manual_seed(settings["seed"] + 1 + 1)
    bos = torch.full((1, 1), tok.bos_token_id)
    direct = model.generate(input_ids=bos, topic_ids=[1], topic_layer=2, num_return_sequences=3, max_new_tokens=5,
                            do_sample=True, top_p=0.9, top_k=0, pad_token_id=tok.pad_token_id,
                            eos_token_id=tok.eos_token_id)
    first = tok.decode(direct[0, 1:], skip_special_tokens=True).split()
    kept = upper["per_topic"][1]["texts"][0].split()  # up to <eos>; the decoded ids may run past it
    assert kept and kept == first[:len(kept)]
    # the own-encoder judge reads the steered layer's encoder
    calls = []
    original = model.infer_topics
    model.infer_topics = lambda bow, **kw: calls.append(kw) or original(bow, **kw)
    evaluate_steering(model, topic_layer=2, topics=[0], **settings)
    assert calls == [{"layer": 2}]
    model.infer_topics = original
    bottom = evaluate_steering(model, **settings)
    assert bottom["chance"] == 0.25 and bottom["protocol"]["topic_layer"] is None
    with pytest.raises(ValueError, match="must be an integer in"):
        evaluate_steering(model, topic_layer=3, **settings)
    tcnlm = topic_family_model("tcnlm", tok, topic_tok)
    with pytest.raises(ValueError, match="one layer of topics"):
        evaluate_steering(tcnlm, topic_layer=1, **settings)


def test_a_judge_with_inconsistent_arrays_a_damaged_header_or_another_vocabulary_is_refused(synthetic, tmp_path):
    """LDAJudge.load checks its arrays against each other (topic_word of another shape, or not the normalised
    components_) and refuses a damaged header with one ValueError (cached_lda_judge then fits again); the judge
    records its topic vocabulary and is refused on another one."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    from topic_lm_hf import build_vocabularies

    docs, _, topic_tok = synthetic
    judge = fit_lda_judge(docs, topic_tok, num_topics=JUDGE_TOPICS, seed=0, max_iter=5, restarts=1)
    path = tmp_path / "judge.safetensors"
    judge.save(path)
    assert LDAJudge.load(path).topic_vocab_hash == judge.topic_vocab_hash is not None
    with safe_open(str(path), framework="numpy") as f:
        arrays, metadata = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    cases = {"fewer_words": ({**arrays, "topic_word": arrays["topic_word"][:, :-1]}, metadata, "arrays disagree"),
             "other_topics": ({**arrays, "topic_word": arrays["topic_word"][::-1].copy()}, metadata,
                              "not the normalised components_"),
             "header": (arrays, {**metadata, "settings": "{not json"}, "damaged LDA judge"),
             "no_numbers": (arrays, {k: v for k, v in metadata.items() if k != "numbers"}, "damaged LDA judge")}
    for name, (a, m, message) in cases.items():
        save_file(a, str(tmp_path / f"{name}.safetensors"), metadata=m)
        with pytest.raises(ValueError, match=message):
            LDAJudge.load(tmp_path / f"{name}.safetensors")
    other = build_vocabularies(docs.select(range(len(docs) // 2)), min_freq=1)[1]
    with pytest.raises(ValueError, match="fitted over another topic vocabulary"):
        judge.get_topics(5, topic_tokenizer=other)
