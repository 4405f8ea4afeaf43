"""The tables a study writes and the HTML report it renders, checked on one --quick study of a tiny model:
every column is defined in docs/TABLES.md with its type, no cell holds a stringified structure, whole
numbers are integers, each table is written once under its name (the result store lives apart and is
reused), and the HTML report reads well (no index column, no literal backticks, captions, figure widths)."""

from __future__ import annotations

import re
from html import escape as html_escape
from pathlib import Path

import pandas as pd
import pytest

from probing.study.report import _html_table, _inline, figure_info

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "TABLES.md"
TYPES = {"int", "float", "str", "bool"}


def parse_tables_doc(text: str) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """docs/TABLES.md -> ``({section: {column: type}}, {table file name: section})``. A section is a
    ``## `kind` `` heading; its ``Files:`` line names the tables of that kind; its column rows are
    ``| `column` | type | meaning | unit |``. The section ``standard columns`` applies to every table."""
    sections: dict[str, dict[str, str]] = {}
    files: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"^## `([^`]+)`", line)
        if m:
            current = m.group(1)
            sections[current] = {}
            continue
        if current is None:
            continue
        if line.startswith("Files:"):
            for name in re.findall(r"`([^`]+)`", line):
                files[name] = current
        m = re.match(r"^\| `([^`]+)` \| (\w+) \|", line)
        if m:
            sections[current][m.group(1)] = m.group(2)
    return sections, files


@pytest.fixture(scope="session")
def study(quick_study):
    """The session's --quick study of a tiny random model (tests/conftest.py ``quick_study``): run twice (the
    second reuses every stored result), then Q2 alone with ``force_analyses``."""
    return quick_study


@pytest.fixture(scope="session")
def tables(study) -> dict[str, pd.DataFrame]:
    """The named tables of the first run as :func:`analyses.results.read_table` reads them (Parquet), from
    the bytes kept before the forced Q2-only run rewrote tables/ with fewer."""
    import io

    names = sorted({Path(n).stem for n in study["named"] if n.endswith(".csv")})
    return {n: pd.read_parquet(io.BytesIO(study["named"][f"{n}.parquet"])) for n in names}


def _csv(study, name: str) -> pd.DataFrame:
    import io

    return pd.read_csv(io.BytesIO(study["named"][f"{name}.csv"]), dtype=str, keep_default_na=False)


# ---------------------------------------------------------------------------------------------------
# One copy of each table; the result store is reused, and recomputed with --force


@pytest.mark.slow
def test_tables_dir_holds_each_named_table_once(study):
    names = sorted(study["named"])
    assert names, "the study wrote no tables"
    stems = {Path(n).stem for n in names}
    assert not [n for n in names if re.search(r"-[0-9a-f]{16}", n)], names  # no hash-named copies
    assert all(f"{s}.csv" in names and f"{s}.parquet" in names for s in stems), names
    assert {"q1_change", "q1_decisions", "finetune_predictions", "q8_pooling"} <= stems
    # the runners' store: hash-named results, apart from tables/
    assert any(re.fullmatch(r"[a-z_]+-[0-9a-f]{16}\.csv", n) for n in study["first"]), sorted(study["first"])


@pytest.mark.slow
def test_second_run_reuses_the_store_and_force_recomputes(study):
    assert study["second"] == study["first"]  # nothing in the store was rewritten
    assert not study["stale_left"]  # a hash-named file an older version left in tables/ is removed
    results = lambda named: {k: v for k, v in named.items() if not k.startswith("stages.")}  # noqa: E731
    # the named result tables came out identical (stages.* records each run's own times)
    assert results(study["named_again"]) == results(study["named"])
    recomputed = [n for n, t in study["forced"].items() if t != study["first"].get(n)]
    # Q2 alone, forced: its interchange, decoding and attention tables again (the store was emptied first)
    assert {n.split("-")[0] for n in recomputed} >= {"representation_change", "format_probes", "paired_attention"}
    assert set(study["forced"]) < set(study["first"]) | set(recomputed)
    assert not [n for n in study["forced"] if n.startswith("finetune_pooling-")]


# ---------------------------------------------------------------------------------------------------
# Every column documented, typed, tidy


def _doc():
    return parse_tables_doc(DOC.read_text(encoding="utf-8"))


