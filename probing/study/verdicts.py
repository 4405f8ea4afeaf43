"""Verdicts: the one sentence that opens each report section, computed from comparison rows by rules
declared here once.

A **comparison row** is one tested difference (condition B − condition A, or a score − its baseline)
with the columns ``value``, ``ci_low``, ``ci_high`` (95%), and where known ``p_holm`` (p-value after
Holm's correction over its family), ``p_value``, ``mde`` (minimum detectable effect at this sample
size), ``n``, ``n_groups`` (the clusters the CI resampled), ``grouping`` (``document`` or
``example``) and a facet column such as ``layer``. Rows from the analyses carry these columns; where
a table does not have them yet, :func:`difference_rows` derives provisional rows from two marginal
intervals.

Decision rules (:func:`decide`), with the practical-significance threshold
:data:`PRACTICAL_THRESHOLD` = 0.03 (three points on the 0-1 scales every compared quantity here
lives on: accuracy, micro-F1, macro AUC, 1 − cos, attention share) and α = :data:`ALPHA` = 0.05:

============================================  ===========================================================
the row                                       verdict
============================================  ===========================================================
significant and ``|value| >= threshold``      ``yes``: "Yes: …"
significant and ``|value| < threshold``       ``yes_small``: "Yes, but small: …"
not significant, ``mde <= threshold`` and    ``no_difference``: "No measurable difference (…; this
the CI inside ``(-threshold, threshold)``     sample could detect >= mde, and its CI stays within ±threshold)"
not significant and ``mde > threshold``       ``inconclusive``: "Inconclusive: this sample could only
                                              detect >= mde"
not significant, the CI reaching ±threshold   ``inconclusive``: "Inconclusive: the 95% CI reaches …, beyond
                                              the practical threshold"
============================================  ===========================================================

"No measurable difference" is a claim that any difference is below the threshold, so it needs both the
power (the sample could have detected the threshold) and the interval (a difference of the threshold or
more is outside the 95% CI: an equivalence test by two one-sided tests at 2.5% each, Lakens 2017,
Soc. Psychol. Personal. Sci. 8(4)). A row with adequate power whose CI still reaches past the threshold
(say +0.007 to +0.046 with Holm p = 0.06) leaves a practically relevant difference open: inconclusive.
"No measurable difference at any layer" asks every layer's interval to pass, each at its own 95%: an
intersection-union test, which keeps its level without a correction over the layers (Berger 1982,
Technometrics 24(4)), whereas "a difference at some layer" is a union of tests and needs Holm's.

*Significant* means the 95% CI excludes 0 **and**, when the row has ``p_holm`` (else ``p_value``),
that p-value is below α: the multiple-comparison policy is Holm's step-down correction over the rows
of one comparison (all layers of it), applied by :func:`add_holm` where the analysis did not. A row
without ``mde`` gets the normal-approximation value from its own CI (:func:`mde_from_ci`: 80% power,
two-sided α = 0.05, ``mde = (z_0.975 + z_0.8) × SE`` with ``SE`` = CI half-width / 1.96).

Across a facet (layers, sentence positions, k): :func:`summarise` decides each row; when some but not
all rows are significant in the direction of the strongest one the verdict is "Only in layers a–b: …",
quoting the strongest row (and naming the layers significant in the opposite direction, if any);
when all are, the strongest row decides between "Yes" and "Yes, but small"; when none are, it is
"No measurable difference" if every row is, else "Inconclusive", quoting the least powerful
inconclusive row and, when other rows do rule the threshold out, naming them: "Inconclusive at
layers 1–4 (no measurable difference at layers 5–6): …".
A one-sided question (``Claim.direction = +1``: "is it above?") whose significant rows all go the
other way is answered "No" ("No, in any layer: …" when every layer does). A row whose CI excludes 0
but whose Holm-adjusted p does not pass says so in its sentence. Comparison rows derived from
marginal intervals say "unpaired (provisional)" in the sentence.

Intervals are printed by :func:`analyses.stats.format_interval` with as many decimals as it takes for
the bounds and the value to differ (at least 3), so an interval never collapses to a point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Literal

import numpy as np
import pandas as pd
from scipy import stats

from analyses.stats import format_interval, holm, minimum_detectable_effect, wald_p_value  # noqa: F401 (format_interval: re-exported)

#: Smallest difference that matters in practice, on 0-1 scales (accuracy, F1, macro AUC, 1 − cos, attention share).
PRACTICAL_THRESHOLD = 0.03
#: Significance level of every test (two-sided), and 1 − the CI level.
ALPHA = 0.05
#: Power at which the minimum detectable effect is computed.
POWER = 0.8

Decision = Literal["yes", "yes_small", "no_difference", "inconclusive", "not_measured"]
#: The opening words of each decision: the one declaration used by the sentences below.
LABELS: dict[str, str] = {
    "yes": "Yes",
    "yes_small": "Yes, but small",
    "no_difference": "No measurable difference",
    "inconclusive": "Inconclusive",
    "not_measured": "Not measured",
}
#: Columns a comparison row must have; the others are optional.
REQUIRED = ("value", "ci_low", "ci_high")


# ---------------------------------------------------------------------------------------------------
# Numbers on the page


def ranges(values: Iterable) -> str:
    """Integers as runs: ``[2, 3, 4, 6]`` -> ``'2–4, 6'``; names (a facet such as the pooling) as a
    list in their order.

    >>> ranges([6, 2, 3, 4])
    '2–4, 6'
    >>> ranges(["max", "first_word"])
    'max, first_word'
    """
    values = list(values)
    try:
        v = sorted(set(int(x) for x in values))
    except (TypeError, ValueError):
        return ", ".join(dict.fromkeys(str(x) for x in values))
    runs: list[list[int]] = []
    for x in v:
        if runs and x == runs[-1][-1] + 1:
            runs[-1].append(x)
        else:
            runs.append([x])
    return ", ".join(f"{r[0]}–{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs)


# ---------------------------------------------------------------------------------------------------
# Rows


def mde_from_ci(ci_low: float, ci_high: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """Minimum detectable effect of a difference whose (1 − alpha) CI is ``[ci_low, ci_high]``:
    :func:`analyses.stats.minimum_detectable_effect` at ``SE`` = half-width / z_{1−α/2} (normal
    approximation).

    >>> round(mde_from_ci(-0.01, 0.01), 4)
    0.0143
    """
    se = (ci_high - ci_low) / 2 / stats.norm.ppf(1 - alpha / 2)
    return minimum_detectable_effect(se, alpha, power)


def add_holm(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with ``p_holm`` filled where missing: Holm's step-down correction of ``p_value`` over
    all rows (one comparison's family; :func:`analyses.stats.holm`)."""
    rows = rows.copy()
    if "p_value" not in rows.columns:
        return rows
    if "p_holm" in rows.columns and rows["p_holm"].notna().all():
        return rows
    adjusted = holm(pd.to_numeric(rows["p_value"], errors="coerce").to_numpy(dtype=float))
    rows["p_holm"] = rows["p_holm"].where(rows["p_holm"].notna(), adjusted) if "p_holm" in rows.columns else adjusted
    return rows


