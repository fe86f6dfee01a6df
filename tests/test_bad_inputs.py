"""Bad input gets one clear line, never a silent wrong answer or a traceback: the cases of the package's bad-input
review that are fixed (each refused with a message that says what to do; exit code 2 on the command line)."""

import json
from pathlib import Path

import pytest
import torch

from topic_lm_hf import TCNLMConfig, TCNLMForCausalLM, build_vocabularies, save_vocabularies, synthetic_documents
from topic_lm_hf.cli import main
from topic_lm_hf.pretraining import steering_recipe


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bad-inputs") / "m"
    tok, topic_tok = build_vocabularies(synthetic_documents(30), min_freq=1)
    torch.manual_seed(0)
    model = TCNLMForCausalLM(TCNLMConfig.from_tokenizers(tok, topic_tok, num_topics=3, embedding_size=4,
                                                         hidden_size=4))
    model.save_pretrained(folder)
    save_vocabularies(tok, topic_tok, folder)
    return folder, model, tok


def one_line_error(capsys, argv) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("scale", [float("inf"), float("nan"), 1e300, -1.0, 101])
def test_a_non_finite_or_absurd_guidance_scale_is_refused(saved_model, scale):
    _, model, tok = saved_model
    with pytest.raises(ValueError, match=r"topic_guidance_scale must be a number in \[0, 100\]"):
        model.generate(torch.tensor([[tok.bos_token_id]]), topic_ids=[1], topic_guidance_scale=scale,
                       max_new_tokens=2)
    assert model.generate(torch.tensor([[tok.bos_token_id]]), topic_ids=[1], topic_guidance_scale=100,
                          max_new_tokens=2, min_new_tokens=2, pad_token_id=tok.pad_token_id).shape == (1, 3)


@pytest.mark.parametrize("flags, message", [
    (["--topic_ids", ""], "--topic_ids is empty: give at least one topic id"),
    (["--topic_ids", ","], "--topic_ids is empty: give at least one topic id"),
    (["--topic_ids", "1,1"], "--topic_ids lists topic 1 more than once"),
    (["--num_beams", "0"], "--num_beams must be a positive integer, got 0"),
    (["--num_return_sequences", "0"], "--num_return_sequences must be a positive integer, got 0"),
    (["--max_new_tokens", "0"], "--max_new_tokens must be a positive integer, got 0"),
])
def test_generate_refuses_empty_repeated_or_zero_settings(saved_model, capsys, flags, message):
    folder, _, _ = saved_model
    assert message in one_line_error(capsys, ["generate", "--model_name_or_path", str(folder), *flags])


def test_steer_refuses_a_topic_listed_twice(saved_model, capsys):
    folder, _, _ = saved_model
    assert "--topics lists topic 3 more than once" in one_line_error(
        capsys, ["steer", "--model_name_or_path", str(folder), "--topics", "1,3,3", "--num_samples", "1"])


def test_a_typo_in_a_model_type_is_an_error_not_an_empty_recipe():
    assert steering_recipe("lstm_lm") == {}  # a family without topics has none
    with pytest.raises(ValueError, match=r"unknown model family 'tcnml': the package's families are \['lstm_lm'"):
        steering_recipe("tcnml")


def test_a_config_file_that_is_not_a_json_object_is_one_line(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps([{"model_type": "tcnlm"}]))
    message = one_line_error(capsys, ["train", "--config_file", str(config), "--output_dir", str(tmp_path / "out"),
                                      "--synthetic", "true", "--max_steps", "1", "--report_to", "none"])
    assert "is not a valid JSON file" in message or "holds a JSON list, not an object" in message


def test_the_demo_refuses_zero_threads(capsys, tmp_path):
    assert "--threads must be in 1.." in one_line_error(
        capsys, ["demo", "--threads", "0", "--output_dir", str(tmp_path)])


def test_the_demo_refuses_an_unknown_family(capsys, tmp_path):
    assert "--family must be one of tcnlm, topic_rnn, nclm, rgbn_rnn, got 'lstm_lm'" in one_line_error(
        capsys, ["demo", "--family", "lstm_lm", "--output_dir", str(tmp_path)])


# ----------------------------------------------------------------------------------------------
# silent wrong answers of the metrics and of the document inputs
# ----------------------------------------------------------------------------------------------


def test_a_context_text_without_a_topic_word_is_refused(saved_model, capsys):
    folder, _, _ = saved_model
    for text in ["", "zzzz qqqq"]:
        assert "bag of words of context_text" in one_line_error(
            capsys, ["generate", "--model_name_or_path", str(folder), "--context_text", text, "--max_new_tokens", "2"])


@pytest.mark.parametrize("family", ["tcnlm", "lstm_lm"])
def test_an_empty_prompt_tensor_is_one_line(saved_model, family):
    from topic_lm_hf import LSTMLMConfig, LSTMLMForCausalLM

    _, model, tok = saved_model
    if family == "lstm_lm":
        model = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), embedding_size=4, hidden_size=4))
    with pytest.raises(ValueError, match=r"the prompt is empty \(input_ids of shape \(1, 0\)\)"):
        model.generate(torch.zeros((1, 0), dtype=torch.long), max_new_tokens=2)


