"""Decision rules: how a family of comparison rows becomes decisions a reader can trust.

A **comparison row** is one tested quantity: ``value`` (a difference B − A, or a score − its baseline),
``se`` (its bootstrap standard error: over documents, and over training seeds where a fine-tuned model
is on either side), ``measure`` (the key of the :class:`Rule` that judges it) and ``family`` (the rows
corrected together: one comparison over its layers, poolings or positions).

One correction gives both the interval and the p-value of a row, so they can never disagree: within a
family of ``m`` rows, at level α = :data:`ALPHA`,

* the interval is simultaneous (Bonferroni): ``value ∓ z(1 − α / 2m) · se``;
* the p-value is Bonferroni-adjusted from the same normal approximation:
  ``p_adj = min(1, m · 2 (1 − Φ(|value| / se)))``;

so ``p_adj < α`` exactly when the interval excludes 0. (Holm's step-down is more powerful for the
p-values alone, but has no interval that agrees with it row by row; with families of at most a few
layers or poolings the difference is small, and an interval and a p-value that say the same thing
are worth more to a reader.)

Each measure declares its own practical threshold, in its own unit (:class:`Rule`): accuracy points,
AUC points, the share of the distance to another input. A row is then

==========================================  ===================  =========================================
the row                                     ``decision``         read as
==========================================  ===================  =========================================
significant, ``|value| >= threshold``       ``yes``              a difference that matters
significant, ``|value| < threshold``        ``yes_small``        a real difference, below what matters
not significant, CI inside ±threshold       ``no_difference``    any difference is below what matters
not significant, CI reaching ±threshold     ``inconclusive``     this sample cannot tell
==========================================  ===================  =========================================

"No difference" is an equivalence test (two one-sided tests, Lakens 2017, Soc. Psychol. Personal. Sci.
8(4)), at the same simultaneous level as the interval. The **confidence** word a plain answer carries
(:func:`confidence`) says how far the interval is from changing the decision: ``high`` when the whole
interval lies on one side of the threshold band (beyond it for a difference, inside it for none),
``moderate`` when the decision holds but the interval reaches into or across the threshold, ``low``
when the answer is inconclusive.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
from scipy import stats

#: Significance level of every family (two-sided), and 1 − the simultaneous interval's level.
ALPHA = 0.05
#: Power at which the minimum detectable effect is stated.
POWER = 0.8

Decision = Literal["yes", "yes_small", "no_difference", "inconclusive", "not_measured"]
Confidence = Literal["high", "moderate", "low"]
#: The confidence levels from the weakest to the strongest.
LEVELS: tuple[Confidence, ...] = ("low", "moderate", "high")


def weakest(levels) -> Confidence:
    """The weakest of some confidence levels: an answer built from several findings is as sure as its least sure.

    >>> weakest(["high", "low", "moderate"])
    'low'
    """
    return min(levels, key=LEVELS.index)
#: The opening words of each decision, the one declaration every table and sentence uses.
LABELS: dict[str, str] = {
    "yes": "Yes",
    "yes_small": "Yes, but small",
    "no_difference": "No difference that matters",
    "inconclusive": "Cannot tell",
    "not_measured": "Not measured",
}
#: Columns every comparison row has.
ROW_COLUMNS = ("measure", "family", "value", "se")


@dataclass(frozen=True)
class Rule:
    """How one measure is judged.

    ``measure``: what the value is, in words ("fine-tuned accuracy, concat − pair"); ``unit``: the unit
    the threshold and the value are printed in ("accuracy points"); ``threshold``: the smallest difference
    that matters, on the value's own scale (0.02 for 2 accuracy points); ``scale``: value × scale is the
    number in ``unit`` (100 for points and percent, 1 for a ratio); ``direction``: 0 when either sign
    answers the question, +1 when it asks "is it above?"; ``why``: one sentence on the threshold.

    >>> Rule("accuracy", "accuracy points", 0.02).show(0.0234)
    '2.3 accuracy points'
    """

    measure: str
    unit: str
    threshold: float
    scale: float = 100.0
    direction: int = 0
    why: str = ""

    def __post_init__(self) -> None:
        if not (self.threshold > 0 and math.isfinite(self.threshold)):
            raise ValueError(f"Rule {self.measure!r}: threshold must be a positive number, got {self.threshold!r}")
        if self.direction not in (-1, 0, 1):
            raise ValueError(f"Rule {self.measure!r}: direction must be -1, 0 or +1, got {self.direction!r}")

    def number(self, value: float, signed: bool = False, digits: int | None = None) -> str:
        """``value`` in the rule's unit, without the unit: ``'2.3'``, ``'+2.3'``."""
        x = float(value) * self.scale
        if digits is None:
            digits = 1 if abs(x) >= 1 or x == 0 else 2
        return f"{x:+.{digits}f}" if signed else f"{x:.{digits}f}"

    def show(self, value: float, signed: bool = False) -> str:
        """``value`` with its unit: ``'2.3 accuracy points'``."""
        return f"{self.number(value, signed)} {self.unit}"

    def interval(self, low: float, high: float) -> str:
        """An interval in the rule's unit: ``'−1.2 to +3.4 accuracy points'``."""
        return f"{self.number(low, True)} to {self.number(high, True)} {self.unit}"


