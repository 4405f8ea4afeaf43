"""The study's analysis stages on one core against all of them, measured in the same run.

Runs the question analyses of a finished study twice from its caches, once pinned to one core (the process's CPU
affinity and every thread pool set to 1) and once on the machine's cores, each into a fresh output directory that
holds only the study's stored fine-tuning runs (so fine-tuning is read back, not redone, and every analysis is
computed), and prints each stage's wall time from the two runs' ``tables/stages.csv`` and the ratio of their
analysis totals. On one core the sections run one after another; on several, the study forks them into
single-threaded workers (:mod:`probing.study.parallel`) and then reads their tables back, and both passes
count; the run on several cores orders its sections by the one-core run's stage times, as a study run again in
its output directory does. The scale issue's goal: the analysis stages Q1-Q7 together at least 1.6x faster on
the 2-core machine with two cores than with one (6x on a 16-core GPU machine).

    python -m probing.study seed_questions --out runs/seed_questions --caches caches   # once
    python benchmarks/analyses_cores.py --study runs/seed_questions --caches caches

Linux only (``os.sched_setaffinity``). Results: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from probing.study.parallel import WORKER_SUFFIX  # noqa: E402
GOAL = 1.6
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "RAYON_NUM_THREADS")


def run(study: Path, caches: Path, config: str, questions: str, cores: list[int], work: Path,
        costs: Path | None = None, device: str | None = None, quick: bool = False) -> dict[str, float]:
    """One run of the analyses on ``cores``: ``{stage: wall seconds}`` from its stages table. ``costs``: a stage
    table put where the run looks for its last one, so that its workers start the longest sections first."""
    import pandas as pd

    out = work / f"cores{len(cores)}"
    (out / ".results").mkdir(parents=True)
    for f in (study / ".results").glob("finetune_run-*"):
        shutil.copy2(f, out / ".results" / f.name)
    if costs is not None:
        (out / "tables").mkdir()
        shutil.copy2(costs, out / "tables" / "stages.csv")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="true" if len(cores) > 1 else "false",
               **{v: str(len(cores)) for v in THREAD_VARIABLES})
    cmd = [sys.executable, "-m", "probing.study", config, "--out", str(out), "--caches", str(caches), "--questions",
           questions, "--no-progress"] + (["--device", device] if device else []) + (["--quick"] if quick else [])
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          preexec_fn=lambda: os.sched_setaffinity(0, cores))
    if done.returncode != 0:
        raise SystemExit(f"the study failed on {len(cores)} core(s):\n{done.stderr[-3000:]}")
    stages = pd.read_csv(out / "tables" / "stages.csv").set_index("stage")["seconds"].to_dict()
    stages["(whole run)"] = time.perf_counter() - t0
    return stages


def analyses_seconds(stages: dict[str, float]) -> float:
    """The analyses' wall time in one run's stage table: the workers' pass (``analyses, N workers``) and the
    runner's pass over the sections (``analyses Q1`` ...); not the workers' own rows, which overlap the pass."""
    return sum(v for k, v in stages.items() if k.startswith("analyses") and not k.endswith(WORKER_SUFFIX))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--study", required=True, help="a finished study's output directory (its .results are read)")
    p.add_argument("--caches", required=True, help="the study's cache directory")
    p.add_argument("--config", default="seed_questions", help="the study's config (default seed_questions)")
    p.add_argument("--questions", default="Q1,Q2,Q3,Q4,Q5,Q6,Q7", help="the analyses timed (default Q1-Q7)")
    p.add_argument("--quick", action="store_true", help="the study was run with --quick (its [quick] settings)")
    p.add_argument("--device", default=None,
                   help="the study's --device for both runs (default: the config's); on a GPU machine 'cpu' times "
                        "the analyses on its cores (the study forks no workers where CUDA is in use)")
    args = p.parse_args(argv)
    study, caches = Path(args.study), Path(args.caches)
    if not (study / ".results").is_dir() or not caches.is_dir():
        p.error(f"--study {study} needs a finished study's .results/ and --caches {caches} its caches")
    available = sorted(os.sched_getaffinity(0))
    work = Path(tempfile.mkdtemp(prefix="probing-cores-"))
    try:
        one = run(study, caches, args.config, args.questions, available[:1], work, device=args.device, quick=args.quick)
        # the workers take the sections longest first by the costs the one-core run has just measured
        many = run(study, caches, args.config, args.questions, available, work,
                   costs=work / "cores1" / "tables" / "stages.csv", device=args.device, quick=args.quick)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"machine: {os.uname().machine}, {len(available)} cores available; study {study}, questions {args.questions}")
    width = max(len(k) for k in [*one, *many])
    print(f"{'stage':<{width}}{'1 core s':>10}{f'{len(available)} cores s':>12}")
    for k in dict.fromkeys([*one, *many]):
        if k.startswith("analyses") or k == "(whole run)":
            a, b = (f"{d[k]:.1f}" if k in d else "-" for d in (one, many))
            print(f"{k:<{width}}{a:>10}{b:>12}")
    t1, tn = analyses_seconds(one), analyses_seconds(many)
    ratio = t1 / tn
    print(f"analyses together: {t1:.1f} s on 1 core, {tn:.1f} s on {len(available)}: {ratio:.2f}x "
          f"(goal >= {GOAL}x on 2 cores) {'PASS' if ratio >= GOAL else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