def test_a_string_where_documents_are_expected_is_refused(saved_model):
    from topic_lm_hf import evaluate_perplexity, make_bow

    _, model, tok = saved_model
    topic_tok = build_vocabularies(synthetic_documents(30), min_freq=1)[1]
    with pytest.raises(ValueError, match=r"documents\[0\] is a string, where a list is expected"):
        evaluate_perplexity(model, ["the senate met"], tokenizer=tok, topic_tokenizer=topic_tok)
    with pytest.raises(ValueError, match=r"documents\[0\]\[0\] is a string"):
        evaluate_perplexity(model, [["the senate met"]], tokenizer=tok, topic_tokenizer=topic_tok)
    with pytest.raises(ValueError, match=r"make_bow takes a list of texts .* make_bow\(\[text\]"):
        make_bow("police said the court", topic_tok)
    assert make_bow(["police said the court"], topic_tok).shape[0] == 1


@pytest.fixture(scope="module")
def metric():
    pytest.importorskip("evaluate")
    from topic_lm_hf.evaluation.metrics import load_metric

    return load_metric


def test_classification_refuses_non_integer_predictions(metric):
    classification = metric("classification")
    with pytest.raises(ValueError, match=r"predictions must be class ids \(integers\), got 0.7"):
        classification.compute(predictions=[0.7, 1.0], references=[0, 1])
    with pytest.raises(ValueError, match=r"predictions has shape \(2, 2\).*argmax"):
        classification.compute(predictions=[[0.2, 0.8], [0.9, 0.1]], references=[1, 0])
    assert classification.compute(predictions=[1.0, 0.0], references=[1, 0])["accuracy"] == 1.0


def test_an_argument_of_another_metric_is_honoured_or_refused(metric):
    topics = [["a", "b", "c"], ["a", "d", "e"]]
    diversity = metric("topic_diversity")
    assert diversity.compute(predictions=topics, top_n=2) == diversity.compute(predictions=topics, k=2)
    assert diversity.compute(predictions=topics, k=3, top_n=10)["k"] == 3  # combine: top_n is npmi's
    npmi = metric("npmi")
    docs = [["a", "b", "c"], ["a", "d"], ["b", "c", "e"]]
    assert npmi.compute(predictions=topics, reference=docs, window=None, k=2)["protocol"]["top_n"] == [2]
    with pytest.raises(TypeError, match=r"distinct_n takes n=, not max_n="):
        metric("distinct_n").compute(predictions=["a b c"], max_n=3)
    assert metric("distinct_n").compute(predictions=["a b c"], n=1, max_n=3) == {"distinct_1": 1.0}
    with pytest.raises(TypeError, match=r"texygen_self_bleu takes max_n=, not n="):
        metric("texygen_self_bleu").compute(predictions=["a b", "a c"], n=2)


def test_texygen_bleu_refuses_nested_references(metric):
    from topic_lm_hf.evaluation.bleu import texygen_bleu

    with pytest.raises(ValueError, match=r"references\[0\] is a list of sentences, not of tokens"):
        texygen_bleu(["the cat sat"], [["the cat sat"]])
    with pytest.raises(ValueError, match=r"is a list of sentences, not of tokens"):
        metric("texygen_bleu").compute(predictions=["the cat sat"], reference_texts=[["the cat sat"]])
    assert texygen_bleu(["the cat sat"], [["the", "cat", "sat"]], max_n=2)[2] == pytest.approx(1.0)


@pytest.mark.parametrize("name, kwargs", [
    ("distinct_n", {}), ("texygen_bleu", {"reference_texts": ["a b"]}), ("texygen_self_bleu", {})])
def test_text_metrics_refuse_no_predictions_and_non_text_rows(metric, name, kwargs):
    with pytest.raises(ValueError, match=rf"{name}: predictions is empty"):
        metric(name).compute(predictions=[], **kwargs)
    with pytest.raises(ValueError, match=rf"{name}: predictions\[0\] is int 1: give texts"):
        metric(name).compute(predictions=[1, 2], **kwargs)


def test_npmi_refuses_an_empty_reference(tmp_path):
    from topic_lm_hf import topic_coherence

    empty = tmp_path / "empty.txt"
    empty.write_text("")
    for reference in (empty, []):
        with pytest.raises(ValueError, match="has no tokens: NPMI needs word counts"):
            topic_coherence([["a", "b"]], reference)


def test_a_topic_shorter_than_top_n_is_labelled_with_the_words_it_has():
    from topic_lm_hf import topic_coherence

    docs = [["a", "b", "c", "a"], ["b", "x", "a"], ["c", "c"]]
    result = topic_coherence([["a", "b", "c"], ["a", "b", "c", "x"]], docs, window=3, top_n=(2, 3, 4))
    assert [list(d) for d in result.per_topic_per_n] == [[2, 3], [2, 3, 4]]
    short = result.per_topic_per_n[0]
    assert result.per_topic[0] == pytest.approx((short[2] + short[3]) / 2)  # top-3 counted once, not twice


# ----------------------------------------------------------------------------------------------
# numerics
# ----------------------------------------------------------------------------------------------


# Per family with TCNLM's angular diversity regulariser: how to make two of its topics coincide, and the term.
def _tcnlm_coinciding(model):
    topic_model = model.model.topic_model
    with torch.no_grad():
        topic_model.topic_vectors[1].copy_(topic_model.topic_vectors[0])
    return topic_model.diversity


def _nclm_coinciding(model):
    with torch.no_grad():
        weight = model.model.topic_model.decoder.weight  # (V_c, K): topic k is column k
        weight[:, 1].copy_(weight[:, 0] * (1 + 1e-4))  # nearly: the cosine is 1 - O(1e-8)
    return model.topic_diversity_term


DIVERSITY_REGULARISED = {"tcnlm": _tcnlm_coinciding, "nclm": _nclm_coinciding}


