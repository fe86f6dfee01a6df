"""Sharing models on the Hugging Face Hub, loadable with or without this package installed.

``save_for_hub`` writes, into one folder: the weights (safetensors), ``config.json`` with a full
``auto_map`` (every Auto class of the family, not only the one being saved, so that any of them loads the folder), the
model's flat code files (its ``configuration_*.py`` and ``modeling_*.py`` and the shared ones they import), the
LM tokenizer, the ``topic_tokenizer/`` subfolder and a model card. Users then load it with
``AutoModelForCausalLM.from_pretrained(repo, trust_remote_code=True)`` even without
``pip install topic-lm-hf``; with the package installed the registered classes are used.

The model card is rendered from ``templates/model_card.md``, package data that ships in the wheel, for every
head: a language model's card reports perplexity per context protocol, a classifier's accuracy, the sense
tagger's F1 per evaluation set; each also goes into the card's ``model-index`` (the protocol or evaluation set in
the metric's name), so the Hub shows them as evaluation results, and results on a Hub benchmark dataset also into
the ``.eval_results/`` files the Hub reads now (:func:`eval_result_files`). ``render_card`` renders one from a
config alone (the cards of ``modeling_cards/``, ``scripts/make_cards.py``).

``push_to_hub`` writes the upload-ready folder first; when the Hub cannot be reached it says so in one line
(:class:`HubUnreachableError`) with the folder and the command that uploads it later. ``resolve_model_source``
tells a mistyped folder from a Hub id before transformers retries the network.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from importlib import resources
from pathlib import Path
from typing import Any, Optional

from huggingface_hub import EvalResult, HfApi, ModelCard, ModelCardData, constants, try_to_load_from_cache
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError
from transformers import PreTrainedModel

from .data import save_vocabularies
from .models.modeling_hub import HubUnreachableError, auto_class_of, is_network_error, unreachable_message

CARD_TEMPLATE = "templates/model_card.md"  # inside the package (package data, see pyproject.toml)


def save_for_hub(model: PreTrainedModel, directory: str | os.PathLike, tokenizer=None, topic_tokenizer=None,
                 results: Optional[list[dict[str, Any]]] = None, datasets: Optional[list[str]] = None,
                 description: str = "", repo_id: Optional[str] = None, **card) -> Path:
    """Save ``model`` (+ code, tokenizers, model card) so that it loads with ``trust_remote_code``.

    Args:
        results: evaluation rows (see :func:`eval_results`): perplexity rows as
            :func:`~topic_lm_hf.evaluate_perplexity` returns them (``protocol``, ``perplexity``, optionally
            ``tokens``), or ``{"metric": "accuracy" | "f1", "value": ...}`` rows; each with a ``dataset`` name (and
            optionally ``dataset_type``, a Hub dataset id, and ``dataset_split``). They go into the card's table
            and its ``model-index``.
        datasets: Hub ids of the training datasets, for the card's metadata.
        repo_id: the Hub repository the folder is for; the card's example loads it (default: the folder).
        card: more of the card (:func:`render_card`): ``training``, ``topics``, ``steering``, ``measured_note``.
    """
    directory = Path(directory)
    type(model.config).register_for_auto_class()
    type(model).register_for_auto_class(auto_class_of(type(model)))
    # written beside the folder first, then moved in: an earlier export's files that this one does not write
    # (its evaluation results, its remote code, weight shards) never stay behind, and a link inside the folder is
    # replaced, not written through
    staging = directory.parent / f".{directory.name}.export-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    try:
        model.save_pretrained(staging)  # writes the family's full auto_map
        if tokenizer is not None:
            if topic_tokenizer is not None:
                save_vocabularies(tokenizer, topic_tokenizer, staging)
            else:
                tokenizer.save_pretrained(staging)
        write_model_card(model, staging, results=results, datasets=datasets, description=description,
                         repo_id=repo_id if repo_id is not None else str(directory), **card)
        _replace_export(staging, directory)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return directory


# what an earlier export wrote that a new one may not write again (kept by nothing else in an export folder)
_STALE_EXPORT = (".eval_results", "modeling_*.py", "configuration_*.py", "model-*.safetensors",
                 "model.safetensors.index.json")


def _replace_export(staging: Path, directory: Path) -> None:
    """Move the new export's files from ``staging`` into ``directory``: an earlier export's stale files
    (``_STALE_EXPORT``) are removed first, and an entry of the same name is replaced (a link: the link itself,
    never what it points to)."""
    directory.mkdir(parents=True, exist_ok=True)
    for pattern in _STALE_EXPORT:
        for old in directory.glob(pattern):
            if old.is_symlink() or not old.is_dir():
                old.unlink()
            else:
                shutil.rmtree(old)
    for new in staging.iterdir():
        target = directory / new.name
        if target.is_symlink() or (target.exists() and not target.is_dir()):
            target.unlink()
        elif target.is_dir():
            shutil.rmtree(target)
        os.replace(new, target)


# What the Hub shows for each head: its pipeline tag and the task of its evaluation results.
PIPELINE_TAGS = {"AutoModelForCausalLM": "text-generation", "AutoModelForSequenceClassification": "text-classification",
                 "AutoModelForTokenClassification": "token-classification", "AutoModel": "feature-extraction"}
TASK_NAMES = {"text-generation": "Language modeling", "text-classification": "Text classification",
              "token-classification": "Word sense disambiguation", "feature-extraction": "Document representation"}

# The paragraph of a model that is not a family of causal LMs (the families' own are in families.FAMILIES).
TASK_CARDS = {
    "sense_tagger": dict(
        name="BiLSTM word sense tagger",
        paper="the WSD evaluation of NCLM (Chaudhary et al. 2020): a BiLSTM tagger, optionally with a frozen topic "
              "model's document topics",
        equation="sense(w_t) = argmax softmax(U [h_t; topics]) over the word's WordNet senses",
        departures="scored with the Raganato et al. 2017 framework (P / R / F1 per evaluation set)."),
}

# Every size of every family, in the order the card's table shows them.
SIZE_FIELDS = ("vocab_size", "topic_vocab_size", "num_topics", "topic_sizes", "embedding_size", "hidden_size",
               "hidden_sizes", "num_hidden_layers", "num_factors", "encoder_hidden_size", "topic_embedding_size",
               "inference_hidden_size", "cell", "lm_type", "variant", "num_labels")


def family_card(model_type: str) -> dict:
    """The card paragraph of ``model_type``: its family's (``Family.card``), or a task model's (``TASK_CARDS``)."""
    from .families import FAMILIES

    return FAMILIES[model_type].card if model_type in FAMILIES else TASK_CARDS.get(model_type, {})


def is_topic_family(model_type: str) -> bool:
    from .families import FAMILIES

    return model_type in FAMILIES and FAMILIES[model_type].is_topic_model


def card_tags(config) -> list[str]:
    """Hub tags of a model family: what it is (a language model, a topic model), its recurrent cell,
    its ``model_type`` and variant, and ``custom_code`` (it loads with ``trust_remote_code``)."""
    tags = ["language-model", config.model_type]
    if is_topic_family(config.model_type):
        tags.append("topic-model")
    cell = getattr(config, "cell", None)
    if cell is not None:  # TopicRNN / TopicLSTM / TopicGRU
        tags += [cell, f"topic{cell}"]
    else:
        tags.append("lstm")
    if getattr(config, "lm_type", None) == "naive_moe":
        tags.append("mixture-of-experts")
    return tags + ["custom_code"]


def card_sizes(config) -> dict[str, Any]:
    """Every size field the config has (:data:`SIZE_FIELDS`), as the card's table shows them."""
    return {k: getattr(config, k) for k in SIZE_FIELDS if getattr(config, k, None) is not None}


