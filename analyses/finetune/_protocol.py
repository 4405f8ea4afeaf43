"""The shared fine-tuning protocol of the study's questions: one split per task, runs as declared data,
each run once, every prediction kept, comparisons paired on the same test items.

Several questions ask what a fine-tuned model does: Q1 (the same pair task fine-tuned with and without the
middle [SEP]), Q3 (a k-sentence task in several formats), Q4 (does the fine-tuned model use [SEP]: the
same model evaluated with attention to [SEP] knocked out), Q6 (the classification token first, in the
middle, last) and Q8 (poolings, a learning curve). They share one protocol:

* **A task** (:class:`ProtocolTask`) is a corpus, a label and one train/test split of it
  (:func:`grouped_split`): stratified by the label and grouped by document, where documents that share a
  sentence count as one, so that no sentence is on both sides. Every run of a task uses that split, so
  two runs predict the same test items and their accuracies are compared item by item.
* **A run** (:class:`RunSpec`) is a format, a pooling, a training-set size and a training seed: a fresh copy
  of the encoder plus a linear head on the pooled last layer, every weight trainable, trained on the first
  ``n_train`` training items (all of them when None; the order is a seeded permutation fixed per task, so
  smaller training sets are nested in larger ones, a learning curve), then evaluated on every test item
  under each of its ``conditions`` (:data:`CONDITIONS`: ``clean``, and attention to every [SEP] knocked out
  or its same-size control). ``frozen=True`` fits a logistic-regression probe on the frozen encoder's
  pooled last layer on the same training items instead (the same split, the same pooling): what
  fine-tuning adds.
* :func:`run_protocol` runs the union of the runs the questions ask for, each once (a run that two
  questions ask for, such as Q1's pair/[CLS] run, which is Q6's "first" and Q8's [CLS] run, is run once;
  runs that differ only in their evaluation conditions are one run evaluated under all of them, so Q4's
  knockouts add evaluations, not training; frozen probes of one task and format share one forward pass),
  stores each run's predictions under a key of its spec, its training settings, the task's data and the
  code (a second study reuses them), and returns one table: a row per (run, condition, test item).
* :func:`compare_runs` gives a paired difference of accuracy between two sets of runs on the same items,
  with a two-stage bootstrap standard error (training seeds, then documents: the seed is a unit of the
  interval, :func:`analyses.finetune.seed_document_ci`).

The training recipe is `analyses.finetune._train`'s (BERT's fine-tuning: AdamW, linear warm-up and decay);
its settings come from the preset (:data:`PROTOCOL_PRESETS`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from analyses.finetune._config import TrainConfig
from analyses.stats import DEFAULT_RESAMPLES, check_resamples
from analyses.results import keep_table, stored_table
from probing.examples import Example, corpus_fingerprint

#: Training settings of each preset: ``train`` for :class:`analyses.finetune_config.TrainConfig`,
#: ``test_fraction`` the share of each task's documents held out (the training seeds are the study's
#: ``[finetune] seeds``, one source for every question). ``quick`` is for tests and a first look; ``default``
#: fits the study's time on a 2-core CPU (every training item, every weight, one epoch); ``full`` is for a GPU
#: (with ``[finetune] seeds`` of five seeds, say). Every preset leaves out an item longer than the model's
#: ``max_length`` in the run's format (``on_overflow="skip"``, as the study's extraction does, from train and test
#: alike); comparisons pair the test items both runs predicted.
#:
#: ``default``, measured on the 2-core AVX2 VM (2026-11-28; one torch thread, ``time.process_time()``, the
#: machine shared at load 14-19, so CPU seconds are an upper bound): one ``next`` run on BBC pairs
#: (``bbc:n=1000,k=2,max_words=40``: 675 training items, 37.4k tokens, 43 steps of 16, every weight, float32;
#: then its 325 test items, 17.7k tokens) takes 78 CPU s per epoch (161 CPU s with two); a ``topic`` run
#: (315 training, 185 test items) 43-45 CPU s. The default study's fine-tuning with seeds [0, 1]: ``next`` in
#: pair, concat, cls_mid, cls_last (cls) and pair mean, sep1 (12 runs, ~940 CPU s), ``topic`` cls, mean, sep1
#: (6 runs, ~265), Q4's two knockout evaluations (~30), frozen probes (~100), Q3's intruder runs (~270, its
#: settings): about 1,600 CPU s, some 13 minutes on two cores: over the 550 s the study gives fine-tuning, so
#: the packaged study runs its two seeds without Q6's middle position, Q8's sep1 on ``next`` and the learning
#: curve (``[finetune] positions``, ``next_poolings``, ``learning_curve``; docs/STUDY.md has its time).
#: ``topic`` learns in one epoch at lr 1e-4 (seed 0: cls 82.2%, mean 81.1% of 185 test items, 5 topics).
#: Learnability of ``next`` with same-topic negatives (``[finetune] negatives = "same_topic"``; pair/cls, seed 0,
#: same split, 325 test items): 1 epoch at lr 5e-5 57.2%, 1e-4 56.6%, 1e-4 with batches of 8 (85 steps) 55.1%;
#: 2 epochs at 1e-4 or 2e-4 (head 2e-3) 55.1% and 54.8% while the training batches reach 73% and 72%: the
#: fine-tuned model memorises 675 pairs rather than learn coherence; frozen probes read is_next at 0.60-0.66 from
#: [SEP]. With other-topic negatives (BERT's, the study's default; 735 training and 265 test items of the
#: ``finetune()`` split, 1 epoch, seed 0, 2026-11-28): cls 66.0%, mean 69.1% at lr 1e-4, cls 63.8% at 2e-4,
#: about 50 s a run with two torch threads. The questions' answers check that a fine-tuned model cleared chance
#: (:func:`probing.study.questions._common.learnt`) before comparing.
PROTOCOL_PRESETS: dict[str, dict[str, Any]] = {
    "quick": {"test_fraction": 0.3,
              "train": {"epochs": 2, "lr": 1e-4, "head_lr": 2e-3, "batch_size": 16, "warmup_fraction": 0.1,
                        "on_overflow": "skip"}},
    "default": {"test_fraction": 0.3,
                "train": {"epochs": 1, "lr": 1e-4, "head_lr": 2e-3, "batch_size": 16, "warmup_fraction": 0.1,
                          "on_overflow": "skip"}},
    "full": {"test_fraction": 0.2,
             "train": {"epochs": 3, "lr": 3e-5, "head_lr": 5e-4, "batch_size": 32, "warmup_fraction": 0.1,
                       "on_overflow": "skip",
                       "eval_batch_size": 256}},
}

#: Evaluation conditions of a fine-tuned run: ``None`` (the model as trained), or a function of the number
#: of encoder layers giving the :class:`probing.interventions.Intervention` applied while the test items are
#: predicted. The knockouts are Q4's (:func:`analyses.interventions.sep_knockouts`: every token may not attend
#: to any [SEP] in the middle third of the layers; the control takes as many random word keys instead).
CONDITIONS: dict[str, Callable[[int], Any] | None] = {
    "clean": None,
    "sep_knockout": lambda n_layers: _sep_knockouts(n_layers)[0],
    "sep_knockout_control": lambda n_layers: _sep_knockouts(n_layers)[1],
}


def _sep_knockouts(n_layers: int):
    from analyses.interventions import sep_knockouts

    return sep_knockouts(n_layers)


@dataclass(frozen=True)
class RunSpec:
    """One run of the protocol (module docstring). ``task``: a key of the tasks given to
    :func:`run_protocol`; ``format``: a format name or ``name=TEMPLATE``; ``pooling``: a token choice of
    :mod:`analyses.pooling_choices`; ``n_train``: training items (None: all); ``seed``: the training seed;
    ``conditions``: keys of :data:`CONDITIONS`; ``frozen``: a probe on the frozen encoder instead."""

    task: str
    format: str = "pair"
    pooling: str = "cls"
    n_train: int | None = None
    seed: int = 0
    conditions: tuple[str, ...] = ("clean",)
    frozen: bool = False

    def __post_init__(self) -> None:
        unknown = [c for c in self.conditions if c not in CONDITIONS]
        if unknown or not self.conditions:
            raise ValueError(f"run {self.name}: conditions must be some of {sorted(CONDITIONS)}, got "
                             f"{list(self.conditions)}")
        if self.n_train is not None and (isinstance(self.n_train, bool) or int(self.n_train) < 2):
            raise ValueError(f"run {self.name}: n_train must be None (all) or at least 2, got {self.n_train!r}")
        if self.frozen and self.conditions != ("clean",):
            raise ValueError(f"run {self.name}: a frozen probe is evaluated clean only")

    @property
    def name(self) -> str:
        fmt = self.format.split("=", 1)[0]
        kind = "frozen" if self.frozen else f"seed{self.seed}"
        return f"{self.task}/{fmt}/{self.pooling}/n{'all' if self.n_train is None else self.n_train}/{kind}"


@dataclass(frozen=True)
class ProtocolTask:
    """A task: the examples, the label to predict and the ids of the test items (:func:`grouped_split`)."""

    examples: tuple[Example, ...]
    label: str
    test_ids: frozenset[str] = field(default_factory=frozenset)

    @property
    def fingerprint(self) -> str:
        return corpus_fingerprint(list(self.examples))


def leak_groups(examples: Sequence[Example]) -> np.ndarray:
    """``(n_examples,)`` int: the unit a split must keep together. Examples of one document (the ``doc``
    label; an example without one is its own document) and examples that share a sentence (the same text,
    whitespace-stripped) are one unit: connected components, so a sentence never lands on both sides."""
    parent = list(range(len(examples)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[tuple[str, str], int] = {}
    for i, e in enumerate(examples):
        keys = [("doc", str(e.labels["doc"]))] if "doc" in e.labels else []
        keys += [("sentence", s.strip()) for s in e.sentences]
        for key in keys:
            j = first.setdefault(key, i)
            a, b = find(i), find(j)
            if a != b:
                parent[b] = a
    roots = np.asarray([find(i) for i in range(len(examples))])
    return np.unique(roots, return_inverse=True)[1]


def shared_sentences(examples: Sequence[Example], test_ids: Iterable[str]) -> list[str]:
    """Sentences that occur in a training and in a test example (empty for a sound split)."""
    test_ids = set(test_ids)
    sides: dict[str, set[bool]] = {}
    for e in examples:
        for s in e.sentences:
            sides.setdefault(s.strip(), set()).add(e.id in test_ids)
    return sorted(s for s, where in sides.items() if len(where) == 2)


def grouped_split(examples: Sequence[Example], label: str, test_fraction: float = 0.3,
                  seed: int = 0) -> frozenset[str]:
    """The test ids of one split: stratified by ``label``, grouped by :func:`leak_groups`, about
    ``test_fraction`` of the items (``StratifiedGroupKFold`` with ``round(1 / test_fraction)`` folds, its
    first fold). A unit that holds more than a third of the items is an error: the split could not be
    stratified (e.g. negatives that chain every document of a topic together)."""
    from sklearn.model_selection import StratifiedGroupKFold

    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must lie in (0, 1), got {test_fraction!r}")
    missing = [e.id for e in examples if label not in e.labels]
    if missing:
        raise ValueError(f"label {label!r} is missing from {len(missing)} example(s), e.g. {missing[:5]}")
    groups = leak_groups(examples)
    biggest = np.bincount(groups).max()
    if biggest > len(examples) / 3:
        raise ValueError(f"{biggest} of {len(examples)} examples are linked by shared documents or sentences into "
                         f"one unit; a split cannot keep them apart and stratify by {label!r}")
    y = np.asarray([str(e.labels[label]) for e in examples])
    n_splits = max(2, round(1 / test_fraction))
    splitter = StratifiedGroupKFold(n_splits=n_splits, shuffle=True, random_state=seed)
    _, test = next(splitter.split(np.zeros((len(y), 1)), y, groups))
    return frozenset(examples[i].id for i in test)


def make_task(examples: Sequence[Example], label: str, test_fraction: float = 0.3, seed: int = 0) -> ProtocolTask:
    """A :class:`ProtocolTask` with its split."""
    examples = tuple(examples)
    return ProtocolTask(examples, label, grouped_split(examples, label, test_fraction, seed))


def training_order(task: ProtocolTask, seed: int = 0) -> list[str]:
    """The task's training ids in the order ``n_train`` takes them: a seeded permutation, the same for
    every run of the task, so a smaller training set is a prefix of a larger one."""
    ids = [e.id for e in task.examples if e.id not in task.test_ids]
    rng = np.random.default_rng(seed)
    return [ids[i] for i in rng.permutation(len(ids))]


# ---------------------------------------------------------------------------------------------------
# Running


PREDICTION_COLUMNS = ("run", "task", "format", "pooling", "n_train", "seed", "frozen", "condition", "item", "doc",
                      "label", "pred", "correct")


class _FrozenFeatures:
    """The frozen encoder's pooled last layer for every example of a task in one format, computed once for all
    the poolings that the frozen runs of ``wanted`` ((task, format) -> poolings) read, and only when a run
    that is not stored needs them: the frozen probes of one task and format share one forward pass."""

    def __init__(self, wanted: Mapping[tuple[str, str], Sequence[str]]):
        self.wanted = {k: list(dict.fromkeys(v)) for k, v in wanted.items()}
        self.done: dict[tuple[str, str], tuple[dict[str, int], dict[str, np.ndarray]]] = {}

    def rows(self, spec: RunSpec, task: ProtocolTask, lm, config: TrainConfig, device,
             ids: Sequence[str]) -> np.ndarray:
        """``(len(ids), hidden)``: the features of ``spec.pooling`` for the examples ``ids``."""
        from analyses.finetune._experiment import frozen_features
        from analyses.finetune._train import check_pooling, prepare_task
        from probing.formats import Format

        key = (spec.task, spec.format)
        if key not in self.done:
            prepared = prepare_task(list(task.examples), task.label, lm.tokenizer, Format.parse(spec.format),
                                    lm.model.config, config=config, model_max_length=lm.max_length,
                                    test_ids=task.test_ids)
            poolings = [check_pooling(prepared, p) for p in self.wanted.get(key, [spec.pooling])]
            X = frozen_features(lm, prepared.rendered, poolings, config, device)
            self.done[key] = ({i: r for r, i in enumerate(prepared.ids)}, X)
        index, X = self.done[key]
        if spec.pooling not in X:  # a pooling no declared run asked for
            self.wanted[key] = [*self.wanted.get(key, []), spec.pooling]
            del self.done[key]
            return self.rows(spec, task, lm, config, device, ids)
        return X[spec.pooling][[index[i] for i in ids]]


def _one_run(spec: RunSpec, task: ProtocolTask, lm, config: TrainConfig, device, split_seed: int,
             features: _FrozenFeatures | None = None) -> pd.DataFrame:
    from analyses.finetune._train import check_pooling, prepare_task, run_with_conditions
    from probing.formats import Format

    fmt = Format.parse(spec.format)
    order = training_order(task, split_seed)
    keep = set(order[:spec.n_train] if spec.n_train is not None else order) | set(task.test_ids)
    examples = [e for e in task.examples if e.id in keep]
    prepared = prepare_task(examples, task.label, lm.tokenizer, fmt, lm.model.config, config=config,
                            model_max_length=lm.max_length, test_ids=task.test_ids)
    pooling = check_pooling(prepared, spec.pooling)
    docs = {e.id: str(e.labels.get("doc", e.id)) for e in examples}
    t0 = time.perf_counter()
    if spec.frozen:
        groups = np.asarray([docs[i] for i in prepared.ids])
        features = features if features is not None else _FrozenFeatures({})
        X = features.rows(spec, task, lm, config, device, prepared.ids)
        preds, info = _frozen(X, prepared, config, groups, spec.seed)
    else:
        interventions = {c: (CONDITIONS[c](lm.n_layers) if CONDITIONS[c] is not None else None)
                         for c in spec.conditions}
        preds, info = run_with_conditions(lm, prepared, pooling, spec.seed, config, device, fmt, interventions)
    test_ids = [prepared.ids[i] for i in prepared.test]
    y = prepared.y[prepared.test]
    frames = []
    for condition, pred in preds.items():
        frames.append(pd.DataFrame({
            "run": spec.name, "task": spec.task, "format": fmt.name, "pooling": spec.pooling,
            "n_train": len(prepared.train), "seed": -1 if spec.frozen else spec.seed, "frozen": spec.frozen,
            "condition": condition, "item": test_ids, "doc": [docs[i] for i in test_ids],
            "label": [str(prepared.labels[i]) for i in prepared.test], "pred": pred, "correct": (pred == y),
        }))
    out = pd.concat(frames, ignore_index=True)
    out["seconds"] = time.perf_counter() - t0
    for k, v in info.items():
        out[k] = v
    return out


def _frozen(X: np.ndarray, prepared, config: TrainConfig, groups: np.ndarray,
            seed: int) -> tuple[dict[str, np.ndarray], dict]:
    """A logistic-regression probe on ``X: (n_items, hidden)``, the frozen encoder's pooled last layer of the
    prepared items, fitted on the same training items (its C chosen by inner cross-validation grouped by
    ``groups``, the items' documents)."""
    from analyses.finetune._experiment import _frozen_run

    fr = _frozen_run(X, prepared, groups, config, seed)
    return {"clean": fr["test_pred"]}, {"train_accuracy": fr["train_accuracy"], "C": fr["C"]}


def merge_conditions(specs: Sequence[RunSpec]) -> list[RunSpec]:
    """The distinct runs of ``specs``, in order of first appearance, each evaluated under the union of the
    conditions asked of it: a run that one question evaluates clean (Q1's pair/[CLS] run) and another also with
    attention to [SEP] knocked out (Q4's) is trained once; its clean predictions are the same either way.

    >>> [s.conditions for s in merge_conditions([RunSpec("next"), RunSpec("next", conditions=("sep_knockout",))])]
    [('clean', 'sep_knockout')]
    """
    merged: dict[RunSpec, tuple[str, ...]] = {}
    for spec in specs:
        run = replace(spec, conditions=("clean",))
        merged[run] = tuple(dict.fromkeys(merged.get(run, ()) + tuple(spec.conditions)))
    return [replace(run, conditions=conditions) for run, conditions in merged.items()]


def run_protocol(tasks: Mapping[str, ProtocolTask], specs: Sequence[RunSpec], *, model, preset: str = "default",
                 device: str = "auto", out: str | Path | None = None, force: bool = False, split_seed: int = 0,
                 log: Callable[[str], None] | None = None, progress: bool = True,
                 **train_overrides: Any) -> pd.DataFrame:
    """Run every distinct spec of ``specs`` once (stored runs reused) and return the predictions table
    (:data:`PREDICTION_COLUMNS` plus each run's ``seconds``, ``epochs``, ``steps``, ``train_loss_last``,
    ``train_accuracy``)."""
    from analyses.finetune._train import _load
    from probing.models import pick_device

    if preset not in PROTOCOL_PRESETS:
        raise ValueError(f"unknown fine-tuning preset {preset!r}; valid: {', '.join(PROTOCOL_PRESETS)}")
    settings = PROTOCOL_PRESETS[preset]
    config = TrainConfig(**{**settings["train"], **train_overrides})
    unknown = sorted({s.task for s in specs} - set(tasks))
    if unknown:
        raise ValueError(f"runs name task(s) {unknown}; tasks: {sorted(tasks)}")
    for name, task in tasks.items():
        leaks = shared_sentences(task.examples, task.test_ids)
        if leaks:
            raise ValueError(f"task {name!r}: {len(leaks)} sentence(s) are on both sides of its split, e.g. "
                             f"{leaks[0][:60]!r}")
    lm = _load(model)
    dev = pick_device(device)
    unique = merge_conditions(specs)
    wanted: dict[tuple[str, str], list[str]] = {}
    for s in unique:
        if s.frozen:
            wanted.setdefault((s.task, s.format), []).append(s.pooling)
    features = _FrozenFeatures(wanted)
    frames = []
    from tqdm.auto import tqdm

    for spec in tqdm(unique, desc="fine-tuning runs", disable=not progress, delay=1):
        task = tasks[spec.task]
        key = {"spec": asdict(spec), "train": asdict(config), "task": task.fingerprint, "label": task.label,
               "test": sorted(task.test_ids), "model": lm.fingerprint, "split_seed": split_seed}
        path, done = stored_table(out, "finetune_run", key, force)
        if done is None:
            if log is not None:
                log(f"fine-tuning {spec.name}")
            done = keep_table(_one_run(spec, task, lm, config, dev, split_seed, features), path)
        frames.append(done)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=PREDICTION_COLUMNS)


