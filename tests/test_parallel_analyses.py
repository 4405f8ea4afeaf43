"""The sections' analyses in forked single-threaded workers (probing.study.parallel): grouping by shared tables,
longest first from the last stage table, one thread each, failures left to the runner, and a study whose tables
are the same with workers as computed one after another on one thread."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from probing.study.parallel import (PSS_SAMPLED, RSS_BOUND, WORKER_SUFFIX, analyse_in_workers, can_fork, groups,
                                    longest_first, previous_costs)
from probing.study.sections import Context

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the workers are forked on Linux only")


def _section(key: str, tables=(), fail: bool = False):
    def analyse(ctx):
        import torch

        if fail:
            raise RuntimeError(f"{key} fails on purpose")
        (ctx.out / f"{key}.txt").write_text(f"{os.getpid()} {torch.get_num_threads()} {sorted(ctx.tables)}")
        return {}

    return SimpleNamespace(key=key, tables=tuple(tables), analyse=analyse)


def _ctx(tmp_path: Path, logs: list) -> Context:
    return Context(cfg=None, caches=None, corpora={}, lm=None, out=tmp_path, log=logs.append,
                   tables={"finetune_predictions": pd.DataFrame({"x": [1]})})


def test_sections_that_share_a_table_form_one_group_and_preset_tables_do_not_join():
    S = [_section("Q1", ("a", "finetune_predictions")), _section("Q2", ("b",)), _section("Q3", ("c",)),
         _section("Q4", ("finetune_predictions", "d")), _section("Q5", ("b", "c"))]
    # Q5 shares b with Q2 and c with Q3: the three are one group; the fine-tuning table, already there, joins none
    assert [[s.key for s in g] for g in groups(S, preset=("finetune_predictions",))] == [["Q1"], ["Q2", "Q3", "Q5"],
                                                                                         ["Q4"]]
    assert [[s.key for s in g] for g in groups(S)] == [["Q1", "Q4"], ["Q2", "Q3", "Q5"]]


def test_the_costs_come_from_the_last_stage_table_and_order_the_work(tmp_path):
    csv = tmp_path / "stages.csv"
    pd.DataFrame({"stage": ["extraction", "analyses Q1", "analyses Q2", "analyses Q3+Q5" + WORKER_SUFFIX,
                            "analyses Q3", "figures"],
                  "seconds": [100.0, 20.0, 5.0, 30.0, 0.2, 9.0]}).to_csv(csv, index=False)
    costs = previous_costs(csv)
    assert costs == {"Q1": 20.0, "Q2": 5.0, "Q3": 15.0, "Q5": 15.0}  # a worker's row wins over the read-back row
    jobs = [[_section("Q2")], [_section("Q1")], [_section("Q3"), _section("Q5")], [_section("Q9")]]
    # Q9 has no cost yet: it counts as the longest known (20 s) and keeps its place among equals
    assert [[s.key for s in j] for j in longest_first(jobs, costs)] == [["Q3", "Q5"], ["Q1"], ["Q9"], ["Q2"]]
    assert previous_costs(tmp_path / "missing.csv") == {}


def test_workers_run_each_group_once_on_one_thread_and_a_failure_is_left_to_the_runner(tmp_path):
    logs: list[str] = []
    S = [_section("Q1"), _section("Q2", ("b",)), _section("Q3", ("c",), fail=True), _section("Q5", ("c",)),
         _section("Q6")]
    runs, row = analyse_in_workers(S, _ctx(tmp_path, logs), workers=2, log=logs.append)
    assert sorted(r.keys for r in runs) == [("Q1",), ("Q2",), ("Q3", "Q5"), ("Q6",)]
    seen = {k: (tmp_path / f"{k}.txt").read_text().split(" ", 2) for k in ("Q1", "Q2", "Q6")}
    pids = {int(pid) for pid, _, _ in seen.values()}
    assert os.getpid() not in pids and len(pids) == 3  # each group in its own process
    assert all(threads == "1" for _, threads, _ in seen.values())
    assert all("finetune_predictions" in tables for _, _, tables in seen.values())  # the runner's tables inherited
    # Q3 failed before Q5, its group's next section: the group's worker stopped and said so; the rest went on
    assert not (tmp_path / "Q3.txt").exists() and not (tmp_path / "Q5.txt").exists()
    failed = [r for r in runs if r.status != 0]
    assert [r.keys for r in failed] == [("Q3", "Q5")]
    assert any("the worker for Q3+Q5 failed" in line for line in logs)
    assert row["seconds"] > 0 and row["peak_rss_mb"] > 0 and row["rss_method"] in (PSS_SAMPLED, RSS_BOUND)
    assert all(r.stage == "analyses " + "+".join(r.keys) + WORKER_SUFFIX for r in runs)


def test_a_worker_killed_by_a_signal_is_reported_and_the_others_finish(tmp_path):
    import signal

    logs: list[str] = []
    killed = SimpleNamespace(key="Q4", tables=(), analyse=lambda ctx: os.kill(os.getpid(), signal.SIGKILL))
    runs, _ = analyse_in_workers([killed, _section("Q6")], _ctx(tmp_path, logs), workers=2, log=logs.append)
    status = {r.keys: r.status for r in runs}
    assert status == {("Q4",): -signal.SIGKILL, ("Q6",): 0} and (tmp_path / "Q6.txt").exists()
    assert any(f"the worker for Q4 failed (exit status {-signal.SIGKILL})" in line for line in logs)


def test_no_fork_where_cuda_is_the_device():
    assert not can_fork("cuda")
    assert can_fork("cpu") == sys.platform.startswith("linux")


@pytest.mark.slow
def test_a_study_gives_the_same_tables_with_workers_as_one_after_another(tmp_path, bert_tokenizer, monkeypatch):
    """The workers (one thread each) and a serial run on one thread write the same tables, value for value."""
    import torch

    from probing.study.runner import RESULTS_DIR, run_study
    from .conftest import make_tiny_bert, quick_study_config

    model_dir = tmp_path / "tiny-model"
    make_tiny_bert(bert_tokenizer, max_position_embeddings=128).save_pretrained(model_dir)
    bert_tokenizer.save_pretrained(model_dir)
    cfg = quick_study_config(tmp_path, model_dir)
    questions = ["Q3", "Q4", "Q5"]
    logs: list[str] = []
    parallel = run_study(cfg, quick=True, overrides={"study.questions": questions, "study.threads": 2,
                                                    "study.out": str(tmp_path / "parallel")},
                         log=logs.append, progress=False).parent
    stages = pd.read_csv(parallel / "tables" / "stages.csv")
    assert "analyses, 2 workers" in set(stages["stage"])
    assert {"analyses Q3+Q5" + WORKER_SUFFIX, "analyses Q4" + WORKER_SUFFIX} <= set(stages["stage"])
    serial = tmp_path / "serial"
    (serial / RESULTS_DIR).mkdir(parents=True)
    for f in (parallel / RESULTS_DIR).glob("finetune_run-*"):  # the same fine-tuning runs: only analyses differ
        shutil.copy2(f, serial / RESULTS_DIR / f.name)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=1):
            run_study(cfg, quick=True, overrides={"study.questions": questions, "study.threads": 1,
                                                  "study.out": str(serial)}, log=logs.append, progress=False)
    finally:
        torch.set_num_threads(threads)
    assert "analyses, 2 workers" not in set(pd.read_csv(serial / "tables" / "stages.csv")["stage"])
    names = sorted(p.name for p in (parallel / "tables").glob("*.parquet") if p.name != "stages.parquet")
    assert names == sorted(p.name for p in (serial / "tables").glob("*.parquet") if p.name != "stages.parquet")
    assert any(n.startswith("sentence_content") for n in names) and any(n.startswith("q4_") for n in names)
    for name in names:
        pd.testing.assert_frame_equal(pd.read_parquet(parallel / "tables" / name),
                                      pd.read_parquet(serial / "tables" / name), obj=name)