def _finite(value) -> bool:
    return value is not None and isinstance(value, (int, float)) and math.isfinite(value)


def result_metric(row: dict[str, Any]) -> tuple[str, float, str]:
    """``(metric type, value, metric name)`` of an evaluation row: a perplexity row names its protocol, an
    accuracy or F1 row its evaluation set (``config``) when it has one."""
    if "perplexity" in row and "metric" not in row:
        if "protocol" not in row:
            raise ValueError(f"a perplexity row needs the protocol it was measured under ('protocol': 'causal', "
                             f"...), as evaluate_perplexity returns it: {row}")
        return "perplexity", row["perplexity"], f"Perplexity ({row['protocol']} protocol)"
    metric = row.get("metric")
    if metric not in ("perplexity", "accuracy", "f1"):
        raise ValueError(f"an evaluation row is a perplexity, accuracy or f1 row, got {row}")
    config = row.get("protocol") or row.get("config")
    name = {"perplexity": "Perplexity", "accuracy": "Accuracy", "f1": "F1"}[metric]
    return metric, row["value"], f"{name} ({config}{' protocol' if metric == 'perplexity' else ''})" if config \
        else name


def eval_results(results: list[dict[str, Any]], pipeline_tag: str = "text-generation") -> list[EvalResult]:
    """One ``model-index`` entry per evaluation row with a finite value (a NaN is no result: it stays out of
    the metadata); the protocol or evaluation set is in the metric's name and configuration."""
    out = []
    for r in results:
        if "dataset" not in r:
            raise ValueError(f"an evaluation row needs a 'dataset' name for the model card: {r}")
        metric, value, name = result_metric(r)
        if not _finite(value):
            continue
        out.append(EvalResult(
            task_type=pipeline_tag, task_name=TASK_NAMES[pipeline_tag], dataset_name=r["dataset"],
            dataset_type=r.get("dataset_type", re.sub(r"[^\w.-]+", "-", r["dataset"]).strip("-").lower()),
            dataset_split=r.get("dataset_split"), metric_type=metric, metric_name=name,
            metric_config=r.get("protocol") or r.get("config"),
            metric_value=round(float(value), 2 if metric == "perplexity" else 4)))
    return out