def difference_rows(a: pd.DataFrame, b: pd.DataFrame | None = None, on: str = "layer") -> pd.DataFrame:
    """PROVISIONAL comparison rows ``a − b`` (or ``a`` − 0 when ``b`` is None) from two tables of
    marginal values with 95% CIs, matched on the facet column ``on``.

    The two estimates are treated as independent: SE = sqrt(SE_a² + SE_b²) from the CI half-widths,
    a normal-approximation p-value, Holm over the rows. For paired items with a positive correlation
    this overstates the SE (a conservative test); the paired cluster-bootstrap rows of the analyses
    replace these where they exist, so such rows are marked ``provisional``. ``b`` may carry no CI (a
    baseline constant): then SE = SE_a and the row is a one-sample test, not marked provisional; it keeps
    ``a``'s ``n_groups`` and ``grouping`` (the clusters its CI resampled) where ``a`` has them.
    Returns columns ``on``, value, ci_low, ci_high, p_value, p_holm, mde, n, provisional (and
    n_groups, grouping).
    """
    z = stats.norm.ppf(1 - ALPHA / 2)

    def prep(t: pd.DataFrame, suffix: str) -> pd.DataFrame:
        t = t[[on, "value", "ci_low", "ci_high"] + [c for c in ("n", "n_groups", "grouping") if c in t.columns]]
        t = t.drop_duplicates(on)
        t = t.assign(se=(pd.to_numeric(t["ci_high"]) - pd.to_numeric(t["ci_low"])) / (2 * z))
        t["se"] = t["se"].fillna(0.0)
        return t.rename(columns={c: f"{c}{suffix}" for c in t.columns if c != on})

    m = prep(a, "_a")
    if b is not None:
        m = m.merge(prep(b, "_b"), on=on)
    else:
        m["value_b"], m["se_b"] = 0.0, 0.0
    value = m["value_a"].to_numpy(float) - m["value_b"].to_numpy(float)
    se = np.sqrt(m["se_a"].to_numpy(float) ** 2 + m["se_b"].to_numpy(float) ** 2)
    p = wald_p_value(value, se)
    provisional = bool(b is not None and (m["se_b"] > 0).any())
    out = pd.DataFrame({on: m[on].to_numpy(), "value": value, "ci_low": value - z * se, "ci_high": value + z * se,
                        "p_value": p, "mde": (z + stats.norm.ppf(POWER)) * se,
                        "n": m["n_a"].to_numpy() if "n_a" in m.columns else np.nan, "provisional": provisional})
    if not provisional:  # one sample: a's CI alone, over a's clusters
        for c in ("n_groups", "grouping"):
            if f"{c}_a" in m.columns:
                out[c] = m[f"{c}_a"].to_numpy()
    return add_holm(out)


