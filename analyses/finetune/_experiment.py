"""Fine-tuning with different poolings (DESIGN.md Q8): is [CLS] better than mean pooling, and after
fine-tuning would any token do? The experiment runner and its command line.

Frozen and fine-tuned on the same items (:func:`run_pooling_experiment`). The examples are split by
stratified, document-grouped k-fold cross-validation (:func:`cv_splits`: groups = the ``doc`` label
when every example has one, else the example, :func:`analyses.stats.example_groups`; stratified
by the label; several folds and optionally repeated partitions). In every split and for every
pooling, the frozen encoder's pooled last layer is probed by logistic regression
(:class:`analyses.probes.LinearProbe`) fitted on the split's training items, and the encoder is
fine-tuned (:mod:`analyses.finetune`) on the same training items for each training seed; both
predict the same test items. Per-item predictions are kept, so accuracies get cluster-bootstrap CIs
over documents and the comparisons (fine-tuned − frozen, each pooling − mean) are paired
differences on identical items (:func:`analyses.stats.paired_difference`, Holm-adjusted). Every
split reports its best constant (largest test-class share), the training majority's test accuracy
and chance; a run that scores below the best constant or did not converge is flagged (logged and in
the ``warning`` column).

Poolings are the token choices of :mod:`analyses.selection` (``cls``, ``sep1``, ``mean``, ``max``,
``first_word``, ``pos<k>``, ...; :mod:`analyses.finetune._poolings`) read from the *last* hidden layer.
Sentence-BERT (Reimers & Gurevych 2019, table 6) compared CLS, MEAN and MAX for fine-tuned sentence
embeddings; this module asks the same of a classifier and adds ``[SEP]``, the first word and a fixed
position.

Modules: :mod:`analyses.finetune._poolings` (the poolings), :mod:`analyses.finetune._config`
(hyperparameters and presets), :mod:`analyses.finetune` (data, training loop, one run),
:mod:`analyses.finetune._table` (the table's baseline, summary and paired-difference rows, and its
readers), this module (the experiment and ``python -m analyses.finetune``).

>>> get_pooling("pos3").position
3
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import torch

from analyses.stats import DEFAULT_RESAMPLES, MIN_RESAMPLES, check_resamples
from analyses.finetune._train import (RngStreams, Task, _check_label, _collate, _device, _finetune_task, _load,
                                      _max_length_of, _task, check_pooling, render_examples, sorted_batches, split_unit)
from analyses.finetune._config import PRESETS, SCHEDULES, TrainConfig, preset_config, resolve_autocast
from analyses.finetune._poolings import POOLINGS, Pooling, get_pooling, pool, pooling_mask
from analyses.finetune._table import (RUN_METRICS, baseline_rows, best_constant, diff_label, diff_rows, finish_table,
                                      pooled_baselines, summary, summary_rows)
from analyses.results import note_store_use, read_table, resamples_arg, result_path, write_table
from probing.cli import ArgumentParser, int_at_least, output_dir_arg, positive_floats
from probing.examples import Example, corpus_fingerprint
from probing.formats import Format, Rendered, resolve_format
from probing.forward import accepts_token_types, running
from probing.workers import cpu_workers, thread_imap

ANALYSIS = "finetune_pooling"
#: Bump when the protocol changes, so stored results of the old protocol are not reused.
PROTOCOL_VERSION = 3


# --------------------------------------------------------------------------------------------------
# The experiment: poolings x seeds -> tidy table


def _parse_list(values, what: str, cast=str) -> list:
    if isinstance(values, (str, int)):
        values = [values]
    out = []
    for v in values:
        parts = [x.strip() for x in v.split(",")] if isinstance(v, str) else [v]
        for x in parts:
            if x == "":
                continue
            try:
                out.append(cast(x))
            except ValueError:
                raise ValueError(f"bad {what} value {x!r}") from None
    if not out:
        raise ValueError(f"no {what} given")
    dupes = sorted({str(x) for x in out if out.count(x) > 1})
    if dupes:
        raise ValueError(f"{what} repeated: {dupes}")
    return out


def experiment_config(lm, examples: Sequence[Example], label: str, fmt: Format, poolings: Sequence[str],
                      seeds: Sequence[int], config: TrainConfig, n_resamples: int = DEFAULT_RESAMPLES,
                      bootstrap_seed: int = 0) -> dict:
    """What the stored result depends on; hashed by :func:`analyses.results.result_path`."""
    return {
        "analysis": ANALYSIS, "protocol": PROTOCOL_VERSION, "model": lm.fingerprint,
        "corpus": corpus_fingerprint(examples), "label": label, "format": fmt.to_json(),
        "poolings": list(poolings), "seeds": list(seeds), "train": asdict(config),
        "n_resamples": n_resamples, "bootstrap_seed": bootstrap_seed,
    }


@dataclass(frozen=True)
class Split:
    """One train/test split of the experiment: repeat ``repeat``, fold ``fold``; indices into the kept
    examples (``train`` already cut to ``max_train``)."""

    repeat: int
    fold: int
    train: np.ndarray
    test: np.ndarray


def cv_splits(kept: Sequence[Example], y: np.ndarray, groups: np.ndarray, config: TrainConfig) -> list[Split]:
    """The experiment's splits: for ``r < repeats``, :func:`analyses.probes.make_splits` (stratified
    by ``y``, grouped by ``groups``, seed ``seed + r``), its first ``run_folds`` folds; the training
    side keeps the ``max_train`` examples of smallest ``u(id)`` (:func:`split_unit`), so it depends
    neither on the pooling nor on the training seed."""
    from analyses.probes import make_splits

    out = []
    for r in range(config.repeats):
        seed = config.seed + r
        folds = make_splits(y, groups, config.folds, seed)
        for f, (train, test) in enumerate(folds[:config.run_folds]):
            if config.max_train is not None and len(train) > config.max_train:
                u = np.asarray([split_unit(kept[i].id, seed) for i in train])
                train = np.sort(train[np.argsort(u, kind="stable")[:config.max_train]])
            out.append(Split(r, f, train, test))
    return out


def frozen_features(lm, rendered: Sequence[Rendered], poolings: Sequence[Pooling], config: TrainConfig,
                    device: torch.device, rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Each pooling of the frozen encoder's last layer: ``{pooling: (n_examples, hidden) float64}``,
    one eval-mode forward pass per length-sorted batch shared by all poolings (the encoder is not
    trained). Only ``rows`` (default: all) are computed; the other rows are NaN."""
    pad_id = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
    rows = np.arange(len(rendered)) if rows is None else np.asarray(rows)
    lengths = np.asarray([len(rendered[i]) for i in rows])
    out = {p.name: np.full((len(rendered), int(lm.model.config.hidden_size)), np.nan) for p in poolings}
    dtype = next(lm.model.parameters()).dtype
    # a copy when the caller's model is on another device; its train/eval mode is restored below
    with running(lm, device=device, dtype=dtype) as run, torch.inference_mode():
        model, was_training = run.model, run.model.training
        model.eval()
        pass_types = accepts_token_types(model)
        try:
            for part in sorted_batches(lengths, config.eval_batch_size):
                idx = rows[part]
                batch = _collate([rendered[i] for i in idx], poolings[0], pad_id, device)
                kw = {"token_type_ids": batch["token_type_ids"]} if pass_types else {}
                h = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], return_dict=True,
                          **kw).last_hidden_state.float()
                for p in poolings:
                    mask = torch.from_numpy(pooling_mask([rendered[i] for i in idx], p, h.shape[1])).to(device)
                    out[p.name][idx] = pool(h, mask, p.reduce).double().cpu().numpy()
        finally:
            model.train(was_training)
    return out


