"""Pre-training a model's topic model on bags of words before the language model joins.

A topic-guided LM trained jointly from scratch starts with random topics, and its LM learns early
on to ignore topic proportions that carry no information. Training the topic model alone first
gives the LM informative proportions from its first step. Every topic family has the two methods
this needs: ``topic_model_loss(context_bow, ...)`` (its topic model's own objective per context
word) and ``topic_model_parameters()``:

* TCNLM: the neural topic model (encoder, g(theta), beta), its ELBO and diversity term;
* NCLM: the NVDM (and ``diversity_weight``'s term against redundant topics);
* TopicRNN / TopicLSTM / TopicGRU: the inference network with B, under the bag-of-words likelihood
  softmax(B theta) (not in the paper's ELBO, where B learns only through the LM);
* rGBN-RNN / GBN-RNN: the Weibull encoder by gradient, Phi and Pi by TLASGR-MCMC after every
  optimizer step, on whole documents' bags of words.

The batches are ``TopicContextCollator.for_model(model, ..., protocol="pretraining")``'s: the family's training
batches, or one row per document with its whole bag of words where the family declares it (rGBN-RNN, whose
causal training context gives a document's first sentences nearly empty bags).

With ``eval_dataset`` the run stops when the objective on it has not improved for ``patience``
evaluations and the best topic model is kept; ``steps`` is then a cap.

With ``checkpoint_dir`` the run is resumable, like joint training: every ``save_every`` steps, and when it ends, it
writes ``pretraining-<step>.pt`` there (the weights, the optimizer, the step, the data order's and torch's random
states, the record so far and the best topic model), atomically (a temporary file renamed), keeping the last two. A
run started again with the same ``checkpoint_dir`` resumes from the newest one that loads (a file cut short is
skipped with a warning) and ends as the uninterrupted run would; a finished run's last checkpoint returns at once.
A checkpoint records what it was trained on (the model's configuration, the collator's settings and vocabularies, a
digest of the training and development rows, and the optimisation settings); one written under anything else is
refused with the differences named, never resumed.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from .data import vocabulary_hash
from .models.modeling_topic_family import TopicFamilyForCausalLM
from .checkpoints import dict_differences, model_settings

logger = logging.getLogger(__name__)


class _SteeringRecipes(Mapping):
    """model_type -> the steering recipe of every registered topic family (``Family.steering_recipe``): what makes
    its topics matter and steer (README, "Topics that steer, in every family"; measured in
    scripts/benchmark_steering.py). Every entry is a departure from the family's paper, one configuration value
    each; ``topic-lm train`` applies them by default and ``--recipe paper`` leaves them out. A read-only view of the
    family registry."""

    def __getitem__(self, model_type: str) -> dict:
        from .families import FAMILIES

        family = FAMILIES.get(model_type)
        if family is None or not family.steering_recipe:
            raise KeyError(model_type)
        return dict(family.steering_recipe)

    def __iter__(self):
        from .families import FAMILIES

        return iter([name for name, family in FAMILIES.items() if family.steering_recipe])

    def __len__(self) -> int:
        return len(list(iter(self)))


STEERING_RECIPE: Mapping[str, dict] = _SteeringRecipes()
# ... and its topic-model pre-training (pretrain_topic_model's arguments): at most ``steps`` Adam steps, stopped
# by the development objective.
RECIPE_PRETRAINING = {"steps": 20000, "learning_rate": 3e-3, "batch_size": 64, "eval_every": 500, "patience": 3}


def steering_recipe(model_type: str, **settings) -> dict:
    """The configuration values of the steering recipe for ``model_type`` (a copy; ``{}`` for a family without
    topics; a ``ValueError`` listing the families for a model_type that is none of them, so that a typo never drops
    the recipe silently). ``settings``: configuration values already chosen (``variant``, ``lm_type``, ...; None =
    the default). Where the configuration class says the shared prior is unavailable with them (its
    ``output_prior_unavailable``: NCLM's ETA, TCNLM's naive mixture of experts), the rest of the recipe."""
    from .families import FAMILIES, SHARED_PRIOR, family_of

    family_of(model_type)
    recipe = dict(STEERING_RECIPE.get(model_type, {}))
    config_class = FAMILIES[model_type].config_class if recipe else None
    if recipe and config_class.output_prior_unavailable(**{k: v for k, v in settings.items() if v is not None}):
        for key in SHARED_PRIOR:
            recipe.pop(key)
    return recipe


@dataclass
class TopicPretrainingResult:
    """What :func:`pretrain_topic_model` did: the loss of every step, the development objective at every
    evaluation as ``(step, loss)``, the step whose topic model was kept, and what stopped the run
    (``"patience"``: the development objective stopped improving; ``"steps"``: the cap)."""

    losses: list[float] = field(default_factory=list)
    dev_losses: list[tuple[int, float]] = field(default_factory=list)
    best_step: Optional[int] = None
    stopped_by: str = "steps"

    @property
    def steps(self) -> int:
        return len(self.losses)

    @property
    def best_dev_loss(self) -> Optional[float]:
        return min((loss for _, loss in self.dev_losses), default=None)


def _topic_inputs(model, batch: dict) -> dict:
    names = model.topic_model_inputs
    if "context_bow" not in batch:
        raise ValueError("The collator gives no context_bow: build it with a context mode other than 'none'")
    device = next(model.parameters()).device  # the batches follow the model (a GPU when it is there)
    return {name: batch[name].to(device) for name in names if batch.get(name) is not None}


@torch.no_grad()
def topic_model_objective(model, dataset, collator, batch_size: int = 64) -> float:
    """The topic model's objective per context word on ``dataset`` (evaluation mode: no sampling, no TLASGR
    update), each batch weighted by its number of context words."""
    was_training = model.training
    model.eval()
    total = words = 0.0
    for start in range(0, len(dataset), batch_size):
        batch = collator([dataset[i] for i in range(start, min(start + batch_size, len(dataset)))])
        inputs = _topic_inputs(model, batch)
        n = float(inputs["context_bow"].sum())
        total += float(model.topic_model_loss(**inputs)) * n
        words += n
    model.train(was_training)
    return total / max(words, 1.0)


def _pretraining_checkpoints(checkpoint_dir) -> list[str]:
    """The ``pretraining-<step>.pt`` files of ``checkpoint_dir``, oldest first."""
    if not checkpoint_dir or not os.path.isdir(checkpoint_dir):
        return []
    found = [(int(m.group(1)), name) for name in os.listdir(checkpoint_dir)
             if (m := re.fullmatch(r"pretraining-(\d+)\.pt", name))]
    return [os.path.join(checkpoint_dir, name) for _, name in sorted(found)]


def _last_pretraining_checkpoint(checkpoint_dir, settings: dict) -> Optional[dict]:
    """The newest pre-training checkpoint of ``checkpoint_dir`` that loads (None: none); one that does not is
    skipped with a warning naming it. One written with other ``settings`` is an error naming them."""
    for path in reversed(_pretraining_checkpoints(checkpoint_dir)):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:  # noqa: BLE001 (a file cut short: RuntimeError, EOFError, pickle errors)
            logger.warning("Not resuming topic-model pre-training from %s: it is truncated or unreadable (%s)", path,
                           " ".join(str(error).split())[:200])
            continue
        if not isinstance(state, dict) or not {"step", "finished", "settings", "model", "optimizer", "generator",
                                               "result"} <= state.keys() or not isinstance(state["settings"], dict):
            raise ValueError(f"{path} is not a topic-model pre-training checkpoint of this package: remove it, or "
                             f"give another checkpoint_dir than {checkpoint_dir}")
        saved = state["settings"]
        changed = []
        for key, value in settings.items():
            if isinstance(value, dict) and isinstance(saved.get(key), dict):  # name the fields, not the whole record
                changed += [f"{key}.{line}" for line in dict_differences(saved[key], value, "there", "now")]
            elif saved.get(key) != value:
                changed.append(f"{key}: {saved.get(key, '(unset)')!r} there, {value!r} now")
        if changed:
            raise ValueError(f"Cannot resume topic-model pre-training from {path}: it ran with other settings ("
                             + "; ".join(changed) + f"); give the same settings, or remove {checkpoint_dir} to "
                             "start again")
        broken = [name for name, value in state["model"].items()
                  if isinstance(value, torch.Tensor) and value.is_floating_point() and not torch.isfinite(value).all()]
        if broken:
            raise ValueError(f"Cannot resume topic-model pre-training from {path}: its weights are not finite ("
                             f"{', '.join(broken[:3])}); remove {checkpoint_dir} to start again")
        logger.info("Resuming topic-model pre-training from %s", path)
        return state
    return None


def rows_digest(rows) -> Optional[str]:
    """16 hex digits of SHA-256 over prepared rows (a ``datasets.Dataset``, its selection order included, or a
    sequence of rows), or None for None: two runs on other data, or the same data in another order, differ."""
    if rows is None:
        return None
    digest = hashlib.sha256()
    table = getattr(getattr(rows, "data", None), "table", None)
    if table is not None:  # a datasets.Dataset: its Arrow table, in the order its indices give
        indices = getattr(rows, "_indices", None)
        if indices is not None:
            table = table.take(indices.column(0))
        for batch in table.combine_chunks().to_batches():
            digest.update(batch.serialize().to_pybytes())
    else:
        for row in rows:
            digest.update(json.dumps({k: v.tolist() if hasattr(v, "tolist") else v for k, v in dict(row).items()},
                                     sort_keys=True, default=str).encode("utf-8"))
    return f"{len(rows)}:{digest.hexdigest()[:16]}"


def collator_settings(collator) -> dict:
    """What a :class:`~topic_lm_hf.TopicContextCollator` makes of the rows: its settings and its vocabularies."""
    record = {f.name: getattr(collator, f.name) for f in dataclasses.fields(collator)
              if f.name not in ("tokenizer", "topic_tokenizer")} if dataclasses.is_dataclass(collator) else {}
    record = json.loads(json.dumps(record, default=list))
    for name in ("tokenizer", "topic_tokenizer"):
        tokenizer = getattr(collator, name, None)
        record[name] = vocabulary_hash(tokenizer) if tokenizer is not None else None
    return record


def pretrain_topic_model(model, dataset, collator, steps: int, learning_rate: float = 2e-3, batch_size: int = 64,
                         max_grad_norm: float = 5.0, seed: int = 0, eval_dataset=None, eval_every: int = 500,
                         patience: int = 3, callback: Optional[Callable[[int, float], None]] = None,
                         checkpoint_dir: Optional[str] = None, save_every: int = 500) -> TopicPretrainingResult:
    """Train only the topic model of ``model`` on the ``context_bow`` of ``collator`` batches (Adam).

    Args:
        model: a topic family's causal LM (it has ``topic_model_loss`` and ``topic_model_parameters``).
        dataset: rows prepared by ``collator.prepare(documents)`` (with a context mode other than "none").
        collator: the :class:`~topic_lm_hf.TopicContextCollator` that prepared them: the model's pre-training
            batches are ``TopicContextCollator.for_model(model, tokenizer, topic_tokenizer, protocol="pretraining")``.
        steps: the most Adam steps; each reads ``batch_size`` rows drawn at random (seeded).
        eval_dataset: development rows (same collator): every ``eval_every`` steps the objective on them is
            measured; the run stops after ``patience`` evaluations without improvement, and the topic model of
            the best evaluation is restored. None: ``steps`` steps, the last topic model kept. (On APNEWS the
            topics' NPMI still rose long after the objective's first plateaus: TCNLM's from 0.035 at 1,000 steps
            to 0.048 at 5,000; hence evaluations 500 steps apart by default.)
        callback: called as ``callback(step, loss)`` after every step (progress display).
        checkpoint_dir: where to write the run's checkpoints and resume it from (see the module docstring); None:
            no checkpoints. save_every: the steps between two checkpoints.

    Returns:
        A :class:`TopicPretrainingResult`. The LM's weights are untouched; the model is left in training mode.
    """
    if not isinstance(model, TopicFamilyForCausalLM):
        raise ValueError(f"{type(model).__name__} is not a topic model: it has no topic_model_loss() and its "
                         "topic model cannot be pre-trained")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0 or batch_size < 1:
        raise ValueError(f"steps must be an integer >= 0 and batch_size >= 1, got {steps!r}, {batch_size!r}")
    if eval_dataset is not None and (eval_every < 1 or patience < 1):
        raise ValueError(f"eval_every and patience must be >= 1, got {eval_every!r}, {patience!r}")
    if checkpoint_dir is not None and (isinstance(save_every, bool) or not isinstance(save_every, int) or save_every < 1):
        raise ValueError(f"save_every must be an integer >= 1, got {save_every!r}")
    if checkpoint_dir is not None and os.path.exists(checkpoint_dir) and not os.path.isdir(checkpoint_dir):
        raise ValueError(f"checkpoint_dir {checkpoint_dir} is a file: give a folder (it is created if missing)")
    if len(dataset) == 0:
        raise ValueError("pretrain_topic_model needs a non-empty dataset")
    if eval_dataset is not None and len(eval_dataset) == 0:
        raise ValueError("eval_dataset is empty: give development rows, or None to train for `steps` steps")
    model.set_training_corpus_size(len(dataset))  # rGBN-RNN's TLASGR-MCMC scales minibatch statistics to the corpus
    params = model.topic_model_parameters()
    optimizer = torch.optim.Adam(params, lr=learning_rate)
    generator = torch.Generator().manual_seed(seed)
    result = TopicPretrainingResult()
    best_state = None
    settings = {"steps": steps, "learning_rate": learning_rate, "batch_size": batch_size, "seed": seed,
                "max_grad_norm": max_grad_norm, "eval_every": eval_every if eval_dataset is not None else None,
                "patience": patience if eval_dataset is not None else None, "rows": rows_digest(dataset),
                "dev_rows": rows_digest(eval_dataset), "collator": collator_settings(collator),
                "model": model_settings(model.config)}
    start = 0

    def save(step: int, finished: bool) -> None:
        os.makedirs(checkpoint_dir, exist_ok=True)
        path = os.path.join(checkpoint_dir, f"pretraining-{step}.pt")
        state = {"step": step, "finished": finished, "settings": settings, "model": model.state_dict(),
                 "optimizer": optimizer.state_dict(), "generator": generator.get_state(),
                 "torch_rng": torch.get_rng_state(),
                 "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                 "result": dataclasses.asdict(result), "best_state": None if finished else best_state}
        torch.save(state, path + ".tmp")
        os.replace(path + ".tmp", path)  # a kill leaves the previous checkpoint whole
        for old in _pretraining_checkpoints(checkpoint_dir)[:-2]:
            os.remove(old)

    resumed = _last_pretraining_checkpoint(checkpoint_dir, settings) if checkpoint_dir is not None else None
    if resumed is not None:
        model.load_state_dict(resumed["model"])
        optimizer.load_state_dict(resumed["optimizer"])
        generator.set_state(resumed["generator"])
        torch.set_rng_state(resumed["torch_rng"])
        if resumed["cuda_rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(resumed["cuda_rng"])
        record = resumed["result"]
        result = TopicPretrainingResult(losses=list(record["losses"]),
                                        dev_losses=[tuple(pair) for pair in record["dev_losses"]],
                                        best_step=record["best_step"], stopped_by=record["stopped_by"])
        best_state = resumed["best_state"]
        start = resumed["step"]
        if resumed["finished"]:
            model.train()
            return result

    def evaluate(step: int) -> bool:
        """Record the development objective after ``step`` steps; True when the run should stop."""
        nonlocal best_state
        loss = topic_model_objective(model, eval_dataset, collator, batch_size)
        if result.best_dev_loss is None or loss < result.best_dev_loss:
            result.best_step = step
            best_state = copy.deepcopy(model.state_dict())
        result.dev_losses.append((step, loss))
        since_best = sum(1 for s, _ in result.dev_losses if s > result.best_step)
        return since_best >= patience

    model.train()
    if eval_dataset is not None and start == 0:
        evaluate(0)  # the topic model as it starts (patience >= 1: never a reason to stop)
    for step in range(start, steps):
        rows = torch.randint(len(dataset), (batch_size,), generator=generator).tolist()
        batch = collator([dataset[i] for i in rows])
        loss = model.topic_model_loss(**_topic_inputs(model, batch))
        value = float(loss.detach())
        if not math.isfinite(value):
            raise FloatingPointError(f"Topic-model pre-training loss is {value} at step {step}: lower the learning rate")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        optimizer.step()
        result.losses.append(value)
        if callback is not None:
            callback(step, value)
        done = step + 1
        if eval_dataset is not None and (done % eval_every == 0 or done == steps):
            if evaluate(done):
                result.stopped_by = "patience"
                break
        if checkpoint_dir is not None and done % save_every == 0 and done < steps:
            save(done, finished=False)
    if best_state is not None and result.best_step != result.steps:
        model.load_state_dict(best_state)
    if eval_dataset is None:
        result.best_step = result.steps
    model.train()
    if checkpoint_dir is not None:
        save(result.steps, finished=True)
    return result
