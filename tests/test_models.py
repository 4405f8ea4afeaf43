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

    class Slow:
        is_fast = False

    with pytest.raises(ModelLoadError, match="fast tokenizer"):
        prepare_model(make_tiny_bert(bert_tokenizer), Slow(), name="x")


def test_model_dir_without_tokenizer_is_refused(tmp_path, bert_tokenizer):
    """transformers would build an empty-vocabulary tokenizer from config.json: every word [UNK]."""
    make_tiny_bert(bert_tokenizer).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match=rf"model directory '{tmp_path}' has no tokenizer files \(none of "
                                             r"tokenizer\.json, vocab\.txt"):
        load_model(str(tmp_path))
    with pytest.raises(ModelLoadError, match="has no tokenizer files"):
        load_model(str(tmp_path), random_init=True)  # random weights still need the words
    bert_tokenizer.save_pretrained(tmp_path)
    assert load_model(str(tmp_path)).tokenizer.tokenize("the committee") == ["the", "committee"]


def test_tokenizer_that_maps_text_to_unk_is_refused(bert_tokenizer):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from probing.models import check_tokenizer

    check_tokenizer(bert_tokenizer, "minilm")  # the real vocabulary: passes
    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "[PAD]": 3, "the": 4, "a": 5}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]")
    with pytest.raises(ModelLoadError, match=r"tokenizer of model 'six-words' maps 8\d% of ordinary English text "
                                             r"to its unknown token '\[UNK\]' \(vocabulary of 6 tokens\)"):
        check_tokenizer(fast, "six-words")


def test_pickled_weights_are_never_loaded(tmp_path, bert_tokenizer):
    from safetensors.torch import load_file

    make_tiny_bert(bert_tokenizer).save_pretrained(tmp_path)
    bert_tokenizer.save_pretrained(tmp_path)
    torch.save(load_file(tmp_path / "model.safetensors"), tmp_path / "pytorch_model.bin")
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"holds pickled weights \(pytorch_model\.bin\) and no \.safetensors"):
        load_model(str(tmp_path))
    assert load_model(str(tmp_path), random_init=True).random_init  # random init reads no weights


def test_pick_device_refuses_a_device_that_is_not_there(monkeypatch):
    from probing.models import pick_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert pick_device("auto") == torch.device("cpu") and pick_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"--device 'cuda': CUDA is not available here"):
        pick_device("cuda")
    with pytest.raises(ValueError, match=r"--device 'gpu' is not a device torch knows"):
        pick_device("gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match=r"--device 'cuda:2': this machine has 2 CUDA device\(s\), cuda:0\.\.cuda:1"):
        pick_device("cuda:2")
    assert pick_device("cuda:1") == torch.device("cuda:1")
