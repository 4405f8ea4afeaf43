"""Which answers hold on several models (probing/study/across.py): a planted disagreement is found, agreement is
not flagged, "cannot tell" is neither, layers match by rank; and the study command given two models runs both
and writes the comparison."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from probing.study.across import compare, finding, model_slug, render, unique_slugs, write_comparison


def _run(root: Path, name: str, q1: list[tuple], q2: list[tuple], layers=(3, 6)) -> Path:
    """A finished study's tables/: answers.csv and the decisions of Q1 (rows per layer) and Q2."""
    tables = root / name / "tables"
    tables.mkdir(parents=True)
    pd.DataFrame({"question": ["Q1", "Q2"], "asked": ["Does it change?", "Does it take in more?"],
                  "answer": [f"{name} says one", f"{name} says two"], "confidence": ["high", "low"],
                  "preset": "default", "model": name}).to_csv(tables / "answers.csv", index=False)
    rows = []
    for (decision, value), layer in zip(q1, layers):
        rows.append({"measure": "drift", "family": "Q1 drift", "layer": layer, "representation": "cls",
                     "label": "[CLS]: concat − pair", "n": 100 + layer, "value": value, "se": 0.1,
                     "decision": decision, "verdict": decision, "confidence": "high"})
    pd.DataFrame(rows).to_csv(tables / "q1_decisions.csv", index=False)
    pd.DataFrame([{"measure": m, "family": "Q2", "label": m, "pooling": "mean" if m != "attention" else None,
                   "value": v, "se": 0.1, "decision": d, "verdict": d, "confidence": "low"}  # an empty facet too
                  for m, d, v in q2]).to_csv(
        tables / "q2_decisions.csv", index=False)
    return root / name


def test_findings_match_by_rank_and_a_planted_disagreement_is_found(tmp_path):
    # model A has layers 3 and 6, model B (a 2-layer model) 1 and 2: matched by rank
    a = _run(tmp_path, "a", [("yes", 0.5), ("yes_small", -0.2)],
             [("interchange", "no_difference", 0.01), ("decoding", "yes", 0.3), ("attention", "inconclusive", 0.1)])
    b = _run(tmp_path, "b", [("yes", 0.7), ("yes_small", -0.1)],
             [("interchange", "no_difference", -0.02), ("decoding", "yes", -0.3), ("attention", "yes", 0.2)],
             layers=(1, 2))
    summary, rows = compare({"A": a, "B": b})
    q1 = summary.set_index("question").loc["Q1"]
    assert (q1["n_rows"], q1["n_hold"], q1["n_differ"], q1["n_undecided"], q1["holds"]) == (2, 2, 0, 0, True)
    q2 = summary.set_index("question").loc["Q2"]
    # the decoding row's sign flips (a planted disagreement); "cannot tell" on A is undecided, not a difference
    assert (q2["n_rows"], q2["n_hold"], q2["n_differ"], q2["n_undecided"], q2["holds"]) == (3, 1, 1, 1, False)
    flipped = rows[rows["label"] == "decoding"].iloc[0]
    assert (flipped["finding_0"], flipped["finding_1"], flipped["holds"]) == ("yes +", "yes −", False)
    assert pd.isna(rows.loc[rows["label"] == "attention", "holds"].iloc[0])
    assert summary.set_index("question").loc["Q1", "answer_1"] == "b says one"
    text = render(summary, rows, ["A", "B"], ["a", "b"])
    assert "holds: all 2 rows alike" in text and "1 of 3 rows alike; 1 differ; 1 undecided" in text
    assert "| Q2 | decoding (pooling mean) | yes + | yes − |" in text


def test_a_row_missing_on_one_model_is_counted_apart(tmp_path):
    a = _run(tmp_path, "a", [("yes", 0.5), ("yes", 0.4)], [("decoding", "yes", 0.3)], layers=(3, 6))
    b = _run(tmp_path, "b", [("yes", 0.5)], [("decoding", "yes", 0.3)], layers=(1,))
    summary, _ = compare({"A": a, "B": b})
    q1 = summary.set_index("question").loc["Q1"]
    assert (q1["n_rows"], q1["n_only_some"], q1["holds"]) == (1, 1, True)


