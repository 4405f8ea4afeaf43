"""The notebook API: load a model, extract caches, get :class:`probing.cache.Cache` objects back.

Reached through the package (``probing.load_model``, ``probing.extract_caches``, ``probing.Cache``),
which imports this module only when one of them is first used, so ``import probing`` stays light.
``probing.extract`` is the extraction module (``python -m probing.extract``), so the function that
returns caches is named ``extract_caches``: an attribute named like a submodule would be replaced
by the submodule as soon as anything imports it.
"""

from __future__ import annotations

import os
from typing import Sequence

from .cache import Cache
from .examples import Example, as_examples


def load_model(name: str | None = None, *, random_init: bool = False, init_seed: int = 0, device: str = "auto",
               dtype: str = "float32", trust_remote_code: bool = False):
    """A model and its fast tokenizer, ready for :func:`extract_caches` (a
    :class:`probing.models.LoadedModel`). ``name``: a Hugging Face id or local path (None: the default
    model, all-MiniLM-L6-v2, available offline); ``random_init``: the same architecture with random
    weights seeded by ``init_seed`` (the baseline)."""
    from .models import load_model as _load, pick_device

    return _load(name, random_init=random_init, seed=init_seed, device=pick_device(device), dtype=dtype,
                 trust_remote_code=trust_remote_code)


def extract_caches(model, corpus: str | Sequence[Example] | Sequence[str] | Sequence[Sequence[str]], *,
                   formats: str | Sequence[str] = ("pair",),
                   roles: str | Sequence[str] | None = None, layers: str | Sequence[int] | None = None,
                   out: str | os.PathLike = "caches", corpus_name: str | None = None, attention: bool = False,
                   force: bool = False, progress: bool = True, log=print, **options) -> list[Cache]:
    """Extract (or reuse) one cache per format and return them opened, in the order of ``formats``.

    ``model``: a :func:`load_model` result, or a name/path (None: the default model). ``corpus``: a
    corpus spec (``"generated:n=50,k=2"``, ``"bbc:n=200"``; :func:`probing.corpora.load_corpus`), which
    also names the corpus in the cache, or a list (named ``corpus_name``, default ``custom``) of
    :class:`probing.examples.Example`, of strings (one one-sentence example each) or of tuples of strings
    (one example each), ids ``"0", "1", ...`` (:func:`probing.examples.as_examples`). ``formats``:
    built-in names (``native``: the tokenizer's own template), ``name=TEMPLATE`` or
    :class:`probing.formats.Format` objects. ``roles``: what a cache
    stores (``cls,sep,word`` by default, or ``all``). ``layers``: a layer spec (:mod:`probing.layers`:
    ``all``, ``0,3,-1``, ``2-4``; -1 is the last). Other keyword arguments go to
    :func:`probing.extract.extract` (``attention_norm``, ``intervention``, ``dtype``, ``device``, ...).
    """
    from .extract import extract

    if isinstance(corpus, str):
        from .corpora import load_corpus

        examples, corpus_name = load_corpus(corpus), corpus_name or corpus
    else:
        examples = as_examples(corpus)
    paths = extract(examples, formats, model=model, out=out, corpus_name=corpus_name or "custom", roles=roles,
                    layers=layers, attention=attention, force=force, progress=progress, log=log, **options)
    return [Cache.open(p) for p in paths]


def pretrain_models(config, *, force: bool = False, progress: bool = True, log=print, **overrides) -> list:
    """Pretrain every variant of a :mod:`probing.pretrain` config with each of its seeds and return the run
    directories (``pathlib.Path``; each loads with :func:`load_model`). ``config``: a TOML file, a parsed TOML
    document (dict) or a :class:`probing.pretrain.PretrainConfig`; ``overrides``: ``out``, ``preset``, ``seeds``,
    ``device``, ``threads`` (``[run]``) and ``steps`` (``[train]``), as the command line's options. Finished runs
    are kept unless ``force``; interrupted ones resume. (Named apart from the subpackage ``probing.pretrain``.)"""
    from .pretrain import PretrainConfig, load_config, parse_config, pretrain

    sections = {"out": "run", "preset": "run", "seeds": "run", "device": "run", "threads": "run", "steps": "train"}
    unknown = sorted(set(overrides) - set(sections))
    if unknown:
        raise ValueError(f"unknown options {unknown}; valid: {', '.join(sections)}")
    dotted = {f"{sections[k]}.{k}": v for k, v in overrides.items() if v is not None}
    if isinstance(config, PretrainConfig):
        if dotted:
            raise ValueError("options apply to a config file or dict; change the PretrainConfig itself")
        cfg = config
    elif isinstance(config, dict):
        cfg = parse_config(config, overrides=dotted)
    else:
        cfg = load_config(config, overrides=dotted)
    return pretrain(cfg, force=force, progress=progress, log=log)
