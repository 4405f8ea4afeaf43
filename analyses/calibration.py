"""Calibration of the models pretrained by :mod:`probing.pretrain`: do they behave like BERT?

For each run (a directory with ``training.json``), one table (analysis ``calibration``) with:

- its held-out MLM accuracy and loss beside the unigram entropy of the masked tokens, and its sentence-pair
  accuracy on held-out documents with a 95% Wilson interval (from ``training.json``, computed when the run
  finished: :func:`probing.pretrain.evaluate`);
- attention parked on [SEP] (Clark et al. 2019): the attention mass from all tokens to [CLS] and to the [SEP]s
  per layer (head mean, bootstrap CI over documents; :func:`analyses.attention.run_attention`) on consecutive
  passages laid out as the model was pretrained (the clark2019 reproduction's corpus and protocol, in the
  run's own template), and the share uniform attention would give the [SEP]s;
- anisotropy growing with depth (Ethayarajh 2019): the mean cosine of random word pairs per layer
  (:func:`analyses.contextuality.run_contextuality`) on single sentences (the ethayarajh2019 reproduction's
  corpus, each sentence in the run's template for one segment).

Two rows give a verdict each, in ``signature`` (the rule is in :data:`RULES`): ``sep_parking`` and
``anisotropy_growth``. ``python -m analyses.calibration PATH`` writes ``calibration.csv`` (and ``.parquet``) into
PATH: one run's directory, or a run set's (every run under it, one table).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable, Mapping, Sequence

import pandas as pd

from analyses.results import cli_error, make_table, resamples_arg, write_table
from probing.examples import Example

__all__ = ["CORPORA", "RULES", "calibrate", "calibrate_run", "find_runs", "main"]

#: Corpora (specs of :func:`probing.corpora.load_corpus`), as the packaged paper configs
#: clark2019_attention.toml (``paragraphs``) and ethayarajh2019_anisotropy.toml (``sentences``) name them,
#: and their ``--quick`` versions.
CORPORA: dict[str, dict[str, str]] = {
    "full": {"paragraphs": "bbc:n=1000,k=4,max_words=25,pairing=consecutive",
             "sentences": "bbc:n=2000,k=1,max_words=40"},
    "quick": {"paragraphs": "generated:n=60,k=4,pairing=consecutive", "sentences": "generated:n=200,k=1"},
}
#: Ethayarajh's protocol: words in at least this many contexts, at most this many kept per word.
MIN_CONTEXTS, MAX_CONTEXTS = 5, 50
#: Clark et al.'s headline for BERT-base: over half of the attention in layers 6-10 goes to [SEP].
CLARK_SHARE = 0.5
RULES: dict[str, str] = {
    "sep_parking": (f"the peak attention mass to the [SEP]s over the middle layers (2 to L-1; every layer when L < 3) "
                    f"has a 95% CI above {CLARK_SHARE:g}, Clark et al.'s 'over half' for BERT-base"),
    "anisotropy_growth": ("the mean cosine of random words at the last layer has a 95% CI above the embedding "
                          "layer's (Ethayarajh 2019: anisotropy grows with depth)"),
}


def find_runs(path: str | Path) -> list[Path]:
    """``path`` if it is a finished run (it holds ``training.json``), else every finished run under it, sorted."""
    from probing.pretrain import TRAINING_RECORD

    path = Path(path)
    if (path / TRAINING_RECORD).is_file():
        return [path]
    runs = sorted(p.parent for p in path.rglob(TRAINING_RECORD))
    if not runs:
        raise ValueError(f"{str(path)!r} holds no finished pretraining run (no {TRAINING_RECORD} in it or under it)")
    return runs


def _middle_layers(n_layers: int) -> list[int]:
    return list(range(2, n_layers)) if n_layers >= 3 else list(range(1, n_layers + 1))


def _sep_share(cache) -> tuple[float, int]:
    """Mean over examples of (#[SEP] / #tokens): the mass uniform attention puts on the [SEP]s."""
    tokens = cache.tokens
    per = tokens.groupby("example")["role"].agg(lambda r: float((r.astype(str) == "sep").mean()))
    return float(per.mean()), len(per)


def calibrate_run(run: str | Path, *, caches: str | Path = "caches", quick: bool = False, n_resamples: int = 1000,
                  seed: int = 0, device: str = "auto", progress: bool = False,
                  corpora: Mapping[str, str | Sequence[Example]] | None = None,
                  log: Callable[[str], None] = print) -> pd.DataFrame:
    """The calibration table of one finished run (module docstring). Caches go to ``caches`` (reused when
    there); ``quick``: the small generated corpora (a smoke test, not evidence). ``corpora``: other text for
    ``paragraphs`` (4 sentences an example) and ``sentences`` (1 an example), as specs or lists of examples
    (e.g. for a model whose inputs are shorter than the defaults' 100-odd tokens)."""
    from analyses.attention import run_attention
    from analyses.contextuality import run_contextuality
    from analyses.stats import check_resamples
    from probing.api import extract_caches
    from probing.formats import Format
    from probing.models import load_model, pick_device
    from probing.pretrain import TRAINING_RECORD, Variant, pretraining_template

    n_resamples = check_resamples(n_resamples)  # before the model is loaded or a cache written
    run = Path(run)
    record = json.loads((run / TRAINING_RECORD).read_text(encoding="utf-8"))
    v = record["variant"]
    variant = Variant(objective=v["objective"], cls_position=v["cls_position"], sep=v["sep"], segments=v["segments"])
    name = f"{v['name']}/seed{record['seed']}"
    base = {"analysis": "calibration", "model": name, "seed": seed, "run": str(run), "objective": variant.objective,
            "cls_position": variant.cls_position, "sep": variant.sep, "segments": variant.segments,
            "pretrain_seed": record["seed"]}
    held = record["heldout"]
    rows = [{**base, "metric": "mlm_accuracy", "value": held["mlm_accuracy"], "n": held["n_masked"]},
            {**base, "metric": "mlm_loss", "value": held["mlm_loss"], "n": held["n_masked"]},
            {**base, "metric": "unigram_entropy", "value": held["unigram_entropy"], "n": held["n_masked"]}]
    if "pair_accuracy" in held:
        rows.append({**base, "metric": "pair_accuracy", "target": variant.objective.split("+")[1],
                     "value": held["pair_accuracy"], "ci_low": held["pair_ci_low"], "ci_high": held["pair_ci_high"],
                     "p_value": held["pair_p_value"], "n": held["n_pairs"]})
    lm = load_model(str(run), device=pick_device(device), attn_implementation="eager")
    specs = {**CORPORA["quick" if quick else "full"], **(corpora or {})}
    names = {k: (v if isinstance(v, str) else f"custom-{k}") for k, v in specs.items()}

    log(f"{name}: attention to [CLS] and [SEP] (Clark et al. 2019)")
    fmt = Format("pretrain-clark", pretraining_template(variant, "{1} {2}", "{3} {4}"))
    (cache,) = extract_caches(lm, specs["paragraphs"], formats=[fmt], attention=True, out=caches, on_overflow="skip",
                              corpus_name=names["paragraphs"], progress=progress, log=log)
    att = run_attention(cache, n_resamples=n_resamples, seed=seed, per_head=False)
    att = att[(att["head"].astype(str) == "mean") & (att["role"] == "all tokens")]
    share, n_share = _sep_share(cache)
    skipped = len(cache.manifest.get("skipped", []) or [])
    common = {**base, "corpus": names["paragraphs"], "format": fmt.template, "role": "all tokens",
              "n_skipped": skipped}
    for target, metric in (("cls", "attention_to_cls"), ("all [SEP]", "attention_to_sep")):
        for r in att[att["target"] == target].sort_values("layer").itertuples():
            rows.append({**common, "metric": metric, "target": target, "layer": int(r.layer), "value": r.value,
                         "ci_low": r.ci_low, "ci_high": r.ci_high, "n": r.n, "grouping": r.grouping,
                         "n_groups": r.n_groups})
    rows.append({**common, "metric": "sep_uniform_share", "target": "all [SEP]", "value": share, "n": n_share})
    sep = att[(att["target"] == "all [SEP]") & att["layer"].isin(_middle_layers(lm.n_layers))]
    if not sep.empty:
        peak = sep.loc[sep["value"].idxmax()]
        rows.append({**common, "metric": "sep_parking", "target": "all [SEP]", "layer": int(peak["layer"]),
                     "value": peak["value"], "ci_low": peak["ci_low"], "ci_high": peak["ci_high"], "n": peak["n"],
                     "signature": bool(peak["ci_low"] > CLARK_SHARE), "rule": RULES["sep_parking"]})

    log(f"{name}: anisotropy by layer (Ethayarajh 2019)")
    single = Format("pretrain-single", pretraining_template(variant, "{1}", None))
    (cache,) = extract_caches(lm, specs["sentences"], formats=[single], out=caches, on_overflow="skip",
                              corpus_name=names["sentences"], progress=progress, log=log)
    ctx = run_contextuality(cache, min_contexts=MIN_CONTEXTS, max_contexts=MAX_CONTEXTS, n_resamples=n_resamples,
                            seed=seed)
    aniso = ctx[ctx["metric"] == "anisotropy_baseline"].sort_values("layer")
    common = {**base, "corpus": names["sentences"], "format": single.template, "role": "word",
              "n_skipped": len(cache.manifest.get("skipped", []) or [])}
    for r in aniso.itertuples():
        rows.append({**common, "metric": "anisotropy", "layer": int(r.layer), "value": r.value, "ci_low": r.ci_low,
                     "ci_high": r.ci_high, "n": r.n})
    if len(aniso) >= 2:
        first, last = aniso.iloc[0], aniso.iloc[-1]
        rows.append({**common, "metric": "anisotropy_growth", "layer": int(last["layer"]),
                     "value": last["value"] - first["value"], "n": last["n"],
                     "signature": bool(last["ci_low"] > first["ci_high"]), "rule": RULES["anisotropy_growth"]})
    return make_table(rows)


def calibrate(path: str | Path, *, out: str | Path | None = None, **options) -> pd.DataFrame:
    """The calibration table of every finished run at or under ``path`` (:func:`find_runs`), written to
    ``out`` (default ``<path>/calibration.csv`` and ``.parquet``); ``options`` go to :func:`calibrate_run`. Too few
    resamples or an ``out`` whose directory cannot be written are refused before any run is read."""
    from analyses.stats import check_resamples
    from probing.cli import check_output_dir

    runs = find_runs(path)
    out = Path(out) if out is not None else Path(path) / "calibration.csv"
    check_output_dir(out.parent, None)
    if "n_resamples" in options:
        check_resamples(options["n_resamples"])
    table = pd.concat([calibrate_run(r, **options) for r in runs], ignore_index=True)
    if "signature" in table.columns:
        table["signature"] = table["signature"].astype("boolean")
    write_table(table, out)
    return table


def main(argv: Sequence[str] | None = None) -> int:
    from analyses.stats import DEFAULT_RESAMPLES, MIN_RESAMPLES
    from probing.cli import ArgumentParser, int_at_least

    p = ArgumentParser(prog="python -m analyses.calibration",
                       description="Calibrate pretrained models (probing.pretrain): held-out MLM and pair accuracy, "
                                   "attention to [SEP] by layer, anisotropy by layer. Writes calibration.csv.")
    p.add_argument("path", help="a run directory (with training.json) or a run set's directory")
    p.add_argument("--caches", default="caches", help="where the caches go (reused when there)")
    p.add_argument("--table", default=None, help="the CSV to write (default: PATH/calibration.csv)")
    p.add_argument("--quick", action="store_true", help="small generated corpora: a smoke test, not evidence")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda")
    p.add_argument("--resamples", type=resamples_arg, default=DEFAULT_RESAMPLES,
                   help=f"bootstrap resamples of every interval, at least {MIN_RESAMPLES} "
                        f"(default {DEFAULT_RESAMPLES})")
    p.add_argument("--seed", type=int_at_least(0), default=0, help="seed of the resampling (default 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    args = p.parse_args(argv)
    from probing.cache_layout import CacheError
    from probing.models import ModelLoadError

    try:
        table = calibrate(args.path, out=args.table, caches=args.caches, quick=args.quick,
                          n_resamples=args.resamples, seed=args.seed, device=args.device,
                          progress=not args.no_progress, log=lambda s: print(s, file=sys.stderr))
    except (ValueError, OSError, ImportError, ModelLoadError, CacheError) as err:
        return cli_error(err)
    summary = table[table["metric"].isin(["mlm_accuracy", "pair_accuracy", "sep_parking", "anisotropy_growth"])]
    print(summary[["model", "metric", "layer", "value", "ci_low", "ci_high", "signature"]].to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
