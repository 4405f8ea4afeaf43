"""The why study's representation measures (the seed questions' Q1 and Q2 on each pretrained model): does dropping
the middle [SEP] move a model's vectors more when it was pretrained with one, and does sentence 1 then take in more
of sentence 2?

On held-out BBC pairs, each finished model's last layer is extracted (:func:`probing.extract.extract`, cached under
``<out>/caches``) in ``pair`` (``[CLS] s1 [SEP] s2 [SEP]``) and ``concat_segments`` (the same tokens and segment
ids without the middle [SEP]), and in both formats again with sentence 2 replaced by a sentence of the same topic
from another held-out article (:func:`probing.study.questions._common.replace_second`; the replacements come from
the other half of the held-out documents, so no measured document lends a sentence). Per example, as in Q1 and Q2
of the seed questions (:mod:`analyses.representation_change`), a change is ``1 − cos`` of the same token (paired by
key and token id) or vector in the two inputs, averaged over the example's tokens, as a share of the
representation's spread (``1 − cos`` between two different examples, from random pairs of the reference input):

* ``drop_sep``: ``pair`` → ``concat_segments``, for sentence 1's words, sentence 2's words and [CLS];
* ``interchange``: sentence 2 replaced, for sentence 1's words, in ``pair`` and in ``concat_segments``; and
  ``interchange_gain``, the second minus the first: how much more sentence 1 depends on sentence 2 without the
  [SEP] (the seed questions' Q2).

Per model the shares form an ``(examples x pretraining seeds)`` matrix; the comparison rows (reference − the model
pretrained without [SEP]) take the two-stage bootstrap over pretraining seeds, then documents
(:func:`analyses.finetune.seed_document_ci`), as every row of the why study does.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

__all__ = ["MEASURES", "REPRESENTATION_RULE", "change_shares", "measured_pairs", "representation_predictions",
           "representation_rows"]

#: Each measure: (what, the representation of analyses.representation_change, the reference input, the changed
#: one); inputs are ``(corpus, format)`` with corpus ``pairs`` or ``replaced``.
MEASURES: dict[str, tuple[str, str, tuple[str, str], tuple[str, str]]] = {
    "drop_sep_s1": ("sentence 1's words, dropping the middle [SEP]", "s1 words", ("pairs", "pair"),
                    ("pairs", "concat_segments")),
    "drop_sep_s2": ("sentence 2's words, dropping the middle [SEP]", "s2 words", ("pairs", "pair"),
                    ("pairs", "concat_segments")),
    "drop_sep_cls": ("[CLS], dropping the middle [SEP]", "cls", ("pairs", "pair"), ("pairs", "concat_segments")),
    "interchange_pair": ("sentence 1's words when sentence 2 is replaced, with [SEP]", "s1 words", ("pairs", "pair"),
                         ("replaced", "pair")),
    "interchange_concat": ("sentence 1's words when sentence 2 is replaced, without [SEP]", "s1 words",
                           ("pairs", "concat_segments"), ("replaced", "concat_segments")),
}
#: Derived measures: name -> (what, a − b of two measures).
GAINS = {"interchange_gain": ("how much more sentence 1's words follow a replaced sentence 2 without [SEP] than "
                              "with it", "interchange_concat", "interchange_pair")}
#: The rule of the representation rows: Q1's unit and threshold.
REPRESENTATION_RULE = ("difference in how far the same vectors move", "points of the way to another input", 0.05,
                       "5% of the distance between two different inputs, the seed questions' Q1 yardstick")
#: At most this many examples are measured (half of the held-out documents; the other half lends replacements).
MAX_EXAMPLES = 400
#: Random pairs of different examples behind each spread.
N_PAIRS = 5000


def _half(doc: str) -> bool:
    return int(hashlib.sha256(f"why-interchange|{doc}".encode()).hexdigest()[:8], 16) % 2 == 0


def measured_pairs(examples: Sequence, max_examples: int = MAX_EXAMPLES, seed: int = 0) -> tuple[list, list]:
    """``(measured, replaced)``: the pairs of half the documents (by a hash of the document name; at most
    ``max_examples``, in corpus order) and the same pairs with sentence 2 replaced by a same-topic sentence of a
    document of the other half."""
    from probing.study.questions._common import replace_second

    doc = [str(e.labels.get("doc", e.id)) for e in examples]
    measured = [e for e, d in zip(examples, doc) if _half(d)][:max_examples]
    pool = [e for e, d in zip(examples, doc) if not _half(d)]
    return measured, replace_second(measured, pool, seed=seed, pool_name="the other half of the held-out pairs")


def _rows_of(cache, representation: str, other) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(example ids per row, reference rows' last-layer states, the changed input's)`` of ``representation``."""
    from analyses.representation_change import is_token_group, token_pairs
    from analyses.selection import item_rows, pool

    last = cache.layers[-1]
    if is_token_group(representation):
        p = token_pairs(cache, other, representation)
        A = cache.states(None, p["row_ref"].to_numpy())[:, cache.layer_index(last)]
        B = other.states(None, p["row_other"].to_numpy())[:, other.layer_index(last)]
        return p["example_id"].to_numpy(), A, B
    out = []
    for c in (cache, other):
        items = item_rows(c, representation)
        ids = c.examples["example_id"].astype(str).to_numpy()[items.examples]
        out.append((ids, pool(c, None, items)[:, c.layer_index(last)]))
    (ia, A), (ib, B) = out
    ids, a, b = np.intersect1d(ia, ib, return_indices=True)
    return ids, A[a], B[b]


