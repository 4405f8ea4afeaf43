"""Extraction split among processes: under torchrun (CPU, gloo, 2 processes) the cache equals the
single-process cache byte for byte; a rank killed mid-run leaves nothing that a re-run (with the same
or another number of processes) does not complete into the same bytes; rank 0 writes the manifest
only once every rank's shards are there, and no rank returns before it exists."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from probing.cache import Cache, CacheError
from probing.cache_layout import MANIFEST, REQUEST, SHARDS
from probing.distributed import TORCHRUN_ENV, DistContext, barrier_timeout
from probing.extract import ExtractError, assign_shards, extract
from probing.extract import main as extract_main
from probing.models import prepare_model

from .conftest import make_tiny_bert, sample_examples

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 180  # per subprocess; a healthy run takes a few seconds


def _gloo_available() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return dist.is_available() and dist.is_gloo_available()


needs_gloo = pytest.mark.skipif(not _gloo_available(),
                                reason="this torch build has no torch.distributed with the gloo backend")
needs_linux = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="finds torchrun's worker processes through /proc")


# ---------------------------------------------------------------------------------------------------
# Helpers


def _tree(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` (relative path -> bytes)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _assert_same_cache_tree(expected: Path, actual: Path) -> None:
    """Same cache directory names, same files, every file byte-identical; token tables equal row for
    row and states equal through the read API too."""
    a, b = _tree(expected), _tree(actual)
    assert sorted(a) == sorted(b)
    assert any(name.endswith(".npy") for name in a)
    different = [name for name in a if a[name] != b[name]]
    assert different == [], f"files that differ: {different}"
    for mf in sorted(expected.glob(f"*/*/{MANIFEST}")):
        ca, cb = Cache.open(mf.parent), Cache.open(actual / mf.parent.relative_to(expected))
        assert ca.manifest == cb.manifest
        pd.testing.assert_frame_equal(ca.tokens, cb.tokens)
        np.testing.assert_array_equal(ca.states(), cb.states())


def _env() -> dict[str, str]:
    """The environment for every subprocess: one thread per process in every run (the same for the
    single-process reference), offline, gloo, no torchrun variables inherited from outside."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_ENV}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PROBING_DIST_BACKEND="gloo", PROBING_DIST_TIMEOUT_S="120",
               PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    return env


def _extract_args(model_dir: Path, out: Path) -> list[str]:
    """Two formats, many small shards (about 36 per format), so a kill lands mid-run."""
    return ["-m", "probing.extract", "--model", str(model_dir), "--corpus", "generated:n=60", "--formats", "pair",
            "concat", "--shard-mb", "0.02", "--device", "cpu", "--no-progress", "--out", str(out)]


