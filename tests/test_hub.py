"""Hub sharing: remote code loads without the package; the card names its protocols; push uploads."""

import json
import os
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard

from topic_lm_hf import LSTMLMConfig, LSTMLMForCausalLM, build_vocabularies, synthetic_documents
from topic_lm_hf.hub import push_to_hub, save_for_hub

from conftest import run_without_package


def test_saved_folder_loads_with_remote_code_in_a_process_without_the_package(tmp_path):
    tok, topic_tok = build_vocabularies(synthetic_documents(40), min_freq=1)
    torch.manual_seed(0)
    model = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), embedding_size=8, hidden_size=8)).eval()
    save_for_hub(model, tmp_path / "repo", tok, topic_tok,
                 results=[{"protocol": "causal", "perplexity": 123.456, "tokens": 99, "dataset": "apnews valid"}])
    files = {p.name for p in (tmp_path / "repo").iterdir()}
    assert {"modeling_lstm_lm.py", "configuration_lstm_lm.py", "modeling_recurrent.py", "model.safetensors",
            "tokenizer.json", "topic_tokenizer", "README.md"} <= files
    auto_map = json.loads((tmp_path / "repo" / "config.json").read_text())["auto_map"]
    assert auto_map["AutoModelForCausalLM"] == "modeling_lstm_lm.LSTMLMForCausalLM"
    assert auto_map["AutoModel"] == "modeling_lstm_lm.LSTMLMModel"
    card = ModelCard.load(tmp_path / "repo" / "README.md")
    assert "| apnews valid | causal | 123.46 | 99 |" in card.text and "custom_code" in card.data.tags

    ids = tok(["the senate said"], return_tensors="pt")["input_ids"]
    expected = model(input_ids=ids).logits[0, -1, :5].tolist()
    # the card's own lines load the tokenizer without being asked to run the repo's code (AutoTokenizer reads
    # config.json, whose auto_map made transformers prompt and wait)
    card_tok = next(line for line in card.text.splitlines() if line.startswith("tok = "))
    assert "trust_remote_code" not in card_tok
    result = run_without_package(f"""
        import torch
        from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
        repo = {str(tmp_path / 'repo')!r}
        model = AutoModelForCausalLM.from_pretrained(repo, trust_remote_code=True).eval()
        {card_tok.split("#")[0].strip()}
        ids = tok(["the senate said"], return_tensors="pt")["input_ids"]
        out = model.generate(input_ids=ids, max_new_tokens=3, min_new_tokens=3, do_sample=False)
        print(json.dumps({{"cls": type(model).__module__, "logits": model(input_ids=ids).logits[0, -1, :5].tolist(),
                          "generated": out.shape[1]}}))
    """, tmp_path)
    assert result["cls"].startswith("transformers_modules")
    assert torch.allclose(torch.tensor(result["logits"]), torch.tensor(expected), atol=1e-6)
    assert result["generated"] == ids.shape[1] + 3


def test_push_to_hub_uploads_the_saved_folder(monkeypatch, tmp_path):
    uploaded = {}

    class FakeApi:
        def __init__(self, token=None):
            pass

        def create_repo(self, repo_id, private=False, exist_ok=True):
            uploaded["repo"] = repo_id

        def upload_folder(self, repo_id, folder_path, commit_message):
            uploaded["files"] = sorted(str(p.relative_to(folder_path)) for p in Path(folder_path).rglob("*") if p.is_file())

    monkeypatch.setattr("topic_lm_hf.hub.HfApi", FakeApi)
    tok, topic_tok = build_vocabularies(synthetic_documents(20), min_freq=1)
    model = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), embedding_size=4, hidden_size=4))
    push_to_hub(model, "me/lstm-test", tok, topic_tok, local_dir=tmp_path / "ready")
    assert uploaded["repo"] == "me/lstm-test"
    assert "model.safetensors" in uploaded["files"] and "topic_tokenizer/tokenizer.json" in uploaded["files"]


