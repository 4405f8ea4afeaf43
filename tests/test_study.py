"""The study end to end in --quick mode on a tiny random model and the generated corpus."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from probing.study import CONFIG_DIR, QUESTIONS, StudyError, load_config, packaged_configs, run_study
from probing.study.stages import PER_STAGE, SINCE_START

from .conftest import make_tiny_bert

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, bert_tokenizer):
    d = tmp_path_factory.mktemp("tiny-model")
    make_tiny_bert(bert_tokenizer, max_position_embeddings=128).save_pretrained(d)
    bert_tokenizer.save_pretrained(d)
    return d


@pytest.mark.slow
def test_quick_study_end_to_end_and_reuse(quick_study):
    """The first run of the session's --quick study (``quick_study``, shared with tests/test_tables.py), then
    its second run, which reuses every cache."""
    run, logs = quick_study["first_run"], quick_study["logs"]
    text = (run / "report.md").read_text()
    for q in QUESTIONS:
        m = re.search(rf"^## {q}\..*?(?=^## )", text, flags=re.S | re.M)
        assert m, f"section {q} missing"
        answer = re.search(r"\*\*Answer\.\*\* (.*)", m.group(0)).group(1)
        evidence = re.search(r"\*\*Evidence\.\*\* (.*)", m.group(0)).group(1)
        opening = r"(Yes|No measurable difference|Inconclusive|Only in|No)"
        if q == "Q4":  # six parts: coherence and each sentence's content words, against [SEP]'s baselines, then [CLS]
            parts = [f"\\[SEP\\] against {against}: {what} — {opening}" for against in ("its baselines", "\\[CLS\\]")
                     for what in ("coherence \\(is_next\\)", "content words of sentence 1",
                                  "content words of sentence 2")]
            assert re.match(".* ".join(parts), answer), answer
        elif q == "Q3":  # two parts: [CLS] and the inner words of sentences 1-2, each over its own spread
            assert re.match(rf"\[CLS\] — {opening}.* Inner words of sentences 1–2 — {opening}", answer), answer
        elif q == "Q7":  # three parts: content words, length, word order, each opened by its verdict
            assert re.match(rf"Content words of sentence 1 — {opening}.* Sentence length — {opening}.* "
                            rf"Word order — {opening}", answer), answer
        elif q == "Q8":  # two parts: frozen, after fine-tuning
            assert re.match(rf"Frozen — {opening}.* After fine-tuning — {opening}", answer), answer
        else:
            assert re.match(opening, answer), f"{q}: {answer}"
        assert re.search(r"\d\.\d{3}", answer), f"{q} verdict has no measured number: {answer}"
        assert re.search(r"\d\.\d{3}", evidence) and "not measured" not in evidence
    # every question's verdict, without its numbers, listed before the first section (and in the HTML)
    glance = text[text.index("## Answers at a glance"):text.index("## Q1.")]
    for q in QUESTIONS:
        line = next(ln for ln in glance.splitlines() if ln.startswith(f"- **{q}."))
        assert re.search(rf"\*\* .*{opening}", line) and "95% CI" not in line, line
    html_text = (run / "report.html").read_text()
    assert "<h2>Answers at a glance</h2>" in html_text and html_text.count("<li><b>Q") == len(QUESTIONS)
    # quick mode is announced in the title and at the top; the unknown model gets a neutral sentence
    assert text.startswith("# ") and "(quick mode)" in text.splitlines()[0]
    assert text.splitlines()[2].startswith("QUICK MODE")
    assert "no record of how it was trained" in text
    assert "Quick mode: small samples" in text and "generated template sentences" in text
    assert "95% CI" in text and "random-pair baseline" in text and "majority baseline" in text
    assert "## Provenance" in text and "fingerprint" in text
    # verdicts come from paired rows (none from two marginal intervals)
    for q in QUESTIONS:
        sec = re.search(rf"^## {q}\..*?(?=^## )", text, flags=re.S | re.M).group(0)
        answer = re.search(r"\*\*Answer\.\*\* (.*)", sec).group(1)
        assert "provisional" not in sec, f"{q}: {answer}"
    # Q3: the same tokens with k = 2 and with the largest k (3 here), layers 1-L, with their documents counted
    q3 = re.search(r"^## Q3\..*?(?=^## )", text, flags=re.S | re.M).group(0)
    assert "paired per word" in q3 and "paired per example" in q3 and "with k = 2 → with k = 3 sentences" in q3
    assert "prefix_drift: cluster bootstrap of paired per-token differences over" in text
    tables = run / "tables"
    p3 = pd.read_csv(tables / "paired_q3.csv")
    assert set(p3["role"]) == {"cls", "s1 words", "s2 words", "all", "cls and inner words", "inner words",
                               "s1 inner words", "s1 edge words", "s2 inner words", "s2 edge words"}
    assert (p3["k_b"] == 3).all()
    assert "s1 inner words" in set(pd.read_csv(tables / "paired_q2.csv")["role"])
    for name in ("paired_q1", "paired_q2", "paired_q3", "paired_q4", "paired_q5", "paired_q6", "paired_q7", "paired_q8",
                 "q4_knockout_drift", "q4_knockout_probes", "q1_cls_patching"):
        assert (tables / f"{name}.csv").is_file(), name
    # Q4 gains "does the model use [SEP]?" with the knockout − control numbers of its tables
    q4 = re.search(r"^## Q4\..*?(?=^## )", text, flags=re.S | re.M).group(0)
    assert "Does the model use [SEP]?" in q4 and "knockout − control" in q4
    ko = pd.read_csv(tables / "q4_knockout_probes.csv")
    r = ko[(ko["metric"] == "change_difference") & (ko["mode"] == "transfer") & (ko["target"] == "is_next")].iloc[0]
    assert f"{r['value']:+.3f}" in q4
    assert "q4_sep_knockout_drift.png" in q4 and "q1_cls_patching.png" in text
    # the bags of words are compared by macro AUC on the same resamples (Q4's is_next per item), Q5 against
    # mean pooling and, for its verdict, against the length-only probe
    p4 = pd.read_csv(tables / "paired_q4.csv")
    assert set(p4["metric"]) == {"difference", "macro_auc_diff"}
    # sep1 − cls in one family; sep1 − length-only on is_next (the coherence part's bar where lengths read more
    # than the majority) in its own, and trained − random-init sep1 on is_next in a third
    assert p4.groupby("condition_b")["family"].nunique().to_dict() == {
        "choice=cls": 1, "choice=length_only": 1, "model_kind=random_init,choice=sep1": 1}
    assert p4.groupby("condition_b")["family"].first().nunique() == 3
    for b in ("choice=length_only", "model_kind=random_init,choice=sep1"):
        assert set(p4[p4["condition_b"] == b]["target"]) == {"is_next"}
        assert (p4[p4["condition_b"] == b]["layer"] >= 1).all()
    assert set(p4[p4["metric"] == "macro_auc_diff"]["target"]) == {"bow_s1", "bow_s2"}
    p5 = pd.read_csv(tables / "paired_q5.csv")
    assert set(p5["metric"]) == {"macro_auc_diff"} and set(p5["condition_b"]) == {"choice=mean"}
    assert (p5["layer"] >= 1).all()
    pr5 = pd.read_csv(tables / "probes_q5.csv")
    assert {"mean", "length_only"} <= set(pr5[pr5["metric"] == "macro_auc_diff"]["choice_b"])
    # Q7: trained − random-init only; the length target is never compared with the length-only probe,
    # which reads the word counts that target is made of (its ceiling), and the evidence says so
    p7 = pd.read_csv(tables / "paired_q7.csv")
    assert set(p7["condition_b"]) == {"model_kind=random_init"}
    q7 = re.search(r"^## Q7\..*?(?=^## )", text, flags=re.S | re.M).group(0)
    assert "a ceiling, not a baseline" in q7 and "Beyond the length baseline" not in q7
    q6 = pd.read_csv(tables / "paired_q6.csv")
    assert q6["same_folds"].all() and set(q6["condition_b"]) == {"format=cls_last", "format=cls_mid"}
    # Q8: frozen and fine-tuned from identical test items, recorded in the table and the report
    ft = pd.read_csv(tables / "finetune.csv")
    for pooling in ("cls", "mean"):
        n_ft = ft[(ft["metric"] == "test_accuracy_mean") & (ft["pooling"] == pooling)]["n"].iloc[0]
        n_fr = ft[(ft["metric"] == "frozen_test_accuracy_mean") & (ft["pooling"] == pooling)]["n"].iloc[0]
        n_d = ft[(ft["metric"] == "accuracy_diff") & (ft["pooling"] == pooling)
                 & (ft["pooling_b"] == pooling)]["n"].iloc[0]
        assert n_ft == n_fr == n_d > 0
    q8 = re.search(r"^## Q8\..*?(?=^## )", text, flags=re.S | re.M).group(0)
    assert "| same test items |" in q8 and "| True |" in q8
    assert "in fine-tuning (Q8)" in text and "Holm" in q8
    figures = sorted((run / "figures").glob("*.png"))
    linked = re.findall(r"!\[[^]]*\]\(([^)]+)\)", text)
    assert len(figures) >= 8 and len(linked) == len(figures)
    import matplotlib.image as mpimg

    for png in figures:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        img = mpimg.imread(png)
        # distinct colours: each 8-bit RGBA pixel packed into one integer (np.unique over rows took ~2 s a figure)
        rgba = np.ascontiguousarray(np.round(img * 255).astype(np.uint8).reshape(-1, img.shape[-1]))
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[-1] in (3, 4)
        assert len(np.unique(np.pad(rgba, ((0, 0), (0, 4 - rgba.shape[1]))).view(np.uint32))) > 10
        assert png.with_suffix(".pdf").read_bytes()[:4] == b"%PDF"
    html = (run / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(figures)
    check_stage_table(run, text, html, logs)
    # a second run extracts nothing: every cache is reused
    logs2 = quick_study["logs_again"]
    extraction = [l for l in logs2 if "] cache: " in l or "tokens through the model" in l]
    assert extraction == [], extraction
    assert sum("cached:" in l for l in logs2) >= 10


def check_stage_table(run: Path, report: str, html: str, logs: list[str]) -> None:
    """Issue 13: one row per stage (extraction, each question's analyses, figures, report) with its wall
    time and peak RSS, in tables/stages.csv, in the report's provenance and printed in the log."""
    stages = pd.read_csv(run / "tables" / "stages.csv")
    expected = ["extraction"] + [f"analyses {q}" for q in QUESTIONS] + ["figures", "report"]
    assert stages["stage"].tolist() == expected
    assert (stages["seconds"] >= 0).all() and (stages["peak_rss_mb"] > 0).all()
    assert (stages["cpu_seconds"] >= 0).all() and stages["cpu_seconds"].sum() > 0
    assert stages["rss_method"].isin([PER_STAGE, SINCE_START]).all()
    total = float(re.search(r"\*\*run time\*\*: (\d+) s", report).group(1))
    # the stages cover the run: only loading the config and writing the report fall outside them
    assert abs(stages["seconds"].sum() - total) <= max(2.0, 0.05 * total), (stages["seconds"].sum(), total)
    section = report[report.index("## Provenance"):]
    assert "| stage | wall time (s) | peak RSS (MiB) |" in section
    for row in stages.itertuples():
        assert f"| {row.stage} | {row.seconds:.1f} | {row.peak_rss_mb:.0f} |" in section
        assert f"{row.stage} {row.seconds:.1f} s, {row.peak_rss_mb:.0f} MiB" in html
    printed = [l for l in logs if re.match(r"\[ *\d+s\] (extraction|analyses Q\d|figures|report|total) ", l)]
    assert len(printed) == len(expected) + 1  # and a total row


def test_stage_peak_memory_is_per_stage(monkeypatch):
    """With clear_refs writable, a small stage after a large one reports its own, smaller peak; without
    it, the fallback (peak since start) cannot go down, and the table says which was used."""
    import numpy as np

    from probing.study import stages as st

    def run() -> pd.DataFrame:
        rec = st.Stages()
        with rec.stage("large"):
            a = np.ones(40_000_000)  # 320 MB, touched
            del a
        with rec.stage("small"):
            sum(range(1000))
        return rec.table()

    if st.reset_peak_rss():
        t = run()
        assert t["rss_method"].tolist() == [st.PER_STAGE] * 2
        assert t["peak_rss_mb"][1] < t["peak_rss_mb"][0] - 250
        rec = st.Stages()
        rec.rows = t.to_dict("records")
        assert rec.run_peak_mb() == t["peak_rss_mb"].max()  # the largest stage peak, not ru_maxrss after a reset
    monkeypatch.setattr(st, "CLEAR_REFS", Path("/nonexistent-dir/clear_refs"))
    t = run()
    assert t["rss_method"].tolist() == [st.SINCE_START] * 2
    assert t["peak_rss_mb"][1] >= t["peak_rss_mb"][0] > 300


def test_stage_cpu_time_counts_work_not_waiting():
    """``cpu_seconds`` is the process's CPU time during the stage: a busy stage has it, a sleeping one not."""
    import time

    from probing.study import stages as st

    rec = st.Stages()
    with rec.stage("busy"):
        end = time.process_time() + 0.3
        while time.process_time() < end:
            pass
    with rec.stage("asleep"):
        time.sleep(0.3)
    t = rec.table()
    assert t["cpu_seconds"][0] >= 0.3
    assert t["cpu_seconds"][1] < 0.1 and t["seconds"][1] >= 0.3
    assert "CPU s" in rec.lines(1.0)[0] and rec.lines(1.0)[-2].split()[2] == f"{t['cpu_seconds'].sum():.1f}"


def test_config_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[study]\nnmae = 'x'\n")
    with pytest.raises(StudyError, match="unknown key study.nmae"):
        load_config(bad)
    bad.write_text("[nonsense]\nx = 1\n")
    with pytest.raises(StudyError, match=r"unknown section \[nonsense\]"):
        load_config(bad)
    bad.write_text("[study]\nquestions = ['Q9']\n")
    with pytest.raises(StudyError, match="unknown questions"):
        load_config(bad)
    with pytest.raises(StudyError, match=r"config '.*missing\.toml' is neither a file nor a packaged config; "
                                         r"packaged: clark2019_attention, ethayarajh2019_anisotropy"):
        load_config(tmp_path / "missing.toml")
    with pytest.raises(StudyError, match="'seed_question' is neither"):
        load_config("seed_question")


def test_configs_found_by_name_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ here: the packaged ones are found by name
    assert packaged_configs() == ["clark2019_attention", "ethayarajh2019_anisotropy", "jawahar2019_probing",
                                  "reimers2019_pooling", "seed_questions"]
    by_name = load_config("seed_questions", quick=True)
    assert by_name == load_config("seed_questions.toml", quick=True)
    assert by_name == load_config(CONFIG_DIR / "seed_questions.toml", quick=True)
    assert by_name.study.name == "seed_questions" and by_name.corpus.pairs.startswith("generated:")
    own = tmp_path / "seed_questions.toml"  # a file of that name in the working directory wins over the package's
    own.write_text('[study]\nname = "mine"\n')
    assert load_config("seed_questions.toml").study.name == "mine"
    assert load_config("seed_questions").study.name == "seed_questions"


def test_configs_are_package_data():
    """setup.cfg's package_data puts every packaged config, and the questions' titles and claims (data the
    study reads at import), into the wheel (a non-editable install)."""
    import configparser

    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    globs = [g.strip() for g in setup["options.package_data"]["probing.study"].split(",")]
    shipped = {p for g in globs for p in (REPO / "probing" / "study").glob(g)}
    data = set((REPO / "probing" / "study").rglob("*.toml"))
    assert shipped == data == set(CONFIG_DIR.glob("*.toml")) | {REPO / "probing" / "study" / "questions.toml"}
    assert len(shipped) == 6


def test_remote_code_only_with_the_command_line_flag(tmp_path):
    cfg = tmp_path / "remote.toml"
    cfg.write_text('[model]\nname = "some/model"\ntrust_remote_code = true\n')
    with pytest.raises(StudyError, match=r"remote\.toml' sets model\.trust_remote_code = true.*--trust-remote-code"):
        load_config(cfg)
    with pytest.raises(StudyError, match="--trust-remote-code"):
        load_config(None, overrides={"model.trust_remote_code": True})
    assert load_config(cfg, trust_remote_code=True).model.trust_remote_code is True
    assert load_config(None, trust_remote_code=True).model.trust_remote_code is True  # the flag alone
    assert load_config(None).model.trust_remote_code is False


def test_study_command_line_passes_the_flag(tmp_path, monkeypatch):
    import probing.study.runner as study

    seen = {}
    monkeypatch.setattr(study, "run_study", lambda config, **kw: seen.update(kw, config=config))
    cfg = tmp_path / "remote.toml"
    cfg.write_text('[model]\nname = "some/model"\ntrust_remote_code = true\n')
    assert study.main([str(cfg), "--out", str(tmp_path / "run"), "--trust-remote-code"]) == 0
    assert seen["trust_remote_code"] is True and seen["config"] == str(cfg)
    seen.clear()
    assert study.main([str(cfg), "--out", str(tmp_path / "run")]) == 2 and not seen


def test_shipped_configs_parse():
    cfg = load_config(CONFIG_DIR / "seed_questions.toml")
    quick = load_config(CONFIG_DIR / "seed_questions.toml", quick=True)
    assert cfg.study.questions == QUESTIONS
    assert quick.corpus.pairs != cfg.corpus.pairs and quick.quick and not cfg.quick


PAPER_CONFIGS = {"clark2019": "clark2019_attention.toml", "ethayarajh2019": "ethayarajh2019_anisotropy.toml",
                 "reimers2019": "reimers2019_pooling.toml", "jawahar2019": "jawahar2019_probing.toml"}


def test_paper_configs_cite_their_paper():
    from probing.study.reproductions import PAPERS

    assert set(PAPER_CONFIGS) == set(PAPERS)
    for key, name in PAPER_CONFIGS.items():
        text = (CONFIG_DIR / name).read_text()
        cfg = load_config(CONFIG_DIR / name)
        assert cfg.study.questions == (key,)
        assert "doi:10.18653/" in text and "2019" in text  # the citation
        assert load_config(CONFIG_DIR / name, quick=True).quick


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(PAPER_CONFIGS))
def test_paper_config_runs_quick_on_a_tiny_model(key, tmp_path, tiny_model_dir):
    """Each shipped reproduction config, in its --quick form with the tiny model: a report section with
    measured numbers, a table, and valid figures; a second run reuses everything."""
    from probing.study.reproductions import PAPERS

    over = {"model.name": str(tiny_model_dir), "study.out": str(tmp_path / "run"),
            "study.caches": str(tmp_path / "caches"), "probes.max_iter": 100,
            "model.random_init_seed": 1}  # not the tiny model's own seed-0 weights (a baseline with them is refused)
    report = run_study(CONFIG_DIR / PAPER_CONFIGS[key], quick=True, overrides=over, log=lambda *a: None)
    text = report.read_text()
    section = text.split(f"## {PAPERS[key].title}", 1)[1].split("## Provenance", 1)[0]
    answer = re.search(r"\*\*Answer\.\*\* (.*)", section).group(1)
    assert re.search(r"\d\.\d{3}", answer) and "not measured" not in answer, answer
    evidence = re.search(r"\*\*Evidence\.\*\* (.*)", section)
    assert "95% CI" in answer + (evidence.group(1) if evidence else "")
    assert "| layer |" in section or "| pooling |" in section  # the section's table
    figures = sorted((tmp_path / "run" / "figures").glob("*.png"))
    assert figures and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in figures)
    assert all(f"figures/{p.name}" in section for p in figures)
    logs: list[str] = []
    run_study(CONFIG_DIR / PAPER_CONFIGS[key], quick=True, overrides=over, log=logs.append)
    assert not [l for l in logs if "tokens through the model" in l]
    assert "reused from earlier runs" in (tmp_path / "run" / "report.md").read_text()