def test_tables_doc_parses_and_declares_known_types():
    sections, files = _doc()
    assert "standard columns" in sections and len(sections) > 8
    assert set(files.values()) <= set(sections)
    bad = {(s, c, t) for s, cols in sections.items() for c, t in cols.items() if t not in TYPES}
    assert not bad, bad
    # the doc's standard integers are the ones the writer makes integers
    from analyses.results import INTEGER_COLUMNS, RESULT_COLUMNS
    from probing.study.across import COUNT_COLUMNS  # the comparison of models writes its counts as integers itself

    assert set(RESULT_COLUMNS) <= set(sections["standard columns"])
    declared_int = {c for cols in sections.values() for c, t in cols.items() if t == "int"}
    assert declared_int <= INTEGER_COLUMNS | COUNT_COLUMNS, declared_int - INTEGER_COLUMNS - COUNT_COLUMNS


@pytest.mark.slow
def test_every_column_of_every_table_is_documented(tables):
    sections, files = _doc()
    missing = {n for n in tables if n not in files}
    assert not missing, f"tables without a section in docs/TABLES.md: {sorted(missing)}"
    undocumented = {n: [c for c in df.columns if c not in sections[files[n]] and c not in sections["standard columns"]]
                    for n, df in tables.items()}
    undocumented = {n: c for n, c in undocumented.items() if c}
    assert not undocumented, undocumented


#: A stringified structure in a cell: a tuple or list repr, a dict repr, or a semicolon-joined list.
STRUCTURE = re.compile(r"^\(.*,.*\)$|^\[.*,.*\]$|^\{.*:.*\}$|[^\s;]+;[^\s;]+")


def test_structure_pattern_is_precise():
    for s in ("(0, 'cls')", "[1, 2]", "0.1;0.1;0.1", "{'a': 1}", "knockout all->sep@3;4"):
        assert STRUCTURE.search(s), s
    for s in ("[CLS]", "[SEP]#1", "s1 words", "cls − mean", "generated:n=120,k=2", "role=cls", "(quick)",
              "0/0 and undefined; returning nan", "all layers (Holm over layers)"):
        assert not STRUCTURE.search(s), s


@pytest.mark.slow
def test_no_cell_holds_a_stringified_structure(tables):
    found = {}
    for name, df in tables.items():
        for col in df.columns:
            if pd.api.types.is_numeric_dtype(df[col]) or pd.api.types.is_bool_dtype(df[col]):
                continue
            hits = sorted({str(v) for v in df[col].dropna() if STRUCTURE.search(str(v))})
            if hits:
                found[f"{name}.{col}"] = hits[:3]
    assert not found, f"stringified structures in {sorted(found)}: {found}"


#: What ``role`` holds in every table: a stored token role or a group of them (docs/TABLES.md), never a
#: token choice (``mean``, ``max``, ``sep1`` as a choice), a pooling or a difference of two.
ROLE = re.compile(r"cls|sep|word|words|all|sep\d+|s\d+ (inner |edge )?words|inner words|cls and inner words"
                  r"|\[CLS\]|\[SEP\](#\d+)?|all tokens")


@pytest.mark.slow
def test_role_means_a_token_role_in_every_table(tables):
    other = {name: sorted({str(v) for v in df["role"].dropna() if not ROLE.fullmatch(str(v))})[:5]
             for name, df in tables.items() if "role" in df.columns}
    other = {n: v for n, v in other.items() if v}
    assert not other, f"role holds something else than a token role in {sorted(other)}: {other}"


@pytest.mark.slow
def test_integer_columns_are_integers(study, tables):
    sections, files = _doc()
    wrong = {}
    for name, df in tables.items():
        declared = {**sections["standard columns"], **sections[files[name]]}
        text = _csv(study, name)
        for col in df.columns:
            if declared.get(col) != "int":
                continue
            cells = [c for c in text[col] if c != ""]
            if not pd.api.types.is_integer_dtype(df[col]) or not all(re.fullmatch(r"-?\d+", c) for c in cells):
                wrong[f"{name}.{col}"] = (str(df[col].dtype), cells[:3])
    assert not wrong, wrong