def test_card_has_model_index_results_family_tags_and_the_repo_id(tmp_path):
    from topic_lm_hf import TCNLMConfig, TCNLMForCausalLM, TopicRNNConfig, TopicRNNForCausalLM

    tok, topic_tok = build_vocabularies(synthetic_documents(30), min_freq=1)
    lstm = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), embedding_size=4, hidden_size=4))
    rows = [{"protocol": p, "perplexity": v, "tokens": 99, "dataset": "APNEWS valid"}
            for p, v in (("paper", 101.234), ("causal", 123.456))]
    save_for_hub(lstm, tmp_path / "lstm", tok, topic_tok, results=rows, repo_id="me/lstm-apnews")
    card = ModelCard.load(tmp_path / "lstm" / "README.md")
    assert "REPO_ID" not in card.content and 'repo = "me/lstm-apnews"' in card.text
    assert card.data.model_name == "lstm-apnews"
    results = {r.metric_config: r for r in card.data.eval_results}
    assert set(results) == {"paper", "causal"}
    causal = results["causal"]
    assert (causal.metric_type, causal.metric_value, causal.dataset_name, causal.dataset_type, causal.task_type) == (
        "perplexity", 123.46, "APNEWS valid", "apnews-valid", "text-generation")
    assert "model-index" in (tmp_path / "lstm" / "README.md").read_text()
    assert "topic-model" not in card.data.tags and {"lstm", "lstm_lm", "custom_code"} <= set(card.data.tags)

    tcnlm = TCNLMForCausalLM(TCNLMConfig(vocab_size=len(tok), topic_vocab_size=len(topic_tok), num_topics=3,
                                         embedding_size=4, hidden_size=4, lm_type="naive_moe"))
    tags = set(save_for_hub(tcnlm, tmp_path / "tcnlm") and ModelCard.load(tmp_path / "tcnlm" / "README.md").data.tags)
    assert {"topic-model", "lstm", "tcnlm", "mixture-of-experts", "custom_code"} <= tags
    card = ModelCard.load(tmp_path / "tcnlm" / "README.md")
    assert card.data.eval_results is None and "No evaluation recorded." in card.text
    assert f'repo = "{tmp_path / "tcnlm"}"' in card.text  # without a repo id, the example loads the folder

    gru = TopicRNNForCausalLM(TopicRNNConfig.from_tokenizers(tok, topic_tok, cell="gru", num_topics=3,
                                                             embedding_size=4, hidden_size=4))
    save_for_hub(gru, tmp_path / "gru")
    tags = set(ModelCard.load(tmp_path / "gru" / "README.md").data.tags)
    assert {"topic-model", "gru", "topicgru", "topic_rnn"} <= tags and "lstm" not in tags


def test_the_card_template_ships_in_the_wheel_and_is_used_from_an_installed_package(tmp_path):
    """Build the wheel from the sources, unpack it, and write a card from there in a process that
    sees neither this checkout nor an editable install: the results must be in the card."""
    import shutil
    import subprocess
    import sys
    import zipfile

    import topic_lm_hf

    root = Path(topic_lm_hf.__file__).resolve().parents[2]
    project = tmp_path / "project"
    shutil.copytree(root / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, project / name)
    build = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                            "print(build_meta.build_wheel(sys.argv[1]))", str(tmp_path / "dist")],
                           cwd=project, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-2000:]
    wheel = tmp_path / "dist" / build.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as zf:
        assert "topic_lm_hf/templates/model_card.md" in zf.namelist()
        zf.extractall(tmp_path / "site")
    script = f"""
import json, os, sys
sys.path = [{str(tmp_path / 'site')!r}] + [p for p in sys.path if not os.path.isdir(os.path.join(p or ".", "topic_lm_hf"))]
import topic_lm_hf
assert topic_lm_hf.__file__.startswith({str(tmp_path / 'site')!r}), topic_lm_hf.__file__
from huggingface_hub import ModelCard
from topic_lm_hf import LSTMLMConfig, LSTMLMForCausalLM
from topic_lm_hf.hub import save_for_hub
model = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=20, embedding_size=4, hidden_size=4))
save_for_hub(model, "card", results=[{{"protocol": "causal", "perplexity": 77.7, "dataset": "apnews valid"}}])
card = ModelCard.load("card/README.md")
print(json.dumps({{"values": [r.metric_value for r in card.data.eval_results], "table": "| causal | 77.70 |" in card.text}}))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": "", "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"values": [77.7], "table": True}


UNREACHABLE = "http://127.0.0.1:9"  # a closed port: the Hub "cannot be reached" at once, the same on every machine


def _cli(tmp_path, *argv, env=None):
    """``topic-lm argv`` in its own process (the exit code and stderr a user sees)."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "topic_lm_hf.cli", *map(str, argv)], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub-cache"), **(env or {})},
                          timeout=300)