# ---------------------------------------------------------------------------------------------------
# Sections declared as data, verdicts from their tables, text generated from the config


def _drift_rows(concat_minus_pair: float, half: float = 0.002, role: str = "s1 words") -> "pd.DataFrame":
    """A paired_q2-like table (analyses.paired.run_paired_drift): one role, concat − pair, layers 0-2,
    with the p-value of a z-test from the half-width (Holm left to the verdict machinery)."""
    import pandas as pd
    from scipy import stats

    rows = []
    for layer in (0, 1, 2):
        v = concat_minus_pair * (layer > 0)
        se = half / 1.96
        rows.append({"analysis": "paired_drift", "reference": "single", "format": "pair", "format_b": "concat",
                     "layer": layer, "role": role, "metric": "drift_diff", "value": v, "ci_low": v - half,
                     "ci_high": v + half, "p_value": 2 * stats.norm.sf(abs(v) / se), "n": 100, "n_groups": 40,
                     "grouping": "document"})
    return pd.DataFrame(rows)


def test_q2_attention_evidence_is_paired_and_names_the_layers_that_differ():
    """Planted: sentence 1's words attend less to sentence 2 in `concat` at layers 2-3 (CIs below 0), alike
    elsewhere; the text names those layers and the largest row, and says when no layer differs."""
    import pandas as pd

    from probing.study.question_text import _attention_q2

    rows = pd.DataFrame([{"analysis": "paired_attention", "metric": "attention_diff", "role": "s1 words",
                          "target": "s2 words", "layer": L, "value": v, "ci_low": v - 0.004, "ci_high": v + 0.004,
                          "p_holm": 0.001 if abs(v) > 0.004 else 1.0}
                         for L, v in enumerate([0.0, 0.001, -0.02, -0.01, 0.0, 0.002, 0.0])])
    text = _attention_q2(rows)
    assert "`concat` − `pair` paired per example: less in `concat` at layers 2–3" in text, text
    assert "more in `concat`" not in text and "largest at layer 2: -0.020" in text
    assert "no layer differs" in _attention_q2(rows.assign(value=0.0, ci_low=-0.004, ci_high=0.004, p_holm=1.0))
    assert _attention_q2(rows.iloc[0:0]) == ""


def test_q2_verdict_reads_the_inner_words_and_the_evidence_names_the_edge_words():
    """An effect planted on the edge words only (the last word of sentence 1 is next to the middle [SEP])
    moves all of sentence 1's words, but the verdict reads the inner words: no difference there."""
    import pandas as pd

    from probing.study.question_text import answer_q2
    from probing.study.legacy_questions import QUESTION_SECTIONS

    cfg = load_config(None)
    T = {"paired_q2": pd.concat([_drift_rows(0.01, role="s1 words"), _drift_rows(0.0, role="s1 inner words"),
                                 _drift_rows(0.12, half=0.01, role="s1 edge words")], ignore_index=True)}
    v = QUESTION_SECTIONS["Q2"].verdict(T, cfg)
    assert v.decision == "no_difference" and "sentence 1's inner words move as far" in v.sentence, v.sentence
    text = answer_q2(T)
    assert "s1's words +0.010" in text and "s2's words" not in text  # no sentence-2 rows here
    T2 = {"paired_q2": pd.concat([T["paired_q2"], _drift_rows(0.01).assign(reference="single2", role="s2 words")],
                                 ignore_index=True)}
    assert "s2's words +0.010 (95% CI +0.008 to +0.012) (not a context effect alone: sentence 2 sits " \
           "one position earlier in `concat`" in answer_q2(T2), answer_q2(T2)
    assert "its edge words (the first and the last" in text and "+0.120 (95% CI +0.110 to +0.130" in text
    assert "against +0.000" in text or "against 0.000" in text or "against -0.000" in text, text
    # planted on the inner words too: the verdict finds it
    T["paired_q2"] = pd.concat([T["paired_q2"][T["paired_q2"]["role"] != "s1 inner words"],
                                _drift_rows(0.05, role="s1 inner words")], ignore_index=True)
    assert QUESTION_SECTIONS["Q2"].verdict(T, cfg).sentence.startswith(
        "Yes, in every layer: sentence 1's inner words move further from their states alone in `concat`")


