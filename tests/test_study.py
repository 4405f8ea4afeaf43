"""The study end to end in --quick mode on a tiny random model and the generated corpus."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from probing.study import CONFIG_DIR, QUESTIONS, StudyError, load_config, packaged_configs, run_study

from .conftest import make_tiny_bert

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, bert_tokenizer):
    d = tmp_path_factory.mktemp("tiny-model")
    make_tiny_bert(bert_tokenizer, max_position_embeddings=128).save_pretrained(d)
    bert_tokenizer.save_pretrained(d)
    return d


def _config(tmp_path: Path, model_dir: Path) -> Path:
    cfg = tmp_path / "study.toml"
    cfg.write_text(f"""
[study]
name = "tiny"
out = "{tmp_path / 'run'}"
caches = "{tmp_path / 'caches'}"
bootstrap_resamples = 50

[model]
name = "{model_dir}"

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

[quick]
"study.bootstrap_resamples" = 30
""")
    return cfg


@pytest.mark.slow
def test_quick_study_end_to_end_and_reuse(tmp_path, tiny_model_dir):
    cfg = _config(tmp_path, tiny_model_dir)
    logs: list[str] = []
    report = run_study(cfg, quick=True, log=logs.append)
    text = report.read_text()
    for q in QUESTIONS:
        m = re.search(rf"^## {q}\..*?(?=^## )", text, flags=re.S | re.M)
        assert m, f"section {q} missing"
        answer = re.search(r"\*\*Answer\.\*\* (.*)", m.group(0)).group(1)
        assert re.search(r"\d\.\d{3}", answer), f"{q} answer has no measured number: {answer}"
        assert "not measured" not in answer
    assert "95% CI" in text and "random-pair baseline" in text and "majority baseline" in text
    assert "## Provenance" in text and "fingerprint" in text
    figures = sorted((tmp_path / "run" / "figures").glob("*.png"))
    linked = re.findall(r"!\[[^]]*\]\(([^)]+)\)", text)
    assert len(figures) >= 8 and len(linked) == len(figures)
    import matplotlib.image as mpimg

    for png in figures:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        img = mpimg.imread(png)
        assert img.ndim == 3 and img.shape[0] > 100 and len(np.unique(img.reshape(-1, img.shape[-1]), axis=0)) > 10
        assert png.with_suffix(".pdf").read_bytes()[:4] == b"%PDF"
    html = (tmp_path / "run" / "report.html").read_text()
    assert html.count("data:image/png;base64,") == len(figures)
    # a second run extracts nothing: every cache is reused
    logs2: list[str] = []
    run_study(cfg, quick=True, log=logs2.append)
    extraction = [l for l in logs2 if "] cache: " in l or "tokens through the model" in l]
    assert extraction == [], extraction
    assert sum("cached:" in l for l in logs2) >= 10


def test_config_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[study]\nnmae = 'x'\n")
    with pytest.raises(StudyError, match="unknown key study.nmae"):
        load_config(bad)
    bad.write_text("[nonsense]\nx = 1\n")
    with pytest.raises(StudyError, match=r"unknown section \[nonsense\]"):
        load_config(bad)
    bad.write_text("[study]\nquestions = ['Q9']\n")
    with pytest.raises(StudyError, match="unknown questions"):
        load_config(bad)
    with pytest.raises(StudyError, match=r"config '.*missing\.toml' is neither a file nor a packaged config; "
                                         r"packaged: clark2019_attention, ethayarajh2019_anisotropy"):
        load_config(tmp_path / "missing.toml")
    with pytest.raises(StudyError, match="'seed_question' is neither"):
        load_config("seed_question")


def test_configs_found_by_name_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ here: the packaged ones are found by name
    assert packaged_configs() == ["clark2019_attention", "ethayarajh2019_anisotropy", "jawahar2019_probing",
                                  "reimers2019_pooling", "seed_questions"]
    by_name = load_config("seed_questions", quick=True)
    assert by_name == load_config("seed_questions.toml", quick=True)
    assert by_name == load_config(CONFIG_DIR / "seed_questions.toml", quick=True)
    assert by_name["study"]["name"] == "seed_questions" and by_name["corpus"]["pairs"].startswith("generated:")
    own = tmp_path / "seed_questions.toml"  # a file of that name in the working directory wins over the package's
    own.write_text('[study]\nname = "mine"\n')
    assert load_config("seed_questions.toml")["study"]["name"] == "mine"
    assert load_config("seed_questions")["study"]["name"] == "seed_questions"


def test_configs_are_package_data():
    """setup.cfg's package_data puts every packaged config into the wheel (a non-editable install)."""
    import configparser

    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    globs = [g.strip() for g in setup["options.package_data"]["probing"].split(",")]
    shipped = {p for g in globs for p in (REPO / "probing").glob(g)}
    assert shipped == set(CONFIG_DIR.glob("*.toml")) and len(shipped) == 5