def _torchrun(nproc: int) -> list[str]:
    """torchrun picks a free port itself (endpoint port 0), on loopback only."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "--max-restarts", "0"]


def _run(cmd: list[str], log: Path) -> subprocess.CompletedProcess:
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            proc.wait(timeout=TIMEOUT_S)
        finally:
            _kill_group(proc)
    text = log.read_text(errors="replace")
    assert proc.returncode == 0, f"{' '.join(cmd)} exited with {proc.returncode}:\n{text[-4000:]}"
    return subprocess.CompletedProcess(cmd, proc.returncode, text)


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill what is left of a process group this test started (torchrun and its workers)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        ppid = int(text[text.rindex(")") + 2:].split()[1])
        if ppid == pid:
            out.append(int(stat.parent.name))
    return out


def _worker_with_rank(launcher: int, rank: int) -> int | None:
    for pid in _children(launcher):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            return pid
    return None


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory, bert_tokenizer) -> Path:
    """A tiny random BERT and its tokenizer saved with save_pretrained, for ``--model <dir>``."""
    d = tmp_path_factory.mktemp("tiny-bert-saved")
    make_tiny_bert(bert_tokenizer).save_pretrained(d)
    bert_tokenizer.save_pretrained(d)
    return d


@contextlib.contextmanager
def _one_process(threads: int = 1):
    """Run the command-line entry point in this process as a plain single-process run: no torchrun
    variables, and as many torch threads as each torchrun worker has (OMP_NUM_THREADS=1)."""
    saved = {k: os.environ.pop(k) for k in TORCHRUN_ENV if k in os.environ}
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
        os.environ.update(saved)


def _main(args: list[str]) -> None:
    """``python -m probing.extract ARGS`` in this process (it would cost a few seconds of imports as a
    subprocess); the same entry point torchrun starts in each worker."""
    with _one_process():
        assert extract_main(args[2:]) == 0  # args[:2] is "-m probing.extract"


@pytest.fixture(scope="module")
def reference(tmp_path_factory, saved_model) -> Path:
    """The single-process cache (no torchrun): two formats, many shards each. Read-only."""
    root = tmp_path_factory.mktemp("single") / "caches"
    _main(_extract_args(saved_model, root))
    return root


# ---------------------------------------------------------------------------------------------------
# Under torchrun


@needs_gloo
@pytest.mark.slow
def test_torchrun_two_processes_equal_one_process_byte_for_byte(tmp_path, saved_model, reference):
    out = tmp_path / "caches"
    res = _run([*_torchrun(2), *_extract_args(saved_model, out)], tmp_path / "log.txt")
    manifests = sorted(reference.glob(f"*/*/{MANIFEST}"))
    assert len(manifests) == 2
    for mf in manifests:
        assert len(json.loads(mf.read_text())["shards"]) >= 4
    # both ranks really worked: each wrote its own shards (rank 0 reports only what it computed)
    assert "resumed" not in res.stdout
    rank0_tokens = [int(line.split(" tokens through")[0].rsplit(", ", 1)[1])
                    for line in res.stdout.splitlines() if "tokens through the model" in line]
    assert len(rank0_tokens) == 2
    for mf, n in zip(manifests, rank0_tokens):
        total = json.loads(mf.read_text())["n_tokens"]  # roles cls,sep,word: every token is stored
        assert 0 < n < total
    _assert_same_cache_tree(reference, out)


@needs_gloo
@needs_linux
@pytest.mark.slow
def test_killed_rank_then_rerun_with_one_process_completes_the_same_bytes(tmp_path, saved_model, reference,
                                                                            capsys):
    killed = tmp_path / "caches"
    with open(tmp_path / "killed.txt", "wb") as log:
        proc = subprocess.Popen([*_torchrun(2), *_extract_args(saved_model, killed)], cwd=REPO, env=_env(),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline, victim = time.time() + TIMEOUT_S, None
            while time.time() < deadline and proc.poll() is None:
                if len(list(killed.glob(f"*/*/{SHARDS}/[0-9]*.json"))) >= 4:
                    victim = _worker_with_rank(proc.pid, 1)
                    if victim is not None:
                        os.kill(victim, signal.SIGKILL)
                        break
                time.sleep(0.005)
            assert victim is not None, "the run ended (or timed out) before rank 1 could be killed"
            proc.wait(timeout=TIMEOUT_S)  # torchrun notices the dead rank and stops rank 0
        finally:
            _kill_group(proc)
    assert proc.returncode != 0
    assert not list(killed.glob(f"*/*/{MANIFEST}"))
    (cache_dir,) = [p.parent for p in killed.glob(f"*/*/{REQUEST}")]  # killed in the first format
    ref_manifest = reference / cache_dir.relative_to(killed) / MANIFEST
    n_shards = len(json.loads(ref_manifest.read_text())["shards"])
    shards = cache_dir / SHARDS
    n_done = len(list(shards.glob("[0-9]*.json")))
    assert 4 <= n_done < n_shards

    # what a process killed at other moments would leave: a half-written temporary, a states file
    # renamed into place whose record was never written, and a shard damaged after its record
    (shards / ".00001.npy.half.tmp").write_bytes(b"\x93NUMPY half")
    missing = next(i for i in range(n_shards) if not (shards / f"{i:05d}.json").exists())
    (shards / f"{missing:05d}.npy").write_bytes(b"not the states")
    damaged = sorted(shards.glob("[0-9]*.json"))[0].name.split(".")[0]
    (shards / f"{damaged}.npy").write_bytes((shards / f"{damaged}.npy").read_bytes()[:-4])

    # the world size changes: one process finishes what two started
    capsys.readouterr()
    _main(_extract_args(saved_model, killed))
    assert f"{n_done - 1} shard(s) resumed" in capsys.readouterr().out  # the damaged one was computed again
    assert not list(killed.rglob("*.tmp"))
    _assert_same_cache_tree(reference, killed)


# ---------------------------------------------------------------------------------------------------
# The protocol, in one process: ranks run one after another or as threads


def _lm(tokenizer):
    # a model and tokenizer per rank: ranks share nothing, as separate processes would not
    tok = copy.deepcopy(tokenizer)
    return prepare_model(make_tiny_bert(tok), tok, name="tiny-bert")


def _quiet(*args) -> None:
    pass


def _owned(cache: Cache, world: int, rank: int) -> set[int]:
    """Shards that ``assign_shards`` gives ``rank`` of ``world``, from a finished cache: the shard
    ranges come from the manifest, each example's forward-pass length from its token table (every
    position is stored: the pair format has only cls, sep and word tokens)."""
    lengths = np.bincount(cache.tokens["example"].to_numpy(), minlength=len(cache.examples))
    stand_in = SimpleNamespace(lengths=lengths, shards=[tuple(r["examples"]) for r in cache.manifest["shards"]])
    return set(assign_shards(stand_in, world)[rank])


@pytest.mark.parametrize("attempts", [
    [(0, 2), (1, 2), (0, 2)],  # the two ranks in turn; rank 0 again writes the manifest
    [(0, 2), (0, 1)],  # rank 0 did its share, then a single process finishes
    [(0, 3), (1, 3), (0, 1)],  # two of three ranks, then a single process finishes
])
def test_ranks_in_turn_complete_the_single_process_cache(tmp_path, bert_tokenizer, attempts):
    examples = sample_examples(24)
    kw = dict(shard_mb=0.03, progress=False, log=_quiet)
    (ref,) = extract(examples, ["pair"], model=_lm(bert_tokenizer), out=tmp_path / "one", **kw)
    ref_cache = Cache.open(ref)
    n_shards = len(ref_cache.manifest["shards"])
    assert n_shards >= 6
    split = tmp_path / "split" / ref.relative_to(tmp_path / "one")
    done: set[int] = set()
    for i, (rank, world) in enumerate(attempts):
        owned = _owned(ref_cache, world, rank)
        assert owned  # every rank has work
        if i < len(attempts) - 1 and rank == 0:
            # no barrier here: rank 0 finds the shards of ranks that have not run missing, and
            # writes no manifest
            left = sorted(set(range(n_shards)) - done - owned)
            with pytest.raises(CacheError, match=re.escape(f"shards {left} are missing after extraction")):
                extract(examples, ["pair"], model=_lm(bert_tokenizer), out=tmp_path / "split", rank=rank,
                        world_size=world, **kw)
        else:
            (path,) = extract(examples, ["pair"], model=_lm(bert_tokenizer), out=tmp_path / "split",
                              rank=rank, world_size=world, **kw)
            assert path == split
        now = {int(p.name.split(".")[0]) for p in (split / SHARDS).glob("[0-9]*.json")}
        assert now - done == owned - done  # each rank wrote its own shards, and only those
        done = now
        assert (split / MANIFEST).exists() == (i == len(attempts) - 1)
    _assert_same_cache_tree(tmp_path / "one", tmp_path / "split")


def test_rank_0_waits_for_every_rank_and_no_rank_returns_before_the_manifest(tmp_path, bert_tokenizer):
    """Two ranks as threads with a real barrier; rank 1 starts its shards late. Rank 0 must not write
    the manifest before rank 1's last shard, and rank 1 must not return before the manifest exists."""
    examples = sample_examples(24)
    barrier = threading.Barrier(2, timeout=60)
    seen: dict[int, object] = {}

    def rank_barrier(rank: int):
        calls = [0]

        def wait() -> None:
            barrier.wait()
            calls[0] += 1
            if rank == 1 and calls[0] == 2:  # the barrier before the shards are computed
                time.sleep(0.5)

        return wait

    models = [_lm(bert_tokenizer) for _ in range(2)]  # built here: seeding is not thread-safe

    def run(rank: int) -> None:
        try:
            (path,) = extract(examples, ["pair"], model=models[rank], out=tmp_path / "split",
                              shard_mb=0.03, progress=False, log=_quiet, rank=rank, world_size=2,
                              barrier=rank_barrier(rank))
            seen[rank] = (path / MANIFEST).exists()  # checked the moment extract returns
        except BaseException as err:  # reported by the main thread
            seen[rank] = err
            barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert seen == {0: True, 1: True}
    (cache_dir,) = [p.parent for p in (tmp_path / "split").glob(f"*/*/{MANIFEST}")]
    records = list((cache_dir / SHARDS).glob("[0-9]*.json"))
    manifest = json.loads((cache_dir / MANIFEST).read_text())
    assert len(records) == len(manifest["shards"]) >= 6
    assert (cache_dir / MANIFEST).stat().st_mtime_ns >= max(r.stat().st_mtime_ns for r in records)
    (ref,) = extract(examples, ["pair"], model=_lm(bert_tokenizer), out=tmp_path / "one", shard_mb=0.03,
                     progress=False, log=_quiet)
    _assert_same_cache_tree(tmp_path / "one", tmp_path / "split")


