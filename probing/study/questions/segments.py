"""What Q3 and Q5 share: inputs of k sentences from the ``groups`` corpus, the caches, the content readout and
interchange tables, and Q3's fine-tuned intruder task.

* Items and donors: whole documents of the ``groups`` corpus, ``[segments] donor_share`` of each topic's, are
  held out as donors (:func:`probing.corpus_replace.hold_out_documents`); every other example is an item. A
  sentence that replaces another in the interchange comes from a donor of the same topic, so it is as plausible
  as the one it replaces; an intruder from a donor of another topic (``[segments] intruders``). Either never sits
  in two items.
* Derived corpora (:func:`derive`): ``segments_k<k>``, the first k sentences of the items, for each k of
  ``[segments] ks``; ``segments_swap``, the items at the largest k with one sentence each replaced (the position
  balanced over 1..k; :func:`probing.corpus_replace.replace_sentences`).
* Caches: ``multi``, ``concat`` and ``control`` (:func:`analyses.sentence_content.segment_format`) at every k;
  ``bertsum`` at the largest k (Q5's per-sentence [CLS]); ``multi`` of ``segments_swap`` (Q5's interchange).
* Tables: ``sentence_content`` (:func:`analyses.sentence_content.run_sentence_content`), ``interchange``
  (:func:`analyses.sentence_content.run_interchange`), ``q3_intruder`` (the fine-tuned runs' accuracy per format
  and the paired differences, from the shared protocol's predictions).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from analyses.sentence_content import LENGTH_ONLY, OWN_CLS, SEGMENT_FORMATS, segment_format

from ..sections import Context, Job, prefix

#: The derived corpus of the interchange (items at the largest k, one sentence each replaced).
SWAP = "segments_swap"
#: The fine-tuned task's name in the shared protocol.
INTRUDER = "intruder"
#: Token choices read from each format: [CLS] and mean pooling; bertsum's own [CLS] of sentence i.
CHOICES: dict[str, tuple[str, ...]] = {"multi": ("cls", "mean"), "concat": ("cls", "mean"),
                                       "control": ("cls", "mean"), "bertsum": (OWN_CLS,)}
#: The formats of the frozen readouts at every k; bertsum only at the largest (Q5).
EVERY_K = ("multi", "concat", "control")


def corpus_key(k: int) -> str:
    """The derived corpus of the first ``k`` sentences of the items."""
    return f"segments_k{k}"


def largest_k(cfg) -> int:
    return max(cfg.segments.ks)


def items_and_donors(cfg, groups: list) -> tuple[list, list]:
    """``(items, donors)`` of the ``groups`` corpus (:func:`probing.corpus_replace.hold_out_documents`), checked:
    the examples have at least the largest k of ``[segments] ks`` (and ``finetune_k``) sentences."""
    from probing.corpus_replace import hold_out_documents

    from ..errors import StudyError

    need = max(largest_k(cfg), cfg.segments.finetune_k)
    have = min((e.n_sentences for e in groups), default=0)
    if have < need:
        raise StudyError(f"config: segments.ks = {list(cfg.segments.ks)} and segments.finetune_k = "
                         f"{cfg.segments.finetune_k} need examples of {need} sentences; corpus.groups "
                         f"({cfg.corpus.groups!r}) has examples of {have}: raise its k or lower them")
    try:
        return hold_out_documents(groups, cfg.segments.donor_share, cfg.study.seed)
    except ValueError as err:
        raise StudyError(f"corpus.groups ({cfg.corpus.groups!r}): {err}") from None


def derive(cfg, corpora: dict) -> dict[str, list]:
    """The derived corpora of the module docstring."""
    from probing.corpus_replace import balanced_positions, replace_sentences

    items, donors = items_and_donors(cfg, corpora["groups"])
    K = largest_k(cfg)
    out = {corpus_key(k): prefix(items, k) for k in sorted(cfg.segments.ks)}
    base = out[corpus_key(K)]
    out[SWAP] = replace_sentences(base, balanced_positions(len(base), K, cfg.study.seed), donors, cfg.study.seed)
    return out


def content_jobs(cfg) -> list[Job]:
    """The caches of the frozen readouts: multi, concat, control at every k; bertsum at the largest."""
    K = largest_k(cfg)
    return ([Job(corpus_key(k), segment_format(kind, k)) for k in sorted(cfg.segments.ks) for kind in EVERY_K]
            + [Job(corpus_key(K), "bertsum")])


def interchange_jobs(cfg) -> list[Job]:
    return [Job(corpus_key(largest_k(cfg)), "multi"), Job(SWAP, "multi")]


# ---------------------------------------------------------------------------------------------------
# Tables


def _probe_options(cfg) -> dict:
    pr = cfg.probes
    return dict(vocab=pr.vocab, n_splits=pr.folds, seed=cfg.study.seed,
                Cs=pr.bow_Cs if pr.bow_Cs is not None else pr.Cs, inner_splits=pr.inner_splits,
                max_iter=pr.max_iter, n_resamples=cfg.study.bootstrap_resamples)


def content_table(ctx: Context) -> pd.DataFrame:
    """``sentence_content``: every (k, format) cache of :func:`content_jobs` this study extracted."""
    from analyses.sentence_content import run_sentence_content

    ctx.log("analyses: each sentence's content words read from k-sentence inputs")
    caches = {}
    for job in content_jobs(ctx.cfg):
        if ctx.caches.has(job.corpus, job.name):
            k = int(job.corpus.rsplit("k", 1)[1])
            kind = "control" if job.name.startswith("control") else job.name
            caches[(k, kind)] = ctx.caches.get(job.corpus, job.name)
    return run_sentence_content(caches, choices={f: CHOICES[f] for _, f in caches}, layer=ctx.cfg.segments.layer,
                                device=ctx.cfg.study.device, out=ctx.out, progress=ctx.progress,
                                **_probe_options(ctx.cfg))


def interchange_table(ctx: Context) -> pd.DataFrame:
    """``interchange``: the largest k's multi [CLS], clean and with one sentence replaced."""
    from analyses.sentence_content import run_interchange

    ctx.log("analyses: interchange (one sentence replaced)")
    opts = _probe_options(ctx.cfg)
    opts.pop("inner_splits")
    clean = ctx.caches.get(corpus_key(largest_k(ctx.cfg)), "multi")
    return run_interchange(clean, ctx.caches.get(SWAP, "multi"), choice="cls", layer=ctx.cfg.segments.layer,
                           out=ctx.out, **opts)


