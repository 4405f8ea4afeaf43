"""probing: measure what input formatting does to the representations of BERT-like encoders.

The pipeline runs one way: corpus -> examples -> formats -> extract -> cache -> analyses -> results
-> figures -> report. This package owns everything up to the cache; ``analyses`` reads caches and
writes tidy tables; ``figures`` reads tables only.

From a notebook (each name is imported on first use, so ``import probing`` loads neither torch nor
transformers)::

    import probing, analyses
    lm = probing.load_model()                                   # the default model, offline
    pair, concat = probing.extract_caches(lm, "generated:n=50,k=2", formats=["pair", "concat"])
    pair = probing.Cache.find("caches", model="all-MiniLM-L6-v2", format="pair", corpus="generated:n=50,k=2")
    analyses.drift_table(pair, concat, layers="-1")             # a DataFrame
    runs = probing.pretrain_models("pretrain.toml", seeds=[0, 1])  # BERTs pretrained here: model directories
"""

from __future__ import annotations

import importlib
import sys as _sys

if getattr(_sys, "argv", [None])[:1] == ["-m"]:  # Python is locating a module to run: refuse a library module
    from .module_guard import refuse_library_run

    refuse_library_run()
del _sys

__version__ = "0.1.0"

#: The notebook API: attribute -> (module, name), imported on first access (PEP 562). Only modules of
#: the probing core (text -> cache) may be named: the study's entry point is ``probing.study.run``.
API: dict[str, tuple[str, str]] = {
    "load_model": ("probing.api", "load_model"),
    "extract_caches": ("probing.api", "extract_caches"),
    "Cache": ("probing.cache", "Cache"),
    "load_corpus": ("probing.corpora", "load_corpus"),
    "Example": ("probing.examples", "Example"),
    "Format": ("probing.formats", "Format"),
    "resolve_layers": ("probing.layers", "resolve_layers"),
    "pretrain_models": ("probing.api", "pretrain_models"),
}

__all__ = ["__version__", *API]


def __getattr__(name: str):
    if name in API:
        module, attr = API[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'probing' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(API))
