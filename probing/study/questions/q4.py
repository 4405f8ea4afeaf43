"""Q4: what does the output at [SEP] capture?

The old Q4 credited the middle [SEP] with "coherence" because a probe on it told a sentence's true successor
(``is_next = 1``) from a replaced one. But the negatives differ from the positives in ways that need no model: the
two sentences of a true pair share more words, and a sentence encoder that never sees them together already knows
how similar they are. This module measures [SEP] beside those baselines, on the same folds, paired per item
(:mod:`analyses.coherence`):

* **What the middle [SEP] tells.** Logistic-regression probes for ``is_next`` on the middle [SEP] of ``pair``, on
  an ordinary token at the same place (``pair_word``: ``[CLS] {1} ',' <1> {2} [SEP]``, the ',' has the position and
  the segment of the middle [SEP]) and on [CLS], at the middle and the last layer; beside them the baselines: word
  overlap (content-word Jaccard and counts), lengths, and the cosine of the two sentences encoded apart
  (``single`` and ``single2``, mean-pooled last layer). Two corpora: negatives from another article of the same
  topic (``pairs``) and from the same article, at least two sentences away (``pairs_article``: overlap and topic
  cannot give it away).
* **What it holds beyond them.** A regression on the baselines and the [SEP] probe's cross-fitted score against
  the same regression on the baselines alone: the increment in accuracy points.
* **Whether the model uses it.** The fine-tuned ``next`` pair/[CLS] runs of the shared protocol, evaluated clean,
  with attention to every [SEP] knocked out in the middle third of the layers and with a control knockout of as
  many random word keys: accuracy (knockout − control), two-stage bootstrap over seeds and documents.

The [SEP] content-word probes of the old Q4 are not repeated: they are about what [SEP] holds of each sentence,
which Q2/Q5 measure, and the answer does not need them.
"""

from __future__ import annotations

import pandas as pd

from ..answers import Answer
from ..rules import Rule
from ..sections import Context, Job, corpus_text, safe_plot
from ._base import Question

KEY = "Q4"
ASKED = "What does the output at [SEP] capture?"
#: The two corpora and what their negatives are.
CORPORA = {"pairs": "same_topic", "pairs_article": "same_article"}
NEGATIVES = {"same_topic": "a same-topic sentence of another article",
             "same_article": "a sentence of the same article, at least two sentences away"}
#: The ordinary token at the middle [SEP]'s place: a literal ',' (role ``lit``, token choice ``lit1``).
PAIR_WORD = "[CLS] {1} ',' <1> {2} [SEP]"
PROBES, PAIRED, KNOCKOUT = "q4_coherence_probes", "q4_coherence_paired", "q4_knockout"
FORMAT, POOLING = "pair", "cls"
CONDITIONS = ("clean", "sep_knockout", "sep_knockout_control")

_ACC = "accuracy points"
_WHY = "below 2 points practitioners do not change a format or a claim"
RULES = {
    "sep_vs_text": Rule("is_next probe accuracy, the middle [SEP] − word overlap and lengths", _ACC, 0.02, why=_WHY),
    "sep_vs_apart": Rule("is_next probe accuracy, the middle [SEP] − the cosine of the sentences encoded apart", _ACC,
                         0.02, why=_WHY),
    "sep_vs_word": Rule("is_next probe accuracy, the middle [SEP] − an ordinary token (',') at its place", _ACC, 0.02,
                        why=_WHY),
    "sep_vs_cls": Rule("is_next probe accuracy, the middle [SEP] − [CLS]", _ACC, 0.02, why=_WHY),
    "sep_beyond_baselines": Rule("is_next accuracy, baselines with the middle [SEP] − the baselines alone", _ACC, 0.02,
                                 direction=1, why=_WHY),
    "knockout": Rule("fine-tuned accuracy, attention to [SEP] knocked out − a control knockout", _ACC, 0.02,
                     why=_WHY),
}
#: The paired comparison of each measure, in words for the rows' ``label``.
LABELS = {"sep_vs_text": "[SEP] − word overlap and lengths", "sep_vs_apart": "[SEP] − cosine of the sentences apart",
          "sep_vs_word": "[SEP] − ',' at its place", "sep_vs_cls": "[SEP] − [CLS]",
          "sep_beyond_baselines": "baselines + [SEP] − baselines"}