def render_card(config, model_class: str, repo_id: str, results=None, datasets=None, description: str = "",
                training: Optional[dict[str, str]] = None, topics: Optional[list[dict[str, Any]]] = None,
                steering: Optional[dict[str, Any]] = None, measured_note: str = "") -> ModelCard:
    """The model card of a model of class ``model_class`` with ``config``, for ``repo_id``.

    Args:
        results: evaluation rows (:func:`eval_results`).
        training: how it was trained, as ``{"data": ..., "vocabulary": ..., "budget": ..., "recipe": ...}``.
        topics: the topic table, ``[{"words": [...], "npmi": float | None}, ...]``.
        steering: ``evaluate_steering``'s figures (``accuracy_own``, ``accuracy_lda``, ``chance``,
            ``fluency_ratio``, ...).
        measured_note: where the numbers come from when not from this very model (said above every table).
    """
    auto_class = auto_class_of(model_class)
    pipeline_tag = PIPELINE_TAGS[auto_class]
    sizes = card_sizes(config)
    if pipeline_tag not in ("text-classification", "token-classification"):
        sizes.pop("num_labels", None)  # transformers' default, meaningless for a language model
    results = list(results or [])
    rows = []
    for r in results:
        metric, value, name = result_metric(r)
        rows.append({"dataset": r.get("dataset", ""), "what": r.get("protocol") or r.get("config") or "",
                     "metric": metric, "value": f"{value:.2f}" if _finite(value) and metric == "perplexity"
                     else f"{value:.4f}" if _finite(value) else "n/a", "tokens": r.get("tokens", "")})
    card_data = ModelCardData(
        language="en", license="apache-2.0", library_name="transformers", datasets=datasets,
        pipeline_tag=pipeline_tag, tags=card_tags(config), model_name=Path(repo_id).name,
        eval_results=eval_results(results, pipeline_tag) or None)
    template = resources.files(__package__).joinpath(CARD_TEMPLATE)
    family = family_card(config.model_type)
    with resources.as_file(template) as path:
        return ModelCard.from_template(
            card_data, template_path=str(path), model_type=config.model_type, model_class=model_class,
            auto_class=auto_class, pipeline_tag=pipeline_tag, repo_id=repo_id, sizes=sizes, rows=rows,
            model_description=description, family=family, training=training or {}, topics=topics or [],
            steering=steering or {}, measured_note=measured_note,
            # a topic family (which reads its document's context); the LSTM LM and the task models read none
            topic_model=is_topic_family(config.model_type))


