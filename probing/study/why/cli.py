"""The why study's command line."""

from __future__ import annotations

import shlex
import sys
from typing import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    from argparse import ArgumentTypeError

    from probing.cli import ArgumentParser, check_output_dir, seed_list

    from .config import packaged_configs

    p = ArgumentParser(
        prog="python -m probing.study.why",
        description="The why study: pretrain (or reuse) BERT-like encoders that differ in one choice each "
                    "(objective, [CLS] position, [SEP]), several seeds each, measure every model with frozen probes "
                    "and fine-tuning on BBC News articles the pretraining held out, and write <out>/report.md with "
                    "the answers, the pretraining seed a unit of every interval (docs/WHY.md).")
    p.add_argument("config", nargs="?", default="why_questions",
                   help=f"a packaged config ({', '.join(packaged_configs())}) or a TOML file (default why_questions)")
    p.add_argument("--out", default=None, help="override [why] out (the report and tables)")
    p.add_argument("--pretrain-out", default=None, help="override [pretrain.run] out (the pretraining runs)")
    p.add_argument("--preset", default=None, help="override [pretrain.run] preset: test, tiny, small, base")
    p.add_argument("--steps", type=int, default=None, help="override the preset's pretraining steps")
    p.add_argument("--train-seeds", default=None, help="override [pretrain.run] seeds (pretraining seeds), e.g. 0,1,2")
    p.add_argument("--device", default=None, help="the device of pretraining, probes and fine-tuning: auto, cpu, cuda")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads of the pretraining")
    p.add_argument("--force", action="store_true", help="fine-tune and probe again (finished pretraining is kept)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--pretrain-only", action="store_true",
                   help="pretrain (or reuse) the runs and stop, no measurement and no report: several such commands "
                        "side by side, one per --train-seeds, share a GPU, then the study reuses their runs "
                        "(benchmarks/why_split.sh)")
    args = p.parse_args(argv)
    from probing.pretrain._config import ConfigError

    from .config import load_why_config
    from .run import run_why

    overrides = {}
    try:
        if args.out is not None:
            overrides["why.out"] = args.out
        if args.pretrain_out is not None:
            overrides["pretrain.run.out"] = args.pretrain_out
        if args.preset is not None:
            overrides["pretrain.run.preset"] = args.preset
        if args.steps is not None:
            overrides["pretrain.train.steps"] = args.steps
        if args.train_seeds is not None:
            try:
                overrides["pretrain.run.seeds"] = seed_list(args.train_seeds)
            except ArgumentTypeError as err:  # a usage error reported like the config's own
                raise ValueError(f"--train-seeds {err}") from None
        if args.device is not None:
            overrides["why.device"] = args.device
            overrides["pretrain.run.device"] = args.device
        if args.threads is not None:
            overrides["pretrain.run.threads"] = args.threads
        cfg = load_why_config(args.config, overrides=overrides)
        check_output_dir(cfg.why.out, "[why] out")
        check_output_dir(cfg.pretrain.run.out, "[pretrain.run] out")
    except (ConfigError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.pretrain_only:
        from probing.pretrain import pretrain

        runs = pretrain(cfg.pretrain, progress=not args.no_progress)
        print(f"pretrained {len(runs)} run(s) under {cfg.pretrain.run.out}; the study reuses them")
        return 0
    given = argv if argv is not None else sys.argv[1:]
    command = "python -m probing.study.why " + " ".join(shlex.quote(a) for a in given)
    result = run_why(cfg, force=args.force, progress=not args.no_progress, command=command.strip())
    print(f"wrote {result.out / 'report.md'}")
    for key, (text, conf) in result.answers.items():
        print(f"- {key}: {text} ({conf})")
    return 0