def test_question_verdict_is_computed_from_its_table():
    from probing.study.legacy_questions import QUESTION_SECTIONS

    cfg = load_config(None)
    q2 = QUESTION_SECTIONS["Q2"]
    big = q2.verdict({"paired_q2": _drift_rows(0.05)}, cfg)
    # layer 0 (sentence 1's words embedded alike in every format: 0 by construction) is not read
    assert big.decision == "yes"
    assert big.sentence.startswith("Yes, in every layer: sentence 1's inner words move further")
    assert "+0.050" in big.sentence and "provisional" not in big.sentence and "40 documents" in big.sentence
    small = q2.verdict({"paired_q2": _drift_rows(0.01)}, cfg)
    assert small.decision == "yes_small" and "+0.010" in small.sentence
    null = q2.verdict({"paired_q2": _drift_rows(0.0, half=0.002)}, cfg)
    assert null.decision == "no_difference" and null.sentence.startswith("No measurable difference at any layer")
    weak = q2.verdict({"paired_q2": _drift_rows(0.0, half=0.05)}, cfg)
    assert weak.decision == "inconclusive"
    assert q2.verdict({}, cfg).decision == "not_measured"
    # the marginal drift table alone no longer decides: the verdict reads the paired rows only
    assert q2.verdict({"drift_q2": _drift_rows(0.05)}, cfg).decision == "not_measured"


def _probe_rows(diff: float, layers=(1.0, 2.0), **extra) -> "pd.DataFrame":
    """compare_probes-like rows (layers as floats, as the item tables give them)."""
    import pandas as pd

    rows = []
    for L in layers:
        v = diff * L / max(layers) if max(layers) > 0 else diff  # the strongest at the last layer
        rows.append({"analysis": "probe_comparison", "metric": "difference", "layer": L, "value": v,
                     "ci_low": v - 0.01, "ci_high": v + 0.01, "p_value": 0.001 if abs(v) > 0.01 else 0.8,
                     "p_holm": 0.002 if abs(v) > 0.01 else 1.0, "mde": 0.014, "n": 400, "n_groups": 80,
                     "groups_needed": 30, "grouping": "document", "family": "declared family", **extra})
    return pd.DataFrame(rows)


def test_q1_verdict_names_the_words_its_rows_compare_with():
    """paired_q1 compares [CLS] with every word of the example (run_role_contrast's versus="words"), so
    the sentence must not say "the words of sentence 1" (it did: -0.0070 at layer 6 is [CLS] − all
    words; [CLS] − sentence 1's words would be about -0.005)."""
    from probing.study.question_tables import _paired_q1
    import inspect

    from probing.study.legacy_questions import QUESTION_SECTIONS

    v = QUESTION_SECTIONS["Q1"].verdict(
        {"paired_q1": _probe_rows(-0.05, metric="normalised_drift_diff_roles", role="cls", role_b="words")},
        load_config(None))
    assert "the words of both sentences" in v.sentence and "sentence 1" not in v.sentence
    assert 'versus=' not in inspect.getsource(_paired_q1)  # the study keeps run_role_contrast's default: every word


@pytest.mark.parametrize("key,table,extra,words", [
    ("Q1", "paired_q1", {"metric": "normalised_drift_diff_roles", "role": "cls", "role_b": "words"}, "[CLS] changes"),
    ("Q4", "paired_q4", {"target": "is_next", "choice": None}, "middle [SEP]"),
    ("Q6", "paired_q6", {"target": "topic", "condition_a": "format=pair", "condition_b": "format=cls_last"},
     "placed first"),
    ("Q8", "paired_q8", {"target": "topic"}, "mean pooling"),
])
def test_probe_question_verdicts_follow_their_paired_rows(key, table, extra, words):
    from probing.study.legacy_questions import QUESTION_SECTIONS

    cfg = load_config(None)
    spec = QUESTION_SECTIONS[key]
    up = spec.verdict({table: _probe_rows(0.05, **extra)}, cfg)
    assert up.decision == "yes" and "+0.050" in up.sentence and "at layer 2" in up.sentence
    assert "provisional" not in up.sentence and words in up.sentence
    down = spec.verdict({table: _probe_rows(-0.05, **extra)}, cfg)
    assert down.decision == "yes" and "-0.050" in down.sentence and down.sentence != up.sentence
    null = spec.verdict({table: _probe_rows(0.0, **extra)}, cfg)
    assert null.decision == "no_difference" and ">= 0.014" in null.sentence
    # layer 0 ([CLS] is one vector for every input there) never decides
    zero = _probe_rows(0.0, layers=(0.0,), **extra)
    assert spec.verdict({table: zero}, cfg).decision == "not_measured"
    # the comparison table states the declared multiple-comparison family
    assert "declared family" in spec.comparison_table({table: _probe_rows(0.05, **extra)})[1]


def test_q8_asks_whether_cls_is_better_so_mean_pooling_ahead_answers_no():
    """Q8 is one-sided ("Is [CLS] better than mean pooling?"): mean pooling significantly ahead is a No,
    not a Yes about some difference; [CLS] ahead is a Yes."""
    from probing.study.legacy_questions import QUESTION_SECTIONS

    cfg = load_config(None)
    spec = QUESTION_SECTIONS["Q8"]
    down = spec.verdict({"paired_q8": _probe_rows(-0.05, target="topic")}, cfg).sentence
    up = spec.verdict({"paired_q8": _probe_rows(0.05, target="topic")}, cfg).sentence
    assert down.startswith("Frozen — No") and "mean pooling reads topic better than [CLS]" in down
    assert up.startswith("Frozen — Yes") and "[CLS] reads topic better than mean pooling" in up


def _finetune_rows(diffs: dict, half: float = 0.01) -> "pd.DataFrame":
    """finetune-table-like accuracy_diff rows: each pooling − mean after fine-tuning, and a fine-tuned −
    frozen row that the second part of Q8 must not read."""
    import pandas as pd

    rows = [{"metric": "accuracy_diff", "pooling": p, "pooling_b": "mean", "condition": "fine_tuned",
             "condition_b": "fine_tuned", "value": v, "ci_low": v - half, "ci_high": v + half,
             "p_value": 0.001 if abs(v) > half else 0.8, "p_holm": 0.004 if abs(v) > half else 1.0, "n": 600,
             "n_groups": 75, "grouping": "document"} for p, v in diffs.items()]
    rows.append({**rows[0], "pooling_b": rows[0]["pooling"], "condition_b": "frozen", "value": 0.3,
                 "ci_low": 0.29, "ci_high": 0.31})
    return pd.DataFrame(rows)


def test_q8_second_part_asks_whether_any_token_does_after_fine_tuning():
    """"After fine-tuning, would any token do?" is decided from the fine-tuned pooling − mean rows, per
    pooling, beside the frozen verdict."""
    from probing.study.legacy_questions import QUESTION_SECTIONS

    cfg = load_config(None)
    spec = QUESTION_SECTIONS["Q8"]
    frozen = _probe_rows(-0.05, target="topic")
    same = spec.verdict({"paired_q8": frozen, "finetune": _finetune_rows({"cls": 0.002, "first_word": -0.004})},
                        cfg).sentence
    assert same.startswith("Frozen — No, in any layer")
    assert (" After fine-tuning — No measurable difference at any "
            "pooling: after fine-tuning, every pooling reads topic as well as mean pooling") in same
    worse = spec.verdict({"paired_q8": frozen, "finetune": _finetune_rows({"cls": 0.002, "first_word": -0.05})},
                         cfg).sentence
    assert ("After fine-tuning — Only in pooling first_word (no measurable difference at pooling cls): after "
            "fine-tuning, mean pooling reads topic better than this pooling") in worse and "-0.050" in worse
    wide = spec.verdict({"finetune": _finetune_rows({"cls": 0.0, "max": 0.0}, half=0.05)}, cfg).sentence
    assert wide.startswith("Frozen — Not measured. After fine-tuning — Inconclusive")
    table, caption = spec.comparison_table({"paired_q8": frozen, "finetune": _finetune_rows({"cls": 0.0})})
    assert list(table["part"]) == ["Frozen", "Frozen", "After fine-tuning"] and "pooling − mean" in caption
    assert "per layer or pooling, each row decided" in caption
    assert list(table.columns[:3]) == ["part", "layer", "pooling"]
    assert table["pooling"].tolist() == ["–", "–", "cls"] and table["layer"].tolist() == [1.0, 2.0, "–"]


def test_power_sentence_is_generated_from_groups_needed():
    from probing.study.question_text import power_text

    rows = _probe_rows(0.0)
    assert "can detect a difference of 0.03 at every layer (needs at most 30)" in power_text(rows, "it")
    short = power_text(rows.assign(groups_needed=[120, 300]), "it")
    assert "cannot reliably detect a difference of 0.03" in short and "about 300 documents" in short
    assert "80 documents" in short
    # the sentence names the layer it is about (the layer quoted before it may have the power)
    assert "at every layer: at layer 2 that would take about 300 documents" in short, short
    one = power_text(rows.iloc[[1]].assign(groups_needed=300), "it")
    assert ": that would take about 300 documents" in one and "every layer" not in one


def _finetune_table(n_frozen: int = 50):
    """The fine-tuning table's layout (analyses.finetune._table): a split's baselines first (fold 0), then the
    pooled ones (fold empty), per-pooling summaries, and paired differences naming both sides."""
    import pandas as pd

    rows = [{"metric": "best_constant", "condition": "baseline", "value": 0.5, "fold": 0},
            {"metric": "chance", "condition": "baseline", "value": 0.2, "fold": 0}]
    for pooling, ft, fr in (("cls", 0.8, 0.7), ("mean", 0.82, 0.75)):
        rows += [
            {"metric": "test_accuracy_mean", "pooling": pooling, "condition": "fine_tuned", "value": ft,
             "ci_low": ft - 0.05, "ci_high": ft + 0.05, "n": 50, "n_runs": 6, "warning": ""},
            {"metric": "frozen_test_accuracy_mean", "pooling": pooling, "condition": "frozen", "value": fr,
             "ci_low": fr - 0.05, "ci_high": fr + 0.05, "n": n_frozen, "n_runs": 3, "warning": ""},
            {"metric": "accuracy_diff", "pooling": pooling, "condition": "fine_tuned", "pooling_b": pooling,
             "condition_b": "frozen", "value": ft - fr, "ci_low": ft - fr - 0.04, "ci_high": ft - fr + 0.04,
             "p_value": 0.01, "p_holm": 0.02, "n": 50},
            {"metric": "test_accuracy", "pooling": pooling, "condition": "fine_tuned", "seed": 0, "value": ft, "n": 25,
             "fold": 0, "warning": "test accuracy 0.1 below the best constant 0.3" if pooling == "mean" else ""},
        ]
    rows += [{"metric": "accuracy_diff", "pooling": "cls", "condition": "frozen", "pooling_b": "mean",
              "condition_b": "frozen", "value": -0.05, "ci_low": -0.09, "ci_high": -0.01, "p_value": 0.01,
              "p_holm": 0.03, "n": 50},
             {"metric": "best_constant", "condition": "baseline", "value": 0.3},
             {"metric": "chance", "condition": "baseline", "value": 0.2},
             {"metric": "n_skipped", "condition": "", "value": 3}]
    return pd.DataFrame(rows)


