"""The seed questions Q1-Q8 declared as data: one :class:`probing.study.sections.StudySection` each, in
:data:`QUESTION_SECTIONS`, with each question's notes; titles and claims are plain data in
``questions.toml``. The parts live beside this module, one concern each: the caches and analyses
(:mod:`probing.study.question_tables`), figures and report tables (:mod:`probing.study.question_figures`),
comparison rows (:mod:`probing.study.question_rows`) and evidence sentences
(:mod:`probing.study.question_text`).

Each question names the corpora and caches it needs, its analyses (tables shared between questions
are computed once, through :meth:`probing.study.sections.Context.table`), its figures, its report table, its
evidence sentence, the comparison rows its verdict is computed from and the claim they test.

Comparison rows are paired: probe comparisons on the same out-of-fold items
(:func:`analyses.probes.compare_probes` on the item tables the probe runs keep with
``items=True``: Q4 sep1 − cls for is_next, Q6 first − last / first − middle across caches of the same
examples, Q7 trained − random-init and [CLS] − a length-only probe, Q8 frozen cls − mean); the
bag-of-words targets by the macro AUC on the same document resamples of the same out-of-fold items (the
probe tables' ``macro_auc_diff`` rows: Q4 sep1 − cls, Q5 [CLS] − mean and [CLS] − length-only, the
verdict, Q7 [CLS] − length-only); drift
comparisons on the same token keys (:func:`analyses.paired.run_role_contrast` for Q1,
:func:`analyses.paired.run_paired_drift` for Q2, :func:`analyses.paired.run_prefix_drift` for Q3: the
multi → concat drift of the same tokens of sentences 1–2 with the largest k sentences − with 2), the
fine-tuning table's own ``accuracy_diff`` rows for Q8, and a score against a constant baseline (Q7
length and word order) as a one-sample row. Holm's correction runs over the family
:data:`probing.study.question_tables.FAMILIES` declares per question (the report's captions name it).
Comparisons involving [CLS] leave out layer 0 (the embedding layer: [CLS] is one vector for every input
there), and so does Q3's (a shared word's embedding does not depend on what follows it).

Causal sections (issue 14): Q4 extracts ``pair`` with attention to every [SEP] knocked out in the
middle layers and its same-size control (:data:`probing.study.question_tables.INTERVENTIONS`, ``Job.intervention``), tables
``q4_knockout_drift`` / ``q4_knockout_probes``; Q1 extracts ``pair`` with [CLS] patched from ``concat``
at three layers (:func:`probing.study.question_tables.patch_layers`) and with the middle-[SEP] routes cut, table ``q1_cls_patching``.
"""

from __future__ import annotations

from .question_figures import (_fig_q1, _fig_q2, _fig_q3, _fig_q4, _fig_q5, _fig_q6, _fig_q7, _fig_q8, _table_q1,
                               _table_q2, _table_q3, _table_q4, _table_q5, _table_q6, _table_q7, _table_q8)
from .question_rows import (_q1_rows, _q2_rows, _q3_rows, _q3_word_rows, _q4_content_rows, _q4_rows,
                            _q4_sep_content_rows, _q4_sep_next_rows, _q4_sep_next_untrained_rows,
                            _q4_sep_untrained_rows, _q5_rows, _q6_rows, _q7_content_rows, _q7_untrained_rows,
                            _q7_length_rows, _q7_rows, _q8_finetune_rows, _q8_rows)
from .question_rows import CLS_AUC_VS_RANDOM_FAMILY, SEP_AUC_VS_LENGTH_FAMILY, SEP_AUC_VS_RANDOM_FAMILY
from .question_tables import FAMILIES, _pair_jobs, _q3_jobs, _q5_jobs, _tables
from .question_text import (QUESTION_TEXT, answer_q1, answer_q2, answer_q3, answer_q4, answer_q5, answer_q6,
                            answer_q7, answer_q8, claim)
from .sections import StudySection, corpus_text
from .verdicts import Claim

#: Each question's title and the claim its verdict tests (plain data in questions.toml).
TITLES: dict[str, str] = {k: v["title"] for k, v in QUESTION_TEXT.items() if "title" in v}
CLAIMS: dict[str, Claim] = {k: claim(k) for k in TITLES}


