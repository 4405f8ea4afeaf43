"""The probe protocol for many feature sets at once (layers x token choices), in torch.

:func:`probe_many_results` runs :func:`analyses.probes.cross_validate_probe`'s protocol (same
splits, C grid, standardisation, objective and scores) for every feature set together with the
batched solver of :mod:`analyses.probes._solver`; :func:`probe_many` returns it as one tidy table.
Columns: :mod:`analyses.probes`.
"""

from __future__ import annotations

from typing import Any, Hashable, Mapping, Sequence

import numpy as np
import pandas as pd

from analyses.stats import check_resamples
from analyses.probes._metrics import (DEFAULT_CS, DTYPES, SelectBy, _check_Cs, _check_X, _check_groups, _check_n_groups,
                                      _check_select_by, _check_y, _choose_C, _evaluate_fold, _fold_items,
                                      control_labels, make_splits)
from analyses.probes._results import PROBE_RESAMPLES, ProbeResult, _item_matrices, _items_table, _result, probe_rows
from analyses.probes._solver import (HISTORY, _Problems, _device_inner_scores, _lbfgs, _torch, feature_basis,
                                     feature_spectrum)
from analyses.results import make_table
from probing.workers import cpu_workers, split, thread_map

#: Condition number of a feature set's covariance above which the batched solver is preconditioned
#: (:mod:`analyses.probes._solver`): below it plain L-BFGS took as few iterations on the planted
#: benchmark (condition number ~9), above it (~2e7, anisotropic states) the preconditioner cut them ~7x.
PRECONDITION_ABOVE = 100.0

#: Default bound on the elements of one batch's largest tensors (``max_batch_elements``): 256 MiB per
#: worker in float32. Large enough that the benchmark's and the study's feature sets are solved in one
#: batch per worker (batching fewer sets together costs time: benchmarks/RESULTS.md), small enough that
#: a corpus of 100k items is solved a few feature sets at a time instead of all at once.
MAX_BATCH_ELEMENTS = 2 ** 26

#: Rows standardised at a time when a feature set is read (float64 temporaries of this many rows).
STANDARDISE_ROWS = 256

def probe_many_results(features: Mapping[Hashable, Any], y: Any, groups: Any = None, *, n_splits: int = 5,
                       seed: int = 0, Cs: Sequence[float] = DEFAULT_CS, inner_splits: int = 3,
                       select_by: SelectBy = "log_loss", max_iter: int = 1000, tol: float = 1e-4,
                       control_types: Any = None, device: str | None = None, dtype: str = "float32",
                       max_batch_elements: int = MAX_BATCH_ELEMENTS, num_threads: int | None = None,
                       confidence: float = 0.95, n_resamples: int = PROBE_RESAMPLES) -> dict[Hashable, ProbeResult]:
    """The protocol of :func:`cross_validate_probe` for many feature sets at once, in torch.

    ``features``: name -> ``(n_items, dim)`` array (e.g. ``(layer, role)`` -> states), all with the
    same items in the same order as ``y`` and ``groups``. A value may be any object with a ``shape``
    that ``np.asarray`` reads (e.g. :class:`analyses.stored.StoredArray`, features kept on disk): it is
    read a batch at a time, in the workers' threads, so that only the feature sets being solved are in
    memory. Every feature set uses the same outer and
    inner splits, C grid, standardisation, objective and scoring as the reference, so results agree
    with :func:`cross_validate_probe` up to optimiser tolerance. All (feature set x outer fold x
    inner fold x C [x task/control]) problems of a chunk are solved together by :func:`_lbfgs`
    (stage 1, choosing C: the Cs in ascending order, each started from the previous C's solutions and
    curvature pairs), then all (feature set x outer fold) refits (stage 2, each started from the mean
    of its inner folds' solutions at the chosen C). One eigendecomposition per feature set
    (:func:`analyses.probes._solver.feature_basis`) preconditions every solve when some covariance's
    condition number exceeds :data:`PRECONDITION_ABOVE`. Features stay in ``dtype`` (one
    ``(B, n, d + 1)`` tensor per chunk and its transpose, never copied per problem). ``device``: None ->
    CUDA if available; ``dtype`` in ``DTYPES``. ``max_batch_elements`` bounds the elements of the
    largest tensors of one batched solve (memory): its features and their transpose, ``2 B n (d + 1)``,
    and its problems' logits and optimiser histories, ``B G K (n + 2 HISTORY (d + 1))``; so the peak
    stays flat in the number of items once the bound binds (fewer feature sets per batch: slower).
    ``num_threads``: on the CPU, the feature sets are dealt to this many workers of one torch thread
    each (:mod:`probing.workers`; None: torch's thread count, by default the machine's cores), which
    is faster than torch's own threads on these small products; torch's setting is restored
    afterwards. The preconditioning decision is taken over all feature sets, so the results do not
    depend on the number of workers beyond float rounding. Returns name -> :class:`ProbeResult`.
    """
    check_resamples(n_resamples, confidence)  # before any fit
    return _probe_many_results(features, y, groups, n_splits=n_splits, seed=seed, Cs=Cs, inner_splits=inner_splits,
                               select_by=select_by, max_iter=max_iter, tol=tol, control_types=control_types,
                               device=device, dtype=dtype, max_batch_elements=max_batch_elements,
                               workers=cpu_workers(num_threads), confidence=confidence, n_resamples=n_resamples)


