"""The why study (probing.study.why): its config, the held-out measuring text, the pretraining snapshots, the
comparisons on constructed predictions (a planted effect found, a null not) and one small run end to end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from probing.pretrain._config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
QUIET = {"progress": False, "log": lambda *a: None}


# ------------------------------------------------------------------------------------------------ the config

def test_the_packaged_config_pretrains_each_role_once():
    from probing.study.why import ROLES, load_why_config, packaged_configs

    assert packaged_configs() == ["why_questions"]
    cfg = load_why_config("why_questions")
    assert cfg.reference.name == "mlm+nsp.first.sep.seg"
    assert {r: cfg.variant(r).name for r in ROLES} == {
        "mlm": "mlm.first.sep.seg", "sop": "mlm+sop.first.sep.seg", "last": "mlm+nsp.last.sep.seg",
        "nosep": "mlm+nsp.first.nosep.seg"}
    assert len(cfg.pretrain.run.seeds) >= 2  # the pretraining seed is the unit of every interval
    assert cfg.pretrain.train.snapshots and max(cfg.pretrain.train.snapshots) < cfg.pretrain.train.steps
    over = load_why_config("why_questions", overrides={"pretrain.run.seeds": [3], "why.out": "x"})
    assert over.pretrain.run.seeds == (3,) and over.why.out == "x"


@pytest.mark.parametrize("change, message", [
    ({"why": {"ouT": "x"}}, "unknown key why.ouT; did you mean why.out?"),
    ({"why": {"pairs": "generated:n=10,k=2"}}, "a 'bbc:' spec"),
    ({"why": {"pairs": "bbc:n=10,k=2,pretrain_heldout=0.1"}}, "pretrain_heldout comes from [pretrain.corpus]"),
    ({"why": {"epochs": 0}}, "why.epochs = 0: expected an integer >= 1"),
    ({"pretrain": {"variant": {"objective": "mlm"}}}, "[pretrain.variant] must be BERT's"),
    ({"pretrain": {"train": {"snapshots": [5000]}}}, "snapshots [5000] lie beyond steps = 700"),
])
def test_bad_why_configs_are_refused_with_the_key(change, message):
    from probing.study.why import parse_why_config

    raw = {"why": {}, "pretrain": {"run": {"preset": "tiny"}}}
    for section, table in change.items():
        if section == "pretrain":
            raw["pretrain"] = {**raw["pretrain"], **table}
        else:
            raw[section] = table
    with pytest.raises(ConfigError) as err:
        parse_why_config(raw)
    assert message in str(err.value)


def test_the_command_refuses_a_bad_config_before_any_work(tmp_path, capsys):
    from probing.study.why.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text('[why]\nepochs = 0\n[pretrain.run]\npreset = "test"\n')
    assert main([str(bad), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert main(["why_questions", "--train-seeds", "a,b"]) == 2
    assert "--train-seeds 'a,b'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# -------------------------------------------------------------------------------------- the measuring text

@pytest.mark.slow
def test_pretrain_heldout_draws_examples_and_negatives_from_heldout_articles_only():
    from probing.corpora import load_corpus
    from probing.corpus_news import bbc_article_paths, bbc_article_sentences
    from probing.heldout import is_heldout

    ex = load_corpus("bbc:n=60,k=2,max_words=40,negatives=other_topic,pretrain_heldout=0.2")
    assert len(ex) == 60
    assert all(is_heldout(f"bbc/{e.labels['doc']}", 0.2) for e in ex)
    held = {s for p in bbc_article_paths() if is_heldout(f"bbc/{p.parent.name}/{p.stem}", 0.2)
            for s in bbc_article_sentences(p)}
    negatives = [e for e in ex if e.labels["is_next"] == 0]
    assert negatives and all(e.sentences[1] in held for e in negatives)  # the donors are held out too
    with pytest.raises(ValueError, match="pretrain_heldout must be in"):
        load_corpus("bbc:n=10,k=2,pretrain_heldout=0.9")


# -------------------------------------------------------------------------------------------- the snapshots

def test_snapshots_are_model_directories_and_change_no_number(tmp_path):
    """A run that also writes snapshots ends with the same weights and the same run identity; its step-0 snapshot
    is the initialisation, and each snapshot loads as a model."""
    import torch
    from safetensors.torch import load_file

    import probing
    from probing.models import load_model
    from probing.pretrain import Variant, parse_config
    from probing.pretrain._model import build_model
    from probing.pretrain._tokenizer import load_tokenizer
    from .test_pretrain import config_dict, topic_text

    text = tmp_path / "t.txt"
    text.write_text(topic_text(n_docs=60))
    plain = config_dict(text, tmp_path / "plain", steps=12, checkpoint_every=5)
    snap = config_dict(text, tmp_path / "snap", steps=12, checkpoint_every=5, snapshots=[0, 7])
    (a,) = probing.pretrain_models(plain, **QUIET)
    (b,) = probing.pretrain_models(snap, **QUIET)
    assert json.loads((a / "run.json").read_text())["train"] == json.loads((b / "run.json").read_text())["train"]
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)  # writing snapshots changed no weight
    assert sorted(p.name for p in b.iterdir() if p.name.startswith("step")) == ["step0", "step7"]
    w0 = load_file(str(b / "step0" / "model.safetensors"))
    init = build_model(parse_config(snap).model, Variant(), load_tokenizer(tmp_path / "snap" / "tokenizer"), 0)
    assert all(torch.equal(w0[k], v) for k, v in init.bert.state_dict().items() if k in w0)
    assert not all(torch.equal(w0[k], wb[k]) for k in w0)
    assert load_model(str(b / "step7")).n_layers == 2


# -------------------------------------------------------------------------- comparisons on planted data

def _planted(n_docs=40, per_doc=5, seeds=(0, 1), moved_loss=0.25, nsp_gain=0.0, rng_seed=0) -> pd.DataFrame:
    """Predictions of every run the comparisons read, with known accuracies: every model reads the `next` task at
    70% at its own position; read at the other end it loses ``moved_loss``; the reference's [CLS] gains
    ``nsp_gain`` over MLM alone; without [SEP] the reference loses 10 points, the model pretrained without none."""
    rng = np.random.default_rng(rng_seed)
    items = [(f"d{d}:{i}", f"d{d}") for d in range(n_docs) for i in range(per_doc)]
    base = 0.7
    acc = {("reference", "pair"): base, ("reference", "cls_last"): base - moved_loss,
           ("last", "cls_last"): base, ("last", "pair"): base - moved_loss,
           ("nosep", "pair"): base, ("nosep", "concat_segments"): base, ("reference", "concat_segments"): base - 0.1}
    frames = []
    for seed in seeds:
        for frozen in (False, True):
            for (role, fmt), p in acc.items():
                frames.append(pd.DataFrame({"role": role, "task": "next", "format": fmt, "pooling": "cls",
                                            "frozen": frozen, "step": 700, "seed": seed,
                                            "item": [i for i, _ in items], "doc": [d for _, d in items],
                                            "label": np.arange(len(items)) % 2,
                                            "correct": rng.random(len(items)) < p}))
            for role, gain in (("mlm", 0.0), ("reference", nsp_gain), ("sop", 0.0)):
                for pooling in ("cls", "sep1", "mean"):
                    frames.append(pd.DataFrame({"role": role, "task": "next", "format": "pair", "pooling": pooling,
                                                "frozen": True, "step": 700, "seed": seed,
                                                "item": [i for i, _ in items], "doc": [d for _, d in items],
                                                "label": np.arange(len(items)) % 2,
                                                "correct": rng.random(len(items)) < 0.6 + (gain if pooling == "cls"
                                                                                           else 0)}))
    P = pd.concat(frames, ignore_index=True)
    # the mlm/sop/reference frozen pair/cls rows above overlap the first family's reference rows: keep the latter
    return P.drop_duplicates(["role", "task", "format", "pooling", "frozen", "step", "seed", "item"], keep="first")


def test_a_planted_position_effect_is_found_and_a_null_is_not():
    from probing.study.rules import decide
    from probing.study.why import RULES, comparison_rows

    rows = decide(comparison_rows(_planted(), 700, n_resamples=300), RULES)
    first = rows[(rows["question"] == "first") & (rows["representation"] == "fine-tuned")].set_index("label")
    own = first.loc["pretrained last, read last − pretrained first, read first"]
    moved = first.loc["pretrained first: read last − read first"]
    assert moved["decision"] == "yes" and moved["value"] < -0.15  # the planted 25-point loss
    assert own["decision"] != "yes" and abs(own["value"]) < 0.1  # no planted difference: not called one
    sep = rows[(rows["question"] == "sep") & (rows["representation"] == "fine-tuned")].set_index("label")
    inter = sep.loc["change of the model pretrained with [SEP] − of the one without"]
    assert inter["value"] < -0.04 and inter["n_seeds"] == 2


def test_a_planted_nsp_gain_is_found_and_a_null_is_not():
    from probing.study.rules import decide
    from probing.study.why import RULES, comparison_rows

    for gain, found in ((0.3, True), (0.0, False)):
        rows = decide(comparison_rows(_planted(nsp_gain=gain), 700, n_resamples=300), RULES)
        r = rows[(rows["question"] == "nsp") & (rows["label"] == "MLM + NSP − MLM") & (rows["pooling"] == "cls")]
        assert len(r) == 1
        assert (r["decision"].iloc[0] == "yes") == found


def _shares(ref_shift: float, n_docs=40, per_doc=4, seeds=(0, 1), rng_seed=0) -> pd.DataFrame:
    """Representation shares of every measure for the reference and the model pretrained without [SEP]: each about
    0.10 with noise, the reference's ``drop_sep_s1`` ``ref_shift`` higher."""
    from probing.study.why.representation import GAINS, MEASURES

    rng = np.random.default_rng(rng_seed)
    items = [(f"d{d}:{i}", f"d{d}") for d in range(n_docs) for i in range(per_doc)]
    frames = []
    for role in ("reference", "nosep"):
        for seed in seeds:
            for measure in [*MEASURES, *GAINS]:
                shift = ref_shift if (role == "reference" and measure == "drop_sep_s1") else 0.0
                frames.append(pd.DataFrame({"role": role, "seed": seed, "measure": measure,
                                            "item": [i for i, _ in items], "doc": [d for _, d in items],
                                            "value": 0.10 + shift + rng.normal(0, 0.05, len(items))}))
    return pd.concat(frames, ignore_index=True)