def test_push_without_a_network_leaves_the_ready_folder_and_says_how_to_upload_it(tmp_path, monkeypatch):
    """The package's push_to_hub, the model's own push_to_hub, and `topic-lm export --push_to_hub`."""
    import huggingface_hub

    from topic_lm_hf.hub import HubUnreachableError

    tok, topic_tok = build_vocabularies(synthetic_documents(20), min_freq=1)
    model = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), embedding_size=4, hidden_size=4))
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", UNREACHABLE)
    with pytest.raises(HubUnreachableError) as error:
        push_to_hub(model, "me/lstm-offline", tok, topic_tok, local_dir=tmp_path / "ready")
    message = str(error.value)
    assert "\n" not in message and "The Hub cannot be reached" in message
    assert f"hf upload me/lstm-offline {tmp_path / 'ready'}" in message
    assert {"model.safetensors", "config.json", "README.md", "topic_tokenizer"} <= {p.name for p in (tmp_path / "ready").iterdir()}

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub.hf_api.api, "endpoint", UNREACHABLE)  # transformers' push uses this one
    with pytest.raises(HubUnreachableError, match=r"the upload-ready folder is lstm-model-hub: upload it later with "
                                                  r"`hf upload me/lstm-model lstm-model-hub`"):
        model.push_to_hub("me/lstm-model")
    assert (tmp_path / "lstm-model-hub" / "model.safetensors").exists()

    model.save_pretrained(tmp_path / "saved")
    tok.save_pretrained(tmp_path / "saved")
    proc = _cli(tmp_path, "export", "--model_name_or_path", "saved", "--repo_id", "me/lstm-cli", "--output_dir", "out",
                "--push_to_hub", env={"HF_ENDPOINT": UNREACHABLE})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("topic-lm export: error: The Hub cannot be reached") and "`hf upload me/lstm-cli out`" in last
    assert (tmp_path / "out" / "model.safetensors").exists()


@pytest.mark.parametrize("env", [{"HF_HUB_OFFLINE": "1"}, {"HF_ENDPOINT": UNREACHABLE}], ids=["offline", "no-network"])
def test_a_missing_folder_is_one_line_not_a_hub_traceback(tmp_path, env):
    proc = _cli(tmp_path, "topics", "--model_name_or_path", "out/tcnlm-cli", env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("topic-lm topics: error: there is no folder out/tcnlm-cli, and ")
    (tmp_path / "empty").mkdir()
    proc = _cli(tmp_path, "generate", "--model_name_or_path", "empty", env=env)
    assert proc.returncode == 2 and proc.stderr.strip() == ("topic-lm generate: error: empty is a folder without "
                                                            "config.json: not a saved model (give the folder that "
                                                            "save_pretrained, a Trainer checkpoint or topic-lm train "
                                                            "wrote)")


def test_each_head_gets_its_own_card(tmp_path):
    """A classifier reports accuracy, the sense tagger F1 per evaluation set, rGBN-RNN every size; NaN stays out."""
    from topic_lm_hf import (RGBNRNNConfig, RGBNRNNForCausalLM, SenseTaggerConfig, SenseTaggerForTokenClassification,
                             TCNLMConfig, TCNLMForSequenceClassification)
    from topic_lm_hf.hub import write_model_card

    tok, topic_tok = build_vocabularies(synthetic_documents(30), min_freq=1)
    clf = TCNLMForSequenceClassification(TCNLMConfig(vocab_size=len(tok), topic_vocab_size=len(topic_tok), num_topics=3,
                                                     embedding_size=4, hidden_size=4, num_labels=8))
    card = write_model_card(clf, tmp_path / "clf", repo_id="me/tcnlm-r8",
                            results=[{"dataset": "R8 test", "metric": "accuracy", "value": 0.9312}])
    assert card.data.pipeline_tag == "text-classification"
    (result,) = card.data.eval_results
    assert (result.metric_type, result.metric_value, result.task_type) == ("accuracy", 0.9312, "text-classification")
    assert "Perplexity" not in card.text and "| R8 test |  | accuracy | 0.9312 |" in card.text
    assert "AutoModelForSequenceClassification.from_pretrained(repo, trust_remote_code=True)" in card.text

    tagger = SenseTaggerForTokenClassification(SenseTaggerConfig(vocab_size=len(tok), num_labels=5))
    card = write_model_card(tagger, tmp_path / "tagger", repo_id="me/wsd", results=[
        {"dataset": "Raganato ALL", "metric": "f1", "value": v, "config": name}
        for name, v in (("senseval2", 0.61), ("semeval2015", float("nan")))])
    assert card.data.pipeline_tag == "token-classification"
    assert [(r.metric_name, r.metric_value) for r in card.data.eval_results] == [("F1 (senseval2)", 0.61)]
    assert "| Raganato ALL | semeval2015 | f1 | n/a |" in card.text and "nan" not in card.content.split("---")[1].lower()

    rgbn = RGBNRNNForCausalLM(RGBNRNNConfig.from_tokenizers(tok, topic_tok, topic_sizes=[6, 4], hidden_sizes=[8, 6],
                                                            embedding_size=4))
    card = write_model_card(rgbn, tmp_path / "rgbn", repo_id="me/rgbn", results=[
        {"dataset": "APNEWS valid", "protocol": "paper", "perplexity": float("nan")}])
    assert "| topic_sizes | [6, 4] |" in card.text and "| hidden_sizes | [8, 6] |" in card.text
    assert card.data.eval_results is None and ".nan" not in card.content
    assert card.data.pipeline_tag == "text-generation" and "generate(topic_ids=[3]" in card.text


def test_modeling_cards_are_in_sync_with_the_configurations_and_the_benchmark():
    """modeling_cards/ holds one card per hub_configs/ configuration, exactly as scripts/make_cards.py writes it
    from the template and results/apnews-cpu; its model-index carries the benchmark's perplexities."""
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("make_cards", root / "scripts" / "make_cards.py")
    make_cards = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_cards)
    cards = make_cards.render_all(root / "hub_configs", root / "results" / "apnews-cpu" / "results.json")
    assert set(cards) == {f"{p.stem}.md" for p in (root / "hub_configs").glob("*.json")}
    on_disk = {p.name for p in (root / "modeling_cards").glob("*.md") if p.name != "README.md"}
    assert on_disk == set(cards), "run python scripts/make_cards.py"
    for name, text in cards.items():
        assert (root / "modeling_cards" / name).read_text() == text, f"{name}: run python scripts/make_cards.py"
    benchmark = json.loads((root / "results" / "apnews-cpu" / "results.json").read_text())
    card = ModelCard.load(root / "modeling_cards" / "tcnlm-apnews-small.md")
    measured = {r.metric_config: r.metric_value for r in card.data.eval_results}
    assert measured["causal"] == round(benchmark["results"]["tcnlm"]["perplexity"]["causal"]["perplexity"], 2)
    assert "Not measured on this configuration" in card.text and "| 0 |" in card.text  # topic table
    assert "Not measured yet: IMDB" in (root / "modeling_cards" / "topicgru-imdb.md").read_text()