def _probe_many_results(features, y, groups, *, n_splits, seed, Cs, inner_splits, select_by, max_iter, tol,
                        control_types, device, dtype, max_batch_elements, workers, confidence, n_resamples):
    torch = _torch()
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}; got dtype={dtype!r}")
    tdtype = getattr(torch, dtype)
    from probing.models import pick_device

    dev = pick_device(device)
    if len(features) == 0:
        raise ValueError("features is empty; pass at least one name -> (n_items, dim) array")
    names = list(features)
    shapes = {k: _feature_shape(features[k], f"features[{k!r}]") for k in names}
    n = shapes[names[0]][0]
    y, multilabel = _check_y(y, shapes[names[0]])
    for k, shape in shapes.items():
        if shape[0] != n:
            raise ValueError(f"features[{k!r}] and y differ in n_items: "
                             f"features[{k!r}].shape={shape}, y.shape={y.shape}")
    groups = _check_groups(groups, n)
    n_groups = _check_n_groups(groups, n_splits, "n_splits")
    Cs_arr = _check_Cs(Cs)
    _check_select_by(select_by)

    classes = np.arange(y.shape[1]) if multilabel else np.unique(y)
    binary = not multilabel and len(classes) == 2
    kind = "softmax" if not multilabel and not binary else "sigmoid"
    label_sets = [y]
    if control_types is not None:
        label_sets.append(_check_y(control_labels(y, control_types, seed), (n,), what="control labels")[0])
    L = len(label_sets)

    def encode(lab: np.ndarray) -> np.ndarray:  # 0/1 targets (n, K): one-hot classes or labels
        if multilabel:
            return lab.astype(np.float64)
        idx = np.searchsorted(classes, lab)
        if binary:
            return (idx == 1).astype(np.float64)[:, None]
        return np.eye(len(classes))[idx]

    encoded = [encode(lab) for lab in label_sets]
    K = encoded[0].shape[1]
    outer = make_splits(y, groups, n_splits, seed)
    inner = []
    if len(Cs_arr) > 1:
        for tr, _ in outer:  # the same call LinearProbe.fit makes on the outer training rows
            _check_n_groups(groups[tr], inner_splits, "inner_splits")
            inner.append([(tr[a], tr[b]) for a, b in make_splits(y[tr], groups[tr], inner_splits, seed)])

    def columns(specs):
        """specs: [(label_set, train_idx, eval_idx)] -> train masks, eval masks (n, G), targets (n, K, G)."""
        masks, evals = np.zeros((n, len(specs))), np.zeros((n, len(specs)))
        for g, (_, tr, te) in enumerate(specs):
            masks[tr, g] = 1.0
            evals[te, g] = 1.0
        targets = np.stack([encoded[l] for l, _, _ in specs], axis=2)
        return tuple(torch.as_tensor(a, dtype=tdtype, device=dev) for a in (masks, evals, targets))

    # Stage 1 columns: label set x outer fold x inner fold, solved for each C in turn (ascending, each
    # started from the previous C's solution, as LogisticRegressionCV does); stage 2: label set x outer fold.
    stage1 = [(l, tr_in, te_in) for l in range(L) for folds in inner for tr_in, te_in in folds]
    stage2 = [(l, tr, te) for l in range(L) for tr, te in outer]
    by_dim: dict[int, list[Hashable]] = {}
    for k in names:
        by_dim.setdefault(shapes[k][1], []).append(k)
    batches = []
    for dim, ks in by_dim.items():
        # per feature set: its features and their transpose; per problem the logits (n rows) and the
        # optimiser's 2 x HISTORY history vectors (dim + 1 rows)
        per_set = 2 * n * (dim + 1) + K * max(len(stage1), len(stage2)) * (n + 2 * HISTORY * (dim + 1))
        chunk = max(1, max_batch_elements // per_set)
        # on the CPU at least one batch per worker (each worker solves its batches on one thread)
        parts = max(-(-len(ks) // chunk), workers if dev.type == "cpu" else 1)
        batches += split(ks, parts)
    on_cpu = workers if dev.type == "cpu" else None

    def run(fn, xs):
        return thread_map(fn, xs, on_cpu)

    # With at most one batch per worker all batches are in memory at once anyway: their features are
    # read once and kept from the spectrum pass to the solve. With more batches than workers (a large
    # corpus, the batch bound binding) they are read again for the solve, so that only the batches being
    # solved are in memory.
    keep = len(batches) <= (workers if dev.type == "cpu" else 1)

    def load(keys):
        """The chunk's features as one ``(B, n, d + 1)`` tensor with a trailing ones column (the
        intercept). A fixed global standardisation first: exact for the per-fold standardisation that
        follows (affine per feature) and keeps float32 from cancelling large means. Statistics in
        float64, the features themselves stay in the solver's dtype."""
        B, d = len(keys), shapes[keys[0]][1]
        X = torch.ones(B, n, d + 1, dtype=tdtype, device=dev)
        for b, k in enumerate(keys):
            a = _check_X(features[k], name=f"features[{k!r}]")
            if a.shape != shapes[k]:
                raise ValueError(f"features[{k!r}] was read with shape {a.shape}, not its announced {shapes[k]}")
            mean, std = column_moments(a)
            std = np.where(std > 0, std, 1.0)
            for r in range(0, n, STANDARDISE_ROWS):  # float64 temporaries of a few rows, not of all
                X[b, r:r + STANDARDISE_ROWS, :d] = torch.as_tensor(
                    ((a[r:r + STANDARDISE_ROWS] - mean) / std).astype(dtype, copy=False))
            del a
        return X

    def prepare(keys):
        """The chunk's features (kept only if ``keep``), their covariances' eigenvalues (float64) and
        whether any needs preconditioning. Every feature set is read and checked here, before any solve."""
        X = load(keys)
        lam = feature_spectrum(X)  # the eigenvectors only where preconditioning (solve)
        return X if keep else None, lam, bool((lam.amax(1) > PRECONDITION_ABOVE * lam.amin(1)).any())

    prepared = run(prepare, batches)
    # Preconditioning pays where a covariance is ill-conditioned (states of trained encoders are highly
    # anisotropic); on a well-conditioned one it only adds two d x d products per evaluation. Decided
    # once for all feature sets, so that no result depends on how they were split into batches.
    precondition = any(p[2] for p in prepared)

    def solve(job):
        keys, (X, lam, _) = job
        if X is None:
            X = load(keys)
        # one factorisation per feature set, shared by every fold, C and target
        basis = feature_basis(X) if precondition else (None, lam.to(tdtype))
        XT = X.transpose(1, 2).contiguous()  # shared by both stages' problems
        B, d = len(keys), X.shape[2] - 1
        chosen = np.full((B, L, n_splits), float(Cs_arr[0]))
        theta0 = torch.zeros(B, len(stage2), (d + 1) * K, dtype=tdtype, device=dev)
        if stage1:
            masks, evals, targets = columns(stage1)
            problems = _Problems(X, masks, targets, torch.ones(B, len(stage1), dtype=tdtype, device=dev), kind, basis,
                                 XT)
            theta = torch.zeros(B, len(stage1), (d + 1) * K, dtype=tdtype, device=dev)
            sc = np.empty((B, len(stage1), len(Cs_arr)))
            path, memory = [], {}
            for c, C in enumerate(Cs_arr):
                at_C = problems.with_inv_C(torch.full((B, len(stage1)), 1.0 / C, dtype=tdtype, device=dev))
                theta, _ = _lbfgs(at_C, theta, max_iter=max_iter, tol=tol, memory=memory, precondition=precondition)
                path.append(theta.view(B, L, n_splits, inner_splits, -1).mean(3))
                sc[:, :, c] = _device_inner_scores(at_C, theta, evals, select_by, multilabel).double().cpu().numpy()
            sc = sc.reshape(B, L, n_splits, inner_splits, len(Cs_arr))
            for b, l, o in np.ndindex(B, L, n_splits):
                chosen[b, l, o] = _choose_C(sc[b, l, o], Cs_arr)
                # the refit starts from the mean of its inner folds' solutions at the chosen C
                theta0[b, l * n_splits + o] = path[int(np.searchsorted(Cs_arr, chosen[b, l, o]))][b, l, o]
            del problems, at_C, theta, masks, evals, targets, path, memory
        masks, _, targets = columns(stage2)
        inv_C = torch.as_tensor(1.0 / chosen.reshape(B, L * n_splits), dtype=tdtype, device=dev)
        problems = _Problems(X, masks, targets, inv_C, kind, basis, XT)
        theta, _ = _lbfgs(problems, theta0, max_iter=max_iter, tol=tol, precondition=precondition)
        out = {}
        G2 = len(stage2)
        for b, key in enumerate(keys):  # one feature set's probabilities at a time: (G, K, n) -> (n, K, G)
            own = problems.select(torch.arange(b * G2, (b + 1) * G2, device=dev), None)
            Pb = own.item_loss_and_prob(own.logits(theta[b].reshape(G2, 1, -1)))[1]
            Pb = Pb.double().cpu().numpy().transpose(2, 1, 0)
            if binary:
                Pb = np.concatenate([1 - Pb, Pb], axis=1)
            per_label, per_items = [], []
            for l, lab in enumerate(label_sets):
                per_label.append([_evaluate_fold(lab[tr], lab[te], Pb[te, :, l * n_splits + o], classes, multilabel)
                                  for o, (tr, te) in enumerate(outer)])
                per_items.append([_fold_items(lab[tr], lab[te], Pb[te, :, l * n_splits + o], classes, multilabel)
                                  for o, (tr, te) in enumerate(outer)])
            control = [d_["micro_f1" if multilabel else "accuracy"] for d_ in per_label[1]] if L > 1 else None
            items = _items_table(outer, per_items[0], y, groups, multilabel, per_items[1] if L > 1 else None)
            out[key] = _result(multilabel, per_label[0], list(chosen[b, 0]), n, n_groups, control,
                               list(chosen[b, 1]) if L > 1 else None, confidence, items, n_resamples, seed,
                               _item_matrices(outer, per_items[0], n), grid=tuple(Cs_arr))
        return out

    jobs = list(zip(batches, prepared))
    del prepared
    results: dict[Hashable, ProbeResult] = {}
    for out in run(solve, jobs):
        results.update(out)
    return {k: results[k] for k in names}


def column_moments(a: np.ndarray, rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(a.mean(0), a.std(0))`` in float64, reading ``rows`` rows at a time (default
    :data:`STANDARDISE_ROWS`), so that no float64 copy of the whole of ``a`` is made. Bit for bit the
    same as numpy's: numpy sums over axis 0 of a C-ordered array row after row, and each chunk's sum
    here starts from the running total (as the first row of the reduction), which keeps that order."""
    rows = rows or STANDARDISE_ROWS
    n = a.shape[0]

    def total(fn):
        acc = np.zeros(a.shape[1:], dtype=np.float64)
        for r in range(0, n, rows):
            acc = np.add.reduce(np.concatenate([acc[None], fn(a[r:r + rows])]), axis=0)
        return acc

    mean = total(lambda part: part.astype(np.float64)) / n
    return mean, np.sqrt(total(lambda part: np.square(part - mean)) / n)


def _feature_shape(X: Any, name: str) -> tuple[int, int]:
    """``X``'s ``(n_items, dim)``, without reading it where it has a ``shape`` (arrays, stored arrays)."""
    shape = tuple(int(v) for v in np.shape(X))
    if len(shape) != 2:
        raise ValueError(f"{name} must be (n_items, dim); got {name}.shape={shape}")
    return shape


def probe_many(features: Mapping[Hashable, Any], y: Any, groups: Any = None, *, meta: Mapping[str, Any] | None = None,
               **kwargs: Any) -> pd.DataFrame:
    """:func:`probe_many_results` as one tidy table (``make_table``): rows of :func:`probe_rows` for
    every feature set. A ``(layer, role)`` tuple name fills the ``layer`` and ``role`` columns; any
    other name goes, as it is, into a ``feature`` column. ``meta`` (model, corpus, format, target,
    seed, analysis) goes on every row; ``kwargs`` go to :func:`probe_many_results`."""
    results = probe_many_results(features, y, groups, **kwargs)
    meta = dict(meta or {})
    meta.setdefault("seed", kwargs.get("seed", 0))
    rows = []
    for key, res in results.items():
        where = {"layer": key[0], "choice": key[1]} if isinstance(key, tuple) and len(key) == 2 else {"feature": key}
        rows.extend(probe_rows(res, **{**meta, **where}))
    return make_table(rows)