# ---------------------------------------------------------------------------------------------------
# Notes: how it was measured and what it does not show


def _q3_notes(cfg) -> str:
    return (f"For k consecutive sentences of one document of the groups corpus ({corpus_text(cfg.corpus.groups)} "
            "sentences), `multi` ([SEP] after every sentence, alternating segments) against `concat` (one [CLS] … "
            "[SEP]); the model's pre-training format has two segments at most, so growth with k shows the format "
            "moving away from what it saw in training. It does not measure task accuracy with k segments. The answer "
            "has two parts, [CLS] and the inner words of sentences 1–2 (neither a sentence's first nor its last word), "
            "each paired on the same tokens, which the inputs of k = 2 and of the largest k share (the prefixes are "
            "the first k sentences of the same documents): their multi → concat drift with the largest k minus with "
            "2, both over the part's own spread between inputs (1 − cos of two [CLS], or two inner words, of "
            "different inputs at k = 2; one constant per layer divides both drifts, so the p-values are the raw "
            "drifts'), as in Q1: [CLS] is nearly one vector for every input in a sentence encoder's middle layers, so "
            "its raw drift is tiny whatever happens to it, and pooled with the words token by token it would weigh "
            "as one token in about 40 (analyses.paired.run_prefix_drift; " + FAMILIES["Q3"] + "; layer 0 left out: "
            "a word's embedding does not depend on what follows it, and [CLS]'s is one vector). The edge words are "
            "left out because sentence 2's last word is next to the closing [SEP] in both formats at k = 2, but in "
            "the longer inputs next to a [SEP] in `multi` and to sentence 3 in `concat`: its own neighbour changes, "
            "which is not the format reaching further. The spreads are estimated from 10,000 random pairs per layer "
            "and held fixed in the bootstrap. The table's all-tokens column also counts the words of sentences "
            "3..k, which only the longer inputs have: it is not the comparison.")


def _q8_notes(cfg) -> str:
    ft = cfg.finetune
    return ("Frozen probes score each pooling choice per layer without training the encoder (cls − mean paired on "
            "the same out-of-fold items); the fine-tuning experiment trains the encoder with a linear head on each "
            f"pooling ({', '.join(ft.poolings)}) over {len(ft.seeds)} seed(s) with the `{ft.preset}` preset "
            "of analyses.finetune, on stratified document-grouped cross-validation splits, and on the same splits "
            "fits a frozen probe per pooling: both predict the same test items, so fine-tuned − frozen and "
            "pooling − mean are paired per item. The answer has two parts, each decided by the rules above: frozen "
            "[CLS] − mean pooling per layer 1–L, and after fine-tuning each pooling − mean pooling (would any token "
            "do? 'No measurable difference' means every pooling is within what this sample can detect of mean "
            "pooling). Multiple comparisons: " + FAMILIES["Q8"] + ". " + _seed_caveat(len(ft.seeds)))


def _seed_caveat(n_seeds: int) -> str:
    """What Q8's CIs hold: the test documents; with one seed not the randomness of training (the head's
    initialisation, dropout, batch order), with several also that (:func:`analyses.finetune.seed_document_ci`)."""
    what = ("The CIs resample the test documents; they do not cover the randomness of training (the head's "
            "initialisation, dropout, batch order)")
    if n_seeds == 1:
        return (what + ": with one training seed, another seed is another draw of it, which can move a fine-tuned "
                "accuracy by more than its CI; several seeds (`[finetune] seeds`) average it out per item, each at "
                "the cost of the whole fine-tuning stage.")
    return (f"With {n_seeds} training seeds the fine-tuned rows' CIs resample the seeds as well as the test documents "
            "(a two-stage bootstrap, analyses.finetune.seed_document_ci), so they hold the randomness of training "
            "(the head's initialisation, dropout, batch order); with few seeds that part is crude and errs narrow. "
            "Their p-values come from the items' correctness averaged over the seeds.")