def test_a_rank_that_cannot_see_rank_0s_request_stops_before_computing(tmp_path, tiny_bert, examples):
    """Several machines without a shared --out: rank 0's request.json is not there; a clear error
    before any forward pass, instead of shards written where rank 0 never looks."""
    with pytest.raises(CacheError, match=r"rank 1 of 2: .*request\.json.* every machine shares"):
        extract(examples, ["pair"], model=tiny_bert, out=tmp_path, progress=False, log=_quiet,
                rank=1, world_size=2)
    assert not list(tmp_path.rglob("*.npy"))


@pytest.mark.parametrize("rank, world", [(2, 2), (-1, 2), (0, 0)])
def test_rank_outside_the_world_is_an_error(tmp_path, tiny_bert, examples, rank, world):
    with pytest.raises(ExtractError, match=rf"rank={rank} must be in 0..world_size-1 \(world_size={world}\)"):
        extract(examples, ["pair"], model=tiny_bert, out=tmp_path, progress=False, log=_quiet,
                rank=rank, world_size=world)
    assert not list(tmp_path.iterdir())


def test_dist_context_outside_torchrun_is_one_process(monkeypatch):
    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)
    ctx = DistContext.from_env()
    assert (ctx.rank, ctx.world_size, ctx.initialised_here) == (0, 1, False)
    assert ctx.device("cpu") == torch.device("cpu")
    ctx.barrier()  # a no-op without a process group


