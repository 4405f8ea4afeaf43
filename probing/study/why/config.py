"""The why study's config: a ``[why]`` table (what is measured) and a ``[pretrain]`` table holding a whole
:mod:`probing.pretrain` config (``[pretrain.run]``, ``[pretrain.corpus]``, ``[pretrain.variant]``,
``[[pretrain.variants]]``, ...): the variants the study pretrains or reuses.

Checked as every config of the toolkit is (:mod:`probing.schema`): an unknown key is refused with the closest
known name, a bad value with the key, the value and what was expected, before anything runs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from probing.pretrain._config import ConfigError, PretrainConfig, Variant, parse_config
from probing.schema import Schema, device_name, setting

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = ["CONFIG_DIR", "ROLES", "WhyConfig", "WhySettings", "config_path", "load_why_config", "packaged_configs"]

#: The configs shipped with the package, found by name.
CONFIG_DIR = Path(__file__).resolve().parent / "configs"

#: What each variant of the study is for: role -> the change from the reference variant (``[pretrain.variant]``,
#: BERT's MLM + NSP with [CLS] first, a [SEP] between the segments and segment embeddings). A config's
#: ``[[pretrain.variants]]`` may hold any subset; a question whose variant is missing is reported as not measured.
ROLES: dict[str, dict[str, Any]] = {
    "mlm": {"objective": "mlm"},
    "sop": {"objective": "mlm+sop"},
    "last": {"cls_position": "last"},
    "nosep": {"sep": False},
}


def _corpus_spec(value: str) -> None:
    from probing.corpora import parse_corpus_spec

    name, kwargs, swap = parse_corpus_spec(value)
    if name != "bbc":
        raise ValueError("the why study measures on BBC News articles the pretraining held out: a 'bbc:' spec")
    if "pretrain_heldout" in kwargs:
        raise ValueError("pretrain_heldout comes from [pretrain.corpus] heldout_fraction; leave it out")
    if kwargs.get("k", 2) != 2 or kwargs.get("pairing", "nsp") != "nsp" or swap:
        raise ValueError("expected sentence pairs with nsp negatives (k=2, pairing nsp, no swap)")


@dataclass(frozen=True)
class WhySettings:
    """``[why]``: what the study measures on each pretrained model.

    out: the study's directory (report.md, tables/). pairs: BBC pairs whose negatives' sentence 2 comes from an
    article of another topic (the ``next`` and ``topic`` tasks: next-sentence prediction as BERT posed it);
    pairs_article: pairs whose negatives' sentence 2 comes from the same article (``next_article``: coherence
    alone). Both are drawn from the articles the pretraining held out only. finetune_preset, epochs, lr, head_lr:
    the fine-tuning of the shared protocol (:mod:`analyses.finetune`) on each pretrained model;
    bootstrap_resamples: of every interval (pretraining seeds, then documents). device: of the fine-tuning and
    the probes (the pretraining's is ``[pretrain.run] device``)."""

    out: str = setting("runs/why_questions", nonempty=True)
    pairs: str = setting("bbc:n=1000,k=2,max_words=40,negatives=other_topic", check=_corpus_spec)
    pairs_article: str = setting("bbc:n=600,k=2,max_words=40,negatives=same_article", check=_corpus_spec)
    finetune_preset: str = setting("default", choices=lambda: __import__(
        "analyses.finetune", fromlist=["PROTOCOL_PRESETS"]).PROTOCOL_PRESETS)
    epochs: int = setting(3, ge=1)
    lr: float = setting(5e-4, gt=0, le=1)
    head_lr: float = setting(2e-3, gt=0, le=1)
    bootstrap_resamples: int = setting(1000, ge=100)
    device: str = setting("auto", check=device_name)


@dataclass(frozen=True)
class WhyConfig:
    why: WhySettings
    pretrain: PretrainConfig

    @property
    def reference(self) -> Variant:
        return self.pretrain.variants[0]

    def variant(self, role: str) -> Variant | None:
        """The variant that plays ``role`` (:data:`ROLES`), if the config pretrains it."""
        want = replace(self.reference, **ROLES[role])
        return next((v for v in self.pretrain.variants[1:] if v == want), None)


_CHECKER = Schema({"why": WhySettings}, ConfigError, also=("pretrain",))


def parse_why_config(raw: dict[str, Any], *, source: str = "config",
                     overrides: dict[str, Any] | None = None) -> WhyConfig:
    """A checked :class:`WhyConfig` from a parsed TOML document; ``overrides``: dotted keys (``why.out``,
    ``pretrain.run.seeds``) replacing the file's values."""
    check = _CHECKER.at(source)
    raw = dict(raw)
    pre = raw.pop("pretrain", None)
    if not isinstance(pre, dict):
        raise ConfigError(f"{source}: expected a [pretrain] table (the pretraining config, docs/PRETRAIN.md)")
    tables = check.read(raw)
    pre_over = {}
    for key, value in (overrides or {}).items():
        if str(key).startswith("pretrain."):
            pre_over[str(key).removeprefix("pretrain.")] = value
        else:
            for (section, k), v in check.dotted({key: value}, "override ").items():
                tables.setdefault(section, {})[k] = v
    why = check.build(WhySettings, tables.get("why", {}))
    pretrain = parse_config(pre, source=f"{source} [pretrain]", overrides=pre_over)
    ref = pretrain.variants[0]
    if ref != Variant("mlm+nsp", "first", True, True):
        raise ConfigError(f"{source}: [pretrain.variant] must be BERT's (mlm+nsp, [CLS] first, [SEP], segments), the "
                          f"reference every question compares with; got {ref.name}")
    return WhyConfig(why, pretrain)


def packaged_configs() -> list[str]:
    """Names of the why configs shipped with the package."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.toml"))


def config_path(config: str | Path) -> Path:
    """A packaged config's path by name, or ``config`` as a path."""
    path = Path(config)
    if path.suffix != ".toml" and (CONFIG_DIR / f"{config}.toml").is_file():
        return CONFIG_DIR / f"{config}.toml"
    if not path.is_file():
        raise ConfigError(f"config {str(config)!r} is neither a file nor a packaged config "
                          f"({', '.join(packaged_configs())})")
    return path


def load_why_config(config: str | Path, *, overrides: dict[str, Any] | None = None) -> WhyConfig:
    path = config_path(config)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"config {str(path)!r} is not valid TOML: {err}") from None
    return parse_why_config(raw, source=f"config {str(path)!r}", overrides=overrides)