# ---------------------------------------------------------------------------------------------------
# Q3's fine-tuned task


def finetune_kinds(cfg) -> tuple[str, ...]:
    """The formats the intruder task is fine-tuned in: ``[segments] finetune_formats``, and bertsum too in the
    ``full`` fine-tuning preset (a GPU's)."""
    kinds = tuple(cfg.segments.finetune_formats)
    if cfg.finetune.preset == "full" and "bertsum" not in kinds:
        kinds += ("bertsum",)
    return kinds


def protocol_seeds(cfg) -> tuple[int, ...]:
    """The training seeds of Q3's runs: every question's (``[finetune] seeds``)."""
    from ._common import protocol_seeds as shared

    return shared(cfg)


def tasks(cfg, corpora: dict) -> dict:
    """``{"intruder": task}``: the first ``finetune_k`` sentences of each item, one sentence (position 2..k)
    replaced by a donor's (of another topic, or of the item's with ``[segments] intruders = "same_topic"``) in half
    of them (:func:`probing.corpus_replace.intruder_examples`), split once
    (document-grouped, stratified by the label: :func:`analyses.finetune.make_task`)."""
    from analyses.finetune import PROTOCOL_PRESETS, make_task
    from probing.corpus_replace import intruder_examples

    items, donors = items_and_donors(cfg, corpora["groups"])
    examples = intruder_examples(items, cfg.segments.finetune_k, donors, cfg.study.seed,
                                 other=cfg.segments.intruders == "other_topic")
    return {INTRUDER: make_task(examples, "intruded", PROTOCOL_PRESETS[cfg.finetune.preset]["test_fraction"],
                                cfg.study.seed)}


def runs(cfg) -> list:
    """Each format of :func:`finetune_kinds` fine-tuned with [CLS] pooling once per seed of the preset, and a
    frozen probe of the same pooling on the same split beside each."""
    from analyses.finetune import RunSpec

    k = cfg.segments.finetune_k
    out = []
    for kind in finetune_kinds(cfg):
        fmt = segment_format(kind, k)
        out += [RunSpec(INTRUDER, fmt, "cls", None, s) for s in protocol_seeds(cfg)]
        out.append(RunSpec(INTRUDER, fmt, "cls", None, frozen=True))
    return out