def test_every_family_with_a_diversity_term_is_covered():
    from topic_lm_hf.families import FAMILIES

    with_term = {name for name, family in FAMILIES.items() if hasattr(family.config_class(), "diversity_weight")}
    assert with_term == set(DIVERSITY_REGULARISED)


@pytest.mark.parametrize("model_type", sorted(DIVERSITY_REGULARISED))
def test_coinciding_topics_give_a_finite_diversity_gradient_under_bf16_autocast(model_type):
    from conftest import tiny_model
    from topic_lm_hf.families import FAMILIES

    tok, topic_tok = build_vocabularies(synthetic_documents(30), min_freq=1)
    model = tiny_model(FAMILIES[model_type].representative, tok, topic_tok, diversity_weight=0.1)
    term = DIVERSITY_REGULARISED[model_type](model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = term()
    value.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and torch.isfinite(value) and all(torch.isfinite(g).all() for g in grads)


# ----------------------------------------------------------------------------------------------
# training runs: a finished run is left alone, a truncated checkpoint is skipped
# ----------------------------------------------------------------------------------------------


def _train_argv(out, *flags):
    return ["train", "--synthetic", "true", "--model_type", "lstm_lm", "--config_overrides",
            "embedding_size=8,hidden_size=8", "--output_dir", str(out), "--max_steps", "4", "--save_steps", "2",
            "--per_device_train_batch_size", "8", "--report_to", "none", "--use_cpu", "true", "--disable_tqdm", "true",
            "--eval_strategy", "no", *flags]


def _files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_rerunning_a_finished_training_run_changes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    main(_train_argv(out))
    before = _files(out)
    capsys.readouterr()
    main(_train_argv(out))
    assert "already holds this run, finished at step 4 (checkpoint-4): nothing to do" in capsys.readouterr().out
    assert _files(out) == before  # no checkpoint-5, the saved model as it was


@pytest.mark.parametrize("victim", ["model.safetensors", "optimizer.pt"])
def test_resuming_skips_a_checkpoint_with_a_truncated_file(tmp_path, caplog, victim):
    from topic_lm_hf.checkpoints import last_complete_checkpoint

    out = tmp_path / "run"
    main(_train_argv(out))
    path = out / "checkpoint-4" / victim
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with caplog.at_level("WARNING", logger="topic_lm_hf"):
        assert last_complete_checkpoint(out) == str(out / "checkpoint-2")
    assert f"Not resuming from {out / 'checkpoint-4'}: its {victim} is truncated or unreadable" in caplog.text
    (out / "model.safetensors").unlink()  # the run as killed before its end: it resumes from checkpoint-2
    main(_train_argv(out))
    assert (out / "model.safetensors").exists()


# ----------------------------------------------------------------------------------------------
# the sense tagger finds the topic model it was trained with, and only that one
# ----------------------------------------------------------------------------------------------


def test_the_sense_tagger_records_its_topic_model_by_absolute_path_and_weights(tmp_path, monkeypatch):
    from transformers import AutoModelForTokenClassification, TrainingArguments

    from topic_lm_hf import save_vocabularies
    from topic_lm_hf.tasks import load_wsd_corpus
    from topic_lm_hf.tasks.wsd_tagger import disambiguate, train_sense_tagger

    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "tiny.data.xml").write_text(
        '<corpus lang="en"><text id="d0"><sentence id="d0.s0"><wf lemma="the" pos="DET">the</wf>'
        '<instance id="d0.s0.t0" lemma="court" pos="NOUN">court</instance><wf lemma="rule" pos="VERB">ruled</wf>'
        '</sentence></text></corpus>', encoding="utf-8")
    (tmp_path / "set" / "tiny.gold.key.txt").write_text("d0.s0.t0 court%1:14:00::\n", encoding="utf-8")
    corpus = load_wsd_corpus(tmp_path / "set")
    tok, topic_tok = build_vocabularies(synthetic_documents(30), min_freq=1)
    for name, seed in (("first", 0), ("second", 1)):
        torch.manual_seed(seed)
        topic_model = TCNLMForCausalLM(TCNLMConfig.from_tokenizers(tok, topic_tok, num_topics=3, embedding_size=4,
                                                                   hidden_size=4))
        topic_model.save_pretrained(tmp_path / name / "topics")
        save_vocabularies(tok, topic_tok, tmp_path / name / "topics")
    monkeypatch.chdir(tmp_path / "first")
    args = TrainingArguments(output_dir=str(tmp_path / "tagger"), max_steps=1, report_to="none", use_cpu=True,
                             save_strategy="no", disable_tqdm=True)
    train_sense_tagger(corpus, tmp_path / "tagger", topic_model="topics", training_args=args, embedding_size=4,
                       hidden_size=4)  # a path relative to the folder it trains in
    tagger = AutoModelForTokenClassification.from_pretrained(tmp_path / "tagger")
    assert tagger.config.topic_model_name_or_path == str(tmp_path / "first" / "topics")
    assert len(tagger.config.topic_model_sha256) == 64
    monkeypatch.chdir(tmp_path / "second")  # where "topics" is another topic model
    assert list(disambiguate(tagger, corpus, mode="all_senses")) == ["d0.s0.t0"]  # the one it was trained with
    with pytest.raises(ValueError, match=r"the topic model at topics is not the one this tagger was trained with"):
        disambiguate(tagger, corpus, mode="all_senses", topic_model="topics")


# ----------------------------------------------------------------------------------------------
# crashes that are user errors: one line
# ----------------------------------------------------------------------------------------------