# ---------------------------------------------------------------------------------------------------
# Comparing


def _correctness(P: pd.DataFrame, where: Mapping[str, Any]) -> pd.DataFrame:
    """``(items x seeds)`` correctness of the runs selected by ``where`` (column -> value, or a list of values)."""
    sel = P
    for col, value in where.items():
        sel = sel[sel[col].isin(value) if isinstance(value, (list, tuple, set, frozenset)) else sel[col] == value]
    if sel.empty:
        raise ValueError(f"no predictions match {dict(where)}")
    return sel.pivot_table(index="item", columns="seed", values="correct", aggfunc="mean")


def accuracy(P: pd.DataFrame, where: Mapping[str, Any], n_resamples: int = DEFAULT_RESAMPLES,
             seed: int = 0) -> dict:
    """Accuracy of the selected runs (mean over items and seeds) with its two-stage bootstrap SE and CI."""
    from analyses.finetune._table import seed_document_ci

    n_resamples = check_resamples(n_resamples)
    a = _correctness(P, where)
    docs = P.drop_duplicates("item").set_index("item").loc[a.index, "doc"].to_numpy()
    point, lo, hi, se = seed_document_ci(a.to_numpy(float), None, docs, n_resamples=n_resamples, seed=seed)
    return {"value": point, "ci_low": lo, "ci_high": hi, "se": se, "n_items": len(a), "n_seeds": a.shape[1],
            "n_groups": len(np.unique(docs)), "n_resamples": n_resamples}