def test_a_planted_representation_difference_between_models_is_found_and_a_null_is_not():
    from probing.study.rules import decide
    from probing.study.why import RULES
    from probing.study.why.representation import representation_rows

    for shift, found in ((0.15, True), (0.0, False)):
        values, rows = representation_rows(_shares(shift), n_resamples=300)
        rows = decide(rows, RULES).set_index("task")
        assert set(rows["measure"]) == {"representation"} and (rows["n_seeds"] == 2).all()
        r = rows.loc["drop_sep_s1"]
        assert (r["decision"] == "yes") == found and abs(r["value"] - shift) < 0.03
        assert not (rows.drop(index="drop_sep_s1")["decision"] == "yes").any()  # no other measure was planted
        ref = values.set_index(["role", "measure"]).loc[("reference", "drop_sep_s1")]
        assert ref["ci_low"] < 0.10 + shift < ref["ci_high"] and ref["n_seeds"] == 2


def test_the_interchange_replaces_sentence_2_from_the_other_half_of_the_documents():
    from probing.corpus_generated import generated_corpus
    from probing.study.why.representation import measured_pairs

    examples = [e for e in generated_corpus(n_examples=200, k=2, seed=3)]
    measured, replaced = measured_pairs(examples, max_examples=60)
    docs = {str(e.labels.get("doc", e.id)) for e in measured}
    assert 0 < len(measured) <= 60 and [e.id for e in replaced] == [e.id for e in measured]
    own = {s for e in examples if str(e.labels.get("doc", e.id)) in docs for s in e.sentences}
    for a, b in zip(measured, replaced):
        assert b.sentences[0] == a.sentences[0] and b.sentences[1] != a.sentences[1]
        assert b.sentences[1] not in own and b.labels["s2_doc"] not in docs  # lent by an unmeasured document