def test_a_labelled_corpus_loads_by_its_extension_or_is_refused_naming_the_formats(saved_model, tmp_path, capsys):
    from topic_lm_hf.tasks.classification import load_classification_splits

    folder, _, _ = saved_model
    rows = [("the court ruled on the tax case", i % 2) for i in range(20)]
    (tmp_path / "corpus.csv").write_text("text,label\n" + "\n".join(f"{t},{y}" for t, y in rows))
    (tmp_path / "corpus.jsonl").write_text("\n".join(json.dumps({"text": t, "label": y}) for t, y in rows))
    from_csv = load_classification_splits(tmp_path / "corpus.csv", test_fraction=0.5)
    from_json = load_classification_splits(tmp_path / "corpus.jsonl", test_fraction=0.5)
    assert from_csv[0]["sentences"] == from_json[0]["sentences"] and from_csv[0]["label"] == from_json[0]["label"]
    (tmp_path / "corpus.txt").write_text("the court ruled\tthe tax case\n")
    assert "corpus.txt: a labelled corpus is JSON lines (.jsonl[.gz], .json), CSV (.csv[.gz]) or Parquet" in \
        one_line_error(capsys, ["classify", "--model_name_or_path", str(folder), "--dataset",
                                str(tmp_path / "corpus.txt")])
    assert "--head must be one of mlp, cnn, got 'foo'" in one_line_error(
        capsys, ["classify", "--model_name_or_path", str(folder), "--dataset", str(tmp_path / "corpus.jsonl"),
                 "--head", "foo"])


def test_a_word_for_a_numeric_option_off_by_default_is_one_line(tmp_path, capsys):
    from topic_lm_hf.arguments import ModelArguments
    from topic_lm_hf.commands import make_config

    assert make_config(ModelArguments(model_type="tcnlm", recipe="paper",
                                      config_overrides="topic_factor_spread=1e-2")).topic_factor_spread == 0.01
    assert "--config_overrides topic_factor_spread=abc: a value of the wrong type for TCNLMConfig" in one_line_error(
        capsys, ["train", "--synthetic", "true", "--model_type", "tcnlm", "--config_overrides",
                 "topic_factor_spread=abc", "--output_dir", str(tmp_path / "out"), "--max_steps", "1",
                 "--report_to", "none"])


def test_the_demo_chooses_and_prints_a_decoding_when_no_steered_text_could_be_judged(monkeypatch):
    """A small corpus in float32: every steered text of a decoding empty, so its fluency and lift are None."""
    from topic_lm_hf import demo

    def measured(model, top_p, **kwargs):
        empty = top_p == 0.9
        return {"fluency_ppl_steered": None if empty else 80.0 / top_p, "lift": None if empty else 1.0,
                "distinct_2": None if empty else 0.9}

    monkeypatch.setattr(demo, "evaluate_steering", measured)
    name, _, results = demo.choose_decoding(None, None, [0], None, None, seed=0)
    assert name == "nucleus p = 0.7, no repeated bigram"  # the most fluent of those measured
    assert "fluency n/a (perplexity" in demo.decoding_line("nucleus p = 0.9", results["nucleus p = 0.9"])


def test_export_refuses_a_bad_repo_id_before_writing_and_a_foreign_folder_without_overwrite(saved_model, tmp_path,
                                                                                              capsys):
    folder, _, _ = saved_model
    out = tmp_path / "upload"
    assert "--repo_id '../../x' is not a Hub repository id" in one_line_error(
        capsys, ["export", "--model_name_or_path", str(folder), "--repo_id", "../../x", "--output_dir", str(out)])
    assert not out.exists()
    out.mkdir()
    (out / "README.md").write_text("my own notes\n")
    export = ["export", "--model_name_or_path", str(folder), "--repo_id", "me/tcnlm", "--output_dir", str(out)]
    assert "is not empty and holds no previous export" in one_line_error(capsys, export)
    assert (out / "README.md").read_text() == "my own notes\n"
    main([*export, "--overwrite", "true"])
    main(export)  # a previous export is updated in place
    assert "me/tcnlm" in (out / "README.md").read_text()


# ----------------------------------------------------------------------------------------------
# messages: one line that says what to do
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flags, message", [
    (["--max_eval_documents", "0"], "--max_eval_documents must be a positive integer, got 0"),
    (["--batch_size", "0"], "--batch_size must be a positive integer, got 0"),
])
def test_evaluate_refuses_zero_counts(saved_model, capsys, flags, message, tmp_path):
    folder, _, _ = saved_model
    (tmp_path / "valid.txt").write_text("the court ruled\tthe tax case\n")
    assert message in one_line_error(capsys, ["evaluate", "--model_name_or_path", str(folder), "--validation_file",
                                              str(tmp_path / "valid.txt"), *flags])


def test_load_documents_refuses_a_count_below_one(tmp_path):
    from topic_lm_hf import load_documents

    (tmp_path / "docs.txt").write_text("the court ruled\tthe tax case\n")
    for count in (0, -1):
        with pytest.raises(ValueError, match=rf"max_documents must be a positive integer, got {count}"):
            load_documents(tmp_path / "docs.txt", max_documents=count)


def test_steer_refuses_zero_judge_documents(saved_model, capsys, tmp_path):
    folder, _, _ = saved_model
    assert "--judge_documents must be a positive integer, got 0" in one_line_error(
        capsys, ["steer", "--model_name_or_path", str(folder), "--judge_corpus", str(tmp_path / "x.txt"),
                 "--judge_documents", "0"])


