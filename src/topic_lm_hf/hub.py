"""Sharing models on the Hugging Face Hub, loadable with or without this package installed.

``save_for_hub`` writes, into one folder: the weights (safetensors), ``config.json`` with a full
``auto_map`` (every Auto class of the family, not only the one being saved, hf-notes §3.3), the
model's flat code files (``configuration_*.py``, ``modeling_*.py``, ``modeling_common.py``), the
LM tokenizer, the ``topic_tokenizer/`` subfolder and a model card. Users then load it with
``AutoModelForCausalLM.from_pretrained(repo, trust_remote_code=True)`` even without
``pip install topic-lm-hf``; with the package installed the registered classes are used.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

from huggingface_hub import HfApi, ModelCard, ModelCardData
from transformers import PreTrainedModel

from .data import save_vocabularies

_AUTO_SUFFIXES = {"Model": "AutoModel", "ForCausalLM": "AutoModelForCausalLM",
                  "ForSequenceClassification": "AutoModelForSequenceClassification",
                  "ForTokenClassification": "AutoModelForTokenClassification"}
CARD_TEMPLATE = Path(__file__).resolve().parents[2] / "modeling_cards" / "topic_lm_card.md"


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
                 description: str = "") -> Path:
    """Save ``model`` (+ code, tokenizers, model card) so that it loads with ``trust_remote_code``.

    Args:
        results: evaluation rows, each with ``protocol``, ``perplexity`` (and optionally
            ``dataset``): they go into the card's table with their protocol named.
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
    write_model_card(model, directory, results=results, datasets=datasets, description=description)
    return directory


def _suffix_auto(class_name: str) -> str:
    for suffix, auto in _AUTO_SUFFIXES.items():
        if class_name.endswith(suffix):
            return auto
    return "AutoModel"


def write_model_card(model: PreTrainedModel, directory: str | os.PathLike, results=None, datasets=None,
                     description: str = "") -> ModelCard:
    """Render ``modeling_cards/topic_lm_card.md`` (or huggingface_hub's default template)."""
    config = model.config
    card_data = ModelCardData(language="en", license="apache-2.0", library_name="transformers",
                              pipeline_tag="text-generation", datasets=datasets,
                              tags=["topic-model", "language-model", "lstm", config.model_type, "custom_code"])
    sizes = {k: getattr(config, k) for k in ("vocab_size", "topic_vocab_size", "num_topics", "embedding_size",
                                             "hidden_size", "num_hidden_layers") if hasattr(config, k)}
    kwargs = dict(model_type=config.model_type, model_class=type(model).__name__, sizes=sizes,
                  results=results or [], model_description=description)
    if CARD_TEMPLATE.exists():
        card = ModelCard.from_template(card_data, template_path=str(CARD_TEMPLATE), **kwargs)
    else:  # installed from a wheel: the repository's templates are not there
        card = ModelCard.from_template(card_data, model_description=description or config.model_type)
    card.save(Path(directory) / "README.md")
    return card


def push_to_hub(model: PreTrainedModel, repo_id: str, tokenizer=None, topic_tokenizer=None, private: bool = False,
                token: Optional[str] = None, **card_kwargs) -> str:
    """Create ``repo_id`` if needed and upload everything :func:`save_for_hub` writes."""
    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        save_for_hub(model, tmp, tokenizer, topic_tokenizer, **card_kwargs)
        api.upload_folder(repo_id=repo_id, folder_path=tmp, commit_message="Upload with topic-lm-hf")
    return repo_id