def test_answers_say_so_when_no_model_learnt_the_task():
    """Models at chance give "cannot tell at this scale", not a comparison; learnt ones give the comparison."""
    from probing.study.rules import decide
    from probing.study.why import RULES, comparison_rows
    from probing.study.why.study import accuracy_table, answers

    from probing.study.answers import word_count
    from probing.study.why.report import MAX_WORDS
    from probing.study.why.representation import representation_rows

    learnt = _planted()
    moved = representation_rows(_shares(0.15), n_resamples=200)[1]
    rows = decide(pd.concat([comparison_rows(learnt, 700, n_resamples=200), moved], ignore_index=True), RULES)
    a = answers(rows, accuracy_table(learnt, n_resamples=200))
    assert a["first"][0].startswith("Fine-tuned on next-sentence pairs, a model pretrained with [CLS] last")
    assert "Dropping [SEP] moves sentence 1's last-layer words 25% of the way to another input" in a["sep"][0]
    assert all(word_count(text) <= MAX_WORDS for text, _ in a.values()), a
    flat = learnt.assign(correct=np.random.default_rng(3).random(len(learnt)) < 0.5)
    rows = decide(comparison_rows(flat, 700, n_resamples=200), RULES)
    acc = accuracy_table(flat, n_resamples=200)
    assert (acc["chance"] == 0.5).all() and not acc["learnt"].any()
    a = answers(rows, acc)
    for key in ("first", "nsp", "sep"):
        assert a[key][0].startswith("Cannot tell at this scale") and a[key][1] == "low", a[key]
        assert "against 50% for always guessing" in a[key][0]
    # a planted content gap (MLM alone keeps 20 points more of sentence 1's words in [CLS]) is still reported
    base = flat[(flat["role"] == "mlm") & (flat["pooling"] == "cls")].drop_duplicates(["seed", "item"])
    rng = np.random.default_rng(4)
    content = pd.concat([base.assign(role=role, task="content_s1", correct=np.clip(rng.normal(mu, 0.05, len(base)),
                                                                                   0, 1))
                         for role, mu in (("mlm", 0.4), ("reference", 0.2))]
                        + [base.assign(task="content_s1", pooling="frequency", correct=0.1)], ignore_index=True)
    # and a planted word-order gain (MLM + NSP tells 90% of the minimal pairs apart, MLM alone 50%)
    order = pd.concat([base.assign(role=role, task="order_s1", correct=rng.random(len(base)) < p)
                       for role, p in (("mlm", 0.5), ("reference", 0.9))], ignore_index=True)
    both = pd.concat([flat, content, order], ignore_index=True)
    rows = decide(pd.concat([comparison_rows(both, 700, n_resamples=200), moved], ignore_index=True), RULES)
    a = answers(rows, accuracy_table(both, n_resamples=200))
    assert "But MLM + NSP leaves fewer of sentence 1's content words in [CLS]" in a["nsp"][0]
    assert "Word order: +" in a["nsp"][0] and "Dropping [SEP] moves" in a["sep"][0]
    assert all(word_count(text) <= MAX_WORDS for text, _ in a.values()), a