def test_retrieve_refuses_empty_cut_offs(saved_model, capsys, tmp_path):
    folder, _, _ = saved_model
    for k, message in (("", "--k is empty: give at least one cut-off"), ("0", "--k must be a positive integer")):
        assert message in one_line_error(capsys, ["retrieve", "--model_name_or_path", str(folder), "--dataset",
                                                  str(tmp_path / "x.jsonl"), "--k", k])


def test_train_names_the_package_families_for_an_unknown_model_type_and_the_formats_for_a_csv(tmp_path, capsys):
    message = one_line_error(capsys, ["train", "--model_type", "foo", "--output_dir", str(tmp_path / "o")])
    assert "unknown model family 'foo': the package's families are ['lstm_lm'" in message and "gpt2" not in message
    (tmp_path / "train.csv").write_text("text\nthe court ruled\n")
    message = one_line_error(capsys, ["train", "--train_file", str(tmp_path / "train.csv"), "--output_dir",
                                      str(tmp_path / "o")])
    assert "Cannot tell the format of" in message and "a corpus is a Lau .txt[.gz], JSON lines" in message
    assert "pass format=" not in message


def test_wsd_train_refuses_zero_documents(capsys, tmp_path):
    assert "--max_train_documents must be a positive integer, got 0" in one_line_error(
        capsys, ["wsd", "train", "--train", str(tmp_path), "--output_dir", str(tmp_path / "o"),
                 "--max_train_documents", "0"])


def test_a_full_disk_while_saving_is_one_line(saved_model, capsys, tmp_path, monkeypatch):
    import topic_lm_hf.commands

    folder, _, _ = saved_model

    def full(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:664] . PytorchStreamWriter failed writing file "
                           "data/0: file write failed")

    monkeypatch.setattr(topic_lm_hf.commands, "save_for_hub", full)  # what topic-lm export calls
    assert "the disk is full (no space left on device) while writing (RuntimeError)" in one_line_error(
        capsys, ["export", "--model_name_or_path", str(folder), "--repo_id", "me/m", "--output_dir",
                 str(tmp_path / "x")])


def test_conditioning_with_fewer_rows_than_the_prompts_is_refused_not_repeated(saved_model):
    """Two rows of topics for four prompts once became [t0, t0, t1, t1] (the second prompt given the first row's
    topics); one row or one per prompt are the only forms, in generate and in forward. generate()'s own expansion
    for return sequences keeps each prompt with its row."""
    _, model, tok = saved_model
    prompts = torch.full((4, 1), tok.bos_token_id)
    with pytest.raises(ValueError, match="topic_ids has 2 rows but the batch has 4: give one row, or one per row"):
        model.generate(prompts, topic_ids=[[0], [1]], max_new_tokens=2)
    with pytest.raises(ValueError, match="topic_ids has 2 rows but the batch has 4"):
        model(input_ids=prompts, topic_ids=[[0], [1]])
    torch.manual_seed(0)
    out = model.generate(prompts[:2], topic_ids=[[0], [1]], num_return_sequences=2, do_sample=True, max_new_tokens=2)
    assert out.shape[0] == 4


def test_sentences_given_as_strings_are_refused_not_read_one_character_per_token(saved_model, tmp_path):
    """{"sentences": ["the senate said", ...]} was modelled character by character (44 tokens counted instead of
    10, a vocabulary of letters): refused wherever documents come in, naming text_column for raw text."""
    import datasets

    from topic_lm_hf import TopicContextCollator, evaluate_perplexity, load_documents, load_vocabularies

    folder, model, _ = saved_model
    tok, topic_tok = load_vocabularies(folder)
    docs = datasets.Dataset.from_dict({"sentences": [["the senate said", "police said"]]})
    message = r"sentence 0 is a string \('the senate said'\).*text_column"
    with pytest.raises(ValueError, match=message):
        evaluate_perplexity(model, docs, "causal", tokenizer=tok, topic_tokenizer=topic_tok)
    with pytest.raises(ValueError, match=message):
        TopicContextCollator(tok, topic_tok).prepare(docs)
    path = tmp_path / "docs.jsonl"
    path.write_text(json.dumps({"sentences": ["the senate said", "police said"]}) + "\n")
    with pytest.raises(ValueError, match=message):
        load_documents(path)


@pytest.mark.parametrize("command", ["evaluate", "generate", "export"])
def test_a_folder_of_an_unknown_model_type_is_refused_before_its_code_could_run(tmp_path, capsys, command):
    """A config.json naming a type neither the package nor transformers knows made transformers ask whether to run
    the folder's code (and answering y ran it): the command refuses it in one line, and the code never runs."""
    folder = tmp_path / "foreign"
    folder.mkdir()
    marker = tmp_path / "ran"
    (folder / "config.json").write_text(json.dumps({
        "model_type": "not_a_family", "auto_map": {"AutoConfig": "evil.EvilConfig",
                                                   "AutoModelForCausalLM": "evil.EvilModel"}}))
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    argv = {"evaluate": ["evaluate", "--model_name_or_path", str(folder)],
            "generate": ["generate", "--model_name_or_path", str(folder)],
            "export": ["export", "--model_name_or_path", str(folder), "--repo_id", "org/x", "--output_dir",
                       str(tmp_path / "out")]}[command]
    message = one_line_error(capsys, argv)
    assert "model_type 'not_a_family', which this package does not know" in message and "not run" in message
    assert not marker.exists()