def change_shares(ref, other, representation: str, n_pairs: int = N_PAIRS, seed: int = 0) -> pd.Series:
    """Per example id, the mean over its tokens of ``1 − cos`` between ``ref`` and ``other`` at the last layer, as a
    share of the spread of ``representation`` in ``ref`` (module docstring)."""
    from analyses.drift import MIN_SPREAD, pair_spread, rowwise_cosine
    from analyses.representation_change import example_means

    ids, A, B = _rows_of(ref, representation, other)
    spread = pair_spread([A], ids, np.ones(len(ids), dtype=bool), n_pairs, seed)
    if not (np.isfinite(spread) and spread > MIN_SPREAD):
        raise ValueError(f"{representation!r} has no spread in {ref.path}: every example's vector is the same")
    examples, drift = example_means(1.0 - rowwise_cosine(A, B), ids)
    return pd.Series(drift / spread, index=examples.astype(str))


def representation_predictions(models: Sequence, measured: list, replaced: list, out: Path, *, device: str = "auto",
                               progress: bool = True, log: Callable[[str], None] = print) -> pd.DataFrame:
    """Every finished model's shares, one row per (model, measure, example): ``role``, ``seed``, ``measure``,
    ``item``, ``doc``, ``value``. Extraction caches go to ``out`` (reused when complete)."""
    from probing.cache import Cache
    from probing.extract import extract
    from probing.models import load_model

    docs = {e.id: str(e.labels.get("doc", e.id)) for e in measured}
    frames = []
    for m in models:
        if m.step is not None:
            continue
        lm = load_model(str(m.path))
        caches = {}
        for corpus, examples in (("pairs", measured), ("replaced", replaced)):
            paths = extract(examples, ["pair", "concat_segments"], model=lm, out=out, layers=[lm.n_layers],
                            corpus_name=f"why {corpus} ({len(examples)} held-out pairs)", device=device,
                            on_overflow="skip", progress=progress, log=lambda *a: None)
            caches.update({(corpus, f): Cache.open(p) for f, p in zip(("pair", "concat_segments"), paths)})
        values = {}
        for name, (_, rep, a, b) in MEASURES.items():
            values[name] = change_shares(caches[a], caches[b], rep)
        for name, (_, a, b) in GAINS.items():
            values[name] = (values[a] - values[b]).dropna()
        for name, v in values.items():
            frames.append(pd.DataFrame({"role": m.role, "seed": m.seed, "measure": name, "item": v.index,
                                        "doc": [docs[i] for i in v.index], "value": v.to_numpy()}))
        log(f"representation measures of {m.role} seed {m.seed}: done")
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["role", "seed", "measure", "item", "doc", "value"])


def _matrix(R: pd.DataFrame, role: str, measure: str) -> pd.DataFrame:
    sel = R[(R["role"] == role) & (R["measure"] == measure)]
    return sel.pivot_table(index="item", columns="seed", values="value", aggfunc="mean")


def representation_rows(R: pd.DataFrame, n_resamples: int = 1000) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(values, rows)``: each role's mean share per measure with its interval over pretraining seeds and documents,
    and the comparison rows (reference − the model pretrained without [SEP], per measure) for
    :func:`probing.study.rules.decide`."""
    from analyses.finetune import seed_document_ci

    docs_of = R.drop_duplicates("item").set_index("item")["doc"]
    values, rows = [], []
    for measure in [*MEASURES, *GAINS]:
        what = (MEASURES.get(measure) or GAINS[measure])[0]
        mats = {}
        for role in dict.fromkeys(R["role"]):
            M = _matrix(R, role, measure).dropna()
            if M.empty:
                continue
            mats[role] = M
            v, lo, hi, se = seed_document_ci(M.to_numpy(float), None, docs_of.loc[M.index].to_numpy(),
                                             n_resamples=n_resamples)
            values.append({"role": role, "measure": measure, "what": what, "value": v, "ci_low": lo, "ci_high": hi,
                           "n_items": len(M), "n_seeds": M.shape[1]})
        if "reference" in mats and "nosep" in mats:
            a, b = mats["reference"], mats["nosep"]
            items = a.index.intersection(b.index)
            if a.shape[1] != b.shape[1] or items.empty:
                continue
            A, B = a.loc[items].to_numpy(float), b.loc[items].to_numpy(float)
            docs = docs_of.loc[items].to_numpy()
            v, _, _, se = seed_document_ci(A, B, docs, n_resamples=n_resamples)
            rows.append({"question": "sep", "family": "sep/representation", "measure": "representation",
                         "label": f"{what}: pretrained with [SEP] − without", "representation": "last layer",
                         "task": measure, "value": v, "se": se, "value_a": float(A.mean()), "value_b": float(B.mean()),
                         "n_items": len(items), "n_seeds": A.shape[1], "n_groups": len(np.unique(docs))})
    return pd.DataFrame(values), pd.DataFrame(rows)