def _z(alpha: float, m: int) -> float:
    return float(stats.norm.ppf(1 - alpha / (2 * m)))


def adjust(rows: pd.DataFrame, alpha: float = ALPHA, power: float = POWER) -> pd.DataFrame:
    """``rows`` with, per ``family`` of ``m`` rows: ``m`` (the family's size), ``ci_low``, ``ci_high``
    (simultaneous Bonferroni interval from ``value`` and ``se``), ``p_adj`` (Bonferroni-adjusted two-sided
    p of the same normal approximation), ``significant`` (``p_adj < alpha``, the same as the interval
    excluding 0) and ``mde`` (the smallest difference the family's test detects with ``power``:
    ``(z(1 − α/2m) + z(power)) · se``). A row with a missing or negative ``se`` gets no interval and is
    not significant; ``se = 0`` (every resample alike) gives an interval of no width.

    >>> r = adjust(pd.DataFrame({"family": ["a", "a"], "value": [0.05, 0.0], "se": [0.01, 0.01]}))
    >>> r["significant"].tolist(), round(float(r["ci_low"][0]), 4)
    ([True, False], 0.0276)
    """
    missing = [c for c in ("family", "value", "se") if c not in rows.columns]
    if missing:
        raise ValueError(f"comparison rows lack the column(s) {missing}; they have {list(rows.columns)}")
    out = rows.reset_index(drop=True).copy()
    value = pd.to_numeric(out["value"], errors="coerce").to_numpy(float)
    se = pd.to_numeric(out["se"], errors="coerce").to_numpy(float)
    # se = 0: every resample gave the same value (e.g. a decoder that always falls back to the same answer):
    # a measured value with an interval of no width, not a missing one
    ok = np.isfinite(value) & np.isfinite(se) & (se >= 0)
    m = out.groupby("family", sort=False)["family"].transform("size").to_numpy(int)
    z = np.array([_z(alpha, k) for k in m])
    half = np.where(ok, z * se, np.nan)
    out["m"] = m
    out["ci_low"] = value - half
    out["ci_high"] = value + half
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(se > 0, 2 * stats.norm.sf(np.abs(value) / se), np.where(value == 0, 1.0, 0.0))
    out["p_adj"] = np.where(ok, np.minimum(1.0, m * p), np.nan)
    # decided from the interval, the quantity a reader sees; equal to p_adj < alpha up to rounding
    out["significant"] = ok & ((out["ci_low"] > 0) | (out["ci_high"] < 0))
    out["mde"] = np.where(ok, (z + stats.norm.ppf(power)) * se, np.nan)
    return out


def decide_row(row, rule: Rule) -> Decision:
    """The decision for one adjusted row (a row of :func:`adjust`) under ``rule``."""
    v, lo, hi = (float(row[k]) if row[k] is not None and not pd.isna(row[k]) else math.nan
                 for k in ("value", "ci_low", "ci_high"))
    if not (math.isfinite(v) and math.isfinite(lo) and math.isfinite(hi)):
        return "not_measured"
    t = rule.threshold
    if bool(row["significant"]):
        return "yes" if abs(v) >= t else "yes_small"
    return "no_difference" if -t < lo and hi < t else "inconclusive"


def confidence(row, rule: Rule) -> Confidence:
    """How far the row's interval is from another decision (module docstring)."""
    decision = decide_row(row, rule)
    lo, hi, t = float(row["ci_low"]), float(row["ci_high"]), rule.threshold
    if decision == "yes":
        return "high" if lo >= t or hi <= -t else "moderate"
    if decision == "no_difference":
        return "high"
    if decision == "yes_small":
        return "high" if -t < lo and hi < t else "moderate"
    return "low"


