"""What a study's sections share beyond their own modules: the interventions a job may extract with
(``Job.intervention``: :data:`INTERVENTIONS`, built by :func:`make_intervention`) and the probe runner's options
from the config (:func:`probe_kw`, used by the paper reproductions).
"""

from __future__ import annotations

from pathlib import Path

#: Interventions the study extracts (``Job.intervention``), by name -> what they do. Q4: attention to
#: every [SEP] knocked out in the middle layers, and its control of the same size on random words.
INTERVENTIONS = {
    "sep_ko": "no token attends to any [SEP] in the middle layers",
    "sep_ko_control": "as many random word keys per query knocked out, same layers (control)",
    "cls_patch_first": "[CLS]'s state at layer 1 replaced by concat's (pair format; Q1)",
    "cls_patch_mid": "[CLS]'s state at layer L // 2 replaced by concat's (Q1)",
    "cls_patch_late": "[CLS]'s state at layer L - 1 replaced by concat's (Q1)",
    "sep1_cls_ko": "[CLS] may not attend to the middle [SEP], every layer (Q1)",
    "sep1_all_ko": "no token may attend to the middle [SEP], every layer (Q1)",
}


def patch_layers(n_layers: int) -> dict[str, int]:
    """The layers Q1 patches [CLS] at, by intervention name: first, middle and last but one (a few
    extractions instead of L - 1; with 2 layers all three are layer 1, one cache)."""
    return {"cls_patch_first": 1, "cls_patch_mid": max(1, n_layers // 2), "cls_patch_late": max(1, n_layers - 1)}


def make_intervention(name: str, n_layers: int, caches=None, corpus: str = "", random: bool = False,
                      seed: int = 0):
    """The :class:`probing.interventions.Intervention` of :data:`INTERVENTIONS` ``name`` for a model of
    ``n_layers`` layers (``caches``, ``corpus`` and ``random`` locate a patch's source cache; ``seed``: the
    knockout control's draw of word keys)."""
    from analyses.interventions import cls_patches, middle_sep_knockouts, sep_knockouts

    if name in patch_layers(n_layers):
        source = caches.paths[(corpus, "concat", random)]  # extracted first: clean caches come first
        return cls_patches(source, n_layers)[patch_layers(n_layers)[name]]
    if name in ("sep1_cls_ko", "sep1_all_ko"):
        return dict(zip(("sep1_cls_ko", "sep1_all_ko"), middle_sep_knockouts(n_layers)))[name]
    if name not in ("sep_ko", "sep_ko_control"):
        raise ValueError(f"unknown intervention {name!r}; known: {', '.join(INTERVENTIONS)}")
    ko, control = sep_knockouts(n_layers, seed=seed)
    return {"sep_ko": ko, "sep_ko_control": control}[name]


def probe_kw(cfg, out: Path, progress: bool = True) -> dict:
    """The probe runner's options from the config's ``[probes]`` table, with the study's seed, device and
    bootstrap resamples (``progress``: its bars)."""
    pr = cfg.probes
    return dict(n_splits=pr.folds, seed=cfg.study.seed, vocab=pr.vocab, device=cfg.study.device, Cs=pr.Cs,
                inner_splits=pr.inner_splits, max_iter=pr.max_iter, bow_Cs=pr.bow_Cs, out=out, progress=progress,
                n_resamples=cfg.study.bootstrap_resamples)