def test_q8_reads_the_same_split_fine_tuning_layout():
    from probing.study.question_figures import q8_same_items
    from probing.study.legacy_questions import QUESTION_SECTIONS
    from probing.study import skip_counts

    t = q8_same_items(_finetune_table())
    assert list(t["pooling"]) == ["cls", "mean"] and t["same test items"].all()
    assert t.loc[0, "fine-tuned − frozen"].startswith("+0.100 (95% CI +0.060 to +0.140)")
    assert not q8_same_items(_finetune_table(n_frozen=40))["same test items"].any()
    small = _finetune_table()
    small.loc[small["metric"] == "accuracy_diff", "p_holm"] = 0.00065
    assert set(q8_same_items(small)["p (Holm)"]) == {"< 0.001"}  # as every other table prints it, not 0.001
    ev = QUESTION_SECTIONS["Q8"].answer({"finetune": _finetune_table()})
    assert "cls fine-tuned 0.800" in ev and "frozen 0.700" in ev
    assert "Best constant 0.300" in ev  # the pooled one, not the first split's (0.500)
    assert "cls − mean (frozen): −0.050" in ev or "cls − mean (frozen): -0.050" in ev, ev
    assert "fine_tuned − frozen" not in ev  # the same-pooling differences are in the table above it
    assert "**Warning:** 1 of 2 runs flagged" in ev
    assert "Warning" not in QUESTION_SECTIONS["Q8"].answer({"finetune": _finetune_table().assign(warning="")})
    # how the runs computed, from the table's autocast column (written as text in the CSV)
    assert "computed" not in ev  # an older table without the column: nothing claimed
    for col, said in (([True, True], "under bfloat16 autocast (float32 weights and optimiser)"),
                      (["False", "False"], "computed in float32."), ([True, False], "Some fine-tuning runs")):
        t = _finetune_table()
        t["autocast"] = (col * len(t))[:len(t)]
        assert said in QUESTION_SECTIONS["Q8"].answer({"finetune": t})
    assert skip_counts({"pairs": 2}, _finetune_table()) == "2 at extraction (pairs 2); 3 in fine-tuning (Q8)"


def test_knockout_sentence_compares_with_the_control():
    import pandas as pd

    from probing.study.question_text import knockout_text

    # the verdict reads each role's drift over its own spread; the raw difference (here 1000× smaller, as for
    # [CLS] in a sentence encoder's middle layers) would call any effect small
    drift = pd.DataFrame([{"analysis": "intervention_drift", "layer": L, "role": "cls", "metric": m,
                           "value": v * k, "ci_low": (v - 0.01) * k, "ci_high": (v + 0.01) * k}
                          for L, v in ((1, 0.0), (2, 0.08))
                          for m, k in (("normalised_drift_difference", 1.0), ("drift_difference", 1e-3))])
    probes = pd.DataFrame([{"analysis": "intervention_probes", "mode": "transfer", "target": "is_next", "layer": 2,
                            "metric": m, "value": v, "ci_low": v - 0.02, "ci_high": v + 0.02}
                           for m, v in (("accuracy_clean", 0.7), ("accuracy_treated", 0.6),
                                        ("accuracy_control", 0.69), ("change_difference", -0.09))])
    s = knockout_text({"q4_knockout_drift": drift, "q4_knockout_probes": probes})
    assert ("Only in layer 2 (no measurable difference at layer 1): knocking out attention to [SEP] moves [CLS] more "
            "than the control") in s
    assert "+0.080" in s and "lowers the accuracy more than the control" in s and "-0.090" in s
    assert "is_next ([CLS], layer 2; clean 0.700, treated 0.600, control 0.690)" in s
    words = drift[drift["metric"] == "normalised_drift_difference"].assign(
        role="word", value=[0.0, -0.05], ci_low=[-0.001, -0.06], ci_high=[0.001, -0.04])
    w = knockout_text({"q4_knockout_drift": pd.concat([drift, words]), "q4_knockout_probes": probes})
    assert ("Words: Only in layer 2 (no measurable difference at layer 1): the control knockout moves the words more "
            "than knocking out attention to [SEP] does") in w and "-0.050" in w
    assert "Words:" not in s  # no word rows, no sentence
    flat = knockout_text({"q4_knockout_drift": drift.assign(value=0.0, ci_low=-0.001, ci_high=0.001),
                          "q4_knockout_probes": probes})
    assert "moves [CLS] no more than the control knockout" in flat
    assert knockout_text({}) == ""


def test_knockout_probe_verdict_leaves_out_layers_where_the_clean_probe_is_at_its_baseline():
    import pandas as pd

    from probing.study.question_text import knockout_text

    def rows(layer, clean, lo, diff):
        base = {"analysis": "intervention_probes", "mode": "transfer", "target": "is_next", "layer": layer}
        return [{**base, "metric": "accuracy_clean", "value": clean, "ci_low": lo, "ci_high": clean + 0.03},
                {**base, "metric": "majority_baseline", "value": 0.5, "ci_low": float("nan"), "ci_high": float("nan")},
                {**base, "metric": "change_difference", "value": diff, "ci_low": diff - 0.005, "ci_high": diff + 0.005,
                 "p_value": 0.001 if abs(diff) > 0.01 else 0.8, "mde": 0.01}]

    # layer 3 reads is_next and loses 0.05 of it; layer 6 is at chance, where a large "gain" is meaningless
    probes = pd.DataFrame(rows(3, 0.63, 0.60, -0.05) + rows(6, 0.52, 0.49, 0.002))
    s = knockout_text({"q4_knockout_probes": probes})
    assert "is_next ([CLS], layers 3, 6; clean accuracy 0.520 to 0.630, majority baseline 0.500)" in s, s
    assert "lowers the accuracy more than the control" in s and "-0.050" in s
    assert ("Left out of the verdict: layer 6, where the clean probe's CI reaches its majority baseline "
            "(0.520 at layer 6)") in s
    assert "at layer 6" not in s.split("Left out")[0]  # the verdict itself is over layer 3 only
    at_chance = pd.DataFrame(rows(6, 0.52, 0.49, 0.002))
    assert ("no verdict: the clean probe's CI reaches its majority baseline at every probed layer, so a knockout has "
            "nothing to lower (knockout − control at layer 6: +0.002"
            ) in knockout_text({"q4_knockout_probes": at_chance})


def test_every_section_is_declared_once_with_its_parts():
    from probing.study.legacy_questions import QUESTION_SECTIONS
    from probing.study.reproductions import PAPERS, Reproduction
    from probing.study.sections import StudySection
    from probing.study import section_specs, sections

    assert Reproduction is StudySection
    assert tuple(QUESTION_SECTIONS) == QUESTIONS and sections() == QUESTIONS + tuple(PAPERS)
    for key, spec in section_specs().items():
        assert spec.key == key and spec.corpora and callable(spec.analyse) and callable(spec.figures)
        if key in QUESTIONS:
            assert spec.comparisons is not None and spec.claim is not None
    assert {k for k, s in section_specs().items() if s.about_cls} >= {"Q1", "Q4", "Q6", "Q8"}


def test_study_jobs_union_of_sections():
    from probing.study.sections import Job
    from probing.study import study_jobs

    cfg = load_config(None, overrides={"study.questions": ["Q1", "Q3"], "model.random_init_baseline": False})
    corpora = {"pairs": [], "groups": [], "groups_k2": [], "groups_k3": []}
    jobs = study_jobs(cfg, corpora)
    assert Job("pairs", "pair", attention=True) in jobs and Job("pairs", "concat_segments") in jobs
    assert {j for j in jobs if j.corpus.startswith("groups_k")} == {
        Job("groups_k2", "multi"), Job("groups_k2", "concat"), Job("groups_k3", "multi"), Job("groups_k3", "concat")}
    assert not any(j.random for j in jobs) and len(jobs) == len(set(jobs))
    # Q1's patching and middle-[SEP] routes are extractions of `pair` with an intervention
    assert Job("pairs", "pair", intervention="cls_patch_mid") in jobs
    assert Job("pairs", "pair", intervention="sep1_all_ko") in jobs
    q4 = study_jobs(load_config(None, overrides={"study.questions": ["Q4"]}), corpora)
    assert {j.name for j in q4 if j.intervention} == {"pair@sep_ko", "pair@sep_ko_control"}


def test_interventions_are_built_for_the_model_depth():
    from probing.study.question_tables import make_intervention, patch_layers

    assert patch_layers(6) == {"cls_patch_first": 1, "cls_patch_mid": 3, "cls_patch_late": 5}
    ko = make_intervention("sep_ko", 6)
    assert [k.layers for k in ko.knockouts] == [(3, 4)] and not ko.knockouts[0].control
    assert make_intervention("sep_ko_control", 6).knockouts[0].control
    with pytest.raises(ValueError, match="unknown intervention 'nope'"):
        make_intervention("nope", 6)


def test_model_facts_and_caveats():
    from probing.study.model_facts import cls_caveat, model_facts, model_sentence

    assert model_facts("sentence-transformers/all-MiniLM-L6-v2").nsp is False
    s = model_sentence("all-MiniLM-L6-v2")
    assert "mean pooling" in s and "contrastive" in s and "--model bert-base-uncased" in s
    assert "download" in s and "local" in s  # a Hugging Face id needs a download or a local copy: say so
    assert "BERT" in cls_caveat("all-MiniLM-L6-v2") and "next-sentence" in cls_caveat("all-MiniLM-L6-v2")
    assert cls_caveat("bert-base-uncased") == "" and "next-sentence prediction" in model_sentence("bert-base-uncased")
    assert "no record" in model_sentence("/tmp/tiny") and "/tmp/tiny" in cls_caveat("/tmp/tiny")


def test_limits_and_protocol_text_come_from_the_config():
    from probing.study.legacy_questions import QUESTION_SECTIONS
    from probing.study.reproductions import PAPERS
    from probing.study import run_limits

    cfg = load_config("seed_questions", quick=True)
    corpora = {"groups": [None] * 60}
    text = run_limits(cfg, corpora, QUESTION_SECTIONS["Q3"], "all-MiniLM-L6-v2")
    assert "60 examples of generated template sentences (generated:n=60,k=4,pairing=consecutive)" in text
    assert "Quick mode" in text
    q3_note = QUESTION_SECTIONS["Q3"].note_text(cfg)
    assert "news" not in q3_note and "article" not in q3_note
    full = load_config("seed_questions")
    assert "BBC News" in QUESTION_SECTIONS["Q3"].note_text(full)
    assert "Quick mode" not in run_limits(full, corpora, QUESTION_SECTIONS["Q3"], "x")
    assert "mean pooling" in run_limits(full, {"pairs": [1]}, QUESTION_SECTIONS["Q8"], "all-MiniLM-L6-v2")
    eth = load_config("ethayarajh2019_anisotropy", quick=True)
    notes = PAPERS["ethayarajh2019"].note_text(eth)
    assert "generated template sentences" in notes and "news" not in notes and "centred" in notes
    clark = load_config("clark2019_attention")
    assert "BBC News sentences" in PAPERS["clark2019"].note_text(clark)


def test_intervals_description_follows_the_grouping_column():
    import pandas as pd

    from probing.study.report import describe_intervals, fmt

    probe = pd.DataFrame({"analysis": ["probe"], "value": [0.5], "ci_low": [0.4], "ci_high": [0.6]})
    assert "out-of-fold predictions over examples" in describe_intervals({"p": probe})
    assert "out-of-fold predictions over documents" in describe_intervals({"p": probe.assign(grouping="document")})
    both = describe_intervals({"p": probe.assign(grouping="document"), "q": probe.assign(grouping="example")})
    assert "over documents or examples" in both
    cka = pd.DataFrame({"analysis": ["cka"], "value": [0.9], "ci_low": [float("nan")], "ci_high": [float("nan")]})
    assert "cka: point values (no CI)" in describe_intervals({"c": cka})
    assert fmt((0.0021, 0.0019, 0.0024)) == "0.0021 (95% CI 0.0019 to 0.0024)"


def test_quick_notice_names_only_what_this_run_shrank():
    import pandas as pd

    from probing.study.report import quick_notice

    cfg = load_config("seed_questions", quick=True)
    plain = quick_notice(cfg, {"pairs": [0] * 120}, {})
    assert plain.startswith("QUICK MODE") and "pairs 120" in plain and "200 bootstrap resamples" in plain
    assert "probe folds" not in plain and "fine-tuning" not in plain
    probes = quick_notice(cfg, {"pairs": [0] * 120}, {"p": pd.DataFrame({"analysis": ["probe"]})})
    assert "3 probe folds" in probes


def _eth_table(baselines):
    import pandas as pd

    return pd.DataFrame([{"analysis": "contextuality", "layer": L, "metric": "anisotropy_baseline", "value": v,
                          "ci_low": v - 0.002, "ci_high": v + 0.002} for L, v in enumerate(baselines)])