def _num(row, key: str) -> float:
    v = row.get(key, np.nan) if hasattr(row, "get") else getattr(row, key, np.nan)
    return float("nan") if v is None or pd.isna(v) else float(v)


def significant(row) -> bool:
    """The CI excludes 0 and, where the row has one, its Holm p-value (else p-value) is below α."""
    lo, hi = _num(row, "ci_low"), _num(row, "ci_high")
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo <= 0 <= hi:
        return False
    p = _num(row, "p_holm")
    if not math.isfinite(p):
        p = _num(row, "p_value")
    return not math.isfinite(p) or p < ALPHA


def row_mde(row) -> float:
    """The row's ``mde``, or :func:`mde_from_ci` of its CI where it has none."""
    mde = _num(row, "mde")
    if math.isfinite(mde):
        return mde
    lo, hi = _num(row, "ci_low"), _num(row, "ci_high")
    return mde_from_ci(lo, hi) if math.isfinite(lo) and math.isfinite(hi) else float("nan")


def within_threshold(row, threshold: float = PRACTICAL_THRESHOLD) -> bool:
    """The row's 95% CI lies strictly inside ``(-threshold, threshold)``: a difference of the threshold
    or more, either way, is ruled out (equivalence by two one-sided tests at 2.5% each)."""
    lo, hi = _num(row, "ci_low"), _num(row, "ci_high")
    return math.isfinite(lo) and math.isfinite(hi) and -threshold < lo and hi < threshold


def decide(row, threshold: float = PRACTICAL_THRESHOLD) -> Decision:
    """The decision for one comparison row (the rules of the module docstring)."""
    if not math.isfinite(_num(row, "value")):
        return "not_measured"
    if significant(row):
        return "yes" if abs(_num(row, "value")) >= threshold else "yes_small"
    mde = row_mde(row)
    powered = math.isfinite(mde) and mde <= threshold
    return "no_difference" if powered and within_threshold(row, threshold) else "inconclusive"


# ---------------------------------------------------------------------------------------------------
# Sentences