NOTES = {
    "Q1": "Drift is 1 − cos between the same token key (same example, sentence, word, subword) in two formats, "
          "averaged per role group, with a cluster bootstrap over documents (examples when the corpus has none). Raw cosines are high for any two "
          "tokens in these models, so each drift is shown beside the random-pair baseline of its layer and "
          "normalised by the baseline of its own role group: 1 − cos of two tokens of that group in different "
          "inputs (two [CLS], two words; 0 = unchanged, 1 = as far as another input would move it). A role whose "
          "state hardly depends on the input has a small raw drift whatever the format does to it, so [CLS] − "
          "words is decided on the normalised drifts; the spreads are estimated from 10,000 random pairs per layer "
          "and held fixed in the bootstrap. `pair` → `concat_segments` "
          "removes only the [SEP] token; `concat_segments` → `concat` removes only the segment embedding. It "
          "does not say whether the change matters for a downstream task (see Q4/Q8 for probes). [CLS] − words is "
          "paired per example (analyses.paired.run_role_contrast; " + FAMILIES["Q1"] + ").",
    "Q2": "Context effect: sentence i's words alone (`single`/`single2`) against the same words inside "
          "`pair` and `concat`. The drift counts every change of context, not only sentence 2's content: in "
          "`concat` sentence 1 also loses the [SEP] that follows it alone and in `pair`, and its last word's "
          "right neighbour changes with it. So the verdict reads sentence 1's inner words (neither its first "
          "nor its last, so both neighbours are words of sentence 1 in every format) and the edge words are "
          "reported apart; even the inner words' drift includes what the missing [SEP] changes through "
          "attention, so a larger drift is a larger context effect, not proof that more of sentence 2 reached "
          "them. concat − pair "
          "is paired on the same words (analyses.paired.run_paired_drift; " + FAMILIES["Q2"] + "); the verdict "
          "leaves out layer 0, where sentence 1's words are embedded alike in every format. Attention "
          "mass from sentence 1's words to sentence 2's words is a second, mechanistic view (Clark et al. "
          "2019); attention weights are not explanations and mass to special tokens is often a no-op.",
    "Q3": _q3_notes,
    "Q4": "Probes read what is linearly decodable from the [SEP] state (topic, is_next, the bag of words of "
          "the sentence before/after it), against the majority baseline, a control task and a probe on the "
          "sentences' word counts alone, and, for the middle [SEP]'s content words, the same probe on the same "
          "architecture with random weights (the randomly initialised model is probed for nothing else of Q4's; "
          "Q7 probes its [CLS] and mean pooling); CKA compares [SEP] with [CLS] and with pooled words of each sentence; attention "
          "gives the mass flowing to and from [SEP]. is_next negatives share sentence 1's topic, so is_next is "
          "not topic mismatch; the bag-of-words targets are content words. Decodable is not the same as used by "
          "the model: the knockout (attention from every token to every [SEP] masked before the softmax in the "
          "middle layers, analyses.interventions.sep_knockouts) against a control knockout of as many random word "
          "keys per query asks whether the model uses [SEP], by [CLS]'s drift, the words' drift (each over its own "
          "spread between inputs, as in Q1: two [CLS] of different inputs lie far closer than two words) and the "
          "[CLS] probes. Each knockout − control difference is paired (per example for the drift; per item for probe "
          "accuracy, the probe trained on the clean states of the same items, its C chosen by inner "
          "cross-validation as for every probe here), with a sign-flip p-value, Holm over the layers. The probes "
          "are read at every layer from the first knocked-out one to the last; a layer where the clean probe's CI "
          "reaches its majority baseline is left out of the verdict, since there is nothing for a knockout to "
          "lower there. The answer has eight parts, each decided by the rules above per layer 1–L. First, what the "
          "middle [SEP] holds against its own baselines: coherence (its is_next accuracy against the majority "
          "baseline, one-sample, Holm over layers; or, where a probe on the two sentences' word counts alone reads "
          "is_next above the majority baseline, against that probe, paired on the same items, Holm over layers: "
          "lengths are not coherence; the evidence gives the length-only probe's accuracy either way) and the content words of the sentence before and of the one after it (the macro AUC "
          "against a length-only probe, which knows only how many words each sentence has, on the same document "
          "resamples of the same out-of-fold scores: " + SEP_AUC_VS_LENGTH_FAMILY + "). Then whether those content "
          "words are learned: the same probe on the middle [SEP] of the same architecture with random weights, "
          "embeddings included, whose attention mixes the input without having been trained to (encoders with "
          "random weights are strong baselines for what sentence representations hold: Wieting & Kiela 2019, "
          "there over pre-trained word embeddings), by macro AUC on the same resamples of the same items ("
          + SEP_AUC_VS_RANDOM_FAMILY + "). Then the same three "
          "against [CLS]: coherence (is_next accuracy, paired per item) and each sentence's content words (the "
          "macro AUC on the same resamples; micro-F1 at a 0.5 threshold reads near 0 for a probe that ranks rare "
          "words well): " + FAMILIES["Q4"] + ".",
    "Q5": "Multi-label probes for the bag of words of sentence i, read from [CLS] of a `multi` input of k "
          "sentences, for each position i; mean pooling as the reference. The targets are the most frequent "
          "content words (stop words and the top frequency band removed); the frequency baseline scores each word "
          "by its training frequency, a macro AUC of exactly 0.5. The verdict reads the macro AUC (does [CLS] rank "
          "the examples containing a word above those without it?) minus that of a probe on the k sentences' word "
          "counts alone (a longer sentence holds more of any word, so length alone ranks above 0.5), on the same "
          "document resamples of the same out-of-fold scores: micro-F1 at a 0.5 threshold counts only words the "
          "probe is sure of, so a probe that ranks rare words well can score an F1 near 0. fw_s1 (function words "
          "of sentence 1, which track length) is the named control. [CLS] − mean rows compare the macro AUC the "
          "same way: " + FAMILIES["Q5"] + ".",
    "Q6": "The same probes on the classification token placed first (`pair`), between the sentences "
          "(`cls_mid`) and last (`cls_last`). Absolute position embeddings make the three different inputs; "
          "the pre-trained model only ever saw [CLS] first. Topic is asked of pairs whose sentences share it "
          "(is_next negatives come from the same topic). Comparisons are paired on the same examples, with the "
          "same folds, across the three caches: " + FAMILIES["Q6"] + ".",
    "Q7": "Bag-of-words, sentence-length and word-order (two adjacent words swapped) probes on [CLS] and on "
          "mean-pooled words, per layer, for the trained and a randomly initialised model of the same "
          "architecture. A random model's high bag-of-words score shows how much comes from the embeddings "
          "alone. The answer has four parts, each decided by the rules above over layers 1–L: content words "
          "(the macro AUC of the bag of content words of sentence 1 from [CLS] against a length-only probe, which "
          "knows only how many words each sentence has, on the same document resamples of the same out-of-fold "
          "items: reading more content words from a longer sentence is not recovering the input); the same "
          "against [CLS] of the random-init model, on the same resamples of the same items (is what [CLS] holds "
          "of them learned, or what any encoder of this architecture holds? " + CLS_AUC_VS_RANDOM_FAMILY + "); "
          "sentence length "
          "and word order (each [CLS] probe against its majority baseline, one-sample, with its detectable "
          "effect). fw_s1 (function words) is the "
          "length-tracking control; trained − random-init is paired on the same items: " + FAMILIES["Q7"] + ".",
    "Q8": _q8_notes,
}