def test_a_folder_whose_config_has_no_model_type_is_one_line_not_a_prompt(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"hidden_size": 8}')
    proc = _cli(tmp_path, "topics", "--model_name_or_path", "m", env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2 and proc.stderr.strip() == ("topic-lm topics: error: m/config.json has no model_type: "
                                                            "not a model this package saved (its model_type names the "
                                                            "family, e.g. \"tcnlm\")")


def test_a_perplexity_row_without_its_protocol_is_a_clear_error(tmp_path):
    tok, _ = build_vocabularies(synthetic_documents(20), min_freq=1)
    model = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), embedding_size=4, hidden_size=4))
    with pytest.raises(ValueError, match="a perplexity row needs the protocol it was measured under"):
        save_for_hub(model, tmp_path / "m", results=[{"perplexity": 80.0, "dataset": "apnews valid"}])


@pytest.mark.parametrize("family", ["lstm_lm", "tcnlm"])
def test_a_folder_resaved_from_remote_code_keeps_every_auto_class(tmp_path, family):
    """Loaded with trust_remote_code where the package is not importable (transformers loads the configuration's
    code twice there) and saved again: the new config.json's auto_map still names every Auto class of the family,
    and each of them loads the new folder."""
    from topic_lm_hf.families import FAMILIES

    from conftest import tiny_model

    tok, topic_tok = build_vocabularies(synthetic_documents(20), min_freq=1)
    model = tiny_model(family, tok, topic_tok)
    model.save_pretrained(tmp_path / "first")
    expected = json.loads((tmp_path / "first" / "config.json").read_text())["auto_map"]
    assert set(expected) == {"AutoConfig", "AutoModel", "AutoModelForCausalLM", "AutoModelForSequenceClassification"}
    assert FAMILIES[family].classifier_class is not None
    result = run_without_package(f"""
        from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification
        model = AutoModelForCausalLM.from_pretrained({str(tmp_path / 'first')!r}, trust_remote_code=True)
        model.save_pretrained({str(tmp_path / 'second')!r})
        auto_map = json.load(open({str(tmp_path / 'second' / 'config.json')!r}))["auto_map"]
        base = AutoModel.from_pretrained({str(tmp_path / 'second')!r}, trust_remote_code=True)
        clf = AutoModelForSequenceClassification.from_pretrained({str(tmp_path / 'second')!r}, num_labels=3,
                                                                 trust_remote_code=True)
        print(json.dumps({{"auto_map": auto_map, "base": type(base).__name__, "clf": type(clf).__name__}}))
    """, tmp_path)
    assert result["auto_map"] == expected
    assert result["base"] == FAMILIES[family].base_model_class.__name__
    assert result["clf"] == FAMILIES[family].classifier_class.__name__