def test_ethayarajh_anisotropy_follows_the_declared_threshold():
    from probing.study.reproductions import ANISOTROPY_THRESHOLD, PAPERS

    eth, cfg = PAPERS["ethayarajh2019"], load_config(None)
    assert ANISOTROPY_THRESHOLD == 0.1
    v = eth.verdict({"ethayarajh2019": _eth_table([0.054, 0.124, 0.143, 0.161, 0.185, 0.248, 0.030])}, cfg)
    assert v.sentence.startswith("Only in layers 1–5 of 0–6") and "does not hold" in v.sentence
    every = eth.verdict({"ethayarajh2019": _eth_table([0.2, 0.3, 0.4])}, cfg).sentence
    assert every.startswith("Yes, anisotropic in every layer")
    assert eth.verdict({"ethayarajh2019": _eth_table([0.03, 0.05])}, cfg).sentence.startswith("No: no layer")


def test_reimers_says_mean_pooling_wins_by_construction_on_a_mean_pooled_model():
    import pandas as pd

    from probing.study.reproductions import PAPERS

    rg = PAPERS["reimers2019"]
    knn = pd.DataFrame([{"analysis": "knn", "layer": 6, "choice": r, "metric": "knn_accuracy", "value": v,
                         "ci_low": v - 0.02, "ci_high": v + 0.02} for r, v in (("cls", 0.6), ("mean", 0.7))])
    mini = load_config(None, overrides={"model.name": "all-MiniLM-L6-v2"})
    # the marginal accuracies alone do not decide: the verdict reads the paired rows
    assert rg.verdict({"reimers2019_knn": knn}, mini) is None
    paired = [{"analysis": "knn_comparison", "layer": L, "choice": c, "choice_b": "cls", "metric": "knn_accuracy_diff",
               "value": v, "ci_low": v - 0.03, "ci_high": v + 0.03, "p_value": 0.001, "p_holm": 0.005, "n": 600,
               "n_groups": 200, "grouping": "document"} for L, c, v in ((5, "mean", 0.0), (6, "mean", 0.1),
                                                                         (6, "max", -0.2))]
    knn = pd.concat([knn, pd.DataFrame(paired)], ignore_index=True)
    s = rg.verdict({"reimers2019_knn": knn}, mini).sentence
    assert s.startswith("Yes: the cosine nearest neighbour of a mean-pooled vector") and "by construction" in s
    assert "+0.100" in s and "paired on the same examples" in s and "200 documents" in s and "provisional" not in s
    bert = load_config(None, overrides={"model.name": "bert-base-uncased"})
    assert "by construction" not in rg.verdict({"reimers2019_knn": knn}, bert).sentence
    assert "by construction" not in rg.note_text(mini)  # said once, in the verdict


def test_clark_verdict_names_the_layers_above_one_half():
    import pandas as pd

    from probing.study.reproductions import PAPERS

    mass = [0.2, 0.3, 0.62, 0.7, 0.66, 0.35, 0.495]
    a = pd.DataFrame([{"analysis": "attention", "layer": L, "head": "mean", "role": "all tokens", "target": t,
                       "metric": "attention_mass", "value": v if t == "all [SEP]" else 0.05,
                       "ci_low": (v if t == "all [SEP]" else 0.05) - 0.02,
                       "ci_high": (v if t == "all [SEP]" else 0.05) + 0.02}
                      for L, v in enumerate(mass) for t in ("all [SEP]", "cls")])
    v = PAPERS["clark2019"].verdict({"clark2019_attention": a}, load_config(None))
    assert v.sentence.startswith("Only in layers 2–4 (the opposite at layers 0–1, 5; "
                                 "no measurable difference at layer 6): more than 0.5 of the attention")
    assert "at layer 3: +0.200" in v.sentence


def test_per_item_predictions_are_released_once_no_later_table_reads_them(monkeypatch):
    """Q8's paired table runs before its fine-tuning, and the items go before the fine-tuning starts;
    a released item table asked for again is computed again, not a KeyError."""
    from probing.study import question_tables as QT
    from probing.study.legacy_questions import QUESTION_SECTIONS
    from probing.study.sections import Context

    calls, seen = [], {}

    def producer(name, items=False):
        def make(ctx):
            calls.append(name)
            if name == "finetune":
                seen["items at fine-tuning"] = sorted(k for k in ctx.tables if k.endswith(":items"))
            if items:
                ctx.tables[f"{name}:items"] = pd.DataFrame({"x": [1]})
            return pd.DataFrame({"value": [0.0]})
        return make

    fake = {n: producer(n, items=n in QT.ITEM_READERS) for n in QT.PRODUCERS}
    for n in ("paired_q4", "paired_q5", "paired_q6", "paired_q7", "paired_q8"):
        fake[n] = lambda ctx, n=n: (calls.append(n), [QT._items(ctx, t) for t, readers in QT.ITEM_READERS.items()
                                                      if n in readers], pd.DataFrame({"value": [0.0]}))[-1]
    monkeypatch.setattr(QT, "PRODUCERS", fake)
    released = []
    real_hand_back = QT.hand_back_freed
    monkeypatch.setattr(QT, "hand_back_freed", lambda: (released.append(1), real_hand_back()))
    ctx = Context(cfg=load_config(None), caches=None, corpora={}, lm=None, out=Path("."))
    sections = [QUESTION_SECTIONS[q] for q in QUESTIONS]
    for i, s in enumerate(sections):
        ctx.later = tuple(t for later in sections[i + 1:] for t in later.tables)
        s.analyse(ctx)
        left = sorted(k for k in ctx.tables if k.endswith(":items"))
        if s.key == "Q4":
            assert left == ["probes_pair:items"]  # Q7 and Q8 still read it
        if s.key == "Q6":
            assert left == ["probes_pair:items"]  # Q6's went with its paired table (Q5 keeps none)
    assert seen["items at fine-tuning"] == []
    assert calls.index("paired_q8") < calls.index("finetune")
    assert calls.count("probes_pair") == 1 and released
    # a later reader finds the items gone and gets them computed again
    QT._items(ctx, "probes_pair")
    assert calls.count("probes_pair") == 2 and "probes_pair:items" in ctx.tables


def _q3_rows(role: str, growth: float, spread: float, metric: str = "normalised_drift_growth") -> "pd.DataFrame":
    """paired_q3-like rows (analyses.paired.run_prefix_drift) of one cell, layers 0-2, k = 2 → 5."""
    return _drift_rows(growth, role=role).assign(metric=metric, k=2, k_b=5, spread_a=spread, value_a=0.1,
                                                 value_b=lambda d: 0.1 + d["value"], family="Holm over layers")


def test_q3_verdict_has_a_part_for_cls_and_one_for_the_inner_words_each_over_its_spread():
    """Q3 reads run_prefix_drift's normalised rows in two parts, [CLS] and the inner words of sentences 1-2,
    layers 1-L: [CLS]'s growth is decided on its own scale, not pooled with ~40 words per [CLS]."""
    import pandas as pd

    from probing.study.legacy_questions import QUESTION_SECTIONS

    cfg = load_config(None)
    q3 = QUESTION_SECTIONS["Q3"]
    # planted: [CLS] grows by 0.3 of its spread, the inner words by nothing
    T = {"paired_q3": pd.concat([_q3_rows("cls", 0.3, 1e-5), _q3_rows("inner words", 0.0, 0.9),
                                 _q3_rows("cls and inner words", 0.0, float("nan"), "drift_growth"),
                                 _q3_rows("s2 edge words", 0.2, 0.7)], ignore_index=True)}
    v = q3.verdict(T, cfg)
    cls_part, words_part = v.sentence.split(" Inner words of sentences 1–2 — ")
    assert cls_part.startswith("[CLS] — Yes, in every layer: [CLS] moves further from `concat` with more segments, "
                               "against its own spread between inputs"), cls_part
    assert "paired per example" in cls_part and "40 documents" in cls_part and "provisional" not in v.sentence
    assert words_part.startswith("No measurable difference"), words_part  # the edge words' growth is not read
    table, caption = q3.comparison_table(T)
    assert list(table["layer"]) == [1, 2, 1, 2]
    assert list(table["part"]) == ["[CLS]"] * 2 + ["Inner words of sentences 1–2"] * 2
    # each part's multiple-comparison family named after it, "[CLS]" as it is written
    assert "[CLS]: Holm over layers; inner words of sentences 1–2: Holm over layers" in caption, caption
    # the other way round: words grow, [CLS] does not
    T = {"paired_q3": pd.concat([_q3_rows("cls", 0.0, 1e-5), _q3_rows("inner words", 0.05, 0.9)], ignore_index=True)}
    v = q3.verdict(T, cfg)
    assert v.sentence.startswith("[CLS] — No measurable difference")
    assert "Inner words of sentences 1–2 — Yes" in v.sentence
    # the raw or pooled rows alone decide nothing, nor the marginal table
    raw = {"paired_q3": pd.concat([_q3_rows("cls", 0.3, 1e-5, "drift_growth"),
                                   _q3_rows("cls and inner words", 0.3, 1e-5, "drift_growth")], ignore_index=True)}
    assert q3.verdict(raw, cfg).decision == "not_measured"
    assert q3.verdict({"drift_q3": _q3_rows("cls", 0.3, 1e-5, "drift_mean")}, cfg).decision == "not_measured"


def test_q3_evidence_states_the_spreads_each_part_is_read_against():
    """The evidence gives each part's spread per layer (two [CLS] of different inputs lie far closer than two
    words) and the normalised drifts at the last layer."""
    import pandas as pd

    from probing.study.question_text import _spreads_q3

    p = pd.concat([_q3_rows("cls", 0.3, 1.2e-5), _q3_rows("inner words", 0.01, 0.87),
                   _q3_rows("cls", 1e-6, 1.2e-5, "drift_growth")], ignore_index=True)
    s = _spreads_q3(p)
    assert "two [CLS] — 1: 1.2e-05, 2: 1.2e-05" in s and "two inner words — 1: 0.87, 2: 0.87" in s, s
    assert "0: " not in s  # layer 0 is no comparison
    assert "at layer 2: [CLS] 0.100 → 0.400, inner words 0.100 → 0.110" in s, s
    assert _spreads_q3(p[p["metric"] != "normalised_drift_growth"]) == ""  # tables without normalised rows


def test_q3_evidence_sets_cls_growth_against_each_ks_own_spread():
    """The verdict divides both k's drifts by the k = 2 spread; the evidence gives [CLS]'s spread at the largest
    k against it and the growth with each k's drift over its own spread, with its CI (paired_q3's
    ``own_spread_drift_growth`` rows): whether each layer keeps the verdict's sign and whether its CI excludes 0.
    Planted: 0.1 → 0.4 of the k = 2 spread; with the k = 5 spread 5 times as large at layer 2, 0.08 − 0.1 < 0."""
    import pandas as pd

    from probing.study.question_text import _cls_spread_at_largest_k

    base = {"role": "cls", "k": 2, "k_b": 5, "value_a": 0.1, "spread_a": 0.01}
    verdict = [{**base, "metric": "normalised_drift_growth", "layer": L, "value": 0.3, "value_b": 0.4,
                "ci_low": 0.29, "ci_high": 0.31} for L in (0, 1, 2)]

    def own(layer2_spread, ci2):
        return [{**base, "metric": "own_spread_drift_growth", "layer": L, "spread_b": sp, "value_b": 0.4 * 0.01 / sp,
                 "value": 0.4 * 0.01 / sp - 0.1, "ci_low": lo, "ci_high": hi, "p_holm": 0.001}
                for L, sp, (lo, hi) in ((1, 0.01, (0.28, 0.32)), (2, layer2_spread, ci2))]

    same = _cls_spread_at_largest_k(pd.DataFrame(verdict + own(0.01, (0.27, 0.33))))
    assert "spread at k = 5 is 1.00–1.00 times its spread at k = 2 (layers 1–2)" in same, same
    assert "1: +0.300 (95% CI +0.280 to +0.320; Holm p = 0.001)" in same, same
    assert "the same sign as the verdict's row in every layer, and its CI excludes 0 in every layer" in same, same
    assert "0: " not in same  # layer 0 is no comparison
    wide = _cls_spread_at_largest_k(pd.DataFrame(verdict + own(0.05, (-0.05, 0.01))))
    assert "1.00–5.00 times" in wide and "2: -0.020 (95% CI -0.050 to +0.010" in wide, wide
    assert "the opposite sign to the verdict's row at layer 2, and its CI excludes 0 at layer 1 only" in wide, wide
    assert _cls_spread_at_largest_k(pd.DataFrame(verdict)) == ""  # a table without the rows: nothing said
    assert _cls_spread_at_largest_k(None) == ""