def _frozen_run(X: np.ndarray, task: Task, groups: np.ndarray, config: TrainConfig, seed: int) -> dict:
    """The frozen probe of one split: :class:`analyses.probes.LinearProbe` on the training items."""
    from analyses.probes import LinearProbe

    t0 = time.perf_counter()
    tr, te = task.train, task.test
    inner = min(3, len(np.unique(groups[tr])))
    probe = LinearProbe(Cs=config.frozen_Cs if inner >= 2 else config.frozen_Cs[-1:], inner_splits=max(inner, 2),
                        seed=seed).fit(X[tr], task.y[tr], groups[tr])
    return {"test_pred": probe.predict(X[te]), "train_accuracy": float((probe.predict(X[tr]) == task.y[tr]).mean()),
            "C": float(probe.C_), "seconds": time.perf_counter() - t0}


def _warn(message: str, log: Callable[[str], None] | None) -> None:
    import warnings

    if log is not None:
        log(f"warning: {message}")
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def run_pooling_experiment(examples: Sequence[Example], label: str, poolings: Sequence[str] | str | None = None,
                           seeds: Sequence[int] | str | None = None, *, model=None, fmt: str | Format = "pair",
                           preset: str = "default", out: str | None = None, force: bool = False,
                           corpus_name: str | None = None, device: str = "auto", progress: bool = True,
                           log: Callable[[str], None] | None = None, with_predictions: bool = False,
                           num_threads: int | None = None, n_resamples: int = DEFAULT_RESAMPLES,
                           bootstrap_seed: int = 0, **train: Any):
    """Fine-tuned and frozen, every pooling, on the same document-grouped splits; a tidy table.

    Splits: :func:`cv_splits` (stratified by the label, grouped by document when every example has a
    ``doc`` label, else by example: :func:`analyses.stats.example_groups`). In each split, for
    each pooling, the frozen probe (:func:`frozen_features` + :class:`analyses.probes.LinearProbe` on
    the split's training items) and the fine-tuned model for each seed predict the SAME test items.

    Rows of the table (:mod:`analyses.finetune._table`, which names the columns; ``pooling`` = the
    pooling, ``role`` empty, ``target`` = label, ``layer`` = the last layer; extra columns
    ``condition`` (``fine_tuned`` / ``frozen``), ``repeat``, ``fold``, ``grouping``, ``n_groups``,
    ``n_skipped`` on every row):

    * per fine-tuning run: ``metric="test_accuracy"`` with ``seed``, ``n`` (test items), ``n_train``,
      ``first_train_loss`` (first step), ``final_train_loss`` (last epoch's mean), ``train_accuracy``
      (last epoch's batches), ``converged``, ``warning`` and ``seconds``; per run and epoch
      ``metric="train_loss_epoch"`` with ``epoch``;
    * per frozen run: ``metric="frozen_test_accuracy"`` (``seed`` empty) with ``train_accuracy``,
      ``C``, ``converged``, ``warning``;
    * per split, ``pooling`` empty and ``condition="baseline"``: ``best_constant``, ``majority_baseline``
      and ``chance`` (:func:`analyses.finetune._table.baseline_rows`);
    * per pooling and condition, over all out-of-fold test items: ``test_accuracy_mean`` (fine-tuned)
      and ``frozen_test_accuracy_mean`` with a cluster-bootstrap CI over documents
      (:func:`analyses.finetune._table.summary_rows`);
    * ``metric="accuracy_diff"``, paired per item, side A (``pooling``, ``condition``) − side B
      (``pooling_b``, ``condition_b``): per pooling fine-tuned − frozen, and per condition each pooling
      − ``mean`` (else the first pooling), Holm over every such row
      (:func:`analyses.finetune._table.diff_rows`);
    * over all test items, ``pooling`` empty: ``best_constant`` and ``chance``, and ``metric="n_skipped"``:
      examples left out for length (never silently; ids in ``attrs["skipped_ids"]``).

    Every CI and p-value draws ``n_resamples`` bootstrap resamples (or sign vectors) from ``bootstrap_seed``
    (column ``n_resamples``); the splits' seed is the training config's ``seed``.

    A warning (``log`` and :class:`RuntimeWarning`) is raised and recorded in the ``warning`` column
    when a run scores below its split's best constant, when its final training loss is not below
    its first, or when its training accuracy is not above the training set's largest class share.

    With ``with_predictions`` returns ``(table, predictions)``: one row per repeat x fold x seed x
    pooling x condition x test item with ``repeat, fold, seed, pooling, condition, example, doc
    (its group), y_true, y_pred, correct``. With ``out``, both are written
    (``result_path(out, "finetune_pooling", config)`` and ``....predictions.csv`` beside it) and
    reused unless ``force``. Cost: see :data:`PRESETS`. ``num_threads``: None runs the fine-tuning runs one
    at a time on torch's threads; a number (CPU only) runs them side by side in that many workers of one
    torch thread each (:mod:`probing.workers`), with the results of the runs one at a time
    (:class:`analyses.finetune._train.RngStreams`). Two workers took the study's Q8 from 151 to 131 s on 2
    cores, but each run in flight holds its own model copy, optimiser state and activations (about
    650 MB on all-MiniLM-L6-v2), which took the study's peak from under 2 GB to 2.7 GB: so the
    default is one at a time (benchmarks/RESULTS.md).
    """
    from analyses.stats import example_groups

    n_resamples = check_resamples(n_resamples)
    pre = PRESETS.get(preset)
    if pre is None:
        raise ValueError(f"unknown preset {preset!r}; valid: {', '.join(PRESETS)}")
    poolings = _parse_list(poolings if poolings is not None else pre["poolings"], "poolings")
    for p in poolings:
        get_pooling(p)
    seeds = _parse_list(seeds if seeds is not None else pre["train_seeds"], "train seeds", int)
    dev = _device(device)
    config = resolve_autocast(preset_config(preset, **train), dev)  # the key records what runs
    fmt = fmt if isinstance(fmt, Format) else Format.parse(fmt)
    examples = list(examples)
    _check_label(examples, label)
    lm = _load(model)
    fmt = resolve_format(fmt, lm.tokenizer, min(e.n_sentences for e in examples))  # native, as extraction does
    path = pred_path = None
    if out is not None:
        path = result_path(out, ANALYSIS, experiment_config(lm, examples, label, fmt, poolings, seeds, config,
                                                            n_resamples, bootstrap_seed))
        pred_path = path.with_name(path.stem + ".predictions.csv")
        found = path.exists() and pred_path.exists() and not force
        note_store_use(path, found)
        if found:
            df = read_table(path)
            df.attrs.update(result_path=str(path), predictions_path=str(pred_path), reused=True)
            return (df, read_table(pred_path)) if with_predictions else df
    kept, rendered, skipped, limit = render_examples(examples, label, lm.tokenizer, fmt, lm.model.config,
                                                     config=config, model_max_length=_max_length_of(lm))
    if skipped:
        _warn(f"Q8 fine-tuning: {len(skipped)} of {len(examples)} examples are longer than {limit} tokens in "
              f"format {fmt.name!r} and were left out of every split (e.g. {skipped[:3]})", log)
    groups, grouping = example_groups(kept)
    y_all = np.asarray(pd.factorize(pd.Series([e.labels[label] for e in kept], dtype=object))[0])
    splits = cv_splits(kept, y_all, groups, config)
    checked = [get_pooling(p) for p in poolings]
    dummy = _task(kept, rendered, label, splits[0].train, splits[0].test, skipped)
    for p in checked:
        check_pooling(dummy, p)
    corpus = corpus_name if corpus_name is not None else "corpus-" + corpus_fingerprint(examples)[:12]
    base = {"analysis": ANALYSIS, "model": lm.name, "corpus": corpus, "format": fmt.name, "format_b": "",
            "layer": int(lm.model.config.num_hidden_layers), "target": label, "grouping": grouping,
            "n_skipped": len(skipped), "autocast": bool(config.autocast)}
    used = np.unique(np.concatenate([np.r_[sp.train, sp.test] for sp in splits]))
    X = frozen_features(lm, rendered, checked, config, dev, rows=used)
    rows: list[dict] = []
    preds: list[pd.DataFrame] = []
    warned: list[str] = []
    from tqdm.auto import tqdm

    bar = tqdm(total=len(splits) * len(checked) * len(seeds), desc="fine-tune", disable=not progress)
    tasks = [_task(kept, rendered, label, sp.train, sp.test, skipped) for sp in splits]
    # The fine-tuning runs, in the order the loop below records them: one at a time on torch's threads, or
    # (num_threads on the CPU) side by side in single-threaded workers (probing.workers), each drawing its
    # own random stream (RngStreams), so every result is the one its run would give alone. The frozen
    # probes run here, between them.
    jobs = [(task, p, seed) for task in tasks for p in checked for seed in seeds]
    workers = cpu_workers(num_threads) if num_threads is not None and dev.type == "cpu" else None
    streams = RngStreams() if workers is not None else None
    finetuned = thread_imap(lambda job: _finetune_task(lm, *job, config, dev, streams), jobs, workers)
    try:
        for sp, task in zip(splits, tasks):
            y_tr, y_te = task.y[sp.train], task.y[sp.test]
            where = {"repeat": sp.repeat, "fold": sp.fold}
            split_base = {**base, **where, "n_groups": int(np.unique(groups[sp.test]).size)}
            best = best_constant(y_te, len(task.classes))
            train_share = float(np.bincount(y_tr).max() / len(y_tr))
            rows += baseline_rows(split_base, y_te, len(task.classes), majority=int(np.bincount(y_tr).argmax()))

            def record(p: Pooling, condition: str, seed, r: dict, extra: dict) -> None:
                acc = float((r["test_pred"] == y_te).mean())
                problems = []
                if acc < best:
                    problems.append(f"test accuracy {acc:.3f} below the best constant {best:.3f}")
                if r["train_accuracy"] <= train_share:
                    problems.append(f"training accuracy {r['train_accuracy']:.3f} not above the training "
                                    f"majority share {train_share:.3f}")
                if "final_train_loss" in extra and not extra["final_train_loss"] < extra["first_train_loss"]:
                    problems.append(f"final training loss {extra['final_train_loss']:.3f} not below the first "
                                    f"{extra['first_train_loss']:.3f}")
                converged = not any("training" in m for m in problems)
                text = "; ".join(problems)
                if text:
                    msg = (f"Q8 {condition} {p.name} (repeat {sp.repeat}, fold {sp.fold}"
                           + (f", seed {seed}" if seed is not None else "") + f"): {text}")
                    warned.append(msg)
                    _warn(msg, log)
                rows.append({**split_base, "pooling": p.name, "condition": condition, "metric": RUN_METRICS[condition],
                             "value": acc, "n": int(len(sp.test)), "seed": seed, "n_train": int(len(sp.train)),
                             "train_accuracy": r["train_accuracy"], "converged": converged, "warning": text,
                             "seconds": r["seconds"], **extra})
                preds.append(pd.DataFrame({
                    "repeat": sp.repeat, "fold": sp.fold, "seed": seed, "pooling": p.name, "condition": condition,
                    "example": [task.ids[i] for i in sp.test], "doc": groups[sp.test], "y_true": y_te,
                    "y_pred": np.asarray(r["test_pred"], dtype=np.int64), "correct": r["test_pred"] == y_te}))

            for p in checked:
                fr = _frozen_run(X[p.name], task, groups, config, config.seed + sp.repeat)
                record(p, "frozen", None, fr, {"C": fr["C"]})
                for seed in seeds:
                    bar.set_postfix(pooling=p.name, seed=seed, fold=sp.fold)
                    r = next(finetuned)
                    record(p, "fine_tuned", seed, r, {"first_train_loss": r["train_loss_steps"][0],
                                                      "final_train_loss": r["train_loss_epochs"][-1]})
                    for e, loss in enumerate(r["train_loss_epochs"]):
                        rows.append({**split_base, "pooling": p.name, "condition": "fine_tuned",
                                     "metric": "train_loss_epoch", "value": loss, "n": r["n_train"], "seed": seed,
                                     "epoch": e})
                    bar.update(1)
    finally:
        finetuned.close()
        bar.close()
    P = pd.concat(preds, ignore_index=True)
    P["seed"] = P["seed"].astype("Int64")  # empty for the frozen probe
    P.insert(0, "analysis", ANALYSIS + "_predictions")
    # one value per test item and condition: correctness averaged over seeds and repeats
    item = P.groupby(["pooling", "condition", "example"], sort=False).agg(correct=("correct", "mean"),
                                                                           doc=("doc", "first")).sort_index()
    runs = pd.DataFrame([r for r in rows if r["metric"] in RUN_METRICS.values()])
    all_test = np.unique(np.concatenate([sp.test for sp in splits]))
    n_classes = len(np.unique(y_all))
    pooled_best = best_constant(y_all[all_test], n_classes)
    summary_base = {**base, "n_groups": int(np.unique(groups[all_test]).size)}
    rows += baseline_rows(summary_base, y_all[all_test], n_classes)
    rows.append({**summary_base, "pooling": None, "condition": "", "metric": "n_skipped",
                 "value": float(len(skipped)), "n": len(examples)})
    names = [p.name for p in checked]
    by_seed = _by_seed(P) if len(seeds) > 1 else None
    boot = dict(n_resamples=n_resamples, seed=bootstrap_seed)
    rows += summary_rows(summary_base, names, item, runs, pooled_best, lambda m: _warn(m, log), by_seed, **boot)
    rows += diff_rows(base, names, item, "mean" if "mean" in poolings else poolings[0], by_seed, **boot)
    df = finish_table(rows)
    if path is not None:
        write_table(df, path)
        write_table(P, pred_path)
    df.attrs.update(result_path=str(path) if path is not None else None,
                    predictions_path=str(pred_path) if pred_path is not None else None, reused=False,
                    n_skipped=len(skipped), skipped_ids=list(skipped), warnings=warned)
    return (df, P) if with_predictions else df


