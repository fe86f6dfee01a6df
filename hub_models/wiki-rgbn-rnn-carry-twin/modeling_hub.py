"""Sharing on the Hub: the ``auto_map`` that lets every Auto class load a saved folder as remote code, the Auto class
of a model class, and the one-line error of an unreachable Hub.

Copied next to the weights with a family's own files when a model is shared with remote code, so it imports only
transformers and huggingface_hub.
"""

from __future__ import annotations

import sys

from transformers import PreTrainedModel


class HubUnreachableError(OSError):
    """The Hub could not be reached; the message says where the upload-ready folder is and how to upload it."""


def is_network_error(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) is a failure to reach a server: no network, a DNS
    failure, a refused connection, a timeout, or huggingface_hub's offline mode. An HTTP error response (the
    server answered) is not one."""
    import importlib

    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    kinds = [ConnectionError, TimeoutError, OfflineModeIsEnabled]
    for name in ("httpx2", "httpx", "requests"):  # the HTTP clients huggingface_hub versions use
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        kinds += [k for k in (getattr(module, "TransportError", None), getattr(module, "ConnectionError", None),
                              getattr(module, "Timeout", None)) if isinstance(k, type)]
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, HfHubHTTPError) and not isinstance(error, OfflineModeIsEnabled):
            return False
        if isinstance(error, tuple(kinds)):
            return True
        error = error.__cause__ or error.__context__
    return False


def unreachable_message(repo_id: str, folder, error: BaseException) -> str:
    """One line: the Hub is unreachable (and why), where the upload-ready folder is, how to upload it later."""
    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    return (f"The Hub cannot be reached ({reason}); the upload-ready folder is {folder}: upload it later with "
            f"`hf upload {repo_id} {folder}`")


# The Auto class of a model class, by the suffix of its name (transformers' naming).
AUTO_CLASS_SUFFIXES = {"Model": "AutoModel", "ForCausalLM": "AutoModelForCausalLM",
                       "ForSequenceClassification": "AutoModelForSequenceClassification",
                       "ForTokenClassification": "AutoModelForTokenClassification"}


def auto_class_of(model_class: type | str) -> str:
    """The Auto class that loads ``model_class`` (a class or its name, e.g. a config's ``architectures`` entry;
    ``"AutoModel"`` for a base model)."""
    name = model_class if isinstance(model_class, str) else model_class.__name__
    for suffix, auto in AUTO_CLASS_SUFFIXES.items():
        if name.endswith(suffix) and not name.endswith("PreTrainedModel"):
            return auto
    return "AutoModel"


def auto_map_for(model: PreTrainedModel) -> dict[str, str]:
    """``config.json``'s ``auto_map`` for ``model``: the config and every model class of its family (every class of
    its modeling file with its config class), so that each Auto class loads a saved folder as remote code.

    Classes are matched by the configuration class's file and name, not by identity: a model loaded as remote code
    has a configuration class that transformers imported once more (``AutoConfig`` and the model's module each load
    the configuration file), so the model classes' ``config_class`` is another object of the same class."""
    config_cls = type(model.config)
    config_key = _class_key(config_cls)
    auto_map = {"AutoConfig": f"{config_key[0]}.{config_key[1]}"}
    module = sys.modules[type(model).__module__]
    for name, obj in sorted(vars(module).items()):
        config_of = getattr(obj, "config_class", None)
        if (isinstance(obj, type) and issubclass(obj, PreTrainedModel) and obj.__module__ == module.__name__
                and isinstance(config_of, type) and _class_key(config_of) == config_key
                and not name.endswith("PreTrainedModel")):
            auto_map[auto_class_of(obj)] = f"{module.__name__.rsplit('.', 1)[-1]}.{name}"
    return auto_map


def _class_key(cls: type) -> tuple[str, str]:
    """(the last part of the module's name, the class's qualified name): the same for the package's class and for
    each copy transformers imports of its remote code file (``transformers_modules.<folder>.<hash>.<file>``)."""
    return cls.__module__.rsplit(".", 1)[-1], cls.__qualname__


__all__ = ["AUTO_CLASS_SUFFIXES", "HubUnreachableError", "auto_class_of", "auto_map_for", "is_network_error",
           "unreachable_message"]