@dataclass(frozen=True)
class Claim:
    """What a comparison row measures, in words.

    ``more`` / ``less``: the finding when the difference is positive / negative, e.g. "[CLS] changes
    more than the words"; ``none``: the null finding, e.g. "[CLS] and the words change alike";
    ``quantity``: what ``value`` is ("difference in 1 − cos"); ``facet``: the column that tells rows
    apart and its plural name (``("layer", "layers")``); ``threshold``: the practical threshold;
    ``direction``: +1 when the question asks whether the difference is positive (the verdict then leads
    with the positive rows where there are any), 0 when either direction answers it.
    """

    more: str
    less: str
    none: str
    quantity: str = "difference"
    facet: tuple[str, str] = ("layer", "layers")
    threshold: float = PRACTICAL_THRESHOLD
    direction: int = 0


@dataclass(frozen=True)
class Verdict:
    """A decision, its sentence with the numbers behind it, the row that sets the wording, and ``short``: the
    sentence without its numbers, for the report's answers at a glance ("" where there is none)."""

    decision: Decision
    sentence: str
    row: dict | None = None
    short: str = ""


def format_p(p: float) -> str:
    """``p = 0.012``, ``p < 0.001``.

    >>> format_p(3e-15), format_p(0.0123)
    ('p < 0.001', 'p = 0.012')
    """
    cell = format_p_cell(p)
    return f"p {cell}" if cell.startswith("<") else f"p = {cell}"


def format_p_cell(p: float) -> str:
    """A p-value in a report table: ``< 0.001``, two significant digits, or ``–`` when there is none
    (three decimals would print 0.00065 as 0.001).

    >>> format_p_cell(0.00065), format_p_cell(0.0523), format_p_cell(float("nan"))
    ('< 0.001', '0.052', '–')
    """
    if p is None or not math.isfinite(p):
        return "–"
    return "< 0.001" if p < 0.001 else f"{p:.2g}"


def _small(x: float) -> str:
    """A detectable effect on the page: three decimals, or two significant digits below 0.01 (so a
    drift difference's 0.0003 does not print as 0.000)."""
    return f"{x:.3f}" if abs(x) >= 0.01 else f"{x:.2g}"


def _evidence(row, claim: Claim, where: str = "") -> str:
    t = claim.threshold
    iv = format_interval(_num(row, "value"), _num(row, "ci_low"), _num(row, "ci_high"), signed=True,
                         distinct_from=(t, -t))
    s = f"{claim.quantity}{where}: {iv}"
    p = _num(row, "p_holm")
    if math.isfinite(p):
        s += f", Holm-adjusted {format_p(p)}"
    prov = row.get("provisional", False) if hasattr(row, "get") else False
    if prov is not None and not pd.isna(prov) and bool(prov):
        s += ", unpaired (provisional)"
    g = _num(row, "n_groups")
    if math.isfinite(g):
        grouping = row.get("grouping") if hasattr(row, "get") else None
        s += f", {int(g)} {grouping or 'group'}s"
    return s


def sentence(row, claim: Claim, decision: Decision | None = None, where: str = "", label: str | None = None) -> str:
    """The verdict sentence of one row: label (default :data:`LABELS` of the decision), finding,
    evidence in parentheses; ``where`` names the row ("at layer 4")."""
    decision = decision or decide(row, claim.threshold)
    label = label or LABELS[decision]
    if decision == "not_measured":
        return f"{label}."
    ev = _evidence(row, claim, where)
    mde = row_mde(row)
    if decision in ("yes", "yes_small"):
        small = f"; below the practical threshold of {claim.threshold:g}" if decision == "yes_small" else ""
        return f"{headline(claim, decision, label, _num(row, 'value'))} ({ev}{small})."
    lo, hi = _num(row, "ci_low"), _num(row, "ci_high")
    if lo > 0 or hi < 0:  # the CI is per comparison; the decision also asks the Holm-adjusted p
        ev += "; the CI excludes 0, but not after Holm's correction across the family"
    t = claim.threshold
    if decision == "no_difference":
        return (f"{headline(claim, decision, label)} ({ev}; this sample could detect >= {_small(mde)}, and its CI "
                f"stays within ±{t:g}).")
    if math.isfinite(mde) and mde <= t:  # powered, but the interval leaves a relevant difference open
        bound = hi if abs(hi) >= abs(lo) else lo
        return (f"{label}: the 95% CI reaches {bound:+.3f}, beyond the practical threshold of {t:g}, though this "
                f"sample could detect >= {_small(mde)} ({ev}).")
    return (f"{label}: this sample could only detect >= {_small(mde)}, above the practical threshold of "
            f"{t:g} ({ev}).")


