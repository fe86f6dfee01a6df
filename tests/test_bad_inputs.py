"""Bad input gets one clear line, never a silent wrong answer or a traceback: the cases of the package's bad-input
review that are fixed (each refused with a message that says what to do; exit code 2 on the command line)."""

import json

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
    (["--num_beams", "0"], "--num_beams must be at least 1, got 0"),
    (["--num_return_sequences", "0"], "--num_return_sequences must be at least 1, got 0"),
    (["--max_new_tokens", "0"], "--max_new_tokens must be at least 1, got 0"),
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
    assert "--threads must be at least 1, got 0" in one_line_error(
        capsys, ["demo", "--threads", "0", "--output_dir", str(tmp_path)])