def _q7_tables(content: float, length: float, order: float) -> dict:
    """Q7's three inputs: [CLS] − length-only macro AUC rows for bow_s1 and the length probe with its
    majority baseline (the pair-format probe table), and word order (swap corpus), layers 1-2."""
    import pandas as pd

    auc = _probe_rows(content, model_kind="trained", choice="cls", choice_b="length_only", target="bow_s1",
                      metric="macro_auc_diff")

    def probe(target: str, above: float) -> pd.DataFrame:
        rows = []
        for L in (1, 2):
            rows += [{"model_kind": "trained", "choice": "cls", "target": target, "layer": L, "metric": "accuracy",
                      "value": 0.5 + above, "ci_low": 0.5 + above - 0.01, "ci_high": 0.5 + above + 0.01, "n": 600,
                      "n_groups": 85, "grouping": "document"},
                     {"model_kind": "trained", "choice": "cls", "target": target, "layer": L,
                      "metric": "majority_baseline", "value": 0.5, "ci_low": 0.5, "ci_high": 0.5, "n": 600}]
        return pd.DataFrame(rows)

    return {"probes_pair": pd.concat([probe("length", length), auc], ignore_index=True),
            "probes_q7": probe("swapped", order)}


def test_q7_asks_whether_what_cls_holds_of_the_content_words_is_learned():
    """Q7's part against random weights: [CLS]'s content-word macro AUC on the trained model − [CLS]'s on the
    same architecture with random weights. A random encoder already ahead is a No, a planted advantage a Yes,
    a null neither; layer 0 is never read; Holm is redone over layers 1–L; without the random-init run the part
    is not measured."""
    from analyses.stats import holm
    from probing.study.question_rows import CLS_AUC_VS_RANDOM_FAMILY, _q7_untrained_rows
    from probing.study.legacy_questions import QUESTION_SECTIONS

    cfg, q7 = load_config(None), QUESTION_SECTIONS["Q7"]

    def tables(diff: float) -> dict:
        T = _q7_tables(content=0.2, length=0.2, order=0.0)
        versus = _probe_rows(diff, layers=(0.0, 1.0, 2.0), model_kind="trained", model_kind_b="random_init",
                             choice="cls", choice_b="cls", target="bow_s1")
        versus["metric"], versus["p_holm"] = "macro_auc_diff", 0.9
        T["probes_pair"] = pd.concat([T["probes_pair"], versus], ignore_index=True)
        return T

    part = "Content words of sentence 1 against random weights — "
    behind = q7.verdict(tables(-0.08), cfg).sentence.split(part)[1]
    assert behind.startswith("No, in any layer: the [CLS] of the same architecture with random weights reads "
                             "sentence 1's content words better than the trained [CLS]")
    ahead = q7.verdict(tables(0.08), cfg).sentence.split(part)[1]
    assert ahead.startswith("Yes, in every layer: [CLS] reads sentence 1's content words better than the [CLS] "
                            "of the same architecture with random weights")
    assert q7.verdict(tables(0.0), cfg).sentence.split(part)[1].startswith("No measurable difference at any layer")
    rows = _q7_untrained_rows(tables(0.08))
    assert sorted(rows["layer"]) == [1, 2] and set(rows["family"]) == {CLS_AUC_VS_RANDOM_FAMILY}
    assert np.allclose(rows["p_holm"], holm(rows["p_value"].to_numpy(float)))
    plain = _q7_tables(content=0.2, length=0.2, order=0.0)
    assert _q7_untrained_rows(plain) is None and part + "Not measured." in q7.verdict(plain, cfg).sentence


def test_q7_answers_content_length_and_word_order_each_by_the_rules():
    """Q7 asks whether the input can be recovered: one verdict per part, each from its own rows."""
    from probing.study.legacy_questions import QUESTION_SECTIONS

    cfg = load_config(None)
    q7 = QUESTION_SECTIONS["Q7"]
    v = q7.verdict(_q7_tables(content=-0.05, length=0.2, order=0.0), cfg).sentence
    content, rest = v.split(" Sentence length — ")
    length, order = rest.split(" Word order — ")
    assert content.startswith("Content words of sentence 1 — No, in any layer: a probe on sentence length alone")
    assert length.startswith("Yes, in every layer: sentence length (words per sentence) can be read from [CLS]")
    assert "+0.200" in length and "85 documents" in length
    assert order.startswith("No measurable difference at any layer: word order cannot be read from [CLS]")
    up = q7.verdict(_q7_tables(content=0.05, length=0.0, order=0.2), cfg).sentence
    # the planted difference is 0.025 at layer 1, under the practical threshold: named, beside layer 2's 0.05
    assert ("Content words of sentence 1 — Yes, in every layer (below the practical threshold at layer 1): [CLS] "
            "reads sentence 1's content words better") in up
    assert "Sentence length — No measurable difference" in up and "Word order — Yes, in every layer" in up
    # the report table holds every part's rows, named, and the caption says what each part compares
    table, caption = q7.comparison_table(_q7_tables(0.05, 0.2, 0.0))
    assert list(table["part"].unique()) == ["Content words of sentence 1", "Sentence length", "Word order"]
    assert len(table) == 6 and "length-only probe" in caption and "majority baseline" in caption
    # the content part's Holm is redone over the layers it reads (1–L), so its caption names that family, not
    # the one its rows were stored with
    assert "[CLS] − length-only macro AUC over layers 1–L (Holm over layers)" in caption
    assert "declared family" not in caption
    from analyses.stats import holm
    from probing.study.question_rows import _q7_content_rows

    stored = _q7_tables(0.05, 0.2, 0.0)
    stored["probes_pair"].loc[stored["probes_pair"]["metric"] == "macro_auc_diff", "p_holm"] = 0.9
    rows = _q7_content_rows(stored)
    assert sorted(rows["layer"]) == [1, 2] and np.allclose(rows["p_holm"], holm(rows["p_value"].to_numpy(float)))
    # a part without its table is "Not measured", the others still decided
    partial = q7.verdict({k: t for k, t in _q7_tables(0.05, 0.2, 0.0).items() if k != "probes_q7"}, cfg)
    assert partial.sentence.endswith("Word order — Not measured.") and partial.decision == "yes"


def test_q7_evidence_lists_only_its_own_choices_against_length():
    """probes_pair also holds Q4's sep1/sep2 − length-only rows; Q7 (about [CLS]) lists only [CLS] and mean."""
    import pandas as pd

    from probing.study.legacy_questions import QUESTION_SECTIONS

    T = _q7_tables(content=0.05, length=0.2, order=0.0)
    cls = T["probes_pair"][T["probes_pair"]["choice_b"].eq("length_only")]
    T["probes_pair"] = pd.concat([T["probes_pair"], cls.assign(choice="sep1", value=0.31)], ignore_index=True)
    text = QUESTION_SECTIONS["Q7"].answer(T)
    assert "Macro AUC − the length-only probe's" in text and "bow_s1 cls +0.050" in text
    assert "sep1" not in text and "+0.310" not in text


def _q5_table(cases):
    """A probes_q5 table: per sentence ``(cls AUC, length-only AUC, cls F1)`` at layer 6, with the
    macro_auc_diff rows run_probes writes (CI ± 0.02 around the difference, p from it)."""
    import pandas as pd

    rows = []
    for s, (auc, length, f1) in enumerate(cases, start=1):
        base = {"model_kind": "trained", "target": f"bow_s{s}", "n": 300, "n_groups": 192, "grouping": "document"}
        cls = {**base, "choice": "cls", "layer": 6}
        d = auc - length
        rows += [{**cls, "metric": "macro_auc", "value": auc, "ci_low": auc - 0.02, "ci_high": auc + 0.02},
                 {**cls, "metric": "majority_baseline_macro_auc", "value": 0.5, "ci_low": 0.5, "ci_high": 0.5},
                 {**cls, "metric": "micro_f1", "value": f1, "ci_low": 0.0, "ci_high": f1 + 0.01},
                 {**cls, "metric": "majority_baseline", "value": 0.0, "ci_low": 0.0, "ci_high": 0.0},
                 {**base, "choice": "length_only", "layer": float("nan"), "metric": "macro_auc", "value": length,
                  "ci_low": length - 0.02, "ci_high": length + 0.02},
                 {**cls, "choice_b": "length_only", "metric": "macro_auc_diff", "value": d, "ci_low": d - 0.02,
                  "ci_high": d + 0.02, "p_value": 0.002 if abs(d) > 0.02 else 0.6, "p_holm": 0.002}]
        # an earlier layer's row, which the verdict (last layer) must not read
        rows.append({**cls, "layer": 5, "choice_b": "length_only", "metric": "macro_auc_diff", "value": 0.3,
                     "ci_low": 0.28, "ci_high": 0.32, "p_value": 0.002, "p_holm": 0.002})
    return pd.DataFrame(rows)


def test_q5_verdict_reads_the_macro_auc_against_length_not_the_thresholded_f1():
    """A probe that ranks the examples by a sentence's words (AUC well above 0.5) but is never sure enough
    to cross 0.5 (micro-F1 0) holds that sentence, if a probe on the sentences' word counts ranks them
    worse: Q5 says so, with the documents its interval resampled. A sentence whose AUC above 0.5 is all
    length (sentence 3: 0.62 against the length-only probe's 0.62) is not held; Holm runs over the
    positions at the last layer, recomputed from the rows' p-values."""
    from probing.study.legacy_questions import QUESTION_SECTIONS

    T = {"probes_q5": _q5_table([(0.75, 0.55, 0.07), (0.70, 0.56, 0.0), (0.62, 0.62, 0.0)])}
    v = QUESTION_SECTIONS["Q5"].verdict(T, load_config(None))
    assert v.sentence.startswith("Only in sentences 1–2 (no measurable difference at sentence 3): [CLS] holds "
                                 "which content words these sentences contain, beyond what their lengths tell")
    assert "− that of a probe on the sentences' word counts alone" in v.sentence and "+0.200" in v.sentence
    assert "192 documents" in v.sentence
    rows, caption = QUESTION_SECTIONS["Q5"].comparison_table(T)
    assert len(rows) == 3 and "Holm over positions" in caption
    # every sentence's AUC above 0.5 explained by length: No measurable difference, though each AUC is > 0.6
    none = QUESTION_SECTIONS["Q5"].verdict({"probes_q5": _q5_table([(0.66, 0.66, 0.1), (0.61, 0.61, 0.0)])},
                                          load_config(None))
    assert none.sentence.startswith("No measurable difference"), none.sentence
    # the evidence names each sentence's length-only AUC beside [CLS]'s
    text = QUESTION_SECTIONS["Q5"].answer(T)
    assert "sentence 3: [CLS] 0.620" in text and "length only 0.620" in text
    # the function-word control is read by macro AUC against the length-only probe, like the bags of words
    fw = _q5_table([(0.58, 0.57, 0.3)]).assign(target="fw_s1")
    control = QUESTION_SECTIONS["Q5"].answer({"probes_q5": pd.concat([T["probes_q5"], fw], ignore_index=True)})
    assert "(fw_s1, which tracks length" in control and "macro AUC 0.580, the length-only probe 0.570" in control
    assert "[CLS] − length-only +0.010" in control and "micro-F1 0.300" not in control