def headline(claim: Claim, decision: Decision, label: str | None = None, value: float = float("nan")) -> str:
    """:func:`sentence` without its evidence: the label and the finding, or, where nothing is decided, what
    was compared (an inconclusive row's own sentence names only the sample's power)."""
    label = label or LABELS[decision]
    if decision == "not_measured":
        return label
    if decision in ("yes", "yes_small"):
        return f"{label}: {claim.more if value > 0 else claim.less}"
    if decision == "no_difference":
        return f"{label}: {claim.none}"
    return f"{label}, on {claim.quantity}"


def summarise(rows: pd.DataFrame | None, claim: Claim) -> Verdict:
    """One verdict over the rows of one comparison, one row per facet value (e.g. per layer).

    Rows without ``p_holm`` get it from :func:`add_holm`. See the module docstring for the rules.
    """
    if rows is None or len(rows) == 0 or not set(REQUIRED) <= set(rows.columns):
        return Verdict("not_measured", f"{LABELS['not_measured']}.", short=LABELS["not_measured"])
    rows = add_holm(rows.reset_index(drop=True))
    col, plural = claim.facet
    decisions = [decide(r, claim.threshold) for _, r in rows.iterrows()]
    sig = [i for i, d in enumerate(decisions) if d in ("yes", "yes_small")]
    measured = [i for i, d in enumerate(decisions) if d != "not_measured"]
    if not measured:
        return Verdict("not_measured", f"{LABELS['not_measured']}.", short=LABELS["not_measured"])
    multi = len(measured) > 1 and col in rows.columns

    def where(i: int) -> str:
        return f" at {col} {rows.loc[i, col]}" if col in rows.columns else ""

    def at(idx: list[int]) -> str:
        return f"{plural if len(idx) > 1 else col} {ranges(rows.loc[idx, col])}"

    if sig:
        lead = [i for i in sig if np.sign(rows.loc[i, "value"]) == claim.direction] if claim.direction else []
        best = max(lead or sig, key=lambda i: abs(float(rows.loc[i, "value"])))
        row = rows.loc[best]
        decision = decide(row, claim.threshold)
        label = None
        same = [i for i in sig if np.sign(rows.loc[i, "value"]) == np.sign(row["value"])]
        opposite = [i for i in sig if i not in same]

        # the rows without a significant difference, named by what they can say: a reader must not take
        # an underpowered row for an absent effect
        rest = [f"{LABELS[d].lower()} at {at(idx)}" for d in ("no_difference", "inconclusive")
                if (idx := [i for i in measured if decisions[i] == d])] if multi else []
        # the strongest row sets the wording; the rows of its direction that are significant but under the
        # practical threshold are named, so that "in every layer" does not stand for layers it barely reaches
        small = [i for i in same if decisions[i] == "yes_small"] if multi and decision == "yes" else []
        below = [f"below the practical threshold at {at(small)}"] if small else []
        if claim.direction and not lead:  # a one-sided question, answered the other way: no
            label = "No"
            if multi:
                label += (f", in any {col}" if len(same) == len(measured) else
                          f" ({'; '.join([f'the opposite at {at(same)}'] + rest)})")
        elif multi and len(same) < len(measured):
            label = f"Only in {at(same)}"
            parts = below + ([f"the opposite at {at(opposite)}"] if opposite else []) + rest
            if parts:
                label += f" ({'; '.join(parts)})"
            label += ", and small" if decision == "yes_small" else ""
        elif multi:
            label = f"{LABELS[decision]}, in every {col}" + (f" ({below[0]})" if below else "")
        return Verdict(decision, sentence(row, claim, decision, where(best), label), row.to_dict(),
                       headline(claim, decision, label, _num(row, "value")))
    # no significant row: the verdict is as weak as its weakest row (an inconclusive one where there is
    # one, the least powerful of those)
    weak = [i for i in measured if decisions[i] == "inconclusive"] or measured
    mdes = np.array([row_mde(rows.loc[i]) for i in weak])
    worst = weak[int(np.nanargmax(mdes))] if np.isfinite(mdes).any() else weak[0]
    row = rows.loc[worst]
    decision = decide(row, claim.threshold)
    label = f"{LABELS[decision]} at any {col}" if multi and decision == "no_difference" else None
    settled = [i for i in measured if decisions[i] == "no_difference"]
    if multi and decision == "inconclusive" and settled:  # mixed: say where the sample does rule 0.03 out
        label = (f"{LABELS['inconclusive']} at {at(weak)} "
                 f"({LABELS['no_difference'].lower()} at {at(settled)})")
    return Verdict(decision, sentence(row, claim, decision, where(worst), label), row.to_dict(),
                   headline(claim, decision, label, _num(row, "value")))