EVAL_RESULTS_DIR = ".eval_results"  # the Hub's evaluation results of a model repository, one YAML file per benchmark


def eval_result_files(results: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The Hub's ``.eval_results/*.yaml`` files of the evaluation rows (file name -> its YAML list), beside the
    card's ``model-index``: one file per benchmark dataset, for the rows whose ``dataset_type`` is a Hub dataset id
    (``owner/name``): the format names the benchmark by its Hub id, so a row on local data (APNEWS read from
    disk) has no entry there. Each entry's ``task_id`` is the row's ``task_id``, else its protocol or evaluation
    set (``"default"`` without one); its ``notes`` name the metric. Empty where the installed huggingface_hub
    cannot write the format (``EvalResultEntry`` is newer than 1.0)."""
    try:
        from huggingface_hub import EvalResultEntry, eval_result_entries_to_yaml
    except ImportError:
        return {}
    entries: dict[str, list] = {}
    for r in results:
        dataset_id = r.get("dataset_type")
        if not dataset_id or not re.fullmatch(r"[\w.-]+/[\w.-]+", dataset_id):
            continue
        metric, value, name = result_metric(r)
        if not _finite(value):
            continue
        entries.setdefault(dataset_id, []).append(EvalResultEntry(
            dataset_id=dataset_id, task_id=r.get("task_id") or r.get("protocol") or r.get("config") or "default",
            value=round(float(value), 2 if metric == "perplexity" else 4), notes=name))
    return {f"{dataset_id.replace('/', '__')}.yaml": eval_result_entries_to_yaml(rows)
            for dataset_id, rows in entries.items()}


def write_model_card(model: PreTrainedModel, directory: str | os.PathLike, results=None, datasets=None,
                     description: str = "", repo_id: Optional[str] = None, **card) -> ModelCard:
    """Render the package's card template (``templates/model_card.md``) into ``directory/README.md``, and the
    results on Hub benchmark datasets into ``directory/.eval_results/`` (:func:`eval_result_files`)."""
    import yaml

    card_ = render_card(model.config, type(model).__name__, repo_id or str(directory), results=results,
                        datasets=datasets, description=description, **card)
    card_.save(Path(directory) / "README.md")
    for name, rows in eval_result_files(list(results or [])).items():
        path = Path(directory) / EVAL_RESULTS_DIR / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(rows, sort_keys=False), encoding="utf-8")
    return card_


def push_to_hub(model: PreTrainedModel, repo_id: str, tokenizer=None, topic_tokenizer=None, private: bool = False,
                token: Optional[str] = None, local_dir: Optional[str | os.PathLike] = None, **card_kwargs) -> str:
    """Write everything :func:`save_for_hub` writes into ``local_dir`` (default: ``./<repo name>-hub``), then
    create ``repo_id`` if needed and upload the folder.

    Where the Hub cannot be reached, raises :class:`HubUnreachableError` with one line: the Hub is unreachable,
    the upload-ready folder, and the command that uploads it later. Returns ``repo_id``."""
    folder = Path(local_dir) if local_dir is not None else Path(f"{repo_id.rsplit('/', 1)[-1]}-hub")
    save_for_hub(model, folder, tokenizer, topic_tokenizer, repo_id=repo_id, **card_kwargs)
    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message="Upload with topic-lm-hf")
    except Exception as error:
        if is_network_error(error):
            raise HubUnreachableError(unreachable_message(repo_id, folder, error)) from None
        raise
    return repo_id


class ModelSourceError(ValueError):
    """``model_name_or_path`` is neither a saved model folder nor a model on the Hub (one line says which)."""


REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def resolve_model_source(name_or_path: str | os.PathLike, token: Optional[str] = None) -> str:
    """Check that ``name_or_path`` is a saved model folder, or a Hub repo id that is in the Hub cache or on the
    Hub, before transformers tries the network (it retries for half a minute, then prints a long traceback
    about connecting that never says the folder is missing). Returns it; raises :class:`ModelSourceError` with
    one line otherwise, without retries (and without the network when ``HF_HUB_OFFLINE`` is set)."""
    name = str(name_or_path)
    if os.path.isdir(name):
        if not os.path.isfile(os.path.join(name, "config.json")):
            raise ModelSourceError(f"{name} is a folder without config.json: not a saved model (give the folder "
                                   "that save_pretrained, a Trainer checkpoint or topic-lm train wrote)")
        try:
            config = json.loads(Path(name, "config.json").read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as error:
            raise ModelSourceError(f"{name}/config.json is not valid JSON ({error})") from None
        if not isinstance(config, dict) or "model_type" not in config:
            # without it transformers asks interactively whether to run remote code
            raise ModelSourceError(f"{name}/config.json has no model_type: not a model this package saved (its "
                                   "model_type names the family, e.g. \"tcnlm\")")
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        if config["model_type"] not in CONFIG_MAPPING:
            # an unknown type makes transformers offer to run the folder's own code: never from here
            from .families import FAMILIES

            raise ModelSourceError(f"{name}/config.json names model_type {config['model_type']!r}, which this package "
                                   f"does not know (its families: {', '.join(sorted(FAMILIES))}); code in the folder "
                                   "is not run")
        return name
    if os.path.exists(name):
        raise ModelSourceError(f"{name} is a file, not a saved model folder")
    if not REPO_ID.match(name) or name.startswith((".", "~")):
        raise ModelSourceError(f"there is no folder {name} (and it is not a Hub repo id)")
    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return name  # downloaded before: transformers loads it from the Hub cache
    if constants.HF_HUB_OFFLINE:
        raise ModelSourceError(f"there is no folder {name}, and {name} is not in the Hub cache (HF_HUB_OFFLINE is set, "
                               "so the Hub was not asked)")
    try:
        HfApi(token=token).model_info(name, timeout=10)
    except RepositoryNotFoundError:
        raise ModelSourceError(f"there is no folder {name}, and the Hub has no model {name} (or it is private: "
                               "log in with `hf auth login`)") from None
    except HfHubHTTPError:
        return name  # the Hub answered (gated, rate-limited ...): transformers says what it needs
    except Exception as error:
        if is_network_error(error):
            raise ModelSourceError(f"there is no folder {name}, and the Hub cannot be reached to look for a model "
                                   f"{name} ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})"
                                   ) from None
        raise
    return name


def auto_class_for(config):
    """The transformers Auto class that loads a saved model with ``config`` (from its ``architectures``)."""
    import transformers

    return getattr(transformers, auto_class_of((getattr(config, "architectures", None) or ["ForCausalLM"])[0]))


def load_pretrained(auto_class, name_or_path: str | os.PathLike, **kwargs):
    """``auto_class.from_pretrained(name_or_path, **kwargs)`` after :func:`resolve_model_source`: a missing folder
    or an unreachable repo id is one line (:class:`ModelSourceError`), not half a minute of retries; so is a
    ``config.json`` that disagrees with the weights (edited sizes, a ``pad_token_id`` outside the vocabulary)."""
    source = resolve_model_source(name_or_path)
    try:
        return auto_class.from_pretrained(source, **kwargs)
    except ValueError as error:
        if "Unrecognized configuration class" not in str(error):
            raise
        config = json.loads(Path(source, "config.json").read_text(encoding="utf-8")) if os.path.isdir(source) else {}
        raise ModelSourceError(f"{source} holds a {config.get('model_type', 'other')} model "
                               f"({', '.join(config.get('architectures') or []) or 'no architectures'}), which "
                               f"{auto_class.__name__} does not load: give "
                               + {"AutoModelForTokenClassification": "a sense tagger's folder (topic-lm wsd train "
                                                                      "writes one)",
                                  "AutoModelForCausalLM": "a language model's folder (topic-lm train writes one)"}.get(
                                   auto_class.__name__, "a folder of the kind this command reads")) from None
    except (RuntimeError, AssertionError) as error:
        text = " ".join(str(error).split())
        if "mismatched_sizes" in text or "size mismatch" in text or "Padding_idx" in text:
            raise ModelSourceError(f"{source}: its config.json does not match its weights ({text[:200]}); restore "
                                   "the config.json saved with them") from None
        raise
