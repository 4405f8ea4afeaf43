"""Streaming cosine drift: running float64 sums per (layer, role group) and their Poisson bootstrap.

Used by :mod:`analyses.drift._streaming`; the bootstrap (Hanley & MacGibbon 2006; Chamandy et al. 2012) gives
each example a Poisson(1) weight per resample, drawn per block of :data:`BLOCK` examples, so the
weights do not depend on batching.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

#: Drift metrics written, the same names as :data:`analyses.drift.DRIFT_METRICS` uses.
STREAM_DRIFT_METRICS: tuple[str, ...] = ("cosine_mean", "drift_mean", "relative_l2_mean")
BLOCK = 1024  # examples per block of the bootstrap weights' generator



class DriftAccumulator:
    """Running float64 sums for cosine drift per (layer, role group), on one device.

    ``sums``: (L, G, 4) token count, Σcos, Σ(1 − cos), Σ relative L2. ``boot``: (R, L, G, 4) the same
    sums weighted by each example's Poisson(1) weight in resample r (None without a bootstrap).
    ``n_examples``: (G,) examples with at least one token in the group. Groups are registered as they
    appear (their number depends on the formats, not on the corpus size).
    """

    def __init__(self, n_layers: int, n_resamples: int, device: torch.device):
        self.device = device
        self.groups: list[str] = []
        self.sums = torch.zeros((n_layers, 0, 4), dtype=torch.float64, device=device)
        self.boot = (torch.zeros((n_resamples, n_layers, 0, 4), dtype=torch.float64, device=device)
                     if n_resamples > 0 else None)
        self.n_examples = np.zeros(0, dtype=np.int64)
        self.n_all = 0  # examples with at least one paired token
        self.bad = torch.zeros((), dtype=torch.int64, device=device)

    def group_ids(self, labels: Sequence[str]) -> np.ndarray:
        """Ids of ``labels``, registering new ones (the accumulators grow by one group each)."""
        new = [g for g in dict.fromkeys(labels) if g not in self.groups]
        if new:
            self.groups.extend(new)
            k = len(new)
            self.sums = torch.cat([self.sums, self.sums.new_zeros(self.sums.shape[0], k, 4)], 1)
            if self.boot is not None:
                self.boot = torch.cat([self.boot, self.boot.new_zeros(*self.boot.shape[:2], k, 4)], 2)
            self.n_examples = np.concatenate([self.n_examples, np.zeros(k, dtype=np.int64)])
        index = {g: i for i, g in enumerate(self.groups)}
        return np.asarray([index[g] for g in labels], dtype=np.int64)

    def count_examples(self, slot: np.ndarray, group: np.ndarray) -> None:
        """Add the examples of one batch: ``slot`` (n,) example in the batch, ``group`` (n,) group id."""
        G = len(self.groups)
        present = np.unique(slot * G + group) % G
        self.n_examples += np.bincount(present, minlength=G)
        self.n_all += int(np.unique(slot).size)

    def update(self, layer: int, A: torch.Tensor, B: torch.Tensor, slot: torch.Tensor, group: torch.Tensor,
               n_slots: int, weights: torch.Tensor | None) -> None:
        """Add one batch at layer index ``layer``. A, B: (n, dim) float64 paired states; slot, group:
        (n,) example-in-batch and group id of each row; weights: (n_slots, R) Poisson weights."""
        aa, bb, ab = (A * A).sum(1), (B * B).sum(1), (A * B).sum(1)
        cos = (ab / torch.sqrt(aa * bb)).clamp(-1.0, 1.0)  # the formula of analyses.drift._metrics
        d = A - B
        rel = torch.sqrt((d * d).sum(1)) / torch.sqrt(aa)
        self.bad += (~torch.isfinite(cos)).sum() + (~torch.isfinite(rel)).sum()
        vals = torch.stack([torch.ones_like(cos), cos, 1.0 - cos, rel], 1)
        G = len(self.groups)
        per = torch.zeros((n_slots * G, 4), dtype=torch.float64, device=self.device)
        per.index_add_(0, slot * G + group, vals)  # per (example, group) sums
        self.sums[layer] += per.view(n_slots, G, 4).sum(0)
        if self.boot is not None:
            self.boot[:, layer] += (weights.T @ per.view(n_slots, G * 4)).view(-1, G, 4)

    def tensors(self) -> dict[str, Any]:
        out = {"drift.sums": self.sums, "drift.n_examples": self.n_examples}
        if self.boot is not None:
            out["drift.bootstrap"] = self.boot
        return out

    def result(self, confidence: float) -> list[dict]:
        """Rows (layer index, role, metric, value, ci_low, ci_high, n, n_examples), groups in order of
        first appearance, then ``all``."""
        if int(self.bad):
            raise ValueError(f"{int(self.bad)} token states have zero norm or non-finite values in format A "
                             "or B, so no cosine (the cached path refuses them too)")
        sums = self.sums.cpu().numpy()
        boot = self.boot.cpu().numpy() if self.boot is not None else None
        cells = [(g, [i], int(self.n_examples[i])) for i, g in enumerate(self.groups)]
        cells.append(("all", list(range(len(self.groups))), self.n_all))
        alpha = (1.0 - confidence) / 2
        rows = []
        for li in range(sums.shape[0]):
            for role, gi, n_ex in cells:
                s = sums[li, gi].sum(0)
                n = int(round(s[0]))
                if n == 0:
                    continue
                if boot is not None:
                    b = boot[:, li, gi].sum(1)  # (R, 4)
                    with np.errstate(invalid="ignore", divide="ignore"):
                        stats = b[:, 1:] / b[:, :1]
                for m, metric in enumerate(STREAM_DRIFT_METRICS):
                    low = high = float("nan")
                    if boot is not None and n_ex >= 2:
                        ok = stats[:, m][np.isfinite(stats[:, m])]
                        if ok.size:
                            low, high = (float(v) for v in np.quantile(ok, [alpha, 1 - alpha]))
                    rows.append({"layer_index": li, "role": role, "metric": metric, "value": float(s[m + 1] / s[0]),
                                 "ci_low": low, "ci_high": high, "n": n, "n_examples": n_ex})
        return rows


def poisson_weights(start: int, stop: int, n_resamples: int, seed: int) -> np.ndarray:
    """(stop - start, R) Poisson(1) weights of examples start..stop-1, drawn per block of ``BLOCK``
    examples from ``default_rng([seed, block])``: the same for an example whatever the batching."""
    parts = []
    for block in range(start // BLOCK, (stop - 1) // BLOCK + 1):
        w = np.random.default_rng([seed, block]).poisson(1.0, size=(BLOCK, n_resamples))
        lo, hi = max(start, block * BLOCK), min(stop, (block + 1) * BLOCK)
        parts.append(w[lo - block * BLOCK:hi - block * BLOCK])
    return np.concatenate(parts).astype(np.float64)