@pytest.mark.slow
def test_every_interval_used_the_configs_resamples(study, tables):
    """The config's ``bootstrap_resamples`` reaches every interval of every table: each row with a bootstrap
    interval records it in ``n_resamples`` (probes, Q8's fine-tuning and paired tables once used their own
    1,000 or 2,000); a t-interval over folds (``ci_method = t_folds``) records none."""
    from probing.study.runner import load_config

    wanted = load_config(study["out"].parent / "study.toml", quick=True).study.bootstrap_resamples
    assert wanted == 100  # the fixture's [quick] value, not its full one (200) nor the default (1,000)
    with_ci = {n: df for n, df in tables.items() if "ci_low" in df.columns and df["ci_low"].notna().any()}
    assert {"q1_change", "q1_finetune", "q2_interchange", "q2_attention", "q3_intruder", "q4_coherence_paired",
            "q4_knockout", "q6_position", "q7_recovery", "q8_pooling", "sentence_content", "interchange",
            *(f"q{i}_decisions" for i in range(1, 9))} <= set(with_ci)
    wrong = {}
    for name, df in with_ci.items():
        assert "n_resamples" in df.columns, f"{name} has intervals but no n_resamples column"
        t_folds = (df["ci_method"] if "ci_method" in df.columns else pd.Series(pd.NA, index=df.index)).eq("t_folds")
        t_folds = t_folds.fillna(False).astype(bool)
        boot = df["ci_low"].notna() & ~t_folds
        counts = set(df.loc[boot, "n_resamples"].astype("Int64").astype(object))
        if counts != {wanted}:
            wrong[name] = counts
        if df.loc[t_folds, "n_resamples"].notna().any():
            wrong[f"{name} (t_folds rows)"] = set(df.loc[t_folds, "n_resamples"].dropna())
    assert not wrong, f"intervals from another count than the config's {wanted}: {wrong}"


@pytest.mark.slow
def test_no_table_has_an_index_column(study, tables):
    for name in tables:
        header = _csv(study, name).columns
        assert not [c for c in header if c == "" or c.startswith("Unnamed")], (name, list(header))
        assert list(tables[name].columns) == list(header)


# ---------------------------------------------------------------------------------------------------
# The HTML report


def _text(html: str) -> str:
    """The report's visible text: data URIs and tags removed."""
    return re.sub(r"<[^>]+>", " ", re.sub(r'src="data:[^"]*"', "", html))


@pytest.mark.slow
def test_html_report_tables_captions_and_figures(study):
    html = study["html"]
    assert "<table" in html and "<figure>" in html
    assert not re.search(r"<th>\s*</th>", html), "an empty header cell (an index column)"
    assert "`" not in _text(html) and "<code>" in html
    figures = {p.stem: p for p in (study["out"] / "figures").glob("*.png")}
    captions = re.findall(r"<figcaption>(.*?)</figcaption>", html, flags=re.S)
    assert len(captions) == len(figures) > 0
    for c in captions:
        plain = re.sub(r"<[^>]+>", "", c).strip()
        assert plain and plain not in figures and not plain.endswith((".png", ".pdf")), c
    titles = {figure_info(p)[0] for p in figures.values()}
    assert "" not in titles  # every figure the study draws has a title, and that title is its caption
    assert {re.sub(r"<[^>]+>", "", c).strip() for c in captions} == {html_escape(t, quote=False) for t in titles}
    imgs = re.findall(r"<img ([^>]*)>", html)
    assert len(imgs) == len(figures)
    natural = sorted(figure_info(p)[1] for p in figures.values())
    widths = sorted(int(re.search(r'width="(\d+)"', a).group(1)) for a in imgs)
    assert widths == natural and min(widths) > 400  # each at its natural width, not a forced small one
    assert not [a for a in imgs if re.search(r"style=", a)]
    style = re.search(r"<style>(.*?)</style>", html, flags=re.S).group(1)
    assert re.search(r"img\{max-width:100%", style)
    assert not re.search(r"img\{[^}]*[^-]width:\s*\d", style)  # no fixed width in the stylesheet either


def test_inline_code_and_tables_without_index():
    assert _inline("the `concat` format & <b>") == "the <code>concat</code> format &amp; &lt;b&gt;"
    assert _inline("one ` alone") == "one ` alone"
    pivot = pd.DataFrame({"layer": [1, 1, 2], "role": ["a", "b", "a"], "value": [0.1, 0.2, 0.3]}).pivot_table(
        index="layer", columns="role", values="value")
    out = _html_table(pivot)
    assert re.findall(r"<th>(.*?)</th>", out) == ["layer", "a", "b"]
    assert "<th></th>" not in out and out.count("<tr") == 3
    flat = _html_table(pivot.reset_index())
    assert re.findall(r"<th>(.*?)</th>", flat) == ["layer", "a", "b"]


def test_figure_info_reads_title_and_natural_width(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from figures.style import DPI, save

    fig, axes = plt.subplots(2, 2, figsize=(8, 6))
    fig.suptitle("Drift of the same  tokens\nmodel-x, corpus-y")
    png = save(fig, tmp_path / "f")[0]
    title, width = figure_info(png)
    assert title == "Drift of the same tokens — model-x, corpus-y"
    assert width == 8 * 96 and DPI > 96  # 8 inches at 96 CSS px per inch, whatever the PNG's dpi
    fig, ax = plt.subplots()
    ax.set_title("one panel")
    assert figure_info(save(fig, tmp_path / "g")[0])[0] == "one panel"