def compare_runs(P: pd.DataFrame, a: Mapping[str, Any], b: Mapping[str, Any], n_resamples: int = DEFAULT_RESAMPLES,
                 seed: int = 0) -> dict:
    """``accuracy(b) − accuracy(a)`` on the items both predicted, paired per item, with a two-stage bootstrap
    (training seeds, then documents) standard error. Both sides fine-tuned with the same seeds share each
    resample's seed draw; a frozen side (one column) is held as it is."""
    from analyses.finetune._table import seed_document_ci

    n_resamples = check_resamples(n_resamples)
    A, B = _correctness(P, a), _correctness(P, b)
    items = A.index.intersection(B.index)
    if len(items) == 0:
        raise ValueError(f"runs {dict(a)} and {dict(b)} share no test item")
    A, B = A.loc[items], B.loc[items]
    if A.shape[1] == 1 and B.shape[1] > 1:  # the frozen side goes second
        A, B, sign = B, A, -1.0
    else:
        sign = 1.0
    if B.shape[1] not in (1, A.shape[1]):
        raise ValueError(f"runs {dict(a)} and {dict(b)} have {A.shape[1]} and {B.shape[1]} seeds")
    docs = P.drop_duplicates("item").set_index("item").loc[items, "doc"].to_numpy()
    point, lo, hi, se = seed_document_ci(A.to_numpy(float), B.to_numpy(float), docs, n_resamples=n_resamples,
                                         seed=seed)
    # seed_document_ci gives A − B; the comparison is b − a
    value = -sign * point
    lo, hi = sorted((-sign * lo, -sign * hi))
    return {"value": value, "ci_low": lo, "ci_high": hi, "se": se, "value_a": float(_side(P, a, items)),
            "value_b": float(_side(P, b, items)), "n_items": len(items), "n_seeds": int(A.shape[1]),
            "n_groups": len(np.unique(docs)), "n_resamples": n_resamples}


def _side(P: pd.DataFrame, where: Mapping[str, Any], items) -> float:
    return float(_correctness(P, where).loc[items].to_numpy(float).mean())