def test_evaluate_adds_its_rows_to_the_folders_results_instead_of_replacing_them(saved_model, tmp_path, monkeypatch,
                                                                                 capsys):
    """A one-document check replaced the folder's perplexity.json (the full results lost, then put on the card by
    export, with the dataset named "/demo30.txt"): rows are merged by dataset, protocol and number of documents,
    and export shows the row measured on the most tokens."""
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(saved_model[0], folder)
    monkeypatch.chdir(tmp_path)
    synthetic = synthetic_documents(6, seed=3)
    Path("valid.txt").write_text("\n".join("\t".join(" ".join(s) for s in d) for d in synthetic["sentences"]) + "\n")
    for flags in (["--protocols", "causal"], ["--protocols", "causal", "--max_eval_documents", "1"],
                  ["--protocols", "paper"]):
        main(["evaluate", "--model_name_or_path", str(folder), "--validation_file", "valid.txt", *flags])
    rows = json.loads((folder / "perplexity.json").read_text())
    assert sorted((r["protocol"], r["documents"]) for r in rows) == [("causal", 1), ("causal", 6), ("paper", 6)]
    assert {r["dataset"] for r in rows} == {"valid.txt"}
    main(["export", "--model_name_or_path", str(folder), "--repo_id", "org/m", "--output_dir", str(tmp_path / "x")])
    card = (tmp_path / "x" / "README.md").read_text()
    full = next(r for r in rows if r["documents"] == 6 and r["protocol"] == "causal")
    one = next(r for r in rows if r["documents"] == 1)
    row = "| valid.txt | causal | {perplexity:.2f} | {tokens} |"
    assert row.format(**full) in card and row.format(**one) not in card and "/valid.txt" not in card


@pytest.mark.parametrize("protocols, message", [
    ("causal,pape", r"--protocols 'causal,pape': unknown 'pape'; give some of paper, causal, causal-carry"),
    (" , ", r"--protocols ' , ': none; give some of paper, causal, causal-carry")])
def test_evaluate_checks_every_protocol_before_it_loads_anything(saved_model, capsys, tmp_path, protocols, message):
    """A misspelt protocol was found only after the earlier protocols had run."""
    folder, _, _ = saved_model
    assert message.replace("\\\\", "") and message in "" or True  # (the pattern is matched below)
    line = one_line_error(capsys, ["evaluate", "--model_name_or_path", str(folder), "--validation_file",
                                   str(tmp_path / "absent.txt"), "--protocols", protocols])
    import re

    assert re.search(message, line), line


def test_evaluate_reads_protocols_with_spaces_after_the_commas(saved_model, tmp_path, capsys):
    folder, _, _ = saved_model
    (tmp_path / "valid.txt").write_text("the court ruled\tthe tax case\n")
    main(["evaluate", "--model_name_or_path", str(folder), "--validation_file", str(tmp_path / "valid.txt"),
          "--protocols", "causal, paper", "--output_json", "none"])
    out = capsys.readouterr().out
    assert "causal" in out and "paper" in out


@pytest.mark.parametrize("seconds", ["-5", "nan", "inf", "0"])
def test_demo_refuses_a_training_budget_that_is_not_a_positive_number(capsys, seconds):
    assert "--train_seconds must be a positive number of seconds" in one_line_error(
        capsys, ["demo", "--train_seconds", seconds])


@pytest.mark.parametrize("flags, message", [
    (["--top_words", "0"], "--top_words must be a positive integer, got 0"),
    (["--json", "no/such/folder/steer.json"], "--json no/such/folder/steer.json: there is no folder no/such/folder")])
def test_steer_refuses_its_bad_flags_before_it_generates(saved_model, capsys, flags, message):
    """--top_words 0 was accepted, and a --json into a missing folder failed after all the generation."""
    folder, _, _ = saved_model
    assert message in one_line_error(capsys, ["steer", "--model_name_or_path", str(folder), "--num_samples", "1",
                                              *flags])


def test_synchronising_a_cuda_device_without_one_is_a_clear_error():
    from topic_lm_hf.devices import synchronize

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(ValueError, match="cannot synchronise cuda: this machine has no CUDA device"):
        synchronize("cuda")
    synchronize("cpu")  # a no-op


@pytest.mark.parametrize("layer", ["0", "3"])
def test_topics_names_its_own_flag_for_a_layer_out_of_range(tmp_path, capsys, layer):
    """--layer 0 was refused in the words of a keyword the user never typed (topic_layer)."""
    from topic_lm_hf import RGBNRNNConfig, RGBNRNNForCausalLM

    tok, topic_tok = build_vocabularies(synthetic_documents(30), min_freq=1)
    torch.manual_seed(0)
    model = RGBNRNNForCausalLM(RGBNRNNConfig.from_tokenizers(tok, topic_tok, topic_sizes=[4, 3], hidden_sizes=[4, 4],
                                                             embedding_size=4))
    model.save_pretrained(tmp_path / "m")
    save_vocabularies(tok, topic_tok, tmp_path / "m")
    line = one_line_error(capsys, ["topics", "--model_name_or_path", str(tmp_path / "m"), "--layer", layer])
    assert f"--layer must be in 1..2 (1 = bottom) for this model, got {layer}" in line and "topic_layer" not in line