def test_results_on_a_hub_benchmark_are_also_written_as_eval_results_files(tmp_path):
    """Beside the card's model-index, a result on a Hub dataset goes into .eval_results/<owner>__<name>.yaml (the
    format the Hub reads now); a result on local data (no Hub id) has no entry there."""
    import yaml

    huggingface_hub = pytest.importorskip("huggingface_hub")
    if not hasattr(huggingface_hub, "EvalResultEntry"):
        pytest.skip("this huggingface_hub cannot write the .eval_results format")
    tok, topic_tok = build_vocabularies(synthetic_documents(20), min_freq=1)
    model = LSTMLMForCausalLM(LSTMLMConfig(vocab_size=len(tok), embedding_size=4, hidden_size=4))
    rows = [{"protocol": "causal", "perplexity": 123.456, "dataset": "APNEWS valid"},
            {"protocol": "causal", "perplexity": 98.765, "dataset": "WikiText-2", "dataset_type": "Salesforce/wikitext",
             "task_id": "wikitext-2-raw-v1"},
            {"protocol": "paper", "perplexity": 90.0, "dataset": "WikiText-2", "dataset_type": "Salesforce/wikitext"}]
    save_for_hub(model, tmp_path / "m", tok, topic_tok, results=rows, repo_id="me/lstm")
    files = sorted(p.name for p in (tmp_path / "m" / ".eval_results").iterdir())
    assert files == ["Salesforce__wikitext.yaml"]
    entries = huggingface_hub.parse_eval_result_entries(
        yaml.safe_load((tmp_path / "m" / ".eval_results" / files[0]).read_text()))
    assert [(e.dataset_id, e.task_id, e.value, e.notes) for e in entries] == [
        ("Salesforce/wikitext", "wikitext-2-raw-v1", 98.77, "Perplexity (causal protocol)"),
        ("Salesforce/wikitext", "paper", 90.0, "Perplexity (paper protocol)")]
    card = ModelCard.load(tmp_path / "m" / "README.md")
    assert len(card.data.eval_results) == 3  # the model-index keeps every row


def test_an_export_over_an_earlier_one_keeps_none_of_its_files_and_never_writes_through_a_link(tmp_path,
                                                                                           tiny_vocabularies):
    """Re-exporting another model into an earlier export folder kept the earlier model's .eval_results and remote
    code (the LSTM's folder would show the TCNLM's perplexity), and a link inside the folder was written through
    (a file outside it overwritten)."""
    from conftest import tiny_model

    tok, topic_tok = tiny_vocabularies
    folder = tmp_path / "repo"
    save_for_hub(tiny_model("tcnlm", tok, topic_tok), folder, tok, topic_tok,
                 results=[{"protocol": "causal", "perplexity": 77.7, "tokens": 9, "dataset": "bench",
                           "dataset_type": "org/bench"}])
    assert (folder / ".eval_results").is_dir() and (folder / "modeling_tcnlm.py").is_file()
    outside = tmp_path / "outside.md"
    outside.write_text("mine")
    (folder / "README.md").unlink()
    (folder / "README.md").symlink_to(outside)
    save_for_hub(tiny_model("lstm_lm", tok, topic_tok), folder, tok, topic_tok)
    files = {p.name for p in folder.iterdir()}
    assert ".eval_results" not in files and not any(name.startswith(("modeling_tcnlm", "configuration_tcnlm"))
                                                    for name in files)
    assert "modeling_lstm_lm.py" in files and "77.7" not in (folder / "README.md").read_text()
    assert outside.read_text() == "mine" and not (folder / "README.md").is_symlink()
    assert not any(p.name.startswith(".repo.export") for p in tmp_path.iterdir())  # no staging folder left
