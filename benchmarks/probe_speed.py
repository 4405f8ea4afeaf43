"""Speed of the batched torch probe path against a plain per-feature-set scikit-learn loop.

Planted data: ``layers x token_choices`` feature sets of ``(n_items, dim)`` states for one
``classes``-way target whose signal strength rises and falls with the layer (and differs a little
between token choices), items grouped into examples of ``items_per_example``, with BERT-like
non-zero means and a few large-scale outlier dimensions. Both paths run the same protocol (grouped
outer CV, grouped inner CV over the same C grid, standardisation, sklearn's objective):

* sklearn: ``cross_validate_probe`` once per feature set (``LinearProbe`` = standardise +
  ``LogisticRegression(lbfgs)`` per inner fold and C, warm-started along the C path);
* batched: ``probe_many_results`` on all feature sets at once.

Prints both wall times, their ratio and the mean / max absolute difference in mean accuracy. Both
libraries are imported before the clock starts (torch's import, about 1.4 s on the development
machine, used to fall inside the batched path's time).

    python benchmarks/probe_speed.py                 # 7 layers x 4 token choices, n=2000, d=384
    python benchmarks/probe_speed.py --n-items 300 --dim 32 --layers 2 --token-choices 2   # smoke test
    python benchmarks/probe_speed.py --Cs 0.003,0.01,0.1 --inner-folds 2 --max-iter 300   # the study's settings
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch  # imported before either path is timed, as scikit-learn is (about 1.4 s here, once per process)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from analyses.probes import DTYPES, cross_validate_probe, probe_many_results  # noqa: E402
from probing.workers import thread_map  # noqa: E402


def planted_features(n_items: int, dim: int, layers: int, token_choices: int, classes: int,
                     items_per_example: int, seed: int) -> tuple[dict, np.ndarray, np.ndarray, dict]:
    """Returns ``features {(layer, token_choice): (n_items, dim)}``, ``y (n_items,)``,
    ``groups (n_items,)`` and the signal strength of each feature set."""
    rng = np.random.default_rng(seed)
    groups = np.arange(n_items) // items_per_example
    y = rng.integers(0, classes, n_items)
    means = rng.normal(size=(classes, dim))
    offset = rng.normal(3.0, 1.0, size=dim)
    scale = np.ones(dim)
    scale[rng.choice(dim, size=max(1, dim // 100), replace=False)] = 20.0  # outlier dimensions
    features, strength = {}, {}
    for layer in range(layers):
        peak = np.sin(np.pi * (layer + 1) / (layers + 1))  # signal rises, then falls with depth
        example_part = rng.normal(size=(groups.max() + 1, dim))
        for t in range(token_choices):
            s = 0.01 + 0.12 * peak * (1.0 - 0.2 * t)
            X = s * means[y] + 0.5 * example_part[groups] + rng.normal(size=(n_items, dim))
            features[(layer, f"token{t}")] = (offset + scale * X).astype(np.float32)
            strength[(layer, f"token{t}")] = s
    return features, y, groups, strength


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-items", type=int, default=2000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--layers", type=int, default=7)
    ap.add_argument("--token-choices", type=int, default=4)
    ap.add_argument("--classes", type=int, default=5)
    ap.add_argument("--items-per-example", type=int, default=4)
    ap.add_argument("--folds", type=int, default=5, help="outer cross-validation folds (default 5)")
    ap.add_argument("--inner-folds", type=int, default=3, help="inner folds choosing C (default 3)")
    ap.add_argument("--Cs", nargs="+", default=["0.001,0.01,0.1,1,10"],
                    help="the C grid, comma- or space-separated (default 0.001,0.01,0.1,1,10)")
    ap.add_argument("--max-iter", type=int, default=1000, help="L-BFGS iterations per fit (default 1000)")
    ap.add_argument("--control", action="store_true", help="also fit control-task probes (example id as type)")
    ap.add_argument("--device", default=None, help="torch device for the batched path (default: cuda if available)")
    ap.add_argument("--dtype", choices=DTYPES, default="float32")
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU workers of the batched path, one torch thread each (probing.workers; default 1: "
                         "like for like with the scikit-learn loop, which runs its BLAS on one thread inside "
                         "LinearProbe.fit; the toolkit's own default is one worker per core)")
    ap.add_argument("--sklearn-workers", type=int, default=1,
                    help="threads running the scikit-learn loop's feature sets side by side (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.Cs = [float(c) for part in args.Cs for c in part.split(",") if c.strip()]

    features, y, groups, strength = planted_features(args.n_items, args.dim, args.layers, args.token_choices,
                                                     args.classes, args.items_per_example, args.seed)
    common = dict(n_splits=args.folds, seed=args.seed, Cs=args.Cs, inner_splits=args.inner_folds,
                  max_iter=args.max_iter, control_types=groups if args.control else None)
    print(f"{len(features)} feature sets ({args.layers} layers x {args.token_choices} token choices), "
          f"n={args.n_items}, d={args.dim}, {args.classes} classes, {args.folds} outer x {args.inner_folds} "
          f"inner folds, {len(args.Cs)} Cs{', with control task' if args.control else ''}")

    t0 = time.perf_counter()
    fast = probe_many_results(features, y, groups, device=args.device, dtype=args.dtype, num_threads=args.threads,
                              **common)
    t_fast = time.perf_counter() - t0

    t0 = time.perf_counter()
    ref = dict(zip(features, thread_map(lambda X: cross_validate_probe(X, y, groups, **common), features.values(),
                                        args.sklearn_workers)))
    t_ref = time.perf_counter() - t0

    diffs = np.array([abs(fast[k].mean - ref[k].mean) for k in features])
    same_C = np.mean([np.mean(fast[k].chosen_Cs == ref[k].chosen_Cs) for k in features])
    print(f"{'feature':>14} {'signal':>7} {'sklearn':>8} {'batched':>8} {'majority':>8}")
    for k in features:
        print(f"{str(k):>14} {strength[k]:7.3f} {ref[k].mean:8.4f} {fast[k].mean:8.4f} {ref[k].majority_baseline:8.4f}")
    device = args.device if args.device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
    print(f"sklearn loop ({args.sklearn_workers} thread(s)): {t_ref:.1f} s")
    print(f"batched torch ({device}, {args.dtype}, {args.threads} worker(s)): {t_fast:.1f} s")
    print(f"speed-up: {t_ref / t_fast:.2f}x")
    print(f"|accuracy difference|: mean {diffs.mean():.4f}, max {diffs.max():.4f}; "
          f"same C chosen in {same_C:.1%} of folds")
    print("load average (1, 5, 15 min) at the end: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