def probe_layers(n_layers: int) -> list[int]:
    """The layers probed: the middle and the last (the layers the knockout straddles and the one people use).

    >>> probe_layers(6), probe_layers(12), probe_layers(1)
    ([3, 6], [6, 12], [1])
    """
    return sorted({max(1, n_layers // 2), n_layers})


def jobs(cfg, corpora: dict) -> list[Job]:
    """``pair``, ``single`` and ``single2`` of both corpora; ``pair_word`` is extracted by :func:`coherence_table`
    (its literal needs role ``lit``, which a study job does not store)."""
    return [Job(corpus, fmt) for corpus in CORPORA for fmt in ("pair", "single", "single2")]


def tasks(cfg, corpora: dict) -> dict:
    from ._common import format_tasks, shared_tasks

    return shared_tasks(cfg, corpora, format_tasks(cfg))


def runs(cfg) -> list:
    """The pair/[CLS] runs of each task of ``[finetune] format_tasks`` (Q1's and Q6's, trained once), evaluated also
    with the knockouts: Q4 adds evaluations, not training."""
    from analyses.finetune import RunSpec

    from ._common import format_tasks

    return [RunSpec(t, FORMAT, POOLING, seed=s, conditions=CONDITIONS) for t in format_tasks(cfg)
            for s in cfg.finetune.seeds]


def _pair_word_cache(ctx: Context, corpus: str):
    from ...cache import Cache
    from ...extract import extract

    cfg = ctx.cfg
    (path,) = extract(ctx.corpora[corpus], [PAIR_WORD], model=ctx.lm, corpus_name=cfg.corpus.specs()[corpus],
                      out=cfg.study.caches, dtype=cfg.extract.dtype, batch_tokens=cfg.extract.batch_tokens,
                      device=cfg.study.device, on_overflow="skip", roles=["cls", "sep", "word", "lit"],
                      log=ctx.log, progress=ctx.progress)
    return Cache.open(path)


def coherence_tables(ctx: Context) -> dict[str, pd.DataFrame]:
    """:func:`analyses.coherence.run_coherence` on both corpora, with a ``negatives`` column."""
    from analyses.coherence import run_coherence
    from analyses.results import make_table

    cfg, p = ctx.cfg, ctx.cfg.probes
    out: dict[str, list] = {PROBES: [], PAIRED: []}
    for corpus, negatives in CORPORA.items():
        ctx.log(f"analyses: Q4 [SEP] against its baselines ({corpus})")
        pair = ctx.caches.get(corpus, "pair")
        T = run_coherence(pair, _pair_word_cache(ctx, corpus), ctx.caches.get(corpus, "single"),
                          ctx.caches.get(corpus, "single2"), layers=probe_layers(max(pair.layers)),
                          n_splits=p.folds, seed=cfg.study.seed, Cs=p.Cs, inner_splits=p.inner_splits,
                          max_iter=p.max_iter, n_resamples=cfg.study.bootstrap_resamples, out=ctx.out)
        for name, df in T.items():
            out[PROBES if name == "coherence_probes" else PAIRED].append(df.assign(negatives=negatives))
    return {name: make_table([r for df in dfs for r in df.to_dict("records")]) for name, dfs in out.items()}


def knockout_table(ctx: Context) -> pd.DataFrame:
    """Per task of ``[finetune] format_tasks``, accuracy of the fine-tuned pair/[CLS] runs under ``condition`` −
    under ``condition_b``, on the same test items (:func:`analyses.finetune.compare_runs`): knockout − clean,
    control − clean, knockout − control; ``learnt``: whether the clean models cleared chance (the lower end of
    their interval above always guessing the commoner answer, ``chance``)."""
    from analyses.results import make_table

    from ._common import format_tasks

    P = ctx.tables.get("finetune_predictions")
    if P is None or P.empty:
        return pd.DataFrame()
    records = []
    for task in format_tasks(ctx.cfg):
        records += _knockout_records(ctx, P, task)
    return make_table(records)


def _knockout_records(ctx: Context, P: pd.DataFrame, task: str) -> list[dict]:
    """:func:`knockout_table`'s rows of one task (none where its runs lack a condition)."""
    from analyses.finetune import accuracy, compare_runs, majority

    base = {"task": task, "format": FORMAT, "pooling": POOLING}
    sel = P[(P["task"] == task) & (P["format"] == FORMAT) & (P["pooling"] == POOLING)
            & (P["frozen"].astype(str).str.lower() == "false") & P["seed"].isin(list(ctx.cfg.finetune.seeds))]
    if "n_train" in sel.columns:
        sel = sel[sel["n_train"].isna()] if sel["n_train"].isna().any() else sel
        if sel["n_train"].notna().any():  # the whole split, not a learning-curve size
            sel = sel[sel["n_train"] == sel["n_train"].max()]
    if not set(CONDITIONS) <= set(sel["condition"].astype(str)):
        return []
    kw = {"n_resamples": ctx.cfg.study.bootstrap_resamples, "seed": ctx.cfg.study.seed}
    floor = majority(sel[sel["condition"] == "clean"], task)["value"]
    learnt = accuracy(sel, {**base, "condition": "clean"}, **kw)["ci_low"] > floor
    records = []
    pairs = (("clean", "sep_knockout"), ("clean", "sep_knockout_control"), ("sep_knockout_control", "sep_knockout"))
    for a, b in pairs:
        r = compare_runs(sel, {**base, "condition": a}, {**base, "condition": b}, **kw)
        records.append({"analysis": "knockout_comparison", "model": getattr(ctx.lm, "name", ""), "chance": floor,
                        "learnt": bool(learnt),
                        "corpus": ctx.cfg.corpus.pairs, "format": FORMAT, "pooling": POOLING, "target": task,
                        "condition": b, "condition_b": a, "metric": "accuracy_diff", "value": r["value"],
                        "ci_low": r["ci_low"], "ci_high": r["ci_high"], "se": r["se"], "value_a": r["value_b"],
                        "value_b": r["value_a"], "n": r["n_items"], "n_seeds": r["n_seeds"],
                        "n_groups": r["n_groups"], "grouping": "document", "n_resamples": r["n_resamples"],
                        "seed": ctx.cfg.study.seed})
    return records


def analyse(ctx: Context) -> dict[str, pd.DataFrame]:
    tables = coherence_tables(ctx)
    return {PROBES: ctx.table(PROBES, lambda c: tables[PROBES]), PAIRED: ctx.table(PAIRED, lambda c: tables[PAIRED]),
            KNOCKOUT: ctx.table(KNOCKOUT, knockout_table)}


# ---------------------------------------------------------------------------------------------------
# Rows, answer, evidence


def rows(T: dict) -> pd.DataFrame:
    """One row per (comparison, negatives, layer) of the paired probes (a family per comparison and corpus, over
    its layers) and the knockout − control row of the fine-tuned runs (its own family)."""
    out = []
    paired = T.get(PAIRED)
    if paired is not None and len(paired):
        for _, r in paired.iterrows():
            out.append({"measure": r["comparison"], "family": f"{r['comparison']} ({r['negatives']})",
                        "label": f"{LABELS[r['comparison']]} (negatives: {r['negatives'].replace('_', '-')})",
                        "layer": int(r["layer"]), "negatives": r["negatives"], "value": float(r["value"]),
                        "se": float(r["se"]), "value_a": float(r["value_a"]), "value_b": float(r["value_b"]),
                        "n_groups": int(r["n_groups"]), "grouping": r["grouping"],
                        "n_resamples": int(r["n_resamples"])})
    ko = T.get(KNOCKOUT)
    if ko is not None and len(ko):
        ko = ko if "target" in ko else ko.assign(target="next")
        for _, r in ko[(ko["condition"] == "sep_knockout") & (ko["condition_b"] == "sep_knockout_control")].iterrows():
            task = str(r["target"])
            out.append({"measure": "knockout", "family": f"knockout ({task})", "task": task,
                        "label": f"fine-tuned on {task}: [SEP] knockout − control", "layer": pd.NA,
                        "negatives": "same_topic", "value": float(r["value"]), "se": float(r["se"]),
                        "value_a": float(r["value_a"]), "value_b": float(r["value_b"]),
                        "n_groups": int(r["n_groups"]), "grouping": "seed x document",
                        "n_resamples": int(r["n_resamples"])})
    return pd.DataFrame(out)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _pts(x: float) -> str:
    return f"{100 * x:+.1f}"


def _row(decided: pd.DataFrame, measure: str, negatives: str = "same_topic", layer: int | None = None):
    if decided is None or len(decided) == 0:
        return None
    sel = decided[(decided["measure"] == measure) & (decided["negatives"] == negatives)]
    if layer is not None:
        sel = sel[sel["layer"] == layer]
    return sel.iloc[0] if len(sel) else None


def answer_layer(decided: pd.DataFrame, negatives: str = "same_topic") -> int | None:
    """The layer the answer reports: where [SEP] adds most beyond the baselines (its family's interval is
    simultaneous over the layers, so picking the largest does not make it look surer than it is)."""
    sel = decided[(decided["measure"] == "sep_beyond_baselines") & (decided["negatives"] == negatives)]
    return int(sel.sort_values("value", ascending=False)["layer"].iloc[0]) if len(sel) else None


def answer(T: dict, decided: pd.DataFrame, cfg) -> Answer:
    from ..answers import not_measured

    layer = answer_layer(decided) if decided is not None and len(decided) else None
    if layer is None:
        return not_measured("the [SEP] probes")
    text_row, beyond = _row(decided, "sep_vs_text", layer=layer), _row(decided, "sep_beyond_baselines", layer=layer)
    apart = _row(decided, "sep_vs_apart", layer=layer)
    sep_acc, text_acc, apart_acc = (float(text_row["value_a"]), float(text_row["value_b"]),
                                    float(apart["value_b"]))
    ci = f"CI {_pts(beyond['ci_low'])} to {_pts(beyond['ci_high'])}"
    if beyond["decision"] in ("yes", "yes_small") and beyond["value"] > 0:
        adds = f"beyond these it adds {_pts(beyond['value'])} points ({ci})"
    elif beyond["decision"] == "no_difference":
        adds = f"beyond these it adds nothing that matters ({_pts(beyond['value'])} points, {ci})"
    else:
        adds = f"whether it adds more is open ({_pts(beyond['value'])} points, {ci})"
    text = (f"At layer {layer}, the middle [SEP] tells a true next sentence from a same-topic one at "
            f"{_pct(sep_acc)}; word overlap and lengths reach {_pct(text_acc)}, the sentences' cosine encoded apart "
            f"{_pct(apart_acc)}; {adds}.")
    text += _knockout_words(T, decided)
    return Answer(text, beyond["confidence"])


def _knockout_words(T: dict, decided: pd.DataFrame) -> str:
    """The knockout's sentence: on the first task whose fine-tuned models learnt it; none where no task was
    learnt (a knockout of a model at chance says nothing about its use of [SEP])."""
    from ._common import TASK_NAMES

    ko = T.get(KNOCKOUT)
    rows_ = decided[decided["measure"] == "knockout"] if decided is not None and len(decided) else None
    if ko is None or not len(ko) or rows_ is None or not len(rows_):
        return ""
    ko = ko if "target" in ko else ko.assign(target="next", learnt=True)
    learnt = [t for t in dict.fromkeys(ko["target"]) if bool(ko[ko["target"] == t]["learnt"].iloc[0])]
    if not learnt:
        names = " or ".join(f"{TASK_NAMES.get(t, t)}" for t in dict.fromkeys(ko["target"]))
        return f" Whether a fine-tuned model uses [SEP] is open: none learnt {names} pairs."
    r = rows_[rows_["task"] == learnt[0]] if "task" in rows_ else rows_
    if not len(r) or r.iloc[0]["decision"] == "not_measured":
        return ""
    r = r.iloc[0]
    return (f" Knocking out attention to [SEP] moves fine-tuned {TASK_NAMES.get(learnt[0], learnt[0])} accuracy "
            f"{_pts(float(r['value']))} points against a control (CI {_pts(r['ci_low'])} to {_pts(r['ci_high'])}).")


def _probe_table(T: dict, layer: int) -> str:
    P = T[PROBES]
    order = [("text", "word overlap + lengths"), ("overlap", "word overlap"), ("lengths", "lengths"),
             ("apart", "cosine of the sentences encoded apart"), ("baselines", "all baselines"),
             ("lit1", "',' at [SEP]'s place"), ("cls", "[CLS]"), ("sep1", "the middle [SEP]"),
             ("baselines+sep1 (stacked)", "all baselines + [SEP]'s score")]
    lines = ["| features | " + " | ".join(f"{NEGATIVES[n]}" for n in CORPORA.values()) + " |",
             "|---|" + "---:|" * len(CORPORA)]
    for feat, words in order:
        cells = []
        for negatives in CORPORA.values():
            sel = P[(P["features"] == feat) & (P["negatives"] == negatives)]
            if feat in ("lit1", "cls", "sep1", "baselines+sep1 (stacked)"):
                sel = sel[sel["layer"] == layer]
            cells.append(f"{_pct(sel['value'].iloc[0])} ({_pct(sel['ci_low'].iloc[0])}–{_pct(sel['ci_high'].iloc[0])})"
                         if len(sel) else "–")
        lines.append(f"| {words} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def evidence(T: dict, decided: pd.DataFrame, cfg) -> str:
    layer = answer_layer(decided)
    if layer is None:
        return "The [SEP] probes were not run."
    maj = T[PROBES].groupby("negatives")["majority_baseline"].first()
    parts = [f"Accuracy of each is_next probe at layer {layer} (out-of-fold, 95% CI over documents; the majority "
             f"class scores {', '.join(f'{_pct(v)} ({k})' for k, v in maj.items())}):", "", _probe_table(T, layer), ""]
    for negatives in CORPORA.values():
        r = _row(decided, "sep_vs_word", negatives, layer)
        c = _row(decided, "sep_vs_cls", negatives, layer)
        if r is not None and c is not None:
            parts.append(f"- Negatives {NEGATIVES[negatives]}: [SEP] − the ',' at its place {_pts(r['value'])} points "
                         f"({r['verdict']}); [SEP] − [CLS] {_pts(c['value'])} points ({c['verdict']}).")
    ko = T.get(KNOCKOUT)
    if ko is not None and len(ko):
        ko = ko if "target" in ko else ko.assign(target="next")
        for task, g in ko.groupby("target", sort=False):
            acc = g[g["condition_b"] == "clean"].set_index("condition")
            clean = float(acc["value_b"].iloc[0])
            floor = (f"; always guessing the commoner answer {_pct(float(g['chance'].iloc[0]))}"
                     if "chance" in g else "")
            parts.append(f"- Fine-tuned `{task}` (pair, [CLS] pooling, {int(acc['n_seeds'].iloc[0])} seed(s), "
                         f"{int(acc['n'].iloc[0])} test items): {_pct(clean)} clean, "
                         f"{_pct(acc.loc['sep_knockout', 'value_a'])} with attention to [SEP] knocked out in the "
                         f"middle layers, {_pct(acc.loc['sep_knockout_control', 'value_a'])} with the control "
                         f"knockout{floor}.")
    else:
        parts.append("- The fine-tuned runs were not made in this study, so the knockout is not measured.")
    return "\n".join(parts)


def figures(T: dict, fig_dir, log) -> list:
    return safe_plot(plot_probes, T[PROBES], fig_dir / "q4_coherence", log=log)


def plot_probes(P: pd.DataFrame, path):
    """Accuracy of the token probes per layer, one panel per corpus, the baselines as horizontal lines."""
    import matplotlib.pyplot as plt

    from figures.style import save

    fig, axes = plt.subplots(1, len(CORPORA), figsize=(4.2 * len(CORPORA), 3.2), sharey=True, squeeze=False)
    for ax, negatives in zip(axes[0], CORPORA.values()):
        sub = P[P["negatives"] == negatives]
        for feat, name in (("sep1", "[SEP]"), ("lit1", "',' at its place"), ("cls", "[CLS]")):
            s = sub[sub["features"] == feat].sort_values("layer")
            ax.errorbar(s["layer"].astype(int), s["value"], yerr=[s["value"] - s["ci_low"], s["ci_high"] - s["value"]],
                        marker="o", capsize=3, label=name)
        for feat, name, style in (("text", "overlap + lengths", ":"), ("baselines", "all baselines", "--")):
            s = sub[sub["features"] == feat]
            if len(s):
                ax.axhline(float(s["value"].iloc[0]), color="grey", linestyle=style, label=name)
        ax.set_xticks(sorted(int(x) for x in sub["layer"].dropna().unique()))
        ax.set_title(f"negatives: {negatives.replace('_', '-')}", fontsize=9)
        ax.set_xlabel("layer")
    axes[0][0].set_ylabel("is_next accuracy")
    axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8, frameon=False)
    fig.suptitle("Q4: what the middle [SEP] tells about the next sentence, beside baselines", fontsize=10)
    return save(fig, path)


def notes(cfg) -> str:
    c, p = cfg.corpus, cfg.probes
    return (f"Two corpora of sentence pairs: {corpus_text(c.pairs)} (negatives: {NEGATIVES['same_topic']}) and "
            f"{corpus_text(c.pairs_article)} (negatives: {NEGATIVES['same_article']}); no sentence belongs to two "
            f"documents. Every probe is a logistic regression on the same {p.folds} document-grouped, label-"
            f"stratified folds (C from {list(p.Cs)} by {p.inner_splits}-fold inner CV), at the middle and the last "
            f"layer; comparisons are paired per item, with cluster-bootstrap SEs over documents "
            f"({cfg.study.bootstrap_resamples} resamples). The increment beyond the baselines stacks the [SEP] "
            f"probe's cross-fitted score onto word overlap, lengths and the cosine of the two sentences encoded apart "
            f"(mean-pooled last layer). A probe is a lower bound: [SEP] may hold more than a linear readout finds. "
            f"The knockout evaluates the fine-tuned pair/[CLS] runs of each task of `[finetune] format_tasks` (seeds "
            f"{', '.join(map(str, cfg.finetune.seeds))}) with no token attending to any [SEP] in the middle third of "
            f"the layers, against as many random word keys knocked out; it shows whether the fine-tuned model routes "
            f"through [SEP], not what pretraining put there.")


QUESTION = Question(
    key=KEY, asked=ASKED, title="What the output at [SEP] captures", corpora=tuple(CORPORA), jobs=jobs,
    analyse=analyse, rules=RULES, rows=rows, answer=answer, evidence=evidence, figures=figures, notes=notes,
    tasks=tasks, runs=runs, tables=(PROBES, PAIRED, KNOCKOUT), about_cls=True)