def test_q4_answers_coherence_and_each_sentences_content_words_against_cls():
    """Q4 in three parts, each per layer 1–L: is_next accuracy (sep1 − cls), and the macro AUC of each
    sentence's content words (sep1 − cls, the macro_auc_diff rows): a planted [SEP] advantage on sentence 2's
    words at every layer is found, sentence 1's null one is not, and layer 0 is never read."""
    import pandas as pd

    from probing.study.legacy_questions import QUESTION_SECTIONS

    rows = []
    for layer in range(0, 4):
        base = {"layer": layer, "n": 300, "n_groups": 124, "grouping": "document", "p_value": 0.002,
                "p_holm": 0.01, "condition_a": "choice=sep1", "condition_b": "choice=cls"}
        rows += [{**base, "target": "is_next", "metric": "difference", "value": 0.0, "ci_low": -0.01,
                  "ci_high": 0.01, "p_value": 0.9, "p_holm": 1.0},
                 {**base, "target": "bow_s1", "metric": "macro_auc_diff", "value": 0.001, "ci_low": -0.01,
                  "ci_high": 0.012, "p_value": 0.8, "p_holm": 1.0},
                 {**base, "target": "bow_s2", "metric": "macro_auc_diff", "value": 0.08 if layer else -0.5,
                  "ci_low": 0.05, "ci_high": 0.11}]
    v = QUESTION_SECTIONS["Q4"].verdict({"paired_q4": pd.DataFrame(rows)}, load_config(None)).sentence
    # without the probe table, the parts against [SEP]'s own baselines are not measured
    assert v.startswith("[SEP] against its baselines: coherence (is_next) — Not measured.")
    coherence, rest = v.split(" [SEP] against [CLS]: content words of sentence 1 — ")
    s1, s2 = rest.split(" [SEP] against [CLS]: content words of sentence 2 — ")
    coherence = coherence.split(" [SEP] against [CLS]: ")[1]
    assert coherence.startswith("coherence (is_next) — No measurable difference")
    assert s1.startswith("No measurable difference at any layer: the middle [SEP] and [CLS] hold the sentence's "
                         "content words alike")
    assert s2.startswith("Yes, in every layer: the middle [SEP] holds which content words the sentence contains "
                         "better than [CLS]") and "+0.080" in s2 and "-0.5" not in s2
    table, caption = QUESTION_SECTIONS["Q4"].comparison_table({"paired_q4": pd.DataFrame(rows)})
    assert len(table) == 9 and "macro AUC, sep1 − cls" in caption


def _q4_baseline_table(next_above: float, content: dict, length_next: float = 0.5,
                       untrained: dict | None = None) -> "pd.DataFrame":
    """probes_pair rows for Q4's first parts, layers 0-2: sep1's is_next accuracy ``0.5 + next_above`` with its
    majority baseline 0.5, sep1 − length-only macro AUC per sentence (``content``: sentence -> difference), and
    the length-only probe's is_next accuracy (no layer); with ``untrained`` (sentence -> difference) also sep1's
    macro AUC on the trained model (0.8) and on the random-init one (0.8 − difference), and the trained −
    random-init rows (``model_kind_b``), whose stored p_holm (per sentence, layers 0-2) the verdict must redo."""
    import pandas as pd

    rows = []
    for sentence, d in (untrained or {}).items():
        for layer in range(0, 3):
            base = {"choice": "sep1", "layer": layer, "n": 1000, "n_groups": 124, "grouping": "document",
                    "target": f"bow_s{sentence}"}
            dl = d if layer else 0.4  # layer 0 is never read
            rows += [{**base, "model_kind": "trained", "metric": "macro_auc", "value": 0.8, "ci_low": 0.78,
                      "ci_high": 0.82},
                     {**base, "model_kind": "random_init", "metric": "macro_auc", "value": 0.8 - dl,
                      "ci_low": 0.78 - dl, "ci_high": 0.82 - dl},
                     {**base, "model_kind": "trained", "model_kind_b": "random_init", "choice_b": "sep1",
                      "metric": "macro_auc_diff", "value": dl, "ci_low": dl - 0.01, "ci_high": dl + 0.01,
                      "p_value": 0.001 * layer * sentence if abs(dl) > 0.01 else 0.7, "p_holm": 0.5,
                      "value_a": 0.8, "value_b": 0.8 - dl}]
    for layer in range(0, 3):
        base = {"model_kind": "trained", "choice": "sep1", "layer": layer, "n": 1000, "n_groups": 124,
                "grouping": "document"}
        acc = 0.5 + (next_above if layer else 0.3)  # layer 0 is never read
        rows += [{**base, "target": "is_next", "metric": "accuracy", "value": acc, "ci_low": acc - 0.02,
                  "ci_high": acc + 0.02},
                 {**base, "target": "is_next", "metric": "majority_baseline", "value": 0.5, "ci_low": 0.5,
                  "ci_high": 0.5}]
        for sentence, d in content.items():
            rows.append({**base, "target": f"bow_s{sentence}", "choice_b": "length_only", "metric": "macro_auc_diff",
                         "value": d, "ci_low": d - 0.01, "ci_high": d + 0.01,
                         "p_value": 0.001 if abs(d) > 0.01 else 0.7, "p_holm": 0.004 if abs(d) > 0.01 else 1.0})
    rows.append({"model_kind": "trained", "choice": "length_only", "layer": float("nan"), "target": "is_next",
                 "metric": "accuracy", "value": length_next, "ci_low": length_next - 0.02,
                 "ci_high": length_next + 0.02, "n": 1000})
    return pd.DataFrame(rows)


def test_q4_first_says_what_sep_holds_against_its_own_baselines():
    """Q4 asks what [SEP] holds: its first parts read the middle [SEP] against its own baselines (is_next
    against the majority baseline, each sentence's content words against the length-only probe), before the
    comparisons with [CLS]. A planted is_next signal and a planted sentence-2 advantage over length are found;
    null ones are not; layer 0 is never read."""
    from probing.study.legacy_questions import QUESTION_SECTIONS

    q4, cfg = QUESTION_SECTIONS["Q4"], load_config(None)
    T = {"probes_pair": _q4_baseline_table(0.1, {1: 0.0, 2: 0.05})}
    v = q4.verdict(T, cfg)
    nxt, rest = v.sentence.split(" [SEP] against its baselines: content words of sentence 1 — ")
    s1, rest = rest.split(" [SEP] against its baselines: content words of sentence 2 — ")
    s2 = rest.split(" [SEP] against [CLS]: ")[0]
    assert nxt.startswith("[SEP] against its baselines: coherence (is_next) — Yes, in every layer: the middle [SEP] "
                          "tells coherent from shuffled pairs (is_next) above its baseline")
    assert "+0.100" in nxt and "+0.300" not in nxt
    assert s1.startswith("No measurable difference at any layer: the middle [SEP] reads the sentence's content "
                         "words no better than a probe on sentence length alone")
    assert s2.startswith("Yes, in every layer: the middle [SEP] reads the sentence's content words better than a "
                         "probe on sentence length alone") and "+0.050" in s2
    assert v.decision == "yes"  # the section's decision is its first part's
    null = q4.verdict({"probes_pair": _q4_baseline_table(0.0, {1: 0.0, 2: 0.0})}, cfg).sentence
    assert null.startswith("[SEP] against its baselines: coherence (is_next) — No measurable difference at any "
                           "layer: the middle [SEP] does not tell coherent from shuffled pairs")
    table, caption = q4.comparison_table(T)
    assert list(table["part"].unique())[:3] == ["[SEP] against its baselines: coherence (is_next)",
                                                "[SEP] against its baselines: content words of sentence 1",
                                                "[SEP] against its baselines: content words of sentence 2"]
    assert len(table) == 6 and "sep1 − length-only probe" in caption and "Holm over all of them" in caption
    # the evidence sets the length-only probe's is_next accuracy beside the majority baseline
    assert "word counts alone reads is_next at 0.500 (95% CI 0.480 to 0.520), against the majority baseline " \
           "0.500: lengths alone do not tell coherent from shuffled pairs here, so the first part's verdict " \
           "compares the middle [SEP] with the majority baseline" in q4.answer(T)
    above = q4.answer({"probes_pair": _q4_baseline_table(0.1, {1: 0.0}, length_next=0.56)})
    assert "lengths alone read is_next above the majority baseline, so the first part's verdict compares" in above


def test_q4_coherence_is_read_against_lengths_where_they_beat_the_majority():
    """Where a probe on the sentences' word counts alone reads is_next above the majority baseline, [SEP]'s
    coherence part is decided against that probe (paired sep1 − length-only rows of paired_q4), not against
    the majority: a margin over the majority that lengths explain is not found; one beyond lengths is. With
    the lengths below the majority the one-sample rows decide, whatever paired_q4 holds; the sep1 − cls part
    never reads the length-only rows."""
    from probing.study.question_rows import _q4_rows, _q4_sep_next_rows
    from probing.study.question_tables import FAMILIES
    from probing.study.legacy_questions import QUESTION_SECTIONS

    def paired(sep_minus_length: float) -> pd.DataFrame:
        rows = []
        for layer in (1, 2):
            for b, v in (("choice=length_only", sep_minus_length), ("choice=cls", 0.0)):
                rows.append({"analysis": "probe_comparison", "target": "is_next", "metric": "difference",
                             "layer": layer, "condition_a": "choice=sep1", "condition_b": b, "value": v,
                             "ci_low": v - 0.02, "ci_high": v + 0.02, "p_value": 0.001 if abs(v) > 0.02 else 0.8,
                             "p_holm": 0.002 if abs(v) > 0.02 else 1.0, "mde": 0.03, "n": 1000, "n_groups": 124,
                             "grouping": "document",
                             "family": FAMILIES["Q4_next_length"] if b.endswith("length_only") else FAMILIES["Q4"]})
        return pd.DataFrame(rows)

    q4, cfg = QUESTION_SECTIONS["Q4"], load_config(None)
    # sep1 is 0.1 above the majority (0.5) but lengths alone read 0.6: no margin beyond lengths
    T = {"probes_pair": _q4_baseline_table(0.1, {1: 0.0}, length_next=0.6), "paired_q4": paired(0.0)}
    rows = _q4_sep_next_rows(T)
    assert set(rows["condition_b"]) == {"choice=length_only"} and sorted(rows["layer"]) == [1, 2]
    nxt = q4.verdict(T, cfg).sentence.split(" [SEP] against its baselines: content words")[0]
    assert "No measurable difference at any layer" in nxt and "word counts alone (paired on the same items)" in nxt
    assert set(_q4_rows(T)["condition_b"]) == {"choice=cls"}
    # a margin beyond the lengths is found
    T["paired_q4"] = paired(0.08)
    assert "Yes, in every layer: the middle [SEP] tells coherent from shuffled pairs (is_next) above its baseline" \
        in q4.verdict(T, cfg).sentence
    # lengths below the majority: the one-sample rows, as before
    low = {"probes_pair": _q4_baseline_table(0.1, {1: 0.0}, length_next=0.45), "paired_q4": paired(0.0)}
    assert "condition_b" not in _q4_sep_next_rows(low).columns or \
        not _q4_sep_next_rows(low)["condition_b"].eq("choice=length_only").any()
    assert "Yes, in every layer" in q4.verdict(low, cfg).sentence.split(" [SEP] against its baselines: content")[0]