#: Questions answered in parts (:attr:`probing.study.sections.StudySection.parts`), each by the same rules: Q3
#: asks how far more segments move [CLS] and the inner words, each against its own spread between inputs; Q4
#: asks what [SEP] holds (coherence, and the content words of the sentence before and after it, each against
#: [SEP]'s own baselines, against the same [SEP] with random weights, and against [CLS]); Q7
#: asks whether the input can be recovered (content words, also against random weights, length, word order); Q8
#: asks two questions
#: (frozen [CLS] against mean pooling; after fine-tuning, each pooling against mean pooling).
PARTS = {"Q3": (("[CLS]", _q3_rows, CLAIMS["Q3"]),
                ("Inner words of sentences 1–2", _q3_word_rows, claim("Q3_words"))),
         "Q4": (("[SEP] against its baselines: coherence (is_next)", _q4_sep_next_rows, claim("Q4_sep_next")),
                ("[SEP] against its baselines: content words of sentence 1", _q4_sep_content_rows(1),
                 claim("Q4_sep_content")),
                ("[SEP] against its baselines: content words of sentence 2", _q4_sep_content_rows(2),
                 claim("Q4_sep_content")),
                ("[SEP] against random weights: coherence (is_next)", _q4_sep_next_untrained_rows,
                 claim("Q4_sep_next_untrained")),
                ("[SEP] against random weights: content words of sentence 1", _q4_sep_untrained_rows(1),
                 claim("Q4_sep_untrained")),
                ("[SEP] against random weights: content words of sentence 2", _q4_sep_untrained_rows(2),
                 claim("Q4_sep_untrained")),
                ("[SEP] against [CLS]: coherence (is_next)", _q4_rows, CLAIMS["Q4"]),
                ("[SEP] against [CLS]: content words of sentence 1", _q4_content_rows(1), claim("Q4_content")),
                ("[SEP] against [CLS]: content words of sentence 2", _q4_content_rows(2), claim("Q4_content"))),
         "Q7": (("Content words of sentence 1", _q7_content_rows, claim("Q7_content")),
                ("Content words of sentence 1 against random weights", _q7_untrained_rows,
                 claim("Q7_content_untrained")),
                ("Sentence length", _q7_length_rows, claim("Q7_length")),
                ("Word order", _q7_rows, CLAIMS["Q7"])),
         "Q8": (("Frozen", _q8_rows, CLAIMS["Q8"]),
                ("After fine-tuning", _q8_finetune_rows, claim("Q8_finetune")))}