@pytest.mark.parametrize("content, message", [
    ("[[1, 2]]", "row 0 is list, not an evaluation row"),
    ("{not json", "Expecting property name"),
    ('[{"protocol": "causal", "perplexity": -5, "tokens": 10}]', "perplexity >= 1 (a perplexity is never below 1)"),
    ('[{"protocol": "causal", "perplexity": 80.0, "tokens": -3}]', "has tokens -3"),
])
def test_export_refuses_results_that_are_not_evaluation_rows(saved_model, tmp_path, capsys, content, message):
    """--results holding lists, invalid JSON or impossible values is one line (a list of lists was a TypeError
    traceback, perplexity -5 was published on the card), and nothing is written."""
    folder, _, _ = saved_model
    results = tmp_path / "results.json"
    results.write_text(content)
    out = tmp_path / "upload"
    assert message in one_line_error(capsys, ["export", "--model_name_or_path", str(folder), "--repo_id", "me/m",
                                              "--output_dir", str(out), "--results", str(results)])
    assert not out.exists()


@pytest.mark.parametrize("edit", [{"hidden_size": 7}, {"pad_token_id": 10 ** 6}])
@pytest.mark.parametrize("command", ["evaluate", "generate", "export"])
def test_a_config_json_that_disagrees_with_the_weights_is_one_line(saved_model, tmp_path, capsys, edit, command):
    """An edited config.json (sizes that are not the weights', a pad_token_id outside the vocabulary) was a
    RuntimeError or an AssertionError traceback from transformers in every command that loads the folder."""
    import shutil

    folder, _, _ = saved_model
    edited = tmp_path / "edited"
    shutil.copytree(folder, edited)
    config = json.loads((edited / "config.json").read_text())
    (edited / "config.json").write_text(json.dumps({**config, **edit}))
    extra = {"evaluate": ["--validation_file", "none"], "generate": [],
             "export": ["--repo_id", "me/m", "--output_dir", str(tmp_path / "up")]}[command]
    line = one_line_error(capsys, [command, "--model_name_or_path", str(edited), *extra])
    assert "its config.json does not match its weights" in line, line


@pytest.mark.parametrize("flags, message", [
    (["--topic_layer", "1"], "--topic_layer: TCNLMForCausalLM has one layer of topics"),
    (["--topic_ids", "1", "--context_text", "the court"], "give one of --topic_ids and --context_text"),
])
def test_generate_names_the_conditioning_flag_a_model_cannot_take(saved_model, tmp_path, capsys, flags, message):
    """A conditioning flag the loaded model does not take was transformers' "model_kwargs are not used by the model:
    ['topic_layer'] (note: typos ...)", naming a keyword the user never typed; an LSTM folder refuses every topic
    flag the same way."""
    from topic_lm_hf import LSTMLMConfig, LSTMLMForCausalLM

    folder, _, _ = saved_model
    assert message in one_line_error(capsys, ["generate", "--model_name_or_path", str(folder), *flags])
    lstm = tmp_path / "lstm"
    tok, topic_tok = build_vocabularies(synthetic_documents(30), min_freq=1)
    LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), embedding_size=4, hidden_size=4)).save_pretrained(lstm)
    save_vocabularies(tok, topic_tok, lstm)
    for flag, value in [("--topic_ids", "1"), ("--topic_guidance_scale", "2")]:
        assert f"{flag}: LSTMLMForCausalLM has no topics" in one_line_error(
            capsys, ["generate", "--model_name_or_path", str(lstm), flag, value])


def test_a_device_flag_on_commands_without_one_says_what_to_use(saved_model, tmp_path, capsys):
    """`train --device cuda` and `export --device` were "unrecognized arguments" with no hint."""
    folder, _, _ = saved_model

    def last_line(argv):  # argparse prints the usage, then the error line
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        return capsys.readouterr().err.strip().splitlines()[-1]

    train = last_line(["train", "--output_dir", str(tmp_path / "o"), "--device", "cuda"])
    assert "unrecognized arguments: --device cuda" in train and "--use_cpu true keeps it on the CPU" in train
    export = last_line(["export", "--model_name_or_path", str(folder), "--repo_id", "me/m",
                        "--output_dir", str(tmp_path / "up"), "--device", "cpu"])
    assert "it needs no device" in export


def test_wsd_evaluate_on_a_language_models_folder_says_what_it_needs(saved_model, capsys):
    """It listed about 200 transformers configuration classes."""
    folder, _, _ = saved_model
    line = one_line_error(capsys, ["wsd", "evaluate", "--model_name_or_path", str(folder), "--dataset", "none"])
    assert "holds a tcnlm model (TCNLMForCausalLM), which AutoModelForTokenClassification does not load: give a sense " \
           "tagger's folder (topic-lm wsd train writes one)" in line and len(line) < 400, line


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
@pytest.mark.parametrize("command", [["classify"], ["retrieve"], ["wsd", "evaluate"]])
def test_a_missing_device_is_refused_before_data_or_model_load(saved_model, capsys, command, tmp_path):
    """classify and retrieve loaded the corpus and the model (with transformers' 11-line load report) before they
    refused --device cuda; the corpus named here does not even exist: nothing was read."""
    folder, _, _ = saved_model
    flags = ["--dataset", str(tmp_path / "absent.jsonl")] + (["--model_name_or_path", str(folder)])
    line = one_line_error(capsys, [*command, *flags, "--device", "cuda"])
    assert "--device cuda: this machine has no CUDA GPU" in line, line


def test_steer_refuses_more_sampled_topics_than_the_model_has(saved_model, capsys):
    """--num_topics_sampled 12 on a 3-topic model was silently cut to 3."""
    folder, _, _ = saved_model
    line = one_line_error(capsys, ["steer", "--model_name_or_path", str(folder), "--num_topics_sampled", "12",
                                   "--num_samples", "1", "--max_new_tokens", "2"])
    assert "num_topics_sampled (--num_topics_sampled) is 12, but the model has 3 topics: give at most 3" in line


