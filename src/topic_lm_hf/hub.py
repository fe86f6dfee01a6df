"""Sharing models on the Hugging Face Hub, loadable with or without this package installed.

``save_for_hub`` writes, into one folder: the weights (safetensors), ``config.json`` with a full
``auto_map`` (every Auto class of the family, not only the one being saved, hf-notes §3.3), the
model's flat code files (its ``configuration_*.py`` and ``modeling_*.py`` and the shared ones they import), the
LM tokenizer, the ``topic_tokenizer/`` subfolder and a model card. Users then load it with
``AutoModelForCausalLM.from_pretrained(repo, trust_remote_code=True)`` even without
``pip install topic-lm-hf``; with the package installed the registered classes are used.

The model card is rendered from ``templates/model_card.md``, package data that ships in the wheel.
Its metadata carries the family's tags and the perplexities as a ``model-index`` (one
``EvalResult`` per protocol), so the Hub shows them as evaluation results.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any, Optional

from huggingface_hub import EvalResult, HfApi, ModelCard, ModelCardData
from transformers import PreTrainedModel

from .data import save_vocabularies

_AUTO_SUFFIXES = {"Model": "AutoModel", "ForCausalLM": "AutoModelForCausalLM",
                  "ForSequenceClassification": "AutoModelForSequenceClassification",
                  "ForTokenClassification": "AutoModelForTokenClassification"}
CARD_TEMPLATE = "templates/model_card.md"  # inside the package (package data, see pyproject.toml)


def auto_map_for(model: PreTrainedModel) -> dict[str, str]:
    """``auto_map`` entries for the config and every model class of ``model``'s family."""
    config_cls = type(model.config)
    auto_map = {"AutoConfig": f"{config_cls.__module__.rsplit('.', 1)[-1]}.{config_cls.__name__}"}
    module = sys.modules[type(model).__module__]
    for name, obj in vars(module).items():
        if isinstance(obj, type) and issubclass(obj, PreTrainedModel) and getattr(obj, "config_class", None) is config_cls:
            for suffix, auto in _AUTO_SUFFIXES.items():
                if name.endswith(suffix) and not name.endswith("PreTrainedModel"):
                    auto_map[auto] = f"{module.__name__.rsplit('.', 1)[-1]}.{name}"
    return auto_map


def save_for_hub(model: PreTrainedModel, directory: str | os.PathLike, tokenizer=None, topic_tokenizer=None,
                 results: Optional[list[dict[str, Any]]] = None, datasets: Optional[list[str]] = None,
                 description: str = "", repo_id: Optional[str] = None) -> Path:
    """Save ``model`` (+ code, tokenizers, model card) so that it loads with ``trust_remote_code``.

    Args:
        results: evaluation rows as :func:`~topic_lm_hf.evaluate_perplexity` returns them (``protocol``,
            ``perplexity``, optionally ``tokens``), each with a ``dataset`` name (and optionally
            ``dataset_type``, a Hub dataset id, and ``dataset_split``): they go into the card's table
            and its ``model-index``, with their protocol named.
        datasets: Hub ids of the training datasets, for the card's metadata.
        repo_id: the Hub repository the folder is for; the card's example loads it (default: the folder).
    """
    directory = Path(directory)
    type(model.config).register_for_auto_class()
    type(model).register_for_auto_class(_suffix_auto(type(model).__name__))
    model.config.auto_map = auto_map_for(model)
    model.save_pretrained(directory)
    if tokenizer is not None:
        if topic_tokenizer is not None:
            save_vocabularies(tokenizer, topic_tokenizer, directory)
        else:
            tokenizer.save_pretrained(directory)
    write_model_card(model, directory, results=results, datasets=datasets, description=description,
                     repo_id=repo_id)
    return directory


def _suffix_auto(class_name: str) -> str:
    for suffix, auto in _AUTO_SUFFIXES.items():
        if class_name.endswith(suffix):
            return auto
    return "AutoModel"


def card_tags(config) -> list[str]:
    """Hub tags of a model family: what it is (a language model, a topic model), its recurrent cell,
    its ``model_type`` and variant, and ``custom_code`` (it loads with ``trust_remote_code``)."""
    tags = ["language-model", config.model_type]
    if hasattr(config, "num_topics"):
        tags.append("topic-model")
    cell = getattr(config, "cell", None)
    if cell is not None:  # TopicRNN / TopicLSTM / TopicGRU
        tags += [cell, f"topic{cell}"]
    else:
        tags.append("lstm")
    if getattr(config, "lm_type", None) == "naive_moe":
        tags.append("mixture-of-experts")
    return tags + ["custom_code"]


def eval_results(results: list[dict[str, Any]]) -> list[EvalResult]:
    """One ``model-index`` entry per evaluation row; the protocol is the metric's configuration."""
    out = []
    for r in results:
        if "dataset" not in r:
            raise ValueError(f"an evaluation row needs a 'dataset' name for the model card: {r}")
        out.append(EvalResult(
            task_type="text-generation", task_name="Language modeling", dataset_name=r["dataset"],
            dataset_type=r.get("dataset_type", re.sub(r"[^\w.-]+", "-", r["dataset"]).strip("-").lower()),
            dataset_split=r.get("dataset_split"), metric_type="perplexity",
            metric_name=f"Perplexity ({r['protocol']} protocol)", metric_config=r["protocol"],
            metric_value=round(float(r["perplexity"]), 2)))
    return out


def write_model_card(model: PreTrainedModel, directory: str | os.PathLike, results=None, datasets=None,
                     description: str = "", repo_id: Optional[str] = None) -> ModelCard:
    """Render the package's card template (``templates/model_card.md``) into ``directory/README.md``."""
    config = model.config
    auto_class = _suffix_auto(type(model).__name__)
    repo_id = repo_id or str(directory)
    card_data = ModelCardData(
        language="en", license="apache-2.0", library_name="transformers", datasets=datasets,
        pipeline_tag="text-classification" if auto_class == "AutoModelForSequenceClassification" else "text-generation",
        tags=card_tags(config), model_name=Path(repo_id).name, eval_results=eval_results(results or []) or None)
    sizes = {k: getattr(config, k) for k in ("vocab_size", "topic_vocab_size", "num_topics", "embedding_size",
                                             "hidden_size", "num_hidden_layers") if hasattr(config, k)}
    template = resources.files(__package__).joinpath(CARD_TEMPLATE)
    with resources.as_file(template) as path:
        card = ModelCard.from_template(card_data, template_path=str(path), model_type=config.model_type,
                                       model_class=type(model).__name__, auto_class=auto_class, repo_id=repo_id,
                                       sizes=sizes, results=results or [], model_description=description)
    card.save(Path(directory) / "README.md")
    return card


def push_to_hub(model: PreTrainedModel, repo_id: str, tokenizer=None, topic_tokenizer=None, private: bool = False,
                token: Optional[str] = None, **card_kwargs) -> str:
    """Create ``repo_id`` if needed and upload everything :func:`save_for_hub` writes."""
    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        save_for_hub(model, tmp, tokenizer, topic_tokenizer, repo_id=repo_id, **card_kwargs)
        api.upload_folder(repo_id=repo_id, folder_path=tmp, commit_message="Upload with topic-lm-hf")
    return repo_id
