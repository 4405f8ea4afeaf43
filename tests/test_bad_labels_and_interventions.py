"""Inputs that used to give a wrong result under a trained model's name, now refused with a clear error:
missing labels and document ids in a corpus file or a cache, a treated or control cache that is not the
intervention the runner sets against its clean run, and the notebook API's plain strings and tuples
(accepted) beside what it cannot take (refused). Every refusal names the input, exits 2 from the command
line and writes nothing."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import probing
from probing.cache import Cache, IncomparableCaches
from probing.corpus_files import read_table
from probing.examples import MISSING_TEXT, Example, as_examples
from probing.extract import extract
from probing.interventions import Intervention, Knockout, Patch, check_intervention

from .conftest import make_tiny_bert, sample_examples

QUIET = dict(progress=False, log=lambda *a: None)


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in Path(root).rglob("*")}


def _cli(module: str, argv: list[str], root: Path, capsys) -> str:
    """Run ``module``'s main in-process; assert exit 2, one ``error:`` first line, nothing written below
    ``root``; return the first line."""
    before = _files(root)
    try:
        code = importlib.import_module(module).main([str(a) for a in argv])
    except SystemExit as exit_:  # argparse
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2, err
    first = err.splitlines()[0]
    assert first.startswith("error: ") and "Traceback" not in err, err
    assert _files(root) == before  # nothing written, not even a temporary
    return first


# -- 1. missing labels in corpus files -------------------------------------------------------------------

def test_missing_spellings_are_pandas_own():
    from pandas._libs.parsers import STR_NA_VALUES

    assert MISSING_TEXT == frozenset(STR_NA_VALUES)


@pytest.mark.parametrize("cell", ["nan", "NaN", "NA", "N/A", "null", "<NA>", "None", "", " NA "])
@pytest.mark.parametrize("suffix, sep", [(".csv", ","), (".tsv", "\t")])
def test_a_missing_label_cell_is_refused_naming_file_column_and_row(tmp_path, cell, suffix, sep):
    """In a number column ``nan`` used to become a float NaN label; in a text column ``NA`` a class of its own."""
    for column, good in (("score", ["1", "2", "3"]), ("topic", ["a", "b", "c"])):
        cells = [good[0], cell, good[2]]
        path = tmp_path / f"c{suffix}"
        rows = "".join(f"Row {i} here.{sep}{v}\n" for i, v in enumerate(cells))
        path.write_text(sep.join(["s", column]) + "\n" + rows)
        with pytest.raises(ValueError) as err:
            read_table(path, ["s"], [column])
        assert str(err.value) == (f"{path}: label column {column!r} is missing in 1 of 3 rows: row 1 (id '1') "
                                  f"{cell!r}; fill these cells in or drop the rows" + (
                                      "; to keep such text as a label, write the corpus as JSONL, where a quoted "
                                      "string such as \"NA\" stays as written" if cell.strip() else ""))


def test_many_missing_cells_list_the_first_few_and_a_count(tmp_path):
    path = tmp_path / "docs.csv"
    docs = ["d0", "nan", "d1", "NA", "null", "", "N/A", "nan", "d2", "None"]
    path.write_text("s,doc\n" + "".join(f"Sentence {i}.,{d}\n" for i, d in enumerate(docs)))
    with pytest.raises(ValueError) as err:
        read_table(path, "s", ["doc"])
    message = str(err.value)
    assert message.startswith(f"{path}: label column 'doc' (the document id that every split and bootstrap groups "
                              f"by: an example without one would silently be a group of its own) is missing in 7 of "
                              f"10 rows: row 1 (id '1') 'nan', row 3 (id '3') 'NA', row 4 (id '4') 'null', "
                              f"row 5 (id '5') '', row 6 (id '6') 'N/A' and 2 more;")


def test_a_label_called_na_is_kept_in_jsonl_and_missing_jsonl_values_are_refused(tmp_path):
    ok = tmp_path / "ok.jsonl"
    ok.write_text('{"s": "One.", "topic": "NA", "doc": "nan"}\n{"s": "Two.", "topic": "EU", "doc": "d1"}\n')
    assert [dict(e.labels) for e in read_table(ok, "s", ["topic", "doc"])] == [
        {"topic": "NA", "doc": "nan"}, {"topic": "EU", "doc": "d1"}]
    for value, shown in (("null", "None"), ("NaN", "nan"), ('"  "', "'  '")):
        bad = tmp_path / "bad.jsonl"
        bad.write_text(f'{{"s": "One.", "doc": "d0"}}\n\n{{"s": "Two.", "doc": {value}}}\n')
        with pytest.raises(ValueError) as err:
            read_table(bad, "s", ["doc"])
        assert str(err.value).startswith(f"{bad}: label column 'doc' (the document id")
        assert str(err.value).endswith(f"is missing in 1 of 2 rows: row 1 (line 3) (id '1') {shown}; fill these "
                                       f"cells in or drop the rows")


def test_the_text_na_stays_a_sentence(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text("s,topic\nNA,a\nnan,b\n")
    assert [e.sentences for e in read_table(path, "s", ["topic"])] == [("NA",), ("nan",)]


def test_examples_refuse_a_missing_label_value():
    for value in (None, float("nan"), np.float32("nan"), pd.NA):
        with pytest.raises(ValueError, match=r"example 'a': label\(s\) \['doc'\] have no value"):
            Example("a", ("One.",), {"doc": value, "topic": "x"})
    assert Example("a", ("One.",), {"doc": "NA"}).labels == {"doc": "NA"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, bert_tokenizer) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny-model"
    make_tiny_bert(bert_tokenizer).save_pretrained(path)
    bert_tokenizer.save_pretrained(path)
    return path


def test_the_extract_command_refuses_a_missing_doc_and_writes_nothing(tmp_path, model_dir, capsys, monkeypatch):
    corpus = tmp_path / "corpus.csv"
    corpus.write_text("s1,s2,topic,doc\n" + "".join(
        f"Sentence {i} here.,Another {i}.,{i % 2},{'nan' if i in (2, 5) else f'd{i // 2}'}\n" for i in range(8)))
    monkeypatch.chdir(tmp_path)
    first = _cli("probing.extract", ["--corpus", f"file:path={corpus},sentences=s1;s2,labels=topic;doc",
                                     "--model", model_dir, "--out", tmp_path / "caches"], tmp_path, capsys)
    assert f"{corpus}: label column 'doc'" in first
    assert "is missing in 2 of 8 rows: row 2 (id '2') 'nan', row 5 (id '5') 'nan'" in first


def test_a_corpus_spec_with_a_missing_cell_is_refused(tmp_path):
    """The spec path that the command line, the study and the API share."""
    path = tmp_path / "c.csv"
    path.write_text("s,score\nOne here.,1\nTwo here.,nan\n")
    with pytest.raises(ValueError, match=r"^corpus 'file:path=.*c\.csv,sentences=s,labels=score': .*c\.csv: label "
                                         r"column 'score' is missing in 1 of 2 rows: row 1 \(id '1'\) 'nan'"):
        probing.load_corpus(f"file:path={path},sentences=s,labels=score")


# -- 1b. a cache whose examples lack a document id: the analyses refuse, never group by example -------------

def test_grouping_refuses_a_doc_label_some_examples_lack():
    from analyses.stats._grouping import example_groups, table_groups

    numbers = pd.DataFrame({"label_doc": [1.0, np.nan, 2.0], "example_id": ["a", "b", "c"]}, index=[0, 1, 2])
    with pytest.raises(ValueError, match=r"^c1: the 'doc' label is missing for 1 of 3 examples \('b'\)"):
        table_groups(numbers, "c1")
    text = pd.DataFrame({"label_doc": ["d1", "", "d1", " "]}, index=[4, 5, 6, 7])  # a cache stores a lacking str as ""
    with pytest.raises(ValueError, match=r"the 'doc' label is missing for 2 of 4 examples \(5, 7\)"):
        table_groups(text)
    assert table_groups(pd.DataFrame({"topic": ["x", "y"]}, index=[4, 5]))[1] == "example"
    exs = [Example("a", ("x.",), {"doc": "d1"}), Example("b", ("y.",)), Example("c", ("z.",), {"doc": ""})]
    with pytest.raises(ValueError, match=r"the 'doc' label is missing for 2 of 3 examples \('b', 'c'\)"):
        example_groups(exs)
    assert example_groups([Example("b", ("y.",))])[1] == "example"


@pytest.fixture(scope="module")
def partial_doc_caches(tmp_path_factory, bert_tokenizer):
    """Two formats of a corpus in which examples 3 and 7 have no ``doc`` label (a cache stores "" for them)."""
    from probing.models import prepare_model

    lm = prepare_model(make_tiny_bert(bert_tokenizer), bert_tokenizer, name="tiny-bert")
    examples = [Example(e.id, e.sentences, {**e.labels, **({} if i in (3, 7) else {"doc": f"d{i // 2}"})})
                for i, e in enumerate(sample_examples(12, k=2))]
    root = tmp_path_factory.mktemp("partial")
    return root, extract(examples, ["pair", "concat"], model=lm, out=root / "caches", **QUIET)


@pytest.mark.parametrize("module, args", [("analyses.drift", ["{pair}", "{concat}", "--layers", "-1"]),
                                          ("analyses.probes", ["{pair}", "--targets", "topic", "--layers", "-1"])])
def test_analyses_refuse_a_cache_with_missing_doc_labels(partial_doc_caches, module, args, capsys):
    root, (pair, concat) = partial_doc_caches
    argv = [a.format(pair=pair, concat=concat) for a in args] + ["--out", str(root / "out")]
    first = _cli(module, argv, root, capsys)
    assert f"error: {pair}: the 'doc' label is missing for 2 of 12 examples ('ex3', 'ex7')" in first


def test_intervention_clusters_refuse_missing_doc_labels(partial_doc_caches):
    from analyses.interventions import clusters

    _, (pair, _) = partial_doc_caches
    with pytest.raises(ValueError, match="the 'doc' label is missing for 2 of 12 examples"):
        clusters(Cache.open(pair), np.arange(12))


# -- 2. intervention runners check that TREATED (and CONTROL) are the intervention they say ------------------

@pytest.fixture(scope="module")
def runs(tmp_path_factory, bert_tokenizer):
    from probing.models import prepare_model

    lm = prepare_model(make_tiny_bert(bert_tokenizer), bert_tokenizer, name="tiny-bert")
    examples = [Example(e.id, e.sentences, {**e.labels, "doc": f"d{i // 2}"})
                for i, e in enumerate(sample_examples(12, k=2))]
    root = tmp_path_factory.mktemp("runs")
    out = root / "caches"

    def run(fmt, intervention=None, corpus=examples):
        (path,) = extract(corpus, [fmt], model=lm, out=out, roles="all", intervention=intervention, **QUIET)
        return path

    ko, control = Knockout("all", "sep", (1, 2)), Knockout("all", "sep", (1, 2), control=True)
    paths = {"clean": run("pair"), "concat": run("concat"), "ko": run("pair", Intervention((ko,))),
             "control": run("pair", Intervention((control,))),
             "control_l2": run("pair", Intervention((Knockout("all", "sep", (2,), control=True),))),
             "other_corpus": run("pair", Intervention((ko,)), examples[:10])}
    paths["patched"] = run("pair", Intervention(patches=(Patch("cls", 1, str(paths["clean"])),)))
    return root, paths


@pytest.mark.parametrize("args, says", [
    (["knockout", "clean", "concat"],
     ["cannot read {concat} as an intervention on {clean}: different formats ('pair' vs 'concat')",
      "the treated cache {concat} carries no intervention (a clean run of format 'concat')"]),
    (["knockout", "clean", "ko", "ko"],
     ["the control cache {ko} is not a control (knockout all->sep@1-2): a control knockout has control=1"]),
    (["knockout", "clean", "ko", "control_l2"],
     ["the control cache {control_l2} (control knockout all->sep@2) is not the control of the treated one "
      "(knockout all->sep@1-2): a control takes the same queries, keys and layers"]),
    (["knockout", "clean", "control", "ko"],
     ["the treated cache is itself a control (control knockout all->sep@1-2)",
      "the control cache {ko} is not a control"]),
    (["knockout", "ko", "ko", "control"], ["the clean cache {ko} is itself intervened (knockout all->sep@1-2)"]),
    (["knockout", "clean", "other_corpus"], ["cannot read {other_corpus} as an intervention on {clean}: different "
                                             "corpora"]),
    (["knockout", "clean", "ko", "clean"], ["the control cache {clean} carries no intervention"]),
    (["patching", "concat", "clean", "concat"], ["cannot read {concat} as an intervention on {clean}: different "
                                                 "formats ('pair' vs 'concat')"]),
    (["patching", "concat", "clean", "ko", "clean"], ["cannot read {clean} as an intervention on {clean}: the "
                                                      "treated cache {clean} carries no intervention"]),
    (["patching", "concat", "clean", "patched"], ["the treated cache patches cls@1 from format 'pair', but the "
                                                  "source cache {concat} holds format 'concat'"]),
], ids=["other-format-as-treated", "knockout-as-its-control", "control-of-other-layers", "swapped",
        "intervened-clean", "other-corpus", "clean-as-control", "patching-clean-treated", "patching-one-clean",
        "patch-from-another-format"])
def test_intervention_commands_refuse_what_is_not_the_intervention(runs, args, says, capsys):
    root, paths = runs
    argv = [str(paths.get(a, a)) for a in args] + ["--resamples", "100", "--out", str(root / "out")]
    first = _cli("analyses.interventions", argv, root, capsys)
    for text in says:
        assert text.format(**{k: str(v) for k, v in paths.items()}) in first, first


def test_one_check_accepts_the_real_thing(runs):
    _, p = runs
    c = {k: Cache.open(v) for k, v in p.items()}
    check_intervention(c["clean"], c["ko"], c["control"])  # no exception
    check_intervention(c["clean"], c["control"])  # a control alone is an intervention too
    check_intervention(c["clean"], c["patched"], source=c["clean"])
    with pytest.raises(IncomparableCaches, match="carries no intervention"):
        check_intervention(c["clean"], c["clean"])


def test_library_runners_refuse_before_writing(runs, tmp_path):
    from analyses.interventions import drift_reproduced, knockout_drift, knockout_probes

    _, p = runs
    c = {k: Cache.open(v) for k, v in p.items()}
    for call in (lambda: knockout_drift(c["clean"], c["concat"], out=tmp_path),
                 lambda: knockout_probes(c["clean"], c["ko"], c["ko"], targets=("topic",), out=tmp_path),
                 lambda: drift_reproduced(c["concat"], c["clean"], [c["ko"], c["concat"]], out=tmp_path)):
        with pytest.raises(IncomparableCaches):
            call()
    assert list(tmp_path.iterdir()) == []


# -- 3. the notebook API takes strings and tuples -------------------------------------------------------------

def _stored(cache: Cache) -> list[tuple]:
    table = cache.examples
    cols = sorted((c for c in table.columns if c.startswith("sentence_")), key=lambda c: int(c.split("_")[1]))
    return [(r["example_id"], tuple(r[c] for c in cols if r[c])) for _, r in table.iterrows()]


def test_extract_caches_takes_a_list_of_strings(tmp_path, tiny_bert):
    (c,) = probing.extract_caches(tiny_bert, ["A sentence.", "Another one here."], formats="single", layers="-1",
                                  out=tmp_path, **QUIET)
    assert _stored(c) == [("0", ("A sentence.",)), ("1", ("Another one here.",))]


@pytest.mark.parametrize("kind", [tuple, list])
def test_extract_caches_takes_tuples_or_lists_of_strings(tmp_path, tiny_bert, kind):
    pairs = [kind(("The cat sat.", "It purred.")), kind(("Dogs bark.", "Birds sing."))]
    (c,) = probing.extract_caches(tiny_bert, pairs, formats="pair", layers="-1", out=tmp_path, **QUIET)
    assert _stored(c) == [("0", ("The cat sat.", "It purred.")), ("1", ("Dogs bark.", "Birds sing."))]
    assert c.manifest["corpus"]["n_examples"] == 2


def test_extract_caches_takes_examples_as_they_are(tmp_path, tiny_bert):
    ex = [Example("first", ("One.", "Two.")), Example("second", ("Three.", "Four."))]
    (c,) = probing.extract_caches(tiny_bert, ex, formats="pair", layers="-1", out=tmp_path, **QUIET)
    assert [i for i, _ in _stored(c)] == ["first", "second"]
    assert as_examples(ex) == ex


@pytest.mark.parametrize("corpus, error, message", [
    (["One.", ("Two.", "Three.")], TypeError, "examples: the list mixes kinds (item 0 is a string, item 1 a tuple "
                                              "of strings)"),
    ([Example("a", ("One.",)), "Two."], TypeError, "examples: the list mixes kinds (item 0 is an Example, item 1 a "
                                                   "string)"),
    (["One.", "  "], ValueError, "examples: item 1 is an empty string; every sentence needs text"),
    ([("One.", "")], ValueError, "examples: item 0, sentence 2, is an empty string"),
    ([("One.", 2)], TypeError, "examples: item 0, sentence 2, is an int (2), not a string"),
    ([("One.", {"topic": "x"})], TypeError, "(for labels, build probing.Example(id, sentences, labels))"),
    ([()], ValueError, "examples: item 0 is an empty tuple; an example needs at least one sentence"),
    ([1, 2], TypeError, "examples: item 0 is an int (1); pass a list of probing.Example objects, of strings"),
    ([{"s": "One."}], TypeError, "examples: item 0 is a dict"),
    ([], ValueError, "examples: the list is empty"),
    (Example("a", ("One.",)), TypeError, "examples: got an Example; pass a list of"),
    (42, TypeError, "examples: got an int"),
], ids=["str-and-tuple", "example-and-str", "empty-string", "empty-in-tuple", "int-in-tuple", "dict-in-tuple",
        "empty-tuple", "ints", "dicts", "empty-list", "one-example", "int"])
def test_extract_caches_refuses_what_it_cannot_take(tmp_path, tiny_bert, corpus, error, message):
    with pytest.raises(error) as err:
        probing.extract_caches(tiny_bert, corpus, formats="pair", out=tmp_path / "caches", **QUIET)
    assert message in str(err.value)
    assert list(tmp_path.iterdir()) == []