def test_the_seed_is_a_unit_of_the_interval():
    """Two pretraining seeds that disagree widen the interval beyond what the documents alone give."""
    from probing.study.why import comparison_rows

    agree = _planted(seeds=(0, 1), rng_seed=1)
    split = agree.copy()
    flip = (split["seed"] == 1) & (split["role"] == "reference") & (split["format"] == "cls_last")
    split.loc[flip, "correct"] = True  # seed 1's first-pretrained model loses nothing when moved
    row = lambda P: comparison_rows(P, 700, n_resamples=400).set_index("label").loc[  # noqa: E731
        "pretrained first: read last − read first"].iloc[0]
    assert row(split)["se"] > 2 * row(agree)["se"]


# ------------------------------------------------------------------------------------------------ end to end

SMALL = """
[why]
pairs = "bbc:n=100,k=2,max_words=20,negatives=other_topic"
pairs_article = "bbc:n=60,k=2,max_words=20,negatives=same_article"
epochs = 1
bootstrap_resamples = 200
[pretrain.run]
seeds = [0, 1]
threads = 1
[pretrain.corpus]
sources = ["bbc"]
heldout_fraction = 0.2
max_documents = 150
[pretrain.model]
max_length = 64
[pretrain.train]
checkpoint_every = 8
snapshots = [0, 8]
eval_pairs = 50
[pretrain.variant]
objective = "mlm+nsp"
[[pretrain.variants]]
objective = "mlm"
[[pretrain.variants]]
cls_position = "last"
[[pretrain.variants]]
sep = false
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                    reason="needs bash and coreutils' timeout")
def test_the_gpu_scripts_why_step_runs_a_small_study_that_a_second_run_reuses(tmp_path):
    """benchmarks/gpu_check.sh's `why` step, rehearsed on the CPU with the `test` preset: the report says which
    preset its answers come from, every answer keeps the page's word limit, every interval rests on both
    pretraining seeds; then the same study in process reuses every run and gives the same table."""
    from probing.study.answers import word_count
    from probing.study.why import load_why_config, run_why
    from probing.study.why.report import MAX_WORDS

    cfg_file = tmp_path / "why.toml"
    cfg_file.write_text(SMALL)
    logs = tmp_path / "logs"
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), OUT=str(logs), PYTHON=sys.executable,
               DEVICE="cpu", STEPS="why", WHY_CONFIG=str(cfg_file), WHY_PRESET="test", WHY_STEPS="16")
    run = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0 and "== failed steps: 0" in run.stdout, run.stdout[-4000:] + run.stderr[-2000:]
    log = (logs / "why.log").read_text()
    assert log.count("the study reuses them") == 2  # benchmarks/why_split.sh: a pretraining process per seed
    assert "seed0: 16 steps" in log and "seed1: 16 steps" in log
    out = logs / "why_questions"
    report = (out / "report.md").read_text()
    assert report.splitlines()[2].startswith("**These answers come from the `test` pretraining preset**")
    assert "--preset test --steps 16 --device cpu" in report
    rows = pd.read_csv(out / "tables" / "why_rows.csv")
    assert set(rows["question"]) == {"first", "nsp", "sep", "learning"} and (rows["n_seeds"] == 2).all()
    for name in ("why_accuracy.csv", "why_pretraining.csv"):
        assert len(pd.read_csv(out / "tables" / name)) > 0
    from probing.study.why.representation import GAINS, MEASURES

    shares = pd.read_csv(out / "tables" / "why_representation.csv")
    assert set(shares["measure"]) == set(MEASURES) | set(GAINS) and (shares["n_seeds"] == 2).all()
    assert {"reference", "nosep", "mlm"} <= set(shares["role"]) and shares["value"].notna().all()
    moved = shares[shares["measure"].str.startswith(("drop_sep", "interchange_pair", "interchange_concat"))]
    assert (moved["value"] > 0).all()  # dropping a token or replacing a sentence moves every model's vectors
    assert (rows["measure"] == "representation").sum() == len(MEASURES) + len(GAINS)
    assert "How far each model's last-layer vectors move" in report
    cfg = load_why_config(cfg_file, overrides={"why.out": str(out), "pretrain.run.out": str(logs / "why-pretrain"),
                                               "pretrain.run.preset": "test", "pretrain.train.steps": 16,
                                               "why.device": "cpu"})
    result = run_why(cfg, **QUIET)
    for key in ("first", "nsp", "sep", "learning"):
        text, conf = result.answers[key]
        assert word_count(text) <= MAX_WORDS and conf in ("high", "moderate", "low")
        assert f'<a id="{key}"></a>' in report and "Not measured" not in text
    assert set(result.predictions["seed"]) == {0, 1}
    content = result.predictions[result.predictions["task"].isin(["content_s1", "content_s2"])]
    assert set(content["role"]) == {"reference", "mlm"} and set(content["pooling"]) == {"cls", "frequency"}
    assert content["correct"].between(0, 1).all() and set(content["step"]) == {0, 8, 16}
    assert (result.rows["measure"] == "content").any()
    assert set(result.predictions.loc[result.predictions["role"] == "reference", "step"]) == {0, 8, 16}
    again = pd.read_csv(out / "tables" / "why_rows.csv")
    pd.testing.assert_frame_equal(again[["label", "value", "se"]], rows[["label", "value", "se"]])


def test_the_seed_study_command_points_to_the_why_command(capsys):
    from probing.study.runner import main

    assert main(["why_questions"]) == 2
    assert "run python -m probing.study.why why_questions" in capsys.readouterr().err
