"""The `topic-lm` command as a user runs it: the README's main job, and train / evaluate / generate."""

import logging
import json
import re
from types import SimpleNamespace

import pytest

from conftest import DATA, requires_data
from topic_lm_hf import PROTOCOLS, demo
from topic_lm_hf.cli import main
from topic_lm_hf.demo import DECODINGS
from topic_lm_hf.families import family_of


def user_error(capsys, argv) -> str:
    """Run ``topic-lm argv``, which must stop on a user error: exit code 2 and one line on stderr, returned."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_.value.code == 2 and len(err) == 1, err
    return err[0]


def test_demo_on_the_synthetic_corpus_says_so(tmp_path, capsys):
    before = logging.getLogger("topic_lm_hf").level
    main(["demo", "--synthetic", "--train_seconds", "2", "--eval_documents", "8", "--output_dir", str(tmp_path)])
    assert logging.getLogger("topic_lm_hf").level == before  # the demo silences the package's log only while it runs
    out = capsys.readouterr().out
    label = family_of(demo.DEMO_FAMILY).label  # the default family: the measured best at the demo's budget
    assert "SYNTHETIC" in out
    assert re.search(r"Training in (bf16 autocast|float32) with the compiled output layer", out)  # the fast path
    # the trained objects compute as their saved weights do (bf16 training leaves no autocast wrapper behind)
    assert out.count("same logits after reloading: True") == 2
    for model in ("LSTM", label):
        for protocol in ("paper", "causal", "causal-carry"):
            assert re.search(rf"\| {model} \| {protocol} \|", out), out
    for protocol in ("paper", "causal"):
        assert re.search(rf"\| {label} \| {protocol}, another document's context \(ablation\)", out)
    # the same wall time for both models, and one verdict under causal with the ablation's split
    steps = re.search(rf"{label} (\d+) steps \([\d.]+ M parameters\), the LSTM (\d+) \([\d.]+ M\), of 64 sentence",
                      out)
    assert steps and int(steps.group(1)) > 0 and int(steps.group(2)) > 0
    verdict = next(line for line in out.splitlines() if "Under causal (what generation sees" in line)
    assert "The document's own topics are worth" in verdict
    # one of three verdicts: too few steps to compare (this 2-second budget, usually), or which model is ahead
    assert sum(words in verdict for words in ("at least as good as the LSTM", "not as good as the LSTM",
                                              "fewer than 50 training steps")) == 1
    assert "the family that did best of the package's topic families at this budget" in verdict
    # the steered samples' decoding: every candidate measured, one chosen by the stated rule
    measured = re.findall(r"^ +(.+?): fluency (\d+) \(perplexity of the steered texts under the LSTM\)", out, re.M)
    assert [name for name, _ in measured] == list(DECODINGS)
    assert re.search(r"chosen: (.+?)(, the most fluent; no decoding met the rule)? \(the most fluent with a "
                     r"topic-word lift", out).group(1) in DECODINGS
    assert "<unk>" not in "\n".join(line for line in out.splitlines() if line.strip().startswith("- "))
    assert re.search(r"\[demo\] finished in \d+ s", out)
    for name in ("lstm", demo.DEMO_FAMILY):
        assert (tmp_path / name / "model.safetensors").exists()
        assert (tmp_path / name / "topic_tokenizer" / "tokenizer.json").exists()


def test_demo_trains_on_the_wikipedia_sample_by_default(tmp_path, capsys, monkeypatch):
    """A fresh clone, nothing beside it: the demo reads the corpus and the NPMI reference that ship with the package."""
    monkeypatch.delenv("TOPIC_LM_DATA", raising=False)
    monkeypatch.chdir(tmp_path)  # no corpus folder near the working directory either
    main(["demo", "--train_seconds", "1", "--eval_documents", "4", "--npmi_documents", "100",
          "--output_dir", str(tmp_path / "demo")])
    out = capsys.readouterr().out
    assert "SYNTHETIC" not in out
    assert "wikipedia-sample (900 docs) / wikipedia-sample/validation (100 docs)" in out
    assert "no trained models in hub_models/" in out  # they ship with the clone, which this folder is not
    npmi = re.search(r"mean NPMI (-?[\d.]+) \(lau2014 preset, npmi_reference\.txt\.gz .*?100 documents", out)
    assert npmi and -1 <= float(npmi.group(1)) <= 1, out
    topics = re.findall(r"^ +topic +\d+ +NPMI [+-][\d.]+ +(.+)$", out, re.M)
    assert len(topics) == 8 and all(len(words.split()) == 10 for words in topics)  # real words of the sample
    label = family_of(demo.DEMO_FAMILY).label
    assert re.search(rf"\| {label} \| causal \| {re.escape(PROTOCOLS['causal'].description)} \| [\d.]+ \|", out)


@pytest.mark.parametrize("family", [f for f in demo.demo_families() if f != demo.DEMO_FAMILY])
def test_demo_trains_any_topic_family_when_asked(family, tmp_path, capsys):
    main(["demo", "--synthetic", "--family", family, "--train_seconds", "1", "--eval_documents", "4",
          "--output_dir", str(tmp_path)])
    out = capsys.readouterr().out
    label = family_of(family).label
    assert f"training {label} (20 topics), then the same-size LSTM" in out
    assert out.count("same logits after reloading: True") == 2
    assert re.search(rf"\| {label} \| causal, another document's context \(ablation\)", out)
    verdict = next(line for line in out.splitlines() if "Under causal (what generation sees" in line)
    assert f"perplexity points to {label}" in verdict
    assert "the family that did best" not in verdict  # another family did: the verdict names it
    assert family_of(demo.DEMO_FAMILY).label in verdict
    if family == "rgbn_rnn":  # it reads whole documents: as many per step as hold about 64 chunks
        assert re.search(r"the LSTM's of 64 sentence chunks, rGBN-RNN's of \d+ whole documents", out)
    assert (tmp_path / family / "model.safetensors").exists()


def test_demo_budget_can_run_on_another_clock():
    clock = [0.0]
    budget = demo.TimeBudget(5, "LSTM ", clock=lambda: clock[0])
    state, control = SimpleNamespace(global_step=1), SimpleNamespace(should_training_stop=False)
    budget.on_train_begin(None, state, control)
    clock[0] = 4.9
    assert not budget.on_step_end(None, state, control).should_training_stop
    clock[0] = 5.0
    assert budget.on_step_end(None, state, control).should_training_stop


def test_demo_progress_is_a_line_per_ten_seconds_however_fast_the_steps(monkeypatch, capsys):
    clock = [100.0]
    monkeypatch.setattr(demo.time, "perf_counter", lambda: clock[0])
    budget, state = demo.TimeBudget(60, "LSTM "), SimpleNamespace(global_step=0)
    budget.on_train_begin(None, state, None)
    for step in range(25, 2401, 25):  # a log every 25 steps, 40 steps per second
        clock[0] += 25 / 40
        state.global_step = step
        budget.on_log(None, state, None, logs={"lm_loss": 4.0})
        budget.on_log(None, state, None, logs={"loss": 4.0})  # a log without the LM loss prints nothing
    lines = capsys.readouterr().out.splitlines()
    # 60 s of training: the first log (step 25, 0.6 s), then one at least 10 s after the last printed
    assert [int(re.search(r"step +(\d+)", line).group(1)) for line in lines] == [25, 425, 825, 1225, 1625, 2025], lines
    assert all(line.startswith("       LSTM : step") and line.endswith("LM loss 4.00 (perplexity 55)")
               for line in lines)


def test_train_evaluate_generate_commands_on_the_wikipedia_sample(tmp_path, capsys, caplog):
    out_dir = tmp_path / "lstm"
    with caplog.at_level(logging.INFO, logger="topic_lm_hf.fast_path"):
        main(["train", "--train_file", "wikipedia-sample", "--max_train_documents", "150",
              "--validation_file", "wikipedia-sample/validation", "--max_eval_documents", "20",
              "--config_overrides", "embedding_size=32,hidden_size=32", "--min_freq", "3",
              "--output_dir", str(out_dir), "--max_steps", "20", "--per_device_train_batch_size", "16",
              "--report_to", "none", "--use_cpu", "--eval_strategy", "steps", "--eval_steps", "20"])
    # one line says which training path the run took, and why
    assert len([r for r in caplog.records if r.getMessage().startswith("Training in ")]) == 1
    assert (out_dir / "model.safetensors").exists()
    main(["evaluate", "--model_name_or_path", str(out_dir), "--validation_file", "wikipedia-sample/validation",
          "--max_eval_documents", "10"])
    out = capsys.readouterr().out
    rows = re.findall(r"\| (paper|causal|causal-carry) \| .*? \| ([\d.]+) \| (\d+) \|", out)
    assert [r[0] for r in rows] == ["paper", "causal", "causal-carry"]
    assert all(1 < float(r[1]) < 5000 for r in rows)
    # export: an upload-ready folder whose card carries the rows evaluate wrote next to the model
    main(["export", "--model_name_or_path", str(out_dir), "--repo_id", "me/lstm-wiki",
          "--output_dir", str(tmp_path / "export")])
    assert "upload it with `hf upload me/lstm-wiki" in capsys.readouterr().out
    from huggingface_hub import ModelCard

    card = ModelCard.load(tmp_path / "export" / "README.md")
    measured = {r.metric_config: r.metric_value for r in card.data.eval_results}
    assert measured == {protocol: round(float(value), 2) for protocol, value, _ in rows}
    assert card.data.eval_results[0].dataset_name == "wikipedia-sample/validation"
    assert 'repo = "me/lstm-wiki"' in card.text
    assert {"modeling_lstm_lm.py", "tokenizer.json", "model.safetensors"} <= {p.name for p in (tmp_path / "export").iterdir()}
    main(["generate", "--model_name_or_path", str(out_dir), "--prompt", "The city was", "--max_new_tokens", "5",
          "--num_beams", "2", "--num_return_sequences", "2"])
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("the city was ")]
    assert len(lines) == 2 and all(3 < len(l.split()) <= 3 + 5 for l in lines)  # prompt + up to 5 new tokens
    with pytest.raises(SystemExit) as exit_:
        main(["topics", "--model_name_or_path", str(out_dir)])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip() == ("topic-lm topics: error: LSTMLMForCausalLM has no topics (it is not a "
                                               "topic model)")


def test_build_model_sizes_a_topic_rnn_to_the_vocabularies():
    from topic_lm_hf import build_vocabularies, synthetic_documents
    from topic_lm_hf.arguments import ModelArguments
    from topic_lm_hf.commands import build_model
    from topic_lm_hf.models.configuration_topic_rnn import TopicRNNConfig

    tok, topic_tok = build_vocabularies(synthetic_documents(40), min_freq=1)
    model = build_model(ModelArguments(model_type="topic_rnn", config_overrides="hidden_size=16,num_topics=4"),
                        tok, topic_tok)
    config = model.config
    assert (config.vocab_size, config.topic_vocab_size, config.hidden_size) == (len(tok), len(topic_tok), 16)
    assert config.topic_word_ids == TopicRNNConfig.topic_word_ids_from_tokenizers(tok, topic_tok)
    lm_vocab = tok.get_vocab()
    for word, index in topic_tok.get_vocab().items():  # every topic word points at itself in the LM vocabulary
        assert config.topic_word_ids[index] == (-1 if word == "<unk>" else lm_vocab[word])


def test_evaluate_refuses_a_folder_whose_weights_belong_to_another_model(wiki, tmp_path, capsys):
    """config.json of a TCNLM next to an LSTM's weights (a folder two runs wrote into): evaluate
    used to print a perplexity of a random model and exit 0."""
    from conftest import tiny_model
    from topic_lm_hf import save_vocabularies

    folder = tmp_path / "mixed"
    tiny_model("lstm_lm", wiki["tok"], wiki["topic_tok"]).save_pretrained(folder)
    save_vocabularies(wiki["tok"], wiki["topic_tok"], folder)
    tiny_model("tcnlm", wiki["tok"], wiki["topic_tok"]).config.save_pretrained(folder)
    with pytest.raises(SystemExit) as exit_:
        main(["evaluate", "--model_name_or_path", str(folder), "--validation_file",
              "wikipedia-sample/validation", "--max_eval_documents", "5", "--protocols", "causal"])
    assert exit_.value.code == 2
    assert re.match(r"topic-lm evaluate: error: .*lacks \d+ weight\(s\) of TCNLMForCausalLM", capsys.readouterr().err)


def test_a_checkpoint_holds_both_tokenizers_and_is_evaluated_and_its_topics_printed(tmp_path, capsys):
    """checkpoint-* folders lacked topic_tokenizer/, and `topics` / `evaluate` on them failed with
    an error asking for sentencepiece or tiktoken."""
    import shutil

    out_dir = tmp_path / "tcnlm"
    main(["train", "--train_file", "wikipedia-sample", "--max_train_documents", "60",
          "--validation_file", "wikipedia-sample/validation", "--max_eval_documents", "5",
          "--model_type", "tcnlm", "--config_overrides", "embedding_size=16,hidden_size=16,num_topics=3",
          "--recipe", "paper", "--min_freq", "3", "--output_dir", str(out_dir), "--max_steps", "2", "--save_steps", "2",
          "--per_device_train_batch_size", "8", "--report_to", "none", "--use_cpu", "--eval_strategy", "no"])
    checkpoint = out_dir / "checkpoint-2"
    assert (checkpoint / "tokenizer.json").exists() and (checkpoint / "topic_tokenizer" / "tokenizer.json").exists()
    capsys.readouterr()
    main(["topics", "--model_name_or_path", str(checkpoint), "--top_n", "5"])
    topics = [l for l in capsys.readouterr().out.splitlines() if l.startswith("topic ")]
    assert len(topics) == 3 and all(len(l.split(":")[1].split()) == 5 for l in topics)
    main(["evaluate", "--model_name_or_path", str(checkpoint), "--validation_file", "wikipedia-sample/validation",
          "--max_eval_documents", "3", "--protocols", "paper"])
    assert re.search(r"\| paper \| .*? \| [\d.]+ \| \d+ \|", capsys.readouterr().out)

    shutil.rmtree(checkpoint / "topic_tokenizer")  # e.g. a checkpoint written by an older version
    assert re.search(r"checkpoint-2 has no topic tokenizer \(no topic_tokenizer/tokenizer\.json",
                     user_error(capsys, ["topics", "--model_name_or_path", str(checkpoint)]))
    assert "has no topic tokenizer" in user_error(capsys, [
        "evaluate", "--model_name_or_path", str(checkpoint), "--validation_file", "wikipedia-sample/validation",
        "--max_eval_documents", "3", "--protocols", "paper"])
# ----------------------------------------------------------------------------------------------
# the command line itself: help, unknown flags, configuration overrides, progress, no noise
# ----------------------------------------------------------------------------------------------

from topic_lm_hf.arguments import ModelArguments  # noqa: E402
from topic_lm_hf.cli import COMMANDS, command_parser, parse_command  # noqa: E402
from topic_lm_hf.commands import make_config  # noqa: E402


def _write_lau(path, documents):
    """Documents in the Lau et al. format: one per line, sentences separated by TAB."""
    path.write_text("".join("\t".join(" ".join(s) for s in doc["sentences"]) + "\n" for doc in documents))
    return str(path)


@pytest.fixture(scope="module")
def synthetic_files(tmp_path_factory):
    from topic_lm_hf import synthetic_documents

    folder = tmp_path_factory.mktemp("corpus")
    docs = synthetic_documents(120, seed=1)
    return _write_lau(folder / "train.txt", docs.select(range(100))), _write_lau(folder / "valid.txt",
                                                                                 docs.select(range(100, 120)))


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_subcommand_help_names_it_and_documents_every_flag(name):
    parser = command_parser(name)
    text = parser.format_help()
    assert text.startswith(f"usage: topic-lm {name} [-h]")
    assert "``" not in text
    undocumented = [a.option_strings for a in parser._actions if not (a.help or "").strip()]
    assert undocumented == []


def test_evaluate_help_lists_only_the_flags_evaluate_uses():
    flags = {a.option_strings[0] for a in command_parser("evaluate")._actions}
    assert flags == {"-h", "--model_name_or_path", "--validation_file", "--text_column", "--max_eval_documents",
                     "--protocols", "--max_sentence_length", "--max_context_tokens", "--batch_size", "--empty_context",
                     "--output_json", "--device"}


def test_stopwords_help_documents_mallet():
    (action,) = [a for a in command_parser("train")._actions if a.dest == "stopwords"]
    assert action.default == "mallet" and "'mallet'" in action.help and "shipped with the package" in action.help


def test_top_level_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert all(re.search(rf"^  {name} +\S", out, re.M) for name in COMMANDS) and "``" not in out
    with pytest.raises(SystemExit, match="unknown command 'trian'"):
        main(["trian"])


@pytest.mark.parametrize("name, required", [("train", []), ("evaluate", ["--model_name_or_path", "m"]),
                                            ("generate", ["--model_name_or_path", "m"]),
                                            ("topics", ["--model_name_or_path", "m"]), ("demo", [])])
def test_an_unknown_flag_is_an_error(name, required, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([name, *required, "--bogus_flag", "3"])
    assert exit_.value.code == 2
    assert f"topic-lm {name}: error: unrecognized arguments: --bogus_flag 3" in capsys.readouterr().err


def test_an_abbreviated_flag_is_an_error(capsys):
    with pytest.raises(SystemExit):
        parse_command("demo", ["--max_step", "5"])  # not silently taken for --max_steps
    assert "unrecognized arguments: --max_step 5" in capsys.readouterr().err


def test_train_defaults_suit_these_models_and_flags_still_win():
    _, _, args, fast = parse_command("train", ["--output_dir", "x"])
    assert (args.learning_rate, args.logging_steps, args.disable_tqdm) == (1e-3, 50, False)
    assert (fast.precision, fast.compile_output_layer) == ("auto", None)  # chosen per device (fast_path)
    _, _, args, fast = parse_command("train", ["--output_dir", "x", "--learning_rate", "3e-4", "--logging_steps", "7",
                                               "--disable_tqdm", "true", "--precision", "fp32",
                                               "--compile_output_layer", "false"])
    assert (args.learning_rate, args.logging_steps, args.disable_tqdm) == (3e-4, 7, True)
    assert (fast.precision, fast.compile_output_layer) == ("fp32", False)


def test_config_overrides_go_through_transformers_and_the_config_class():
    config = make_config(ModelArguments(model_type="tcnlm",
                                        config_overrides="hidden_size=64, dropout=0.25,tie_word_embeddings=true"))
    assert (config.hidden_size, config.dropout, config.tie_word_embeddings) == (64, 0.25, True)
    assert config.num_factors == 64  # derived by TCNLMConfig from the overridden hidden size, not left at 600
    # a config file's explicit values stay unless overridden; its model_type wins
    config = make_config(ModelArguments(model_type="lstm_lm", config_file="hub_configs/tcnlm-apnews-small.json",
                                        config_overrides="hidden_size=128,num_topics=20"))
    assert (config.model_type, config.hidden_size, config.num_factors, config.num_topics) == ("tcnlm", 128, 600, 20)
    with pytest.raises(ValueError, match="hidden_sise isn't in the original config"):
        make_config(ModelArguments(model_type="lstm_lm", config_overrides="hidden_sise=64"))
    with pytest.raises(ValueError, match="dropout must be in"):  # the configuration's own check runs
        make_config(ModelArguments(model_type="tcnlm", config_overrides="dropout=1.5"))
    with pytest.raises(ValueError, match="topic_word_ids"):  # a scalar where the config holds a list
        make_config(ModelArguments(model_type="topic_rnn", config_overrides="topic_word_ids=3"))
    # rGBN-RNN's per-layer sizes are lists, written in brackets; its derived num_topics names what to set
    config = make_config(ModelArguments(model_type="rgbn_rnn",
                                        config_overrides="topic_sizes=[8,4],hidden_sizes=[16, 16],embedding_size=12"))
    assert (config.topic_sizes, config.hidden_sizes, config.embedding_size) == ([8, 4], [16, 16], 12)
    with pytest.raises(ValueError, match=r"RGBNRNNConfig has no num_topics \(got 5\); give topic_sizes"):
        make_config(ModelArguments(model_type="rgbn_rnn", config_overrides="num_topics=5"))
    with pytest.raises(ValueError, match=r"not a list of numbers \(write hidden_sizes=\[16,16\]\)"):
        make_config(ModelArguments(model_type="rgbn_rnn", config_overrides="hidden_sizes=[16,x]"))
    with pytest.raises(ValueError, match="key=value pairs"):
        make_config(ModelArguments(model_type="lstm_lm", config_overrides="hidden_size"))


def test_train_and_evaluate_show_progress_without_pin_memory_noise(synthetic_files, tmp_path, capsys, caplog):
    import warnings

    train_file, valid_file = synthetic_files
    caplog.set_level("INFO", logger="topic_lm_hf")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(["train", "--train_file", train_file, "--validation_file", valid_file, "--min_freq", "1",
              "--config_overrides", "embedding_size=8,hidden_size=8", "--output_dir", str(tmp_path / "m"),
              "--max_steps", "4", "--logging_steps", "2", "--per_device_train_batch_size", "8"])
    assert not [w for w in caught if "pin_memory" in str(w.message)]
    captured = capsys.readouterr()
    assert len(re.findall(r"'loss': ", captured.out + captured.err)) >= 2  # a log line every 2 steps
    assert re.search(r"\d+/4 \[", captured.err)  # the progress bar, up to step 4

    main(["evaluate", "--model_name_or_path", str(tmp_path / "m"), "--validation_file", valid_file,
          "--protocols", "paper,causal"])
    lines = [r.getMessage() for r in caplog.records if r.name == "topic_lm_hf"]
    assert any("evaluating protocol paper (1/2)" in line for line in lines)
    assert any(re.search(r"causal perplexity [\d.]+ on \d+ tokens \(\d+ s\)", line) for line in lines)
    assert re.search(r"\| causal \| .* \| [\d.]+ \| \d+ \|", capsys.readouterr().out)


def test_train_an_nclm_with_a_topic_model_phase_then_evaluate_and_generate_from_topics(tmp_path, capsys):
    out_dir = tmp_path / "nclm"
    main(["train", "--train_file", "wikipedia-sample", "--max_train_documents", "80",
          "--model_type", "nclm", "--recipe", "paper", "--context", "preceding", "--min_freq", "3",
          "--pretraining_phases", "topic_model:4",
          "--config_overrides", "variant=leta,sentence_topics=true,num_topics=6,embedding_size=16,hidden_size=16",
          "--output_dir", str(out_dir), "--max_steps", "8", "--per_device_train_batch_size", "16",
          "--report_to", "none", "--use_cpu"])
    main(["evaluate", "--model_name_or_path", str(out_dir), "--validation_file", "wikipedia-sample/validation",
          "--max_eval_documents", "5"])
    rows = re.findall(r"\| (paper|causal|causal-carry) \| .*? \| ([\d.]+) \| (\d+) \|", capsys.readouterr().out)
    assert [r[0] for r in rows] == ["paper", "causal", "causal-carry"] and len({r[2] for r in rows}) == 1
    main(["generate", "--model_name_or_path", str(out_dir), "--topic_ids", "2", "--max_new_tokens", "5"])
    main(["topics", "--model_name_or_path", str(out_dir), "--top_n", "4"])
    assert len([l for l in capsys.readouterr().out.splitlines() if l.strip()]) >= 6
    # decode-time topic guidance from the command line: s = 1 is the plain text, a scale without topics an error
    generate = ["generate", "--model_name_or_path", str(out_dir), "--topic_ids", "2", "--max_new_tokens", "6"]
    main(generate)
    plain = capsys.readouterr().out
    main(generate + ["--topic_guidance_scale", "1"])
    assert capsys.readouterr().out == plain
    main(generate + ["--topic_guidance_scale", "3"])
    assert capsys.readouterr().out.strip()
    assert "topic_guidance_scale guides towards a conditioning" in user_error(
        capsys, ["generate", "--model_name_or_path", str(out_dir), "--topic_guidance_scale", "3"])
    assert "phase:steps" in user_error(capsys, ["train", "--model_type", "nclm", "--pretraining_phases", "topic_model",
                                                "--output_dir", str(tmp_path)])


def test_train_uses_the_steering_recipe_by_default_and_the_papers_training_one_flag_away(tmp_path, capsys, caplog):
    """A new topic model from `topic-lm train` gets the steering recipe (STEERING_RECIPE's configuration values, the
    topic model pre-trained alone first, early-stopped on the validation documents); --config_overrides win over
    it; --recipe paper is the paper's model and training; the prior's lambda is saved with the model."""
    from transformers import AutoModelForCausalLM

    from topic_lm_hf import STEERING_RECIPE, steering_recipe

    common = ["--train_file", "wikipedia-sample", "--max_train_documents", "60",
              "--validation_file", "wikipedia-sample/validation", "--max_eval_documents", "8",
              "--min_freq", "3", "--max_steps", "3", "--per_device_train_batch_size", "16", "--report_to", "none",
              "--use_cpu"]
    out_dir = tmp_path / "topic_rnn"
    with caplog.at_level(logging.INFO, logger="topic_lm_hf"):
        main(["train", *common, "--model_type", "topic_rnn", "--output_dir", str(out_dir), "--pretrain_topic_model_steps",
              "250", "--config_overrides", "topic_prior_weight_init=1.5,num_topics=5,embedding_size=16,hidden_size=16"])
    assert re.search(r"Topic model pre-trained: \d+ steps \(stopped by (its development objective|the step cap)\), "
                     r"best development objective [\d.]+ at step \d+", caplog.text)
    assert "Recipe: steering" in caplog.text
    config = AutoModelForCausalLM.from_pretrained(out_dir).config
    expected = {**STEERING_RECIPE["topic_rnn"], "topic_prior_weight_init": 1.5}  # the override wins
    assert {k: getattr(config, k) for k in expected} == expected
    assert AutoModelForCausalLM.from_pretrained(out_dir).topic_prior_weight is not None
    assert re.search(r"Pre-training the topic model on \d+ rows, the context bags of sentence chunks", caplog.text)
    # rGBN-RNN: its topic model is pre-trained on whole documents' bags, with the recipe's sparser topics
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="topic_lm_hf"):
        main(["train", *common, "--model_type", "rgbn_rnn", "--output_dir", str(tmp_path / "rgbn"),
              "--pretrain_topic_model_steps", "20", "--per_device_train_batch_size", "2",
              "--config_overrides", "topic_sizes=[5],hidden_sizes=[16],embedding_size=16"])
    assert "Pre-training the topic model on 60 rows, whole documents' bags of words" in caplog.text
    rgbn = AutoModelForCausalLM.from_pretrained(tmp_path / "rgbn").config
    assert {k: getattr(rgbn, k) for k in STEERING_RECIPE["rgbn_rnn"]} == STEERING_RECIPE["rgbn_rnn"]
    assert rgbn.eta_phi == 0.01
    # --recipe paper: the paper's configuration, no pre-training
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="topic_lm_hf"):
        main(["train", *common, "--model_type", "topic_rnn", "--recipe", "paper", "--output_dir", str(tmp_path / "p"),
              "--config_overrides", "num_topics=5,embedding_size=16,hidden_size=16"])
    assert "pre-trained" not in caplog.text and "Recipe: steering" not in caplog.text
    paper = AutoModelForCausalLM.from_pretrained(tmp_path / "p").config
    assert (paper.topic_output_bias, paper.bow_loss_weight, paper.theta_transform) == (None, 0.0, None)
    # NCLM's ETA has no latent topic distribution for the prior: the recipe gives it the diversity term only
    assert steering_recipe("nclm", variant="eta") == {"diversity_weight": 1.0} and steering_recipe("lstm_lm") == {}
    eta = make_config(ModelArguments(model_type="nclm", config_overrides="variant=eta"))
    assert (eta.topic_output_bias, eta.diversity_weight) == (None, 1.0)
    # TCNLM's naive mixture of experts has no prior either (the Table 6 configuration builds)
    moe = make_config(ModelArguments(model_type="tcnlm", config_overrides="lm_type=naive_moe"))
    assert moe.topic_output_bias is None and steering_recipe("tcnlm", lm_type="naive_moe") == {}
    # a published configuration trains as published unless --recipe steering is asked for
    published = make_config(ModelArguments(config_file="hub_configs/topicrnn-apnews.json"))
    assert (published.topic_output_bias, published.bow_loss_weight, published.theta_transform) == (None, 0.0, None)
    asked = make_config(ModelArguments(config_file="hub_configs/topicrnn-apnews.json", recipe="steering"))
    assert (asked.topic_output_bias, asked.theta_transform) == ("beta", "softmax")
    assert make_config(ModelArguments(config_file="hub_configs/tcnlm-table6-naive-moe.json")).lm_type == "naive_moe"
    # continuing a saved model: its own configuration, no pre-training unless asked for
    from topic_lm_hf.commands import build_model, pretraining_steps

    saved = ModelArguments(model_name_or_path=str(tmp_path / "p"))
    from topic_lm_hf import load_vocabularies

    again = build_model(saved, *load_vocabularies(tmp_path / "p"))
    assert again.config.theta_transform is None and pretraining_steps(saved, again) == 0
    # a model without topics: no recipe, no pre-training; asking for pre-training is a user error
    lstm = ["train", "--train_file", "wikipedia-sample", "--max_train_documents", "20",
            "--min_freq", "3", "--model_type", "lstm_lm", "--output_dir", str(tmp_path / "lstm"), "--max_steps", "1",
            "--use_cpu", "--report_to", "none"]
    main(lstm)
    assert "has no topic model to pre-train" in user_error(capsys, lstm + ["--pretrain_topic_model_steps", "5",
                                                                          "--output_dir", str(tmp_path / "lstm2")])


@requires_data("r8", "train.jsonl.gz")
def test_classify_and_retrieve_commands_on_r8(tmp_path, capsys):
    lm_dir = tmp_path / "nclm"
    main(["train", "--train_file", str(DATA / "r8" / "train.jsonl.gz"), "--text_column", "text",
          "--max_train_documents", "200", "--min_freq", "3", "--model_type", "nclm", "--recipe", "paper",
          "--context", "document",
          "--config_overrides", "embedding_size=16,hidden_size=16,num_topics=4,encoder_hidden_size=16,"
          "num_topic_samples=1,variant=lta", "--output_dir", str(lm_dir), "--max_steps", "5",
          "--per_device_train_batch_size", "16", "--report_to", "none", "--use_cpu", "--disable_tqdm", "true"])
    common = ["--model_name_or_path", str(lm_dir), "--dataset", str(DATA / "r8" / "train.jsonl.gz"),
              "--max_train_documents", "120", "--max_test_documents", "40", "--max_document_length", "60"]
    main(["classify", *common, "--epochs", "1", "--output_dir", str(tmp_path / "clf")])
    out = capsys.readouterr().out
    assert "120 training / 40 held-out documents (stratified 80%/20% split, seed 0)" in out
    assert re.search(r"\| NCLMForSequenceClassification \[o_N; c\] \(mlp head, frozen features, 1 epochs\) \| "
                     r"0\.\d{4} \|", out)
    assert re.search(r"\| majority class \| 0\.\d{4} \|", out) and "tf-idf + logistic regression" in out
    assert (tmp_path / "clf" / "model.safetensors").exists() and (tmp_path / "clf" / "topic_tokenizer").exists()
    main(["retrieve", *common, "--k", "1,5", "--fractions", "0.02", "--baselines", "false"])
    out = capsys.readouterr().out
    assert re.search(r"\| NCLMForCausalLM: \[o_N; c\] \(raw\) \| [01]\.\d{4} \| [01]\.\d{4} \| [01]\.\d{4} \|", out), out
    assert "| precision@1 | precision@5 | precision@fraction=0.02 |" in out
    assert "normalize must be one of" in user_error(capsys, ["retrieve", *common, "--normalize", "l2"])


@pytest.mark.parametrize("argv, message", [
    (["generate", "--model_name_or_path", "{model}", "--topic_ids", "1,x"],
     "topic-lm generate: error: --topic_ids takes comma-separated integers, e.g. --topic_ids 3,7 (got '1,x')"),
    (["generate", "--model_name_or_path", "{model}", "--topic_ids", "99"], "topic-lm generate: error: "),
    (["evaluate", "--model_name_or_path", "{model}", "--validation_file", "{missing}"], "topic-lm evaluate: error: "),
    (["evaluate", "--model_name_or_path", "{model}", "--protocols", "causl"], "topic-lm evaluate: error: "),
])
def test_a_user_error_is_one_line_and_exit_code_2_and_debug_shows_the_traceback(argv, message, tmp_path, capsys):
    from topic_lm_hf import TCNLMConfig, TCNLMForCausalLM, build_vocabularies, save_vocabularies, synthetic_documents

    tok, topic_tok = build_vocabularies(synthetic_documents(30), min_freq=1)
    model = TCNLMForCausalLM(TCNLMConfig.from_tokenizers(tok, topic_tok, num_topics=3, embedding_size=4,
                                                         hidden_size=4))
    model.save_pretrained(tmp_path / "m")
    save_vocabularies(tok, topic_tok, tmp_path / "m")
    argv = [a.format(model=tmp_path / "m", missing=tmp_path / "missing.txt") for a in argv]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and err[0].startswith(message), err
    with pytest.raises((ValueError, OSError)):  # --debug: the exception itself, with its traceback
        main([*argv, "--debug"])


def test_a_command_group_lists_its_commands(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["wsd", "--help"])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and out.startswith("usage: topic-lm wsd {train,evaluate}") and "evaluate  " in out


def test_rgbn_topics_per_layer_and_generation_from_an_upper_layer(tmp_path, capsys):
    from topic_lm_hf import RGBNRNNConfig, RGBNRNNForCausalLM, build_vocabularies, save_vocabularies, synthetic_documents

    tok, topic_tok = build_vocabularies(synthetic_documents(30), min_freq=1)
    model = RGBNRNNForCausalLM(RGBNRNNConfig.from_tokenizers(tok, topic_tok, topic_sizes=[4, 3], hidden_sizes=[8, 8],
                                                             embedding_size=8))
    model.save_pretrained(tmp_path / "m")
    save_vocabularies(tok, topic_tok, tmp_path / "m")
    main(["topics", "--model_name_or_path", str(tmp_path / "m"), "--top_n", "3"])
    out = capsys.readouterr().out
    assert "layer 1 (4 topics)" in out and "layer 2 (3 topics)" in out and out.count("topic ") == 7
    main(["topics", "--model_name_or_path", str(tmp_path / "m"), "--layer", "2"])
    out = capsys.readouterr().out
    assert "layer 1" not in out and out.count("topic ") == 3
    main(["generate", "--model_name_or_path", str(tmp_path / "m"), "--topic_ids", "2", "--topic_layer", "2",
          "--max_new_tokens", "4", "--do_sample", "--top_p", "0.9"])
    assert capsys.readouterr().out.strip()
    assert "topic_layer must be an integer in [1, 2]" in user_error(capsys, [
        "generate", "--model_name_or_path", str(tmp_path / "m"), "--topic_ids", "1", "--topic_layer", "3"])


@pytest.mark.parametrize("model_type, overrides", [
    ("lstm_lm", "embedding_size=16,hidden_size=16"),
    ("rgbn_rnn", "topic_sizes=[3],hidden_sizes=[16],embedding_size=16"),
])
def test_train_carry_state_trains_the_carried_lstm_and_the_carried_rgbn_rnn(tmp_path, capsys, model_type, overrides,
                                                                          monkeypatch):
    """`topic-lm train --carry_state true` trains with the state carried across each document's sentences: whole
    documents per batch with the preceding context; the LSTM through TopicLMTrainer(carry_state=True), rGBN-RNN on its
    documents batches with carry_token_state (recorded in the saved config). The model then evaluates under
    causal-carry. --bptt_chunks without --carry_state is refused."""
    from topic_lm_hf import TopicLMTrainer

    seen = {}
    original = TopicLMTrainer.__init__

    def recording(self, *args, **kwargs):
        seen.update(carry_state=kwargs.get("carry_state"), collator=kwargs.get("data_collator"))
        original(self, *args, **kwargs)

    monkeypatch.setattr(TopicLMTrainer, "__init__", recording)
    out_dir = tmp_path / model_type
    main(["train", "--train_file", "wikipedia-sample", "--max_train_documents", "24",
          "--validation_file", "wikipedia-sample/validation", "--max_eval_documents", "4", "--model_type", model_type,
          "--config_overrides", overrides, "--recipe", "paper", "--min_freq", "3", "--output_dir", str(out_dir),
          "--max_steps", "2", "--per_device_train_batch_size", "2", "--report_to", "none", "--use_cpu",
          "--eval_strategy", "no", "--carry_state", "true"])
    collator = seen["collator"]
    assert collator.layout == "documents"
    assert collator.context == ("none" if model_type == "lstm_lm" else "preceding")
    config = json.loads((out_dir / "config.json").read_text())
    if model_type == "rgbn_rnn":
        assert seen["carry_state"] is False and config["carry_token_state"] is True
    else:
        assert seen["carry_state"] is True
    main(["evaluate", "--model_name_or_path", str(out_dir), "--validation_file", "wikipedia-sample/validation",
          "--max_eval_documents", "3", "--protocols", "causal-carry"])
    assert re.search(r"\| causal-carry \| .*? \| [\d.]+ \| \d+ \|", capsys.readouterr().out)
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--output_dir", str(tmp_path / "x"), "--bptt_chunks", "2"])
    assert exit_.value.code == 2 and "--bptt_chunks is an option of --carry_state true" in capsys.readouterr().err


def test_train_language_model_starts_a_carried_rgbn_rnn_from_a_trained_lstm(tmp_path, capsys, monkeypatch):
    """`topic-lm train --language_model <LSTM folder>`: the LSTM LM trained by `topic-lm train` on the same corpus is
    the new carried rGBN-RNN's start (its weights, seen as the trainer receives the model), and the run trains and
    saves, its topic prior's weight held where ``topic_prior_weight_trainable=false`` says so; another corpus's
    vocabulary, a family without topics and a saved model to continue are refused in one line."""
    import torch
    from safetensors.torch import load_file

    from topic_lm_hf import TopicLMTrainer

    common = ["--train_file", "wikipedia-sample", "--max_train_documents", "24", "--min_freq", "3", "--max_steps",
              "2", "--per_device_train_batch_size", "2", "--report_to", "none", "--use_cpu", "--eval_strategy", "no",
              "--carry_state", "true"]
    lstm_dir = tmp_path / "lstm"
    main(["train", "--model_type", "lstm_lm", "--config_overrides", "embedding_size=16,hidden_size=16",
          "--output_dir", str(lstm_dir), *common])
    lstm = load_file(lstm_dir / "model.safetensors")
    seen = {}
    original = TopicLMTrainer.__init__

    def recording(self, *args, **kwargs):
        seen["start"] = {k: v.detach().clone() for k, v in kwargs["model"].state_dict().items()}
        original(self, *args, **kwargs)

    monkeypatch.setattr(TopicLMTrainer, "__init__", recording)
    out_dir = tmp_path / "rgbn"
    main(["train", "--model_type", "rgbn_rnn", "--language_model", str(lstm_dir), "--config_overrides",
          "topic_sizes=[8],hidden_sizes=[16],embedding_size=16", "--recipe", "paper", "--output_dir", str(out_dir),
          *common])
    torch.testing.assert_close(seen["start"]["model.lstms.0.weight_hh_l0"], lstm["model.lstm.weight_hh_l0"])
    torch.testing.assert_close(seen["start"]["lm_head.bias"], lstm["lm_head.bias"])
    assert json.loads((out_dir / "config.json").read_text())["carry_token_state"] is True
    # by the steering recipe with its topic prior's weight held at the recipe's 1: it starts there (a learned one
    # starts at 0) and the trained model keeps it
    held_dir = tmp_path / "rgbn-held"
    main(["train", "--model_type", "rgbn_rnn", "--language_model", str(lstm_dir), "--config_overrides",
          "topic_sizes=[8],hidden_sizes=[16],embedding_size=16,topic_prior_weight_trainable=false",
          "--pretrain_topic_model_steps", "3", "--output_dir", str(held_dir), *common])
    assert float(seen["start"]["topic_prior_weight"]) == 1.0
    assert float(load_file(held_dir / "model.safetensors")["topic_prior_weight"]) == 1.0
    assert json.loads((held_dir / "config.json").read_text())["topic_prior_weight_trainable"] is False
    refusals = [
        (["--model_type", "rgbn_rnn", "--max_train_documents", "30"], "trained with another vocabulary"),
        (["--model_type", "lstm_lm"], "--model_type lstm_lm has no topics"),
        (["--model_type", "rgbn_rnn", "--model_name_or_path", str(out_dir)], "give one of them"),
        (["--model_type", "tcnlm"], "TCNLMForCausalLM has no LSTM of the LSTM LM's form"),
    ]
    for extra, message in refusals:
        with pytest.raises(SystemExit) as exit_:
            main(["train", *common, "--language_model", str(lstm_dir), "--recipe", "paper",
                  "--output_dir", str(tmp_path / "refused"), *extra])
        assert exit_.value.code == 2 and message in capsys.readouterr().err, extra


def test_train_early_stopping_patience_stops_on_the_validation_loss_and_keeps_the_best_weights(tmp_path, capsys,
                                                                                             caplog):
    """`--early_stopping_patience 1`: a run whose validation loss gets worse (a learning rate far too high) stops
    after one evaluation without improvement, long before --max_steps, and the saved model is the best checkpoint's;
    without evaluations the flag is refused in one line."""
    import pathlib

    import torch
    from safetensors.torch import load_file

    out_dir = tmp_path / "lstm"
    common = ["--train_file", "wikipedia-sample", "--max_train_documents", "24", "--validation_file",
              "wikipedia-sample/validation", "--max_eval_documents", "4", "--min_freq", "3", "--model_type", "lstm_lm",
              "--config_overrides", "embedding_size=16,hidden_size=16", "--per_device_train_batch_size", "4",
              "--report_to", "none", "--use_cpu", "--learning_rate", "5", "--max_steps", "60", "--early_stopping_patience",
              "1"]
    caplog.set_level("INFO", logger="topic_lm_hf")
    main(["train", *common, "--eval_strategy", "steps", "--eval_steps", "2", "--output_dir", str(out_dir)])
    checkpoints = sorted(out_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    state = json.loads((checkpoints[-1] / "trainer_state.json").read_text())
    assert state["global_step"] < 60  # stopped by the validation loss
    said = re.search(r"Training stopped by the validation loss at step (\d+); the best checkpoint's weights are saved "
                     r"\((checkpoint-\d+)", caplog.text)
    assert said and int(said.group(1)) == state["global_step"]
    losses = {e["step"]: e["eval_loss"] for e in state["log_history"] if "eval_loss" in e}
    best_step = min(losses, key=losses.get)
    assert state["best_model_checkpoint"].endswith(f"checkpoint-{best_step}")
    best = load_file(pathlib.Path(state["best_model_checkpoint"]) / "model.safetensors")
    saved = load_file(out_dir / "model.safetensors")
    assert all(torch.equal(saved[k], best[k]) for k in saved)
    # the same command again: the run is over (stopped by its validation loss), nothing is trained or replaced
    before = (out_dir / "model.safetensors").read_bytes()
    capsys.readouterr()
    main(["train", *common, "--eval_strategy", "steps", "--eval_steps", "2", "--output_dir", str(out_dir)])
    assert "stopped by its validation loss" in capsys.readouterr().out
    assert (out_dir / "model.safetensors").read_bytes() == before
    assert sorted(out_dir.glob("checkpoint-*")) == sorted(checkpoints)
    for extra, message in [(["--eval_strategy", "no"], "give --eval_strategy steps"),
                           (["--eval_strategy", "steps", "--pretraining_phases", "lm:2"], "give one of them")]:
        with pytest.raises(SystemExit) as exit_:
            main(["train", *common, *extra, "--output_dir", str(tmp_path / "x")])
        assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_train_early_stopping_of_a_topic_model_keeps_the_checkpoint_of_the_best_validation_perplexity(tmp_path):
    """A topic model's validation loss adds its topic terms to the language model's: `--early_stopping_patience`
    keeps the checkpoint of the lowest validation perplexity (eval_lm_loss), the package's stopping rule, also with the
    plateau schedule (for which TrainingArguments fills in the whole loss)."""
    out_dir = tmp_path / "tcnlm"
    main(["train", "--train_file", "wikipedia-sample", "--max_train_documents", "24", "--validation_file",
          "wikipedia-sample/validation", "--max_eval_documents", "4", "--min_freq", "3", "--model_type", "tcnlm",
          "--config_overrides", "embedding_size=16,hidden_size=16,num_topics=4", "--recipe", "paper",
          "--per_device_train_batch_size", "8", "--report_to", "none", "--use_cpu", "--max_steps", "8",
          "--early_stopping_patience", "5", "--eval_strategy", "steps", "--eval_steps", "2",
          "--lr_scheduler_type", "reduce_lr_on_plateau", "--output_dir",
          str(out_dir)])
    state = json.loads((out_dir / "checkpoint-8" / "trainer_state.json").read_text())
    evaluations = [e for e in state["log_history"] if "eval_lm_loss" in e]
    assert len(evaluations) == 4 and all(e["eval_loss"] > e["eval_lm_loss"] for e in evaluations)
    best = min(evaluations, key=lambda e: e["eval_lm_loss"])
    assert state["best_model_checkpoint"].endswith(f"checkpoint-{best['step']}")
    assert state["best_metric"] == pytest.approx(best["eval_lm_loss"])


def test_train_and_evaluate_with_empty_contexts_make_and_measure_a_matched_topic_free_twin(tmp_path, capsys,
                                                                                          monkeypatch):
    """`--empty_context true`: the topic model trains and is stopped on rows whose every context is empty (the same
    uninformative topics for every document: its matched topic-free twin), `topic-lm evaluate --empty_context true`
    measures it the same way (as `evaluate_perplexity(empty_context=True)`), and a model without topics is refused
    in one line."""
    from transformers import AutoModelForCausalLM

    from topic_lm_hf import TopicLMTrainer, evaluate_perplexity, load_documents

    common = ["--train_file", "wikipedia-sample", "--max_train_documents", "24", "--validation_file",
              "wikipedia-sample/validation", "--max_eval_documents", "4", "--min_freq", "3", "--max_steps", "2",
              "--per_device_train_batch_size", "4", "--report_to", "none", "--use_cpu", "--eval_strategy", "steps",
              "--eval_steps", "1", "--empty_context", "true"]
    seen = {}
    original = TopicLMTrainer.__init__

    def recording(self, *args, **kwargs):
        seen.update(train=kwargs["train_dataset"], eval=kwargs["eval_dataset"])
        original(self, *args, **kwargs)

    monkeypatch.setattr(TopicLMTrainer, "__init__", recording)
    out_dir = tmp_path / "twin"
    main(["train", *common, "--model_type", "topic_rnn", "--recipe", "paper", "--config_overrides",
          "num_topics=4,embedding_size=16,hidden_size=16", "--output_dir", str(out_dir)])
    for rows in (seen["train"], seen["eval"]):
        assert len(rows) > 0 and not any(rows["context_ids"])
    main(["evaluate", "--model_name_or_path", str(out_dir), "--max_eval_documents", "4", "--protocols", "causal",
          "--empty_context", "true", "--output_json", "none"])
    out = capsys.readouterr().out
    assert "empty: uninformative topics" in out
    shown = float(re.search(r"\| causal \| [^|]+\| [^|]+\| ([\d.]+) \|", out).group(1))
    docs = load_documents("wikipedia-sample/validation", max_documents=4)
    model = AutoModelForCausalLM.from_pretrained(out_dir).eval()
    assert shown == pytest.approx(evaluate_perplexity(model, docs, "causal", empty_context=True)["perplexity"], abs=0.01)
    assert shown != pytest.approx(evaluate_perplexity(model, docs, "causal")["perplexity"], abs=0.01)
    with pytest.raises(SystemExit) as exit_:
        main(["train", *common, "--model_type", "lstm_lm", "--output_dir", str(tmp_path / "lstm")])
    assert exit_.value.code == 2
    assert "--empty_context true holds a topic model's topics uninformative, and lstm_lm reads no topics" in \
        capsys.readouterr().err