def intruder_table(ctx: Context) -> pd.DataFrame:
    """``q3_intruder``: per format, fine-tuned and frozen accuracy on the intruder task's test items (two-stage
    bootstrap over seeds and documents, :func:`analyses.finetune.accuracy`), and multi − each other format,
    paired on the same items (:func:`analyses.finetune.compare_runs`). Empty without the protocol's predictions."""
    from analyses.finetune import accuracy, compare_runs
    from analyses.results import make_table

    P = ctx.tables.get("finetune_predictions")
    if P is None or "task" not in getattr(P, "columns", ()):
        return make_table([])
    P = P[(P["task"] == INTRUDER) & (P["condition"] == "clean")]
    if P.empty:
        return make_table([])
    cfg = ctx.cfg
    k = cfg.segments.finetune_k
    rs = dict(n_resamples=cfg.study.bootstrap_resamples, seed=cfg.study.seed)
    names = {kind: segment_format(kind, k).split("=", 1)[0] for kind in finetune_kinds(cfg)}
    present = {kind: n for kind, n in names.items() if (P["format"] == n).any()}
    common = {"analysis": "intruder", "corpus": cfg.corpus.groups, "k": k, "pooling": "cls",
              "target": "intruded", "grouping": "document", "seed": cfg.study.seed}
    rows = []
    for kind, name in present.items():
        for frozen in (False, True):
            where = {"format": name, "frozen": frozen}
            if not ((P["format"] == name) & (P["frozen"] == frozen)).any():
                continue
            a = accuracy(P, where, **rs)
            rows.append({**common, "format": kind, "frozen": frozen, "metric": "accuracy", "value": a["value"],
                         "ci_low": a["ci_low"], "ci_high": a["ci_high"], "se": a["se"], "n": a["n_items"],
                         "n_seeds": a["n_seeds"], "n_groups": a["n_groups"], "n_resamples": a["n_resamples"]})
    if "multi" in present:
        for kind, name in present.items():
            if kind == "multi":
                continue
            d = compare_runs(P, {"format": name, "frozen": False}, {"format": present["multi"], "frozen": False},
                             **rs)
            rows.append({**common, "format": "multi", "format_b": kind, "frozen": False, "metric": "accuracy_diff",
                         "value": d["value"], "ci_low": d["ci_low"], "ci_high": d["ci_high"], "se": d["se"],
                         "value_a": d["value_b"], "value_b": d["value_a"], "n": d["n_items"],
                         "n_seeds": d["n_seeds"], "n_groups": d["n_groups"], "n_resamples": d["n_resamples"]})
    return make_table(rows)


# ---------------------------------------------------------------------------------------------------
# Reading the tables


def content(T: dict, **where: Any) -> pd.DataFrame:
    """Rows of ``T["sentence_content"]`` matching ``column=value`` (empty when the table is missing)."""
    df = T.get("sentence_content")
    if df is None or df.empty:
        return pd.DataFrame(columns=["k", "position", "format", "choice", "metric", "value"])
    for col, value in where.items():
        df = df[df[col].isin(value if isinstance(value, (list, tuple, set)) else [value])]
    return df


def comparison_rows(df: pd.DataFrame, measure: str, family: str, label: str) -> pd.DataFrame:
    """Comparison rows (:mod:`probing.study.rules`) from ``macro_auc_diff``-like rows: ``measure``, ``family``,
    ``label``, ``value``, ``se``, the facets ``k`` and ``position``, ``n_groups``, ``grouping``, ``n_resamples``."""
    if df.empty:
        return pd.DataFrame(columns=["measure", "family", "label", "value", "se", "k", "position"])
    out = df[[c for c in ("k", "position", "value", "se", "value_a", "value_b", "n", "n_groups", "grouping",
                          "n_resamples") if c in df.columns]].copy()
    out.insert(0, "label", label)
    out.insert(0, "family", family)
    out.insert(0, "measure", measure)
    return out.reset_index(drop=True)


def md_table(df: pd.DataFrame) -> str:
    """``df`` as a markdown table, the report's own way (no ``tabulate`` needed; "" when empty)."""
    from ..report import _md_table

    return _md_table(df) if not df.empty else ""


def describe_format(kind: str) -> str:
    return SEGMENT_FORMATS.get(kind, kind)


def length_only(T: dict, k: int) -> pd.DataFrame:
    return content(T, k=k, choice=LENGTH_ONLY, metric="macro_auc")
