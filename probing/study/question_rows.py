"""The comparison rows each seed question's verdict is computed from (:mod:`probing.study.verdicts`),
read from the tables of :mod:`probing.study.question_tables`. Paired rows wherever the analyses write
them; the one-sample rows of Q7 (a score against a constant baseline) come from
:func:`probing.study.verdicts.difference_rows`. Comparisons involving [CLS] leave out layer 0 (the
embedding layer: [CLS] is one vector for every input), and so do Q2's and Q3's (at layer 0 a shared
word's state is its token, position and segment embedding, the same whatever follows it).
"""

from __future__ import annotations

import pandas as pd

from .report import last_layer, pick
from .verdicts import difference_rows


def _layers(df: pd.DataFrame) -> pd.DataFrame:
    """Rows sorted by layer, the layer as an integer (probe comparison rows carry it as a float)."""
    df = df[pd.to_numeric(df["layer"], errors="coerce").notna()]
    return df.assign(layer=pd.to_numeric(df["layer"]).astype(int)).sort_values("layer")


def _contextual(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of layers >= 1: comparisons involving [CLS] leave out layer 0, the embedding layer, where
    [CLS] is the same vector for every input (a trivial difference, or a trivial null)."""
    return _layers(df[pd.to_numeric(df["layer"], errors="coerce") >= 1])


def _holm_from_layer1(d: pd.DataFrame) -> pd.DataFrame:
    """Rows of layers 1–L with ``p_holm`` redone over exactly them: the probe runner's own covers layers 0–L of
    one target, and a verdict names the family it reads."""
    from .verdicts import add_holm

    return add_holm(_contextual(d).drop(columns=["p_holm"], errors="ignore").reset_index(drop=True))


def _first_role(rows: pd.DataFrame, *roles: str) -> pd.DataFrame:
    """The rows of the first of ``roles`` present in ``rows`` (tables stored before a role was added have
    only the later ones)."""
    for role in roles:
        d = pick(rows, role=role)
        if not d.empty:
            return d
    return rows.iloc[0:0]


def _q1_rows(T):
    # each role's drift against its own spread: in a sentence encoder's middle layers [CLS] is nearly one
    # vector for every input, so its raw drift is small whatever the format does to it (the raw
    # drift_diff_roles rows are reported beside, not decided on)
    d = pick(T.get("paired_q1"), metric="normalised_drift_diff_roles")
    return None if d.empty else _contextual(d)


def _q2_rows(T):
    # layer 0 left out: sentence 1's words have the same embedding (token, position, segment A) alone, in
    # `pair` and in `concat`, so their drift there is 0 by construction (a trivial null, not a finding)
    # the inner words: an edge word's own neighbour changes when the middle [SEP] goes (the last word of
    # sentence 1 is next to it), which is not sentence 2 reaching sentence 1; tables from before the split
    # have only "s1 words"
    d = _first_role(pick(T.get("paired_q2"), reference="single", metric="drift_diff"), "s1 inner words", "s1 words")
    return None if d.empty else _contextual(d)


def _q3_rows(T):
    # [CLS] against its own spread between inputs, as in Q1: nearly one vector for every input in a sentence
    # encoder's middle layers, so its raw drift is tiny whatever more segments do to it; pooled with the
    # words token by token it would weigh as one token in about 40
    d = pick(T.get("paired_q3"), role="cls", metric="normalised_drift_growth")
    return None if d.empty else _contextual(d)


def _q3_word_rows(T):
    # the inner words of sentences 1-2 together, against their spread: sentence 2's last word changes
    # neighbour in the long `concat` only, so the edge words are left out
    d = pick(T.get("paired_q3"), role="inner words", metric="normalised_drift_growth")
    return None if d.empty else _contextual(d)


def q4_versus_cls(d: pd.DataFrame | None) -> pd.DataFrame:
    """``paired_q4``'s sep1 − cls rows (the table also holds sep1 − length-only on is_next, a family of its own)."""
    if d is None or d.empty or "condition_b" not in d.columns:
        return pd.DataFrame() if d is None else d
    return d[d["condition_b"].eq("choice=cls").fillna(False)]


def _q4_rows(T):
    d = pick(q4_versus_cls(T.get("paired_q4")), target="is_next")
    return None if d.empty else _contextual(d)


def _q4_sep_next_rows(T):
    """What the middle [SEP] holds on its own: its is_next accuracy against the stronger of its baselines, per
    layer 1–L. The majority baseline (one-sample, as Q7 reads [CLS]'s length and word order), unless a probe
    on the two sentences' word counts alone reads is_next above it: then the paired sep1 − length-only rows on
    the same items (``paired_q4``), so that what lengths tell is not counted as coherence."""
    p = pick(T.get("probes_pair"), model_kind="trained", target="is_next")
    length = pick(p, choice="length_only", metric="accuracy")
    majority = pick(p, choice="sep1", metric="majority_baseline")
    if not length.empty and not majority.empty and float(length["value"].iloc[0]) > float(majority["value"].iloc[0]):
        d = pick(T.get("paired_q4"), target="is_next", condition_b="choice=length_only")
        if not d.empty:
            return _contextual(d)
    return _above_majority(pick(p, choice="sep1"))


#: The family of Q4's [SEP] − length-only rows: Holm over layers 1–L of both sentences' bags of words
#: (run_probes' own p_holm covers one target's layers 0–L; :func:`_holm_over_sentences` redoes it).
SEP_AUC_VS_LENGTH_FAMILY = "sep1 − length-only macro AUC over layers 1–L × sentences 1–2 (Holm over all of them)"
#: The family of Q4's trained − random-init [SEP] rows, Holm as above.
SEP_AUC_VS_RANDOM_FAMILY = ("sep1 of the trained model − sep1 of the random-init model, macro AUC over layers 1–L × "
                            "sentences 1–2 (Holm over all of them)")


def _holm_over_sentences(rows: pd.DataFrame, sentence: int, family: str) -> pd.DataFrame | None:
    """Of ``rows`` (macro_auc_diff rows of bow_s1 and bow_s2, every layer), sentence ``sentence``'s rows of
    layers 1–L, with ``p_holm`` over layers 1–L of both sentences (the family the verdict names)."""
    d = rows[rows["target"].isin(["bow_s1", "bow_s2"])]
    if d.empty:
        return None
    d = _holm_from_layer1(d)
    d = d[d["target"] == f"bow_s{sentence}"]
    return None if d.empty else d.assign(family=family)


def _q4_sep_content_rows(sentence: int):
    """What the middle [SEP] holds of sentence ``sentence``'s content words beyond what the sentences' lengths
    tell: the macro AUC of sep1 − that of the length-only probe, on the same resamples, per layer 1–L."""
    def rows(T):
        d = pick(T.get("probes_pair"), model_kind="trained", choice="sep1", choice_b="length_only",
                 metric="macro_auc_diff")
        return None if d.empty else _holm_over_sentences(d, sentence, SEP_AUC_VS_LENGTH_FAMILY)

    return rows


def _q4_sep_untrained_rows(sentence: int):
    """Whether what the middle [SEP] holds of sentence ``sentence``'s content words is learned: the macro AUC of
    sep1 on the trained model − that of sep1 on the random-init model (same architecture, random weights), on
    the same resamples of the same items, per layer 1–L. None without the random-init run."""
    def rows(T):
        d = pick(T.get("probes_pair"), model_kind="trained", model_kind_b="random_init", choice="sep1", choice_b="sep1",
                 metric="macro_auc_diff")
        return None if d.empty else _holm_over_sentences(d, sentence, SEP_AUC_VS_RANDOM_FAMILY)

    return rows


def _q4_sep_next_untrained_rows(T):
    """Whether what the middle [SEP] holds of coherence is learned: is_next accuracy of sep1 on the trained model
    − that of sep1 on the random-init model, paired per item (``paired_q4``'s own family), per layer 1–L. None
    without the random-init run."""
    from .question_tables import FAMILIES

    d = pick(T.get("paired_q4"), target="is_next", family=FAMILIES["Q4_next_random"])
    return None if d.empty else _contextual(d)


#: The family of Q5's verdict rows: one per sentence position, at the last layer.
Q5_FAMILY = "[CLS] − length-only macro AUC over the sentence positions at the last layer (Holm over positions)"


def _q4_content_rows(sentence: int):
    """Q4's content-word part for sentence ``sentence``: the middle [SEP] − [CLS] macro AUC of its bag of
    content words, per layer 1–L, on the same document resamples (``paired_q4``'s macro_auc_diff rows)."""
    def rows(T):
        d = pick(q4_versus_cls(T.get("paired_q4")), target=f"bow_s{sentence}", metric="macro_auc_diff")
        return None if d.empty else _contextual(d)

    return rows


def _q5_rows(T):
    """Q5's verdict: per sentence i, the macro AUC of sentence i's content words read from [CLS] at the last
    layer minus that of a probe on the sentences' word counts alone, on the same document resamples (the
    probe table's ``macro_auc_diff`` rows). The macro AUC, not micro-F1: F1 at a 0.5 threshold is 0 for a
    probe whose scores rank the items right but stay below 0.5 for rare words (sentence 4 of the default
    study: F1 0.009, AUC 0.69). Against length, not only against the frequency baseline's 0.5: a longer
    sentence holds more of any word, so a probe that reads only lengths already ranks above 0.5."""
    from .verdicts import add_holm

    p = pick(T.get("probes_q5"), choice="cls", choice_b="length_only", metric="macro_auc_diff")
    if p.empty:
        return None
    p = p[p["target"].astype(str).str.startswith("bow_s")]  # fw_s1 is the control, not the question
    p = p[p["layer"] == last_layer(p)].assign(sentence=lambda t: t["target"].str[5:].astype(int))
    return add_holm(p.sort_values("sentence").drop(columns=["p_holm"], errors="ignore")).assign(family=Q5_FAMILY)


def _q6_rows(T):
    d = pick(T.get("paired_q6"), target="topic", condition_b="format=cls_last")
    return None if d.empty else _contextual(d)


#: The family of a one-sample row set (a score against its constant baseline, every layer 1–L).
ONE_SAMPLE_FAMILY = "one-sample against the majority baseline over layers 1–L (Holm over layers)"


def _above_majority(p: pd.DataFrame) -> pd.DataFrame | None:
    """One-sample rows: the probe's accuracy − its majority baseline, per layer 1–L."""
    if p.empty:
        return None
    base = pick(p, metric="majority_baseline").assign(ci_low=float("nan"), ci_high=float("nan"))
    return difference_rows(_contextual(pick(p, metric="accuracy")), base).assign(family=ONE_SAMPLE_FAMILY)


def _q7_rows(T):
    return _above_majority(pick(T.get("probes_q7"), model_kind="trained", choice="cls", target="swapped"))


#: The family of Q7's content-word rows (run_probes' macro_auc_diff rows carry Holm over layers 0–L; the verdict
#: reads layers 1–L and :func:`_q7_content_rows` redoes Holm over them).
AUC_VS_LENGTH_FAMILY = "[CLS] − length-only macro AUC over layers 1–L (Holm over layers)"


def _q7_content_rows(T):
    # the macro AUC on the same resamples, not the per-item F1 (thresholded at 0.5: see Q5's rows)
    d = pick(T.get("probes_pair"), model_kind="trained", choice="cls", choice_b="length_only", target="bow_s1",
             metric="macro_auc_diff")
    return None if d.empty else _holm_from_layer1(d).assign(family=AUC_VS_LENGTH_FAMILY)


#: The family of Q7's trained − random-init [CLS] rows.
CLS_AUC_VS_RANDOM_FAMILY = ("[CLS] of the trained model − [CLS] of the random-init model, macro AUC over layers 1–L "
                            "(Holm over layers)")


def _q7_untrained_rows(T):
    """Whether what [CLS] holds of sentence 1's content words is learned: its macro AUC on the trained model −
    that of [CLS] on the random-init model, on the same resamples of the same items, per layer 1–L, Holm
    over them. None without the random-init run."""
    d = pick(T.get("probes_pair"), model_kind="trained", model_kind_b="random_init", choice="cls", choice_b="cls", target="bow_s1",
             metric="macro_auc_diff")
    return None if d.empty else _holm_from_layer1(d).assign(family=CLS_AUC_VS_RANDOM_FAMILY)


def _q7_length_rows(T):
    return _above_majority(pick(T.get("probes_pair"), model_kind="trained", choice="cls", target="length"))


def _q8_rows(T):
    d = pick(T.get("paired_q8"), target="topic")
    return None if d.empty else _contextual(d)


def _q8_finetune_rows(T):
    """Each fine-tuned pooling − fine-tuned mean pooling on the same test items (the fine-tuning table's
    accuracy_diff rows; Holm over every accuracy_diff row of that table)."""
    d = pick(T.get("finetune"), metric="accuracy_diff", condition="fine_tuned", condition_b="fine_tuned",
             pooling_b="mean")
    return None if d.empty else d[d["pooling"] != "mean"].reset_index(drop=True)