def verdict_table(rows: pd.DataFrame, claim: Claim) -> pd.DataFrame:
    """The comparison rows as the report prints them, one per facet value: the difference with its CI
    (:func:`format_interval`), Holm-adjusted p, mde, n_groups and grouping where present, and the
    decision of each row by itself (:func:`row_label`)."""
    rows = add_holm(rows.reset_index(drop=True))
    out = pd.DataFrame({claim.facet[0]: rows[claim.facet[0]]} if claim.facet[0] in rows.columns else {})
    out["difference (95% CI)"] = [format_interval(_num(r, "value"), _num(r, "ci_low"), _num(r, "ci_high"), signed=True)
                                  for _, r in rows.iterrows()]
    out["p (Holm)"] = [format_p_cell(_num(r, "p_holm")) for _, r in rows.iterrows()]
    out["mde"] = [_small(m) if math.isfinite(m) else "–" for m in (row_mde(r) for _, r in rows.iterrows())]
    for c in ("n_groups", "grouping"):
        if c in rows.columns:
            out[c] = rows[c].to_numpy()
    out["decision"] = [row_label(r, claim) for _, r in rows.iterrows()]
    return out


def row_label(row, claim: Claim) -> str:
    """One row's decision as the report's tables print it: :data:`LABELS`, except that in a one-sided question
    (``claim.direction``) a difference in the other direction is a "No" (as the verdict sentence says it), not
    a "Yes" that a reader would take for the asked direction."""
    decision = decide(row, claim.threshold)
    if claim.direction and decision in ("yes", "yes_small") and np.sign(_num(row, "value")) == -claim.direction:
        return "No (the opposite)" if decision == "yes" else "No (the opposite, small)"
    return LABELS[decision]


def describe_rules(threshold: float = PRACTICAL_THRESHOLD) -> str:
    """The decision rules in one paragraph, for the report's introduction."""
    return (f"Each section opens with a verdict computed from its comparison rows: a difference counts when its "
            f"95% CI excludes 0 and its Holm-adjusted p-value (over the layers of that comparison) is below "
            f"{ALPHA:g}; it is '{LABELS['yes']}' when |difference| >= {threshold:g} (the practical threshold, on "
            f"0–1 scales) and '{LABELS['yes_small']}' below it. Without a significant difference the verdict is "
            f"'{LABELS['no_difference']}' when the sample could have detected {threshold:g} (minimum detectable "
            f"effect at 80% power) and the 95% CI lies within ±{threshold:g} (a difference of {threshold:g} is ruled "
            f"out), and '{LABELS['inconclusive']}' when either fails. When only some layers differ it says 'Only in "
            f"layers a–b' and what the other layers show; when none differs but only some rule the threshold out, "
            f"'{LABELS['inconclusive']} at layers a–b ({LABELS['no_difference'].lower()} at layers c–d)'. The "
            f"largest difference sets the wording; layers where the same difference is significant but below the "
            f"threshold are named ('Yes, in every layer (below the practical threshold at layer c)').")