def _question(key, corpora, jobs, tables, figures, table, answer, rows, about_cls=False) -> StudySection:
    return StudySection(key=key, title=TITLES[key], corpora=corpora, jobs=jobs, analyse=_tables(*tables),
                        figures=figures, table=table, answer=answer, notes=NOTES[key], comparisons=rows,
                        claim=CLAIMS[key], about_cls=about_cls, tables=tuple(tables), parts=PARTS.get(key, ()))


#: The seed questions, in report order.
QUESTION_SECTIONS: dict[str, StudySection] = {s.key: s for s in (
    _question("Q1", ("pairs",), _pair_jobs("Q1"), ("drift_q1", "cka_q1", "paired_q1", "q1_cls_patching"), _fig_q1, _table_q1, answer_q1, _q1_rows,
              about_cls=True),
    _question("Q2", ("pairs",), _pair_jobs("Q2"), ("drift_q2", "attention", "paired_q2"), _fig_q2, _table_q2, answer_q2, _q2_rows),
    _question("Q3", ("groups",), _q3_jobs, ("drift_q3", "paired_q3"), _fig_q3, _table_q3, answer_q3, _q3_rows),
    _question("Q4", ("pairs",), _pair_jobs("Q4"), ("attention", "probes_pair", "cka_q4", "paired_q4",
                                                      "q4_knockout_drift", "q4_knockout_probes"), _fig_q4, _table_q4,
              answer_q4, _q4_rows, about_cls=True),
    _question("Q5", ("groups",), _q5_jobs, ("probes_q5", "paired_q5"), _fig_q5, _table_q5, answer_q5, _q5_rows),
    _question("Q6", ("pairs",), _pair_jobs("Q6"), ("probes_q6", "paired_q6"), _fig_q6, _table_q6, answer_q6, _q6_rows,
              about_cls=True),
    _question("Q7", ("pairs", "swap"), _pair_jobs("Q7"), ("probes_pair", "probes_q7", "paired_q7"), _fig_q7, _table_q7, answer_q7,
              _q7_rows),
    _question("Q8", ("pairs",), _pair_jobs("Q8"), ("probes_pair", "paired_q8", "finetune"), _fig_q8, _table_q8, answer_q8,
              _q8_rows, about_cls=True),
)}
