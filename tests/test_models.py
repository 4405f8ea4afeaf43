"""Model loading: the packaged default offline, errors that name the default, random init, fingerprints."""

import numpy as np
import pytest
import torch

from probing.cache import Cache
from probing.extract import extract
from probing.models import DEFAULT_MODEL, ModelLoadError, load_model, model_fingerprint, prepare_model

from .conftest import make_tiny_bert, sample_examples


@pytest.fixture(scope="module")
def minilm():
    return load_model(None)


@pytest.mark.pretrained
def test_default_model_loads_offline(minilm):
    assert minilm.name == DEFAULT_MODEL
    assert (minilm.n_layers, minilm.hidden_size, minilm.type_vocab_size, minilm.max_length) == (6, 384, 2, 512)
    assert minilm.tokenizer.cls_token == "[CLS]" and minilm.tokenizer.is_fast
    assert len(minilm.fingerprint) == 64
    assert minilm.fingerprint == load_model("all-MiniLM-L6-v2").fingerprint  # alias, same weights


@pytest.mark.pretrained
def test_default_model_states_equal_hidden_states(tmp_path, minilm):
    # a literal "[SEP]" in the text is split as text by the extractor but not by the plain tokenizer call
    examples = [e for e in sample_examples(12, k=2) if "[SEP]" not in " ".join(e.sentences)][:6]
    assert len(examples) == 6
    (p,) = extract(examples, ["pair"], model=minilm, out=tmp_path, roles="all", progress=False, log=lambda *a: None)
    c = Cache.open(p)
    tok = c.tokens
    for e, ex in enumerate(examples):
        enc = minilm.tokenizer(ex.sentences[0], ex.sentences[1], return_tensors="pt")
        with torch.no_grad():
            hs = minilm.model(**enc, output_hidden_states=True).hidden_states
        rows = tok.index[tok["example"] == e]
        assert tok.loc[rows, "token_id"].tolist() == enc["input_ids"][0].tolist()
        for layer in (0, 3, 6):
            np.testing.assert_allclose(c.states(layer, rows), hs[layer][0].numpy(), atol=1e-5, rtol=0)


@pytest.mark.pretrained
def test_random_init_is_seeded_and_differs_from_trained(minilm):
    a = load_model(None, random_init=True, seed=0)
    b = load_model(None, random_init=True, seed=0)
    c = load_model(None, random_init=True, seed=1)
    assert a.fingerprint == b.fingerprint != c.fingerprint
    assert a.fingerprint != minilm.fingerprint
    assert a.random_init and a.describe()["random_init"] is True


def test_unloadable_model_names_the_default(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match=r"(?s)could not load model 'no-such-org/no-such-model'.*all-MiniLM-L6-v2"):
        load_model("no-such-org/no-such-model")
    with pytest.raises(ModelLoadError, match="all-MiniLM-L6-v2"):
        load_model(str(tmp_path / "missing-dir"))


def test_fingerprint_tracks_weights_not_precision(bert_tokenizer):
    m1 = make_tiny_bert(bert_tokenizer, seed=0)
    m2 = make_tiny_bert(bert_tokenizer, seed=0)
    assert model_fingerprint(m1) == model_fingerprint(m2)
    with torch.no_grad():
        m2.encoder.layer[0].output.dense.bias[0] += 1e-3
    assert model_fingerprint(m1) != model_fingerprint(m2)
    a = prepare_model(make_tiny_bert(bert_tokenizer, seed=0), bert_tokenizer, name="t", dtype="bfloat16")
    assert a.fingerprint == model_fingerprint(m1)
    assert next(a.model.parameters()).dtype == torch.bfloat16


def test_remote_code_is_off_by_default(monkeypatch):
    seen = {}
    import transformers

    def fake(path, **kw):
        seen.update(kw)
        raise OSError("stop here")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake)
    with pytest.raises(ModelLoadError):
        load_model("some/model")
    assert seen.get("trust_remote_code") is False


def test_slow_tokenizer_is_rejected(bert_tokenizer):
    from transformers import BertTokenizer

    class Slow:
        is_fast = False

    with pytest.raises(ModelLoadError, match="fast tokenizer"):
        prepare_model(make_tiny_bert(bert_tokenizer), Slow(), name="x")
