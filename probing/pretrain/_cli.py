"""The command ``python -m probing.pretrain CONFIG`` (``probing pretrain``): pretrain every variant and seed of a
config (docs/PRETRAIN.md).

Bad input (a config that does not fit the schema, a missing corpus package, an unwritable output directory)
is one line ``error: ...`` and exit status 2, before anything is written. An interrupted run resumes from its
last checkpoint when the same command is run again; finished runs are kept unless ``--force``.
"""

from __future__ import annotations

import sys
from typing import Sequence

from probing.cli import ArgumentParser, int_at_least, output_dir_arg, seed_list

from ._config import PRESET_NAMES


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m probing.pretrain",
                       description="Pretrain BERT-architecture encoders from scratch on offline text, each variant "
                                   "of the config with each seed (docs/PRETRAIN.md).")
    p.add_argument("config", help="a TOML config ([run], [corpus], [model], [train], [variant], [[variants]])")
    p.add_argument("--out", type=output_dir_arg, default=None, help="the run set's directory (config: [run] out)")
    p.add_argument("--preset", choices=PRESET_NAMES, default=None, help="sizes and steps (config: [run] preset)")
    p.add_argument("--train-seeds", type=seed_list, default=None,
                   help="pretraining seeds, e.g. 0,1,2 (config: [run] seeds)")
    p.add_argument("--steps", type=int_at_least(1), default=None, help="optimizer steps (config: [train] steps)")
    p.add_argument("--device", default=None, help="auto, cpu, cuda, cuda:1 (config: [run] device)")
    p.add_argument("--threads", type=int_at_least(1), default=None, help="torch CPU threads (config: [run] threads)")
    p.add_argument("--force", action="store_true", help="train again runs that have finished, and the tokenizer")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from probing.models import ModelLoadError

    from ._config import load_config
    from ._train import pretrain

    overrides = {key: value for key, value in (("run.out", args.out), ("run.preset", args.preset),
                                               ("run.seeds", args.train_seeds), ("train.steps", args.steps),
                                               ("run.device", args.device), ("run.threads", args.threads))
                 if value is not None}
    try:
        config = load_config(args.config, overrides=overrides)
        runs = pretrain(config, force=args.force, progress=not args.no_progress,
                        log=lambda s: print(s, file=sys.stderr))
    except (ValueError, ImportError, OSError, ModelLoadError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: run the same command again to resume from the last checkpoint", file=sys.stderr)
        return 130
    for path in runs:
        print(path)
    return 0