def decide(rows: pd.DataFrame, rules: dict[str, Rule], alpha: float = ALPHA) -> pd.DataFrame:
    """Adjust ``rows`` per family (:func:`adjust`) and decide each under the rule of its ``measure``:
    adds ``decision``, ``verdict`` (the words of :data:`LABELS`; in a one-sided question a significant row
    the other way reads "No (the opposite)") and ``confidence``. An unknown measure is a ValueError naming it."""
    if rows is None or len(rows) == 0:
        return pd.DataFrame(columns=[*ROW_COLUMNS, "ci_low", "ci_high", "p_adj", "significant", "decision", "verdict",
                                     "confidence"])
    unknown = sorted(set(rows["measure"]) - set(rules))
    if unknown:
        raise ValueError(f"comparison rows name measure(s) {unknown} without a rule; rules: {sorted(rules)}")
    out = adjust(rows, alpha)
    decisions, labels, conf = [], [], []
    for _, row in out.iterrows():
        rule = rules[row["measure"]]
        d = decide_row(row, rule)
        label = LABELS[d]
        if rule.direction and d in ("yes", "yes_small") and np.sign(row["value"]) == -rule.direction:
            label = "No (the opposite)"
        decisions.append(d)
        labels.append(label)
        conf.append(confidence(row, rule) if d != "not_measured" else "low")
    out["decision"], out["verdict"], out["confidence"] = decisions, labels, conf
    return out


#: Columns that tell a question's rows apart, shown before the compared quantity where present.
FACETS = ("k", "position", "layer", "pooling", "format", "n_train", "task", "condition", "representation")


def _facet(col: pd.Series) -> pd.Series:
    """A facet column as printed: whole numbers as integers and '–' where a row has none (a column of counts with
    a gap is read as floats, which would print as ``2.000``)."""
    num = pd.to_numeric(col, errors="coerce")
    if col.dtype.kind in "fiu" and ((num.dropna() % 1) == 0).all():
        return pd.Series(["–" if pd.isna(v) else str(int(v)) for v in num], index=col.index, dtype=object)
    return col


def display(decided: pd.DataFrame, rules: dict[str, Rule]) -> pd.DataFrame:
    """The decided rows as a report prints them: the facets, what was compared (``label``), the difference with
    its simultaneous interval in the rule's unit, the adjusted p, the decision and the family's size."""
    if decided is None or len(decided) == 0:
        return pd.DataFrame()
    out = pd.DataFrame({c: _facet(decided[c]) for c in FACETS if c in decided.columns and decided[c].notna().any()})
    if "label" in decided.columns:
        out["compared"] = decided["label"].astype(str)
    cells = []
    for _, r in decided.iterrows():
        rule = rules[r["measure"]]
        if pd.isna(r["ci_low"]):
            cells.append("–")
        else:
            cells.append(f"{rule.number(r['value'], signed=True)} ({rule.interval(r['ci_low'], r['ci_high'])})")
    out["difference (simultaneous 95% CI)"] = cells
    out["adjusted p"] = [format_p(p).removeprefix("p ").removeprefix("= ") for p in decided["p_adj"]]
    out["decision"] = decided["verdict"].to_numpy()
    out["family size"] = decided["m"].to_numpy()
    return out.reset_index(drop=True)


def format_p(p: float) -> str:
    """``'p = 0.012'``, ``'p < 0.001'``, ``'p = 1'``.

    >>> format_p(3e-15), format_p(0.0123), format_p(1.0)
    ('p < 0.001', 'p = 0.012', 'p = 1')
    """
    if p is None or not math.isfinite(p):
        return "p –"
    return "p < 0.001" if p < 0.001 else f"p = {p:.2g}"


def describe(rules: dict[str, Rule]) -> str:
    """The rules in a few sentences, for the report's "How to read this report"."""
    lines = [
        f"Every comparison is a paired difference on the same items, with a bootstrap standard error over "
        f"documents (and over training seeds where a fine-tuned model is involved). Within one comparison's "
        f"family of m rows (its layers, poolings or positions) the interval is simultaneous at "
        f"{1 - ALPHA:.0%} (Bonferroni: ± z(1 − {ALPHA:g}/2m) standard errors) and the p-value is adjusted the "
        f"same way, so a row's interval excludes 0 exactly when its adjusted p is below {ALPHA:g}.",
        f"'{LABELS['yes']}': the difference is significant and at least the measure's threshold; "
        f"'{LABELS['yes_small']}': significant but below it; '{LABELS['no_difference']}': the interval lies "
        f"inside ± the threshold; '{LABELS['inconclusive']}': neither. The confidence word says whether the "
        f"interval sits wholly on one side of the threshold (high), reaches across it (moderate), or leaves "
        f"the answer open (low).",
        "Thresholds, each in its measure's own unit:",
    ]
    for rule in sorted({(r.measure, r) for r in rules.values()}, key=lambda x: x[0]):
        r = rule[1]
        lines.append(f"- {r.measure}: {r.show(r.threshold)}" + (f" ({r.why})" if r.why else ""))
    return "\n".join(lines[:2]) + "\n\n" + "\n".join(lines[2:])
