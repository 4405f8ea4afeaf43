"""Cache integrity and comparability (issue 10): the manifest's own checksum (item 7), one writer per
cache with safe removal of stale temporaries (item 8), and the rules of check_comparable (items 3, 5)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from probing.cache import Cache, CacheError, IncomparableCaches, check_comparable
from probing.cache_layout import MANIFEST, SHARDS
from probing.cache_writer import lock_path, writer_lock
from probing.extract import extract
from probing.extract import main as extract_main

from .conftest import make_tiny_bert, sample_examples

REPO = Path(__file__).resolve().parents[1]


def _extract(tiny_bert, out: Path) -> Path:
    (path,) = extract(sample_examples(12, k=2), ["pair"], model=tiny_bert, out=out, shard_mb=0.002,
                      progress=False, log=lambda *a: None)
    return path


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- item 7: manifest checksum


def test_one_flipped_bit_that_relabels_a_layer_is_refused(tmp_path, tiny_bert):
    """Before: flipping one bit turned layers [0, 1, 2] into [0, 3, 2] and the cache opened."""
    path = _extract(tiny_bert, tmp_path / "c")
    mf = path / MANIFEST
    text = mf.read_bytes()
    start = text.index(b'"layers": [')
    at = text.index(b"1", start)  # '1' (0x31) -> '3' (0x33): still valid JSON, another layer
    mf.write_bytes(text[:at] + bytes([text[at] ^ 0x02]) + text[at + 1:])
    assert json.loads(mf.read_text())["layers"] == [0, 3, 2]
    with pytest.raises(CacheError, match="manifest.json is damaged.*SHA-256") as err:
        Cache.open(path)
    assert str(mf) in str(err.value)


def test_every_flipped_bit_is_refused_naming_the_manifest(tmp_path, tiny_bert):
    """Before: most flips ended in a bare JSONDecodeError that named no file. Now every flip is
    refused with a CacheError naming manifest.json, or leaves the parsed content unchanged."""
    path = _extract(tiny_bert, tmp_path / "c")
    mf = path / MANIFEST
    original = mf.read_bytes()
    manifest = Cache.open(path).manifest
    positions = range(0, len(original), max(1, len(original) // 150))
    refused = 0
    for at in positions:
        for bit in (0, 1, 5):
            mf.write_bytes(original[:at] + bytes([original[at] ^ (1 << bit)]) + original[at + 1:])
            try:
                opened = Cache.open(path)
            except CacheError as err:
                assert str(mf) in str(err), err
                refused += 1
            else:
                assert opened.manifest == manifest  # only a flip that changes nothing may pass
    assert refused >= 0.95 * 3 * len(positions)
    mf.write_bytes(original)
    assert Cache.open(path).manifest == manifest


def test_manifest_written_without_a_checksum_is_refused(tmp_path, tiny_bert):
    path = _extract(tiny_bert, tmp_path / "c")
    m = json.loads((path / MANIFEST).read_text())
    del m["manifest_sha256"]
    (path / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(CacheError, match="no manifest_sha256"):
        Cache.open(path)
    m["cache_version"] = 1  # what an older probing wrote
    (path / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(CacheError, match="cache version 1.*extract again"):
        Cache.open(path)


def test_damaged_request_json_is_named(tmp_path, tiny_bert):
    path = _extract(tiny_bert, tmp_path / "c")
    (path / MANIFEST).unlink()  # an interrupted run: the next one reads request.json
    (path / "request.json").write_bytes(b"\xff" + (path / "request.json").read_bytes()[1:])
    with pytest.raises(CacheError, match="request.json is damaged") as err:
        _extract(tiny_bert, tmp_path / "c")
    assert str(path / "request.json") in str(err.value)


# --------------------------------------------------------------------------- item 8: one writer per cache


def test_second_writer_is_refused_and_leaves_the_first_ones_temporaries(tmp_path, tiny_bert):
    """Before: a second extractor on the same --out deleted the first one's in-flight temporaries."""
    reference = _extract(tiny_bert, tmp_path / "ref")
    path = _extract(tiny_bert, tmp_path / "c")
    (path / MANIFEST).unlink()  # the first writer is still running: no manifest yet
    in_flight = [path / SHARDS / ".00001.npy.abc123.tmp", path / ".examples.parquet.def456.tmp"]
    for f in in_flight:
        f.write_bytes(b"being written")
    with writer_lock(path):
        with pytest.raises(CacheError, match=f"another extraction \\(process {os.getpid()}\\) is writing"):
            _extract(tiny_bert, tmp_path / "c")
        assert all(f.read_bytes() == b"being written" for f in in_flight)
    # the first writer was killed: its lock went with it, and the next run removes its temporaries
    again = _extract(tiny_bert, tmp_path / "c")
    assert not any(f.exists() for f in in_flight) and not list(path.rglob("*.tmp"))
    assert _tree(again) == _tree(reference)
    assert lock_path(path).read_bytes() == b""  # empty at rest


def test_second_writer_from_another_process_gets_exit_2(tmp_path, tiny_bert, bert_tokenizer, capsys):
    """The lock holds across processes: a writer in a child process blocks this process's CLI run."""
    model_dir = tmp_path / "model"
    make_tiny_bert(bert_tokenizer).save_pretrained(model_dir)
    bert_tokenizer.save_pretrained(model_dir)
    args = ["--model", str(model_dir), "--corpus", "generated:n=6", "--formats", "pair", "--device", "cpu",
            "--no-progress", "--out", str(tmp_path / "c")]
    assert extract_main(args) == 0
    (path,) = [p.parent for p in (tmp_path / "c").glob(f"*/*/{MANIFEST}")]
    (path / MANIFEST).unlink()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from probing.cache_writer import writer_lock\n"
         f"with writer_lock({str(path)!r}):\n    print('held', flush=True); time.sleep(60)"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        capsys.readouterr()
        assert extract_main(args) == 2
        err = capsys.readouterr().err
        err = err[err.index("error: "):]  # after transformers' loading progress bar
        assert str(path) in err and f"process {holder.pid}" in err and "refused" in err
        assert not (path / MANIFEST).exists()
    finally:
        holder.kill()
        holder.wait()
    assert extract_main(args) == 0 and (path / MANIFEST).exists()