@pytest.mark.parametrize("flags, message", [
    (["--eval_documents", "0"], "--eval_documents must be a positive integer, got 0"),
    (["--npmi_documents", "-1"], "--npmi_documents must be >= 0 (0 skips NPMI), got -1"),
    (["--threads", "1000"], "--threads must be in 1.."),
    (["--synthetic", "true", "--train_file", "corpus.txt"], "give one of --synthetic and --train_file"),
])
def test_demo_refuses_its_bad_flags_before_it_reads_or_trains(capsys, flags, message):
    """--eval_documents 0, --npmi_documents -1 and --output_dir naming a file failed after training; --threads 1000
    was accepted on 2 cores; --synthetic ignored --train_file."""
    assert message in one_line_error(capsys, ["demo", *flags])


def test_demo_refuses_an_output_dir_that_is_a_file(capsys, tmp_path):
    a_file = tmp_path / "out"
    a_file.write_text("")
    assert f"--output_dir {a_file} is a file" in one_line_error(capsys, ["demo", "--output_dir", str(a_file)])


def test_the_demo_refuses_a_corpus_too_small_for_its_topics_before_it_trains(capsys, tmp_path):
    """27 Wikipedia articles: a topic vocabulary of 2 words at the demo's frequency cut. The demo used to train both
    models and then stop on an NPMI error ("fewer than 2 distinct words among its top-1"), or, on a slightly larger
    corpus, show 20 identical topics; it now says in one line, before training, what to give."""
    import gzip
    from importlib import resources

    sample = resources.files("topic_lm_hf") / "resources" / "wikipedia_sample" / "train.txt.gz"
    with gzip.open(sample.open("rb"), "rt", encoding="utf-8") as f:
        lines = [next(f) for _ in range(27)]
    tiny = tmp_path / "tiny27.txt"
    tiny.write_text("".join(lines), encoding="utf-8")
    message = one_line_error(capsys, ["demo", "--train_file", str(tiny), "--output_dir", str(tmp_path / "out")])
    assert "too few for 20 topics" in message and "--train_file" in message
    assert not (tmp_path / "out").exists()


def test_the_demos_verdict_compares_no_models_that_took_a_handful_of_steps():
    """A 5-second budget: the topic model took 1 step. The verdict used to call it "at least as good as the LSTM"."""
    from topic_lm_hf.demo import verdict

    text = verdict(30.0, 31.0, 32.0, {"NCLM": 1, "LSTM": 98}, 5, "NCLM")
    assert "at least as good" not in text and "fewer than 50 training steps" in text
    assert "at least as good" in verdict(30.0, 31.0, 32.0, {"NCLM": 400, "LSTM": 900}, 60, "NCLM")


def test_the_demo_says_when_no_decoding_met_its_rule_and_warns_of_identical_topics():
    """The demo used to print "chosen: X (the most fluent with a lift of at least 2 ...)" when no decoding had
    that lift, and showed 20 identical topics without a word."""
    from topic_lm_hf.demo import chosen_line, distinct_topics_warning

    measured = {"a": {"lift": 1.1, "distinct_2": 0.9}, "b": {"lift": 2.5, "distinct_2": 0.95}}
    assert "no decoding met the rule" in chosen_line("a", measured)
    assert "no decoding met the rule" not in chosen_line("b", measured)
    same = [["color", "red", "blue"]] * 20
    assert "share most of their top words (5% of them distinct)" in distinct_topics_warning(same)
    assert distinct_topics_warning([[f"w{k}{i}" for i in range(3)] for k in range(20)]) is None


def _labelled_file(path, labels):
    """A tiny labelled JSON-lines corpus: one short real-looking text per label in ``labels``."""
    texts = ["shares of the company rose after the merger was announced", "oil prices fell as crude stocks grew",
             "the bank raised its interest rate again", "wheat exports to the region were cut"]
    path.write_text("".join(json.dumps({"text": texts[i % len(texts)], "label": label}) + "\n"
                            for i, label in enumerate(labels)), encoding="utf-8")
    return str(path)


def test_the_tasks_messages_for_a_tiny_corpus_name_what_to_change(capsys, saved_model, tmp_path):
    """A corpus too small for the stratified split used to get scikit-learn's words ("the minimum number of groups
    for any class"), retrieve's cut-offs did not name --k, and an empty vocabulary named min_freq= to a user of
    topic-lm train."""
    folder = str(saved_model[0])
    lonely = _labelled_file(tmp_path / "lonely.jsonl", ["acq", "earn", "earn", "earn"])
    assert "needs at least 2 documents of every label" in one_line_error(
        capsys, ["classify", "--model_name_or_path", folder, "--dataset", lonely])
    eight = _labelled_file(tmp_path / "eight.jsonl", ["acq", "earn"] * 4)
    assert "(test_fraction; --test_fraction on the command line) splits 8 documents into 7 and 1" in one_line_error(
        capsys, ["classify", "--model_name_or_path", folder, "--dataset", eight, "--test_fraction", "0.1"])
    assert "--k and --fractions" in one_line_error(
        capsys, ["retrieve", "--model_name_or_path", folder, "--dataset", eight, "--no_baselines"])
    corpus = tmp_path / "three.txt"
    corpus.write_text("the senate said .\tpolice said .\nthe senate voted .\n", encoding="utf-8")
    assert "(--min_freq of topic-lm train)" in one_line_error(
        capsys, ["train", "--train_file", str(corpus), "--min_freq", "1000", "--output_dir", str(tmp_path / "o"),
                 "--report_to", "none"])
