"""The `topic-lm` command as a user runs it: the README's main job, and train / evaluate / generate."""

import re

import pytest

from conftest import DATA, requires_data
from topic_lm_hf.cli import main


def test_demo_on_the_synthetic_corpus_says_so(tmp_path, capsys):
    main(["demo", "--synthetic", "--max_steps", "30", "--output_dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "SYNTHETIC" in out
    assert "identical logits: True" in out
    for protocol in ("paper", "causal", "causal-carry"):
        assert re.search(rf"\| lstm_lm \| {protocol} \|", out), out
    assert (tmp_path / "lstm_lm" / "model.safetensors").exists()
    assert (tmp_path / "lstm_lm" / "topic_tokenizer" / "tokenizer.json").exists()


@requires_data("apnews", "train.txt")
def test_train_evaluate_generate_commands_on_apnews(tmp_path, capsys):
    out_dir = tmp_path / "lstm"
    main(["train", "--train_file", str(DATA / "apnews" / "train.txt"), "--max_train_documents", "150",
          "--validation_file", str(DATA / "apnews" / "valid.txt"), "--max_eval_documents", "20",
          "--config_overrides", "embedding_size=32,hidden_size=32", "--min_freq", "3",
          "--output_dir", str(out_dir), "--max_steps", "20", "--per_device_train_batch_size", "16",
          "--report_to", "none", "--use_cpu", "--eval_strategy", "steps", "--eval_steps", "20"])
    assert (out_dir / "model.safetensors").exists()
    main(["evaluate", "--model_name_or_path", str(out_dir), "--validation_file", str(DATA / "apnews" / "valid.txt"),
          "--max_eval_documents", "10"])
    out = capsys.readouterr().out
    rows = re.findall(r"\| (paper|causal|causal-carry) \| .*? \| ([\d.]+) \| (\d+) \|", out)
    assert [r[0] for r in rows] == ["paper", "causal", "causal-carry"]
    assert all(1 < float(r[1]) < 5000 for r in rows)
    main(["generate", "--model_name_or_path", str(out_dir), "--prompt", "The Senate voted", "--max_new_tokens", "5",
          "--num_beams", "2", "--num_return_sequences", "2"])
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("the senate ")]
    assert len(lines) == 2 and all(3 < len(l.split()) <= 3 + 5 for l in lines)  # prompt + up to 5 new tokens
    with pytest.raises(SystemExit, match="not a topic model"):
        main(["topics", "--model_name_or_path", str(out_dir)])


def test_build_model_sizes_a_topic_rnn_to_the_vocabularies():
    from topic_lm_hf import build_vocabularies, synthetic_documents
    from topic_lm_hf.cli import ModelArguments, build_model
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


@requires_data("apnews", "train.txt")
def test_evaluate_refuses_a_folder_whose_weights_belong_to_another_model(apnews, tmp_path):
    """config.json of a TCNLM next to an LSTM's weights (a folder two runs wrote into): evaluate
    used to print a perplexity of a random model and exit 0."""
    from conftest import tiny_model
    from topic_lm_hf import save_vocabularies

    folder = tmp_path / "mixed"
    tiny_model("lstm_lm", apnews["tok"], apnews["topic_tok"]).save_pretrained(folder)
    save_vocabularies(apnews["tok"], apnews["topic_tok"], folder)
    tiny_model("tcnlm", apnews["tok"], apnews["topic_tok"]).config.save_pretrained(folder)
    with pytest.raises(OSError, match=r"lacks \d+ weight\(s\) of TCNLMForCausalLM"):
        main(["evaluate", "--model_name_or_path", str(folder), "--validation_file",
              str(DATA / "apnews" / "valid.txt"), "--max_eval_documents", "5", "--protocols", "causal"])


@requires_data("apnews", "train.txt")
def test_a_checkpoint_holds_both_tokenizers_and_is_evaluated_and_its_topics_printed(tmp_path, capsys):
    """checkpoint-* folders lacked topic_tokenizer/, and `topics` / `evaluate` on them failed with
    an error asking for sentencepiece or tiktoken."""
    import shutil

    out_dir = tmp_path / "tcnlm"
    main(["train", "--train_file", str(DATA / "apnews" / "train.txt"), "--max_train_documents", "60",
          "--validation_file", str(DATA / "apnews" / "valid.txt"), "--max_eval_documents", "5",
          "--model_type", "tcnlm", "--config_overrides", "embedding_size=16,hidden_size=16,num_topics=3",
          "--min_freq", "3", "--output_dir", str(out_dir), "--max_steps", "2", "--save_steps", "2",
          "--per_device_train_batch_size", "8", "--report_to", "none", "--use_cpu", "--eval_strategy", "no"])
    checkpoint = out_dir / "checkpoint-2"
    assert (checkpoint / "tokenizer.json").exists() and (checkpoint / "topic_tokenizer" / "tokenizer.json").exists()
    capsys.readouterr()
    main(["topics", "--model_name_or_path", str(checkpoint), "--top_n", "5"])
    topics = [l for l in capsys.readouterr().out.splitlines() if l.startswith("topic ")]
    assert len(topics) == 3 and all(len(l.split(":")[1].split()) == 5 for l in topics)
    main(["evaluate", "--model_name_or_path", str(checkpoint), "--validation_file", str(DATA / "apnews" / "valid.txt"),
          "--max_eval_documents", "3", "--protocols", "paper"])
    assert re.search(r"\| paper \| .*? \| [\d.]+ \| \d+ \|", capsys.readouterr().out)

    shutil.rmtree(checkpoint / "topic_tokenizer")  # e.g. a checkpoint written by an older version
    with pytest.raises(OSError, match=r"checkpoint-2 has no topic tokenizer \(no topic_tokenizer/tokenizer\.json"):
        main(["topics", "--model_name_or_path", str(checkpoint)])
    with pytest.raises(OSError, match="has no topic tokenizer"):
        main(["evaluate", "--model_name_or_path", str(checkpoint), "--validation_file",
              str(DATA / "apnews" / "valid.txt"), "--max_eval_documents", "3", "--protocols", "paper"])