# --------------------------------------------------------------------------- items 3 and 5: comparability rules


def _fake(name: str, *, corpus="c0", weights="w0", random_init=False, architecture="a0", template="T",
          layers=(0, 1, 2), roles=("cls", "sep", "word")):
    import types

    model = {"name": "m", "fingerprint": weights, "random_init": random_init, "seed": 1 if random_init else None,
             "model_type": "bert", "n_layers": 2, "hidden_size": 32, "type_vocab_size": 2}
    if architecture is not None:
        model["architecture"] = architecture
    manifest = {"corpus": {"name": corpus, "fingerprint": corpus * 8, "n_examples": 10}, "model": model,
                "format": {"name": "pair", "template": template}, "layers": list(layers), "roles": list(roles)}
    return types.SimpleNamespace(path=Path("/caches") / name, manifest=manifest)


def test_check_comparable_rules():
    a = _fake("a")
    check_comparable(a, _fake("b", template="U"))  # two formats of one model on one corpus
    check_comparable(a, _fake("b", weights="w1"), same_model=False)
    cases = [
        (_fake("b", corpus="c1"), {}, "different corpora"),
        (_fake("b", weights="w1"), {}, "different models"),
        (_fake("b", roles=("cls", "word")), {"roles": ["sep"]}, r"second cache stores no \['sep'\]"),
        (_fake("b", weights="w1"), {"random_baseline": True}, "trained weights"),
        (_fake("b", weights="w1", random_init=True, architecture="a1"), {"random_baseline": True},
         "different architectures"),
        (_fake("b", weights="w1", random_init=True, template="U"), {"random_baseline": True}, "different formats"),
        (_fake("b", weights="w1", random_init=True, layers=(0, 2)), {"random_baseline": True}, r"layers \[1\]"),
        (_fake("b", weights="w1", random_init=True, roles=("cls",)), {"random_baseline": True}, "stores no"),
    ]
    for b, kw, why in cases:
        with pytest.raises(IncomparableCaches, match=why) as err:
            check_comparable(a, b, **kw)
        assert "/caches/a" in str(err.value) and "/caches/b" in str(err.value)
        assert isinstance(err.value, ValueError) and isinstance(err.value, CacheError)
    check_comparable(a, _fake("b", weights="w1", random_init=True), random_baseline=True)
    # caches written before the architecture hash: model type, layers, hidden size and token types decide
    old = _fake("a", architecture=None)
    check_comparable(old, _fake("b", weights="w1", random_init=True, architecture=None), random_baseline=True)
    wider = _fake("b", weights="w1", random_init=True, architecture=None)
    wider.manifest["model"]["hidden_size"] = 64
    with pytest.raises(IncomparableCaches, match="different architectures"):
        check_comparable(old, wider, random_baseline=True)
    both = _fake("b", corpus="c1", weights="w1")
    with pytest.raises(IncomparableCaches, match="different corpora.*different models"):
        check_comparable(a, both)


@pytest.mark.parametrize("array", [
    np.arange(2 * 3 * 5, dtype=np.float32).reshape(2, 3, 5),
    np.linspace(-3, 3, 77).astype(np.float16).reshape(7, 11),
    np.zeros((0, 13, 8), dtype=np.float16),
    np.arange(10, dtype=">f4"),  # big-endian: the bytes go to the file as they are in memory
    np.array([True, False, True]),
    np.arange(6, dtype=np.int64).reshape(3, 2)[:, 0],  # not contiguous: written as a copy
])
@pytest.mark.parametrize("alongside", [False, True])
def test_npy_checksum_from_memory_equals_the_files(tmp_path, monkeypatch, array, alongside):
    from probing import cache_writer
    from probing.cache_layout import sha256_file
    from probing.cache_writer import _write_hashed_npy, npy_sha256

    if alongside:  # every array hashed on the second thread while it is written
        monkeypatch.setattr(cache_writer, "_HASH_ALONGSIDE_BYTES", 0)
    path = tmp_path / "a.npy"
    digest = _write_hashed_npy(path, array)
    assert digest == sha256_file(path)
    np.testing.assert_array_equal(np.load(path), array)
    other = np.ones(array.size + 1, dtype=np.float64)  # not the array in the file: sizes differ, so the file is read
    assert npy_sha256(path, other) == sha256_file(path)


def test_npy_checksum_falls_back_to_the_file_when_the_expected_header_is_not_the_files(tmp_path, monkeypatch):
    from probing import cache_writer
    from probing.cache_layout import sha256_file

    array = np.arange(3 * 2**18, dtype=np.float32).reshape(3, -1)  # 3 MiB: hashed alongside the write
    real = np.lib.format.write_array_header_1_0
    monkeypatch.setattr(np.lib.format, "write_array_header_1_0",  # the expected header only, not the file's
                        lambda fp, d: real(fp, {**d, "shape": (1,)}))
    path = tmp_path / "a.npy"
    assert cache_writer._write_hashed_npy(path, array) == sha256_file(path)