def test_remote_code_only_with_the_command_line_flag(tmp_path):
    cfg = tmp_path / "remote.toml"
    cfg.write_text('[model]\nname = "some/model"\ntrust_remote_code = true\n')
    with pytest.raises(StudyError, match=r"remote\.toml' sets model\.trust_remote_code = true.*--trust-remote-code"):
        load_config(cfg)
    with pytest.raises(StudyError, match="--trust-remote-code"):
        load_config(None, overrides={"model.trust_remote_code": True})
    assert load_config(cfg, trust_remote_code=True)["model"]["trust_remote_code"] is True
    assert load_config(None, trust_remote_code=True)["model"]["trust_remote_code"] is True  # the flag alone
    assert load_config(None)["model"]["trust_remote_code"] is False


def test_study_command_line_passes_the_flag(tmp_path, monkeypatch):
    import probing.study as study

    seen = {}
    monkeypatch.setattr(study, "run_study", lambda config, **kw: seen.update(kw, config=config))
    cfg = tmp_path / "remote.toml"
    cfg.write_text('[model]\nname = "some/model"\ntrust_remote_code = true\n')
    assert study.main([str(cfg), "--out", str(tmp_path / "run"), "--trust-remote-code"]) == 0
    assert seen["trust_remote_code"] is True and seen["config"] == str(cfg)
    seen.clear()
    assert study.main([str(cfg), "--out", str(tmp_path / "run")]) == 2 and not seen


def test_shipped_configs_parse():
    cfg = load_config(CONFIG_DIR / "seed_questions.toml")
    quick = load_config(CONFIG_DIR / "seed_questions.toml", quick=True)
    assert cfg["study"]["questions"] == list(QUESTIONS)
    assert quick["corpus"]["pairs"] != cfg["corpus"]["pairs"] and quick["study"]["quick"]


PAPER_CONFIGS = {"clark2019": "clark2019_attention.toml", "ethayarajh2019": "ethayarajh2019_anisotropy.toml",
                 "reimers2019": "reimers2019_pooling.toml", "jawahar2019": "jawahar2019_probing.toml"}


def test_paper_configs_cite_their_paper():
    from probing.reproductions import PAPERS

    assert set(PAPER_CONFIGS) == set(PAPERS)
    for key, name in PAPER_CONFIGS.items():
        text = (CONFIG_DIR / name).read_text()
        cfg = load_config(CONFIG_DIR / name)
        assert cfg["study"]["questions"] == [key]
        assert "doi:10.18653/" in text and "2019" in text  # the citation
        assert load_config(CONFIG_DIR / name, quick=True)["study"]["quick"]


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(PAPER_CONFIGS))
def test_paper_config_runs_quick_on_a_tiny_model(key, tmp_path, tiny_model_dir):
    """Each shipped reproduction config, in its --quick form with the tiny model: a report section with
    measured numbers, a table, and valid figures; a second run reuses everything."""
    from probing.reproductions import PAPERS

    over = {"model.name": str(tiny_model_dir), "study.out": str(tmp_path / "run"),
            "study.caches": str(tmp_path / "caches"), "probes.max_iter": 100}
    report = run_study(CONFIG_DIR / PAPER_CONFIGS[key], quick=True, overrides=over, log=lambda *a: None)
    text = report.read_text()
    section = text.split(f"## {PAPERS[key].title}", 1)[1].split("## Provenance", 1)[0]
    answer = re.search(r"\*\*Answer\.\*\* (.*)", section).group(1)
    assert re.search(r"\d\.\d{3}", answer) and "not measured" not in answer, answer
    assert "95% CI" in answer
    assert "| layer |" in section or "| pooling |" in section  # the section's table
    figures = sorted((tmp_path / "run" / "figures").glob("*.png"))
    assert figures and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in figures)
    assert all(f"figures/{p.name}" in section for p in figures)
    logs: list[str] = []
    run_study(CONFIG_DIR / PAPER_CONFIGS[key], quick=True, overrides=over, log=logs.append)
    assert not [l for l in logs if "tokens through the model" in l]
    assert "reused from earlier runs" in (tmp_path / "run" / "report.md").read_text()