def test_q4_asks_whether_the_content_at_sep_is_learned():
    """Q4's parts against random weights: the middle [SEP]'s content-word macro AUC on the trained model −
    that on the same architecture with random weights. A planted advantage for sentence 2 is found, a null
    one for sentence 1 is not, layer 0 is never read, and Holm is redone over layers 1–L of both sentences
    (the family the report names), whatever p_holm the probe table stored. Without the random-init run the
    parts are left out."""
    from analyses.stats import holm
    from probing.study.question_rows import SEP_AUC_VS_RANDOM_FAMILY, _q4_sep_untrained_rows
    from probing.study.legacy_questions import QUESTION_SECTIONS

    q4, cfg = QUESTION_SECTIONS["Q4"], load_config(None)
    T = {"probes_pair": _q4_baseline_table(0.1, {1: 0.2, 2: 0.2}, untrained={1: 0.0, 2: 0.2})}
    s = q4.verdict(T, cfg).sentence
    s1 = s.split("[SEP] against random weights: content words of sentence 1 — ")[1].split(" [SEP] against")[0]
    s2 = s.split("[SEP] against random weights: content words of sentence 2 — ")[1].split(" [SEP] against")[0]
    assert s1.startswith("No measurable difference at any layer: the middle [SEP] reads the sentence's content "
                         "words no better than that of the same architecture with random weights")
    assert s2.startswith("Yes, in every layer: the middle [SEP] reads the sentence's content words better than "
                         "the middle [SEP] of the same architecture with random weights") and "+0.200" in s2
    assert "+0.400" not in s1 + s2
    rows = [_q4_sep_untrained_rows(k)(T) for k in (1, 2)]
    both = pd.concat(rows)
    assert sorted(both["layer"]) == [1, 1, 2, 2] and set(both["family"]) == {SEP_AUC_VS_RANDOM_FAMILY}
    expected = holm(both["p_value"].to_numpy(float))
    assert np.allclose(both["p_holm"].to_numpy(float), expected) and not np.allclose(both["p_holm"], 0.5)
    table, caption = q4.comparison_table(T)
    assert {"[SEP] against random weights: content words of sentence 1",
            "[SEP] against random weights: content words of sentence 2"} <= set(table["part"])
    assert "sep1 of the trained model − sep1 of the random-init model" in caption
    # the evidence gives both models' macro AUC at the trained model's best layer
    assert ("sentence 2's content words at layer 1, 0.800 (95% CI 0.780 to 0.820) trained against 0.600 (95% CI "
            "0.580 to 0.620) with random weights") in q4.answer(T)
    # no random-init run (random_init_baseline = false): the parts say so, the evidence is silent
    plain = {"probes_pair": _q4_baseline_table(0.1, {1: 0.2, 2: 0.2})}
    not_measured = "[SEP] against random weights: content words of sentence 1 — Not measured."
    assert not_measured in q4.verdict(plain, cfg).sentence
    assert "with random weights" not in q4.answer(plain)
    assert _q4_sep_untrained_rows(1)(plain) is None


def test_jawahar_reads_the_bag_of_words_by_its_macro_auc():
    """WC's best layer and baseline come from the macro AUC (0.5: frequency), not the thresholded F1."""
    import pandas as pd

    from probing.study.reproductions import PAPERS

    rows = []
    for layer, (auc, f1) in enumerate([(0.6, 0.30), (0.8, 0.10), (0.7, 0.20)]):
        base = {"model_kind": "trained", "choice": "cls", "target": "bow_s1", "layer": layer, "n": 100}
        rows += [{**base, "metric": "macro_auc", "value": auc, "ci_low": auc - 0.01, "ci_high": auc + 0.01},
                 {**base, "metric": "majority_baseline_macro_auc", "value": 0.5, "ci_low": 0.5, "ci_high": 0.5},
                 {**base, "metric": "micro_f1", "value": f1, "ci_low": f1 - 0.01, "ci_high": f1 + 0.01},
                 {**base, "metric": "majority_baseline", "value": 0.0, "ci_low": 0.0, "ci_high": 0.0}]
    jw = PAPERS["jawahar2019"]
    T = {"jawahar2019_probes": pd.DataFrame(rows)}
    assert "WC (bag of words) is best read at layer 1 (0.800 (95% CI 0.790 to 0.810); majority 0.500)" in jw.answer(T)
    table, caption = jw.table(T)
    assert table["WC (bag of words)"].tolist() == [0.6, 0.8, 0.7] and "macro AUC for the bag of words" in caption


def test_q4_evidence_says_where_each_token_reads_coherence_best():
    """A last-layer sep1 − cls difference in is_next can be [CLS] falling to its majority baseline after holding
    coherence in the middle layers: the evidence names each token's best layer and says so only when the
    numbers show it (planted probe tables, layers 0-3, majority baseline 0.5)."""
    import pandas as pd

    from probing.study.question_text import _coherence_by_layer

    def probes(cls, sep1, half=0.03):
        rows = [{"model_kind": "trained", "target": "is_next", "metric": "majority_baseline", "choice": "cls",
                 "layer": float(layer), "value": 0.5, "ci_low": 0.5, "ci_high": 0.5} for layer in range(4)]
        for choice, acc in (("cls", cls), ("sep1", sep1)):
            rows += [{"model_kind": "trained", "target": "is_next", "metric": "accuracy", "choice": choice,
                      "layer": float(layer), "value": v, "ci_low": v - half, "ci_high": v + half}
                     for layer, v in enumerate(acc)]
        return pd.DataFrame(rows)

    collapse = _coherence_by_layer(probes(cls=[0.5, 0.6, 0.65, 0.51], sep1=[0.5, 0.58, 0.62, 0.58]))
    assert "[CLS] reads is_next best at layer 2, 0.650" in collapse and "sep1 reads is_next best at layer 2" in collapse
    assert "at layer 3 [CLS]'s interval reaches its majority baseline" in collapse
    assert "[CLS] losing what it held at layer 2" in collapse, collapse
    held = _coherence_by_layer(probes(cls=[0.5, 0.6, 0.65, 0.64], sep1=[0.5, 0.58, 0.62, 0.66]))
    assert "majority baseline" not in held and "losing" not in held and "best at layer 3, 0.660" in held
    # [CLS] at chance at the last layer, but the middle [SEP] there beyond anything [CLS] held: no "losing"
    beyond = _coherence_by_layer(probes(cls=[0.5, 0.6, 0.62, 0.51], sep1=[0.5, 0.58, 0.6, 0.7]))
    assert "reaches its majority baseline" in beyond and "losing" not in beyond
    assert _coherence_by_layer(None) == "" and _coherence_by_layer(probes([0.5] * 4, [0.5] * 4).iloc[0:0]) == ""


def _q4_next_items(trained_correct: float, random_correct: float, n_docs: int = 60, per_doc: int = 5) -> pd.DataFrame:
    """probes_pair items of sep1 and cls on is_next, layers 0-2, on the trained and the random-init model: each
    item correct with the given rate (per side, deterministic per item), documents as the groups."""
    rng = np.random.default_rng(0)
    rows = []
    n = n_docs * per_doc
    for kind, rate in (("trained", trained_correct), ("random_init", random_correct)):
        for layer in (0, 1, 2):
            for choice in ("sep1", "cls"):
                correct = rng.random(n) < rate
                for i in range(n):
                    rows.append({"model_kind": kind, "model": "m" if kind == "trained" else "m-random", "corpus": "c",
                                 "format": "pair", "target": "is_next", "layer": layer, "choice": choice,
                                 "grouping": "document", "example": i, "token": pd.NA, "fold": i % 5,
                                 "group": f"d{i // per_doc}", "y_true": "1", "y_pred": "1" if correct[i] else "0",
                                 "correct": float(correct[i])})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("trained, random_, found", [(0.8, 0.5, True), (0.6, 0.6, False)])
def test_q4_asks_whether_the_coherence_at_sep_is_learned(trained, random_, found):
    """Q4's coherence against random weights: sep1's is_next accuracy on the trained model − on the random-init
    one, paired per item in paired_q4 (a family of its own, layers 1–L). A planted advantage is found, a null
    one is not; the part is "Not measured" without the random-init items, and the sep1 − cls part never reads
    these rows."""
    from probing.study.question_rows import _q4_rows, _q4_sep_next_untrained_rows
    from probing.study.question_tables import FAMILIES, _paired_q4
    from probing.study.legacy_questions import QUESTION_SECTIONS
    from probing.study.sections import Context

    cfg = load_config(None, overrides={"study.bootstrap_resamples": 300})
    items = _q4_next_items(trained, random_)
    probes = _q4_baseline_table(0.1, {1: 0.0})
    ctx = Context(cfg=cfg, caches=None, corpora={}, lm=None, out=Path("."),
                  tables={"probes_pair": probes, "probes_pair:items": items})
    paired = _paired_q4(ctx)
    rows = paired[paired["family"] == FAMILIES["Q4_next_random"]]
    assert sorted(rows["layer"]) == [1, 2] and rows["same_folds"].all()
    assert set(rows["condition_b"]) == {"model_kind=random_init,choice=sep1"}
    T = {"paired_q4": paired, "probes_pair": _q4_baseline_table(0.1, {1: 0.0})}
    part = _q4_sep_next_untrained_rows(T)
    assert len(part) == 2 and not part["condition_b"].eq("choice=cls").any()
    assert not _q4_rows(T)["condition_b"].str.contains("random_init").any()
    s = QUESTION_SECTIONS["Q4"].verdict(T, cfg).sentence
    said = s.split("[SEP] against random weights: coherence (is_next) — ")[1].split(" [SEP] against")[0]
    if found:
        assert said.startswith("Yes, in every layer: the middle [SEP] tells coherent from shuffled pairs (is_next) "
                               "better than the middle [SEP] of the same architecture with random weights"), said
        assert np.allclose(rows["value"], 0.3, atol=0.1)
    else:
        assert not said.startswith("Yes") and not said.startswith("No (the opposite)"), said
    # without the random-init items: no rows, and the part says so
    plain = Context(cfg=cfg, caches=None, corpora={}, lm=None, out=Path("."),
                    tables={"probes_pair": probes, "probes_pair:items": items[items["model_kind"] == "trained"]})
    assert not _paired_q4(plain)["family"].eq(FAMILIES["Q4_next_random"]).any()
    none = {"paired_q4": _paired_q4(plain), "probes_pair": _q4_baseline_table(0.1, {1: 0.0})}
    assert "[SEP] against random weights: coherence (is_next) — Not measured." in \
        QUESTION_SECTIONS["Q4"].verdict(none, cfg).sentence


def test_q4_evidence_gives_the_random_weight_sep_on_is_next():
    from probing.study.question_text import _sep_next_untrained

    rows = []
    for kind, accs in (("trained", [0.9, 0.55, 0.62]), ("random_init", [0.9, 0.51, 0.49])):
        for layer, a in enumerate(accs):
            rows.append({"model_kind": kind, "choice": "sep1", "target": "is_next", "metric": "accuracy",
                         "layer": layer, "value": a, "ci_low": a - 0.03, "ci_high": a + 0.03})
    rows.append({"model_kind": "trained", "choice": "sep1", "target": "is_next", "metric": "majority_baseline",
                 "layer": 1, "value": 0.5, "ci_low": 0.5, "ci_high": 0.5})
    s = _sep_next_untrained(pd.DataFrame(rows))
    assert ("at layer 2 the middle [SEP] reads 0.620 (95% CI 0.590 to 0.650) trained against 0.490 (95% CI 0.460 "
            "to 0.520) with random weights (majority baseline 0.500); with random weights 0.490–0.510 over layers "
            "1–2") in s, s  # layer 0 is not read
    assert _sep_next_untrained(pd.DataFrame([r for r in rows if r["model_kind"] == "trained"])) == ""


def test_q8_notes_say_what_the_cis_leave_out():
    """Q8's CIs resample test documents only; the notes say that training randomness is not in them, with one
    seed and with several."""
    from probing.study.legacy_questions import _q8_notes

    cfg = load_config(None, overrides={"finetune.poolings": ["cls", "mean"], "finetune.seeds": [0]})
    one = _q8_notes(cfg)
    assert "do not cover the randomness of training" in one and "with one training seed" in one, one
    several = _q8_notes(cfg.with_values(**{"finetune.seeds": (0, 1, 2)}))
    assert "With 3 training seeds the fine-tuned rows' CIs resample the seeds" in several, several
    assert "with one training seed" not in several


def test_interval_description_says_when_fine_tuned_cis_resample_seeds():
    import pandas as pd

    from probing.study.report import describe_intervals

    t = pd.DataFrame({"analysis": ["finetune_pooling"] * 2, "grouping": ["document"] * 2, "ci_low": [0.8, 0.8],
                      "ci_high": [0.9, 0.9], "ci_seeds": pd.array([pd.NA, pd.NA], dtype="Int64")})
    one = describe_intervals({"finetune": t})
    assert "over documents" in one and "training seeds" not in one, one
    t["ci_seeds"] = pd.array([pd.NA, 3], dtype="Int64")
    several = describe_intervals({"finetune": t})
    assert "for the fine-tuned rows, over the training seeds first (a two-stage bootstrap)" in several, several
