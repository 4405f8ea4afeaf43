"""The study end to end in --quick mode on a tiny random model and the generated corpus."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from probing.study import CONFIG_DIR, QUESTIONS, StudyError, load_config, packaged_configs, run_study
from probing.study.answers import MAX_WORDS, word_count
from probing.study.questions import QUESTIONS as MODULES
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
    assert tuple(MODULES) == QUESTIONS
    # the page of answers first: each question in the asker's words, its answer, its confidence word, a link
    page = text[text.index("## Answers\n"):text.index("## Q1.")]
    for q, module in MODULES.items():
        assert re.search(rf"\*\*{q}\. {re.escape(module.asked)}\*\* \[evidence\]\(#{q.lower()}\)  \n.+\*\(", page), q
        sec = re.search(rf"^## {q}\..*?(?=^## )", text, flags=re.S | re.M).group(0)
        assert "**Answer.**" in sec and "### Evidence" in sec and "The comparisons behind the answer" in sec, q
        answer = re.search(r"\*\*Answer\.\*\* (.*)", sec).group(1)
        assert word_count(re.sub(r"\*\([^)]*\)\*$", "", answer)) <= MAX_WORDS, (q, answer)
        assert (run / "tables" / f"{q.lower()}_decisions.csv").is_file(), q
    html_text = (run / "report.html").read_text()
    assert all(f'id="{q.lower()}"' in html_text for q in MODULES)
    # quick mode is announced in the title and at the top; the unknown model gets a neutral sentence
    assert text.startswith("# ") and "(quick mode)" in text.splitlines()[0]
    assert text.splitlines()[2].lstrip("*").startswith("QUICK MODE")
    assert "no record of how it was trained" in text
    assert "## Provenance" in text and "fingerprint" in text
    tables = run / "tables"
    for name in ("q1_change", "q1_finetune", "q2_interchange", "q7_recovery"):
        assert (tables / f"{name}.csv").is_file(), name
    # Q7: the decoders' table and the decided rows, the answer a lower bound ("at least")
    rec = pd.read_csv(tables / "q7_recovery.csv")
    assert {"content_words", "word_order", "minimal_pairs", "bshift"} <= set(rec["target"])
    d7 = pd.read_csv(tables / "q7_decisions.csv")
    assert set(d7["measure"]) == {"content", "order", "minimal", "training"}
    q7 = re.search(r"^## Q7\..*?(?=^## )", text, flags=re.S | re.M).group(0)
    assert "at least" in q7 and "Jawahar" in q7
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
    expected = ["extraction", "fine-tuning"] + [f"analyses {q}" for q in QUESTIONS] + ["figures", "report"]
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
        # the HTML renders the same table
        assert re.search(rf"<td>{row.stage}</td>\s*<td>{row.seconds:.1f}</td>\s*<td>{row.peak_rss_mb:.0f}</td>", html)
    printed = [l for l in logs
               if re.match(r"\[ *\d+s\] (extraction|fine-tuning|analyses Q\d|figures|report|total) +\d", l)]
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


def test_the_full_config_runs_what_the_default_leaves_out_on_the_same_caches():
    """seed_questions_full: the default's corpora, probes and model (so its caches are the default's), with every
    fine-tuned setting the default leaves out for a 2-core CPU's 20 minutes, five seeds and the full preset."""
    from analyses.finetune import merge_conditions
    from probing.study.questions import QUESTIONS

    default, full = load_config("seed_questions"), load_config("seed_questions_full")
    for section in ("model", "corpus", "extract", "probes", "recovery"):
        assert getattr(full, section) == getattr(default, section), section

    def runs(cfg):
        return merge_conditions([s for q in QUESTIONS.values() if q.runs is not None for s in q.runs(cfg)])

    small, big = runs(default), runs(full)
    key = lambda s: (s.task, s.format.split("=")[0], s.pooling, s.n_train)  # noqa: E731
    assert {key(s) for s in small} < {key(s) for s in big}
    assert {("next", "cls_mid", "cls", None), ("next", "pair", "sep1", None), ("topic", "pair", "cls", 100),
            ("next", "concat", "cls", None)} <= {key(s) for s in big} - {key(s) for s in small}
    assert any(s.format.startswith("bertsum") for s in big) and not any(s.format.startswith("bertsum") for s in small)
    assert {s.seed for s in big if not s.frozen} == {0, 1, 2, 3, 4}
    assert {s.seed for s in small if not s.frozen} == {0, 1}
    assert (len(small), len(big)) == (30, 144) and full.finetune.preset == "full" and 4 in full.segments.ks


def test_configs_found_by_name_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ here: the packaged ones are found by name
    assert packaged_configs() == ["clark2019_attention", "ethayarajh2019_anisotropy", "jawahar2019_probing",
                                  "reimers2019_pooling", "seed_questions", "seed_questions_full"]
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
    assert shipped == data
    assert {p for p in shipped if p.parent == CONFIG_DIR} == set(CONFIG_DIR.glob("*.toml"))
    assert len(shipped) == 7  # the six study configs and the why study's


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


def test_study_jobs_union_of_sections():
    from probing.study.sections import Job
    from probing.study import study_jobs

    from probing.study.questions._common import REPLACED, SWAPPED

    cfg = load_config(None, overrides={"study.questions": ["Q1", "Q2", "Q3"], "model.random_init_baseline": False})
    corpora = {"pairs": [], "groups": [], "groups_k2": [], "groups_k3": []}
    jobs = study_jobs(cfg, corpora)
    # Q1 and Q2 read the same pairs caches (with the norm-based attention) and derived corpora: each job once
    pair = Job("pairs", "pair", attention=True, attention_norm=True)
    assert jobs.count(pair) == 1 and Job(SWAPPED, "pair") in jobs and Job(REPLACED, "concat") in jobs
    # the union of the questions' jobs, one extraction per cache, in the order first asked: a cache asked for
    # with and without attention is extracted once, with it (Q4 reads the pairs without, Q1 and Q2 with)
    cfg = load_config(None, overrides={"study.questions": ["Q1", "Q2", "Q3", "Q4"],
                                       "model.random_init_baseline": False})
    jobs = study_jobs(cfg, corpora)
    own = [j for q in ("Q1", "Q2", "Q3", "Q4") for j in MODULES[q].jobs(cfg, corpora)]
    key = lambda j: (j.corpus, j.format, j.random, j.intervention)  # noqa: E731
    assert Job("pairs", "pair") in own and Job("pairs", "pair") not in jobs
    assert [key(j) for j in jobs] == list(dict.fromkeys(key(j) for j in own))
    served = {key(j): j for j in jobs}
    assert all(served[key(j)].attention >= j.attention and served[key(j)].attention_norm >= j.attention_norm
               for j in own)
    assert not any(j.random for j in jobs) and not any(j.intervention for j in jobs)


def test_interventions_are_built_for_the_model_depth():
    from probing.study.shared import make_intervention, patch_layers

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