def _by_seed(P: pd.DataFrame) -> dict[tuple[str, str], pd.DataFrame]:
    """Per (pooling, "fine_tuned"), each test item's correctness per training seed, averaged over repeats
    (examples × seeds): what :func:`analyses.finetune.seed_document_ci` resamples."""
    ft = P[P["condition"] == "fine_tuned"]
    table = ft.groupby(["pooling", "example", "seed"], sort=False)["correct"].mean().unstack("seed")
    return {(str(p), "fine_tuned"): g.droplevel("pooling") for p, g in table.groupby(level="pooling", sort=False)}


# --------------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    from probing.formats import BUILTIN_FORMATS
    from probing.models import DEFAULT_MODEL

    pool_help = "\n".join(f"  {n:<12} {d}" for n, d in POOLINGS.items())

    def show(name: str) -> str:
        pre = PRESETS[name]
        train = ", ".join(f"{k}={v}" for k, v in pre["train"].items())
        return (f"  {name:<8} corpus={pre['corpus']} targets={pre['target']} poolings={','.join(pre['poolings'])} "
                f"train-seeds={','.join(map(str, pre['train_seeds']))}\n           {train}")

    defaults = TrainConfig()
    p = ArgumentParser(
        prog="python -m analyses.finetune",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=("Q8: on the same stratified, document-grouped cross-validation splits, fine-tune\n"
                     "the encoder + a linear head on each pooling of the last layer (each training seed)\n"
                     "and fit a frozen probe on the same pooling; report out-of-fold accuracy per pooling\n"
                     "with a cluster-bootstrap CI over documents (examples without a doc label), paired\n"
                     "differences (fine-tuned - frozen, pooling - mean) on identical test items, the best\n"
                     "constant and chance, and a warning for runs below the best constant or that did not\n"
                     "converge."),
        epilog=("poolings (the token choices of analyses.selection):\n" + pool_help
                + "\n\npresets (options given on the command line override them):\n"
                + "\n".join(show(n) for n in PRESETS)
                + "\n\nexample:\n  python -m analyses.finetune --corpus generated:n=300,k=2 --targets topic "
                  "--poolings cls,mean --train-seeds 0,1,2 --preset default --out results/"),
    )
    p.add_argument("--preset", default="default", choices=list(PRESETS),
                   help="settings to start from (default: default; 'full' is meant for a GPU)")
    p.add_argument("--corpus", default=None,
                   help="corpus spec, e.g. 'generated:n=500,k=2' or 'bbc:k=2,n=2000' (default: the preset's)")
    p.add_argument("--targets", default=None,
                   help="the one label to classify, e.g. topic or is_next (exactly one; default: the preset's)")
    p.add_argument("--poolings", default=None,
                   help="comma list of poolings (see below) (default: the preset's)")
    p.add_argument("--train-seeds", default=None,
                   help="comma list of fine-tuning seeds (head, dropout, data order), e.g. 0,1,2 "
                        "(default: the preset's)")
    p.add_argument("--format", default="pair",
                   help=f"input format: one of {', '.join(BUILTIN_FORMATS)} or 'name=TEMPLATE' (default: pair)")
    p.add_argument("--model", default=None,
                   help=f"Hugging Face id or local path (default: {DEFAULT_MODEL}, shipped offline)")
    p.add_argument("--random-init", action="store_true",
                   help="fine-tune the same architecture from seeded random weights (baseline; see --init-seed)")
    p.add_argument("--init-seed", type=int_at_least(0), default=0, help="seed of the --random-init weights (default 0)")
    p.add_argument("--epochs", type=int, default=None, help="passes over the training set (default: the preset's)")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate of AdamW (default: the preset's)")
    p.add_argument("--head-lr", type=float, default=None,
                   help="peak learning rate of the linear head (default: the preset's; unset means --lr)")
    p.add_argument("--freeze-embeddings", default=None, action=argparse.BooleanOptionalAction,
                   help="keep the word-embedding table fixed (faster on CPU; default: the preset's)")
    p.add_argument("--batch-size", type=int, default=None, help="training batch size (default: the preset's)")
    p.add_argument("--max-train", type=int, default=None,
                   help="at most this many training examples, chosen by the fixed hash (default: the preset's)")
    p.add_argument("--max-length", type=int, default=None,
                   help="longest example in tokens; longer ones are skipped by the presets, never truncated "
                        "(default: the preset's)")
    p.add_argument("--weight-decay", type=float, default=None,
                   help=f"AdamW weight decay, not on biases/LayerNorm (default {defaults.weight_decay})")
    p.add_argument("--warmup-fraction", type=float, default=None,
                   help=f"share of steps with linear warm-up (default {defaults.warmup_fraction})")
    p.add_argument("--schedule", default=None, choices=list(SCHEDULES),
                   help="after warm-up: linear decay to 0 or constant (default linear)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the cross-validation partition (repeat r uses seed + r) and of the bootstrap, "
                        f"independent of --train-seeds (default {defaults.seed})")
    p.add_argument("--resamples", type=resamples_arg, default=DEFAULT_RESAMPLES,
                   help=f"bootstrap resamples of every interval and p-value, at least {MIN_RESAMPLES} "
                        f"(default {DEFAULT_RESAMPLES})")
    p.add_argument("--folds", type=int, default=None,
                   help="number of outer cross-validation folds, k (default: the preset's)")
    p.add_argument("--run-folds", type=int, default=None,
                   help="how many of the k folds are run (default: the preset's; unset means all)")
    p.add_argument("--repeats", type=int, default=None, help="repeated k-fold partitions (default: the preset's)")
    p.add_argument("--Cs", type=positive_floats, nargs="+", default=None,
                   help="the frozen probe's C grid, e.g. 0.01,0.1,1 (default: analyses.probes' "
                        f"{','.join(f'{c:g}' for c in defaults.frozen_Cs)})")
    p.add_argument("--device", default="auto", help="'auto' (CUDA if available), 'cpu', 'cuda', 'cuda:1', ...")
    p.add_argument("--threads", type=int_at_least(1), default=None,
                   help="CPU: fine-tuning runs go side by side to this many single-threaded workers, each "
                        "with the result it would have alone; every run in flight holds its own model copy and "
                        "optimiser (default: one run at a time on torch's threads)")
    p.add_argument("--out", default="results", type=output_dir_arg,
                   help="directory of result tables (default: ./results)")
    p.add_argument("--force", action="store_true", help="recompute even if a stored result exists")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from probing.corpora import load_corpus
    from probing.models import ModelLoadError, load_model

    pre = PRESETS[args.preset]
    corpus = args.corpus if args.corpus is not None else pre["corpus"]
    targets = [t.strip() for t in (args.targets if args.targets is not None else pre["target"]).split(",")]
    if len(targets) != 1 or not targets[0]:
        parser.error(f"--targets takes exactly one label for the fine-tuning head, got {args.targets!r}")
    label = targets[0]
    Cs = None if args.Cs is None else tuple(c for cs in args.Cs for c in cs)
    train = {"epochs": args.epochs, "lr": args.lr, "head_lr": args.head_lr,
             "freeze_embeddings": args.freeze_embeddings, "batch_size": args.batch_size, "max_train": args.max_train,
             "max_length": args.max_length, "weight_decay": args.weight_decay,
             "warmup_fraction": args.warmup_fraction, "schedule": args.schedule, "seed": args.seed,
             "folds": args.folds, "run_folds": args.run_folds, "repeats": args.repeats, "frozen_Cs": Cs}
    try:
        examples = load_corpus(corpus)
        lm = load_model(args.model, random_init=args.random_init, seed=args.init_seed)
        t0 = time.perf_counter()
        df = run_pooling_experiment(examples, label, args.poolings, args.train_seeds, model=lm, fmt=args.format,
                                    preset=args.preset, out=args.out, force=args.force, corpus_name=corpus,
                                    device=args.device, progress=not args.no_progress,
                                    num_threads=args.threads, n_resamples=args.resamples,
                                    bootstrap_seed=args.seed if args.seed is not None else TrainConfig().seed, **train)
        elapsed = time.perf_counter() - t0
    except (ValueError, ImportError, ModelLoadError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    s = summary(df)
    pooled = pooled_baselines(df)
    print(f"\n{ANALYSIS}: {label} on {corpus}, format {args.format}, model {lm.name} ({elapsed:.0f} s)")
    unit = "/".join(f"{g}s" for g in dict.fromkeys(df["grouping"].dropna().astype(str))) or "examples"
    print(f"{'pooling':<12} {'condition':<11} {'accuracy':>8}   95% CI ({unit})   runs")
    for _, r in s.iterrows():
        print(f"{r['pooling']:<12} {r['condition']:<11} {r['mean']:8.3f}   [{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
              f"     {int(r['runs'])}" + (f"   WARNING: {r['warning']}" if r["warning"] else ""))
    for _, r in df[df["metric"] == "accuracy_diff"].iterrows():
        print(f"{diff_label(r):<35} {r['value']:+.3f} [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]"
              f"  p_holm={r['p_holm']:.3g}")
    print(f"{'constant':<12} {float(pooled['best_constant']):6.3f}   (the test items' largest class share); "
          f"chance {float(pooled['chance']):.3f}; {int(pooled['n_skipped'])} example(s) skipped as too long")
    how = "reused" if df.attrs.get("reused") else "written"
    print(f"table {how}: {df.attrs.get('result_path')}")
    return 0