def test_written_comparison_and_refusals(tmp_path):
    a = _run(tmp_path, "a", [("yes", 0.5)], [("decoding", "yes", 0.3)], layers=(6,))
    b = _run(tmp_path, "b", [("no_difference", 0.0)], [("decoding", "yes", 0.3)], layers=(2,))
    path = write_comparison({"A": a, "B": b}, tmp_path)
    assert path.read_text(encoding="utf-8").startswith("# Which answers hold on every model")
    table = pd.read_csv(tmp_path / "tables" / "models.csv")
    assert table.set_index("question")["holds"].to_dict() == {"Q1": False, "Q2": True}
    assert pd.read_csv(tmp_path / "tables" / "models_rows.csv")["question"].tolist() == ["Q1", "Q2"]
    with pytest.raises(ValueError, match="at least two runs"):
        compare({"A": a})
    (tmp_path / "c" / "tables").mkdir(parents=True)
    with pytest.raises(ValueError, match="no answers.csv"):
        compare({"A": a, "C": tmp_path / "c"})


def test_the_command_compares_finished_studies(tmp_path, capsys):
    from probing.study.across import main

    a = _run(tmp_path, "a", [("yes", 0.5)], [("decoding", "yes", 0.3)], layers=(6,))
    b = _run(tmp_path, "b", [("yes", 0.4)], [("decoding", "yes", 0.3)], layers=(2,))
    assert main([str(a), str(b), "--out", str(tmp_path / "cmp")]) == 0
    text = (tmp_path / "cmp" / "models.md").read_text(encoding="utf-8")
    assert "answer on a" in text and "[report](../a/report.md)" in text and "holds: all 1 rows alike" in text
    assert main([str(a), "--out", str(tmp_path / "one")]) == 2
    assert "error: comparing models needs at least two runs" in capsys.readouterr().err
    assert main([str(a), str(b), "--out", str(tmp_path / "named"), "--names", "first,second"]) == 0
    assert "answer on first" in (tmp_path / "named" / "models.md").read_text(encoding="utf-8")
    with pytest.raises(SystemExit):
        main([str(a), str(b), "--out", str(tmp_path / "bad"), "--names", "only-one"])
    assert "--names: give 2 different names" in capsys.readouterr().err and not (tmp_path / "bad").exists()


def test_slugs_and_findings():
    assert finding("inconclusive", 3.0) == "cannot tell" and finding("yes", -1e-9) == "yes −"
    assert model_slug("bert-base-uncased") == "bert-base-uncased"
    assert unique_slugs(["/r/why/mlm/seed0", "/r/why/nsp/seed0"]) == ["mlm_seed0", "nsp_seed0"]
    assert unique_slugs(["/a/mlm/seed0", "/b/mlm/seed0"]) == ["a_mlm_seed0", "b_mlm_seed0"]
    assert len(set(unique_slugs(["x/seed0", "./x/seed0"]))) == 2


@pytest.mark.slow
def test_study_command_with_two_models_writes_each_report_and_the_comparison(tmp_path, bert_tokenizer):
    from .conftest import make_tiny_bert, quick_study_config
    from probing.study.runner import main

    dirs = []
    for seed in (0, 2):
        d = tmp_path / f"tiny{seed}"
        make_tiny_bert(bert_tokenizer, seed=seed, max_position_embeddings=128).save_pretrained(d)
        bert_tokenizer.save_pretrained(d)
        dirs.append(d)
    cfg = quick_study_config(tmp_path, dirs[0])
    out = tmp_path / "both"
    code = main([str(cfg), "--quick", "--questions", "Q2", "--out", str(out), "--no-progress",
                 "--model", str(dirs[0]), "--model", str(dirs[1])])
    assert code == 0
    for d in dirs:
        answers = pd.read_csv(out / d.name / "tables" / "answers.csv")
        assert answers["question"].tolist() == ["Q2"] and answers["model"].iloc[0].endswith(d.name)
        assert (out / d.name / "report.md").is_file()
    summary = pd.read_csv(out / "tables" / "models.csv")
    assert summary["question"].tolist() == ["Q2"] and summary["n_rows"].iloc[0] > 0
    text = (out / "models.md").read_text(encoding="utf-8")
    assert f"[report]({dirs[0].name}/report.md)" in text and f"[report]({dirs[1].name}/report.md)" in text


def test_study_command_refuses_one_model_given_twice_as_two(tmp_path):
    from probing.study.runner import run_models
    from probing.study.errors import StudyError

    with pytest.raises(StudyError, match="at least two different"):
        run_models(None, ["m", "m"])