def test_dist_context_device_is_pick_device_with_the_local_rank(monkeypatch):
    """The one resolver (probing.models.pick_device): under torchrun 'auto' and 'cuda' mean the process's own
    GPU, round-robin over the visible ones; a named GPU and 'cpu' stay; outside torchrun 'auto' is cuda."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    ranked = DistContext(rank=3, world_size=4, local_rank=3)
    assert ranked.device("auto") == ranked.device("cuda") == ranked.device(None) == torch.device("cuda:1")
    assert ranked.device("cuda:0") == torch.device("cuda:0") and ranked.device("cpu") == torch.device("cpu")
    assert DistContext().device("auto") == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert ranked.device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match="CUDA is not available here"):
        ranked.device("cuda")


def test_barrier_timeout_from_env(monkeypatch):
    monkeypatch.delenv("PROBING_DIST_TIMEOUT_S", raising=False)
    assert barrier_timeout().total_seconds() == 24 * 3600
    monkeypatch.setenv("PROBING_DIST_TIMEOUT_S", "90")
    assert barrier_timeout().total_seconds() == 90
    for bad in ("soon", "0", "-5"):
        monkeypatch.setenv("PROBING_DIST_TIMEOUT_S", bad)
        with pytest.raises(ValueError, match=f"PROBING_DIST_TIMEOUT_S='{bad}'"):
            barrier_timeout()
