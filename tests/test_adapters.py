"""One adapter per encoder family (probing.adapters), on tiny random models built from each family's
transformers config: extraction equals the model's own hidden states, knocking out nothing is the
identity, a one-key knockout equals a forward with that key masked, a knockout at one layer touches that
layer only (ALBERT's shared block included), ablations replace the state the model records, and
norm-based attention equals a per-head loop written out here. A family without an adapter still
extracts and is refused for interventions, naming the adapter to add."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from probing.adapters import REGISTRY, AdapterError, adapter_for, find_adapter, position_offset
from probing.cache import Cache
from probing.extract import extract, main
from probing.formats import Format, render, special_token_ids, tokenize_sentences
from probing.interventions import Ablate, Intervention, InterventionError, Knockout
from probing.models import prepare_model

from .conftest import sample_examples

QUIET = dict(progress=False, log=lambda *a: None)
FAMILIES = ("bert", "roberta", "distilbert", "albert", "electra", "mpnet", "deberta-v2", "modernbert")
#: Families whose attention transformers also runs through SDPA (the others are eager only).
SDPA = {"bert", "roberta", "distilbert", "albert", "electra", "modernbert"}
#: The length limit of each tiny model: 64 positions less the family's offset (the tokenizers allow more;
#: the RoBERTa test tokenizer's model_max_length is 62).
MAX_LENGTH = {"bert": 64, "roberta": 62, "distilbert": 64, "albert": 64, "electra": 64, "mpnet": 62,
              "deberta-v2": 64, "modernbert": 64}


def _config(family: str, tok):
    import transformers as tf

    common = dict(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=64)
    if family == "bert":
        return tf.BertConfig(**common)
    if family == "roberta":
        return tf.RobertaConfig(**common, type_vocab_size=1, pad_token_id=tok.pad_token_id)
    if family == "distilbert":
        return tf.DistilBertConfig(vocab_size=len(tok), dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                   max_position_embeddings=64)
    if family == "albert":  # one shared block runs both layers
        return tf.AlbertConfig(**common, embedding_size=16)
    if family == "electra":  # embeddings smaller than the hidden size: embeddings_project gives state 0
        return tf.ElectraConfig(**common, embedding_size=16)
    if family == "mpnet":
        return tf.MPNetConfig(**common)
    if family == "deberta-v2":  # DeBERTa-v3's settings: relative positions only, both disentangled terms
        return tf.DebertaV2Config(**common, relative_attention=True, pos_att_type=["p2c", "c2p"],
                                  position_biased_input=False, position_buckets=16, norm_rel_ebd="layer_norm",
                                  share_att_key=True, type_vocab_size=0, pad_token_id=tok.pad_token_id)
    if family == "modernbert":  # layer 1 global, layer 2 a local window of 8 tokens (the examples are longer)
        return tf.ModernBertConfig(**common, local_attention=8, global_attn_every_n_layers=2,
                                   pad_token_id=tok.pad_token_id, cls_token_id=tok.cls_token_id,
                                   sep_token_id=tok.sep_token_id, bos_token_id=tok.cls_token_id,
                                   eos_token_id=tok.sep_token_id)
    if family == "mobilebert":  # a family with no adapter
        return tf.MobileBertConfig(**common, embedding_size=16, intra_bottleneck_size=16, true_hidden_size=16,
                                   num_feedforward_networks=1)
    raise KeyError(family)


def _tiny(family: str, tok, seed: int = 0):
    from transformers import AutoModel

    torch.manual_seed(seed)
    return prepare_model(AutoModel.from_config(_config(family, tok)).eval(), tok, name=f"tiny-{family}")


@pytest.fixture(params=FAMILIES)
def lm(request, bert_tokenizer, roberta_tokenizer):
    return _tiny(request.param, roberta_tokenizer if request.param == "roberta" else bert_tokenizer)


@pytest.fixture()
def examples():
    return sample_examples(8)


def _run(examples, lm, out, intervention=None, **kw):
    (path,) = extract(examples, ["pair"], model=lm, out=out, roles="all", intervention=intervention,
                      batch_tokens=100, **QUIET, **kw)  # several padded batches
    return Cache.open(path)


def _rendered(lm, example):
    fmt = Format.parse("pair")
    return render(fmt, example, tokenize_sentences(lm.tokenizer, list(example.sentences)),
                  special_token_ids(lm.tokenizer, fmt))


def _forward(lm, r, mask=None, **kw):
    """The model's own output for one example alone; ``mask``: its 2-D attention mask (default: all ones)."""
    inputs = {"input_ids": torch.from_numpy(r.input_ids)[None],
              "attention_mask": torch.ones(1, len(r), dtype=torch.long) if mask is None else mask[None]}
    if "token_type_ids" in inspect.signature(lm.model.forward).parameters:
        inputs["token_type_ids"] = torch.zeros_like(inputs["input_ids"])  # pair's <1> is zeroed: no segments
        if lm.type_vocab_size > 1:
            inputs["token_type_ids"] = torch.from_numpy(r.token_type_ids)[None]
    with torch.no_grad():
        return lm.model(**inputs, output_hidden_states=True, **kw)


def _states_of(cache: Cache, example: int) -> np.ndarray:
    """(T, n_layers + 1, hidden): the example's stored states in position order."""
    rows = cache.rows(example=example)
    order = np.argsort(cache.tokens["position"].to_numpy()[rows])
    return cache.states(None, rows[order])


# -- the registry ----------------------------------------------------------------------------------------

def test_every_family_has_its_adapter_and_its_facts(lm):
    kind = lm.model.config.model_type
    adapter = adapter_for(lm.model)
    assert REGISTRY[kind] is adapter and kind in adapter.model_types
    assert adapter.token_types == ("token_type_ids" in inspect.signature(lm.model.forward).parameters)
    assert lm.max_length == MAX_LENGTH[kind]
    assert len(adapter.attention_sites(lm.model)) == len(adapter.value_sites(lm.model)) == lm.n_layers
    assert len(adapter.state_sites(lm.model)) == lm.n_layers + 1


def test_the_registry_covers_the_families_asked_for():
    assert set(REGISTRY) == {"bert", "roberta", "xlm-roberta", "camembert", "distilbert", "albert", "electra",
                             "mpnet", "deberta-v2", "modernbert"}
    assert REGISTRY["xlm-roberta"] is REGISTRY["camembert"] is REGISTRY["roberta"]


def test_position_offsets_set_the_length_limit(bert_tokenizer):
    import transformers as tf

    from probing.models import max_sequence_length

    class NoLimit:  # a tokenizer that sets no model_max_length: the position table decides
        model_max_length = None

    for config, offset in [(tf.RobertaConfig(pad_token_id=1), 2), (tf.XLMRobertaConfig(pad_token_id=1), 2),
                           (tf.CamembertConfig(pad_token_id=1), 2), (tf.MPNetConfig(), 2), (tf.BertConfig(), 0),
                           (tf.ModernBertConfig(), 0), (tf.MobileBertConfig(), 0)]:
        assert position_offset(config) == offset
        assert max_sequence_length(config, NoLimit()) == config.max_position_embeddings - offset
        assert max_sequence_length(config, bert_tokenizer) == min(config.max_position_embeddings - offset,
                                                                  bert_tokenizer.model_max_length)


def test_an_albert_with_several_blocks_per_layer_is_refused(bert_tokenizer):
    from transformers import AlbertConfig, AlbertModel

    model = AlbertModel(AlbertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, embedding_size=16, inner_group_num=2))
    with pytest.raises(AdapterError, match="the albert adapter needs inner_group_num = 1"):
        adapter_for(model).blocks(model)


# -- extraction ------------------------------------------------------------------------------------------

def test_extraction_equals_the_models_own_hidden_states(tmp_path, lm, examples):
    cache = _run(examples, lm, tmp_path)
    for e, ex in enumerate(examples):
        want = torch.stack(_forward(lm, _rendered(lm, ex)).hidden_states, 2)[0].numpy()
        np.testing.assert_allclose(_states_of(cache, e), want, atol=1e-5, rtol=0)


# -- knockout --------------------------------------------------------------------------------------------

def test_knocking_out_nothing_is_the_identity(tmp_path, lm, examples):
    clean = _run(examples, lm, tmp_path)
    nothing = _run(examples, lm, tmp_path, Intervention((Knockout("all", "sep3", (1, 2)),)))  # pair has no sep3
    assert nothing.path != clean.path
    assert (clean.path / "shards" / "00000.npy").read_bytes() == (nothing.path / "shards" / "00000.npy").read_bytes()


@pytest.mark.parametrize("impl", ["default", "eager"])
def test_a_one_key_knockout_equals_a_literal_masked_forward(tmp_path, lm, examples, impl):
    """No query may attend to [CLS] (position 0) at any layer: every other position is what the model gives
    with [CLS] masked out of its attention mask (whose [CLS] row differs: the knockout keeps the diagonal)."""
    if impl == "eager":
        lm.model.set_attn_implementation("eager")
    kind = lm.model.config.model_type
    if impl == "default" and kind in SDPA:
        assert lm.model.config._attn_implementation == "sdpa"
    cache = _run(examples, lm, tmp_path, Intervention((Knockout("all", "cls", (1, 2)),)))
    clean = _run(examples, lm, tmp_path)
    for e, ex in enumerate(examples):
        r = _rendered(lm, ex)
        mask = torch.ones(len(r), dtype=torch.long)
        mask[0] = 0
        want = torch.stack(_forward(lm, r, mask).hidden_states, 2)[0].numpy()
        got = _states_of(cache, e)
        np.testing.assert_allclose(got[1:], want[1:], atol=2e-5, rtol=0)
        assert np.abs(got[1:, 1:] - _states_of(clean, e)[1:, 1:]).max() > 1e-3  # the knockout did something


def test_a_knockout_at_one_layer_leaves_the_other(tmp_path, lm, examples):
    """Words may not attend to [CLS] at layer 2: their attention to it is 0 there and not at layer 1 (for
    ALBERT, whose one block runs both layers, the hook counts the block's calls)."""
    (path,) = extract(examples, ["pair"], model=lm, out=tmp_path, attention=True, batch_tokens=100,
                      intervention=Intervention((Knockout("word", "cls", (2,)),)), **QUIET)
    _, mass, groups = Cache.open(path).attention()
    words, cls = [groups.index(g) for g in ("s1", "s2")], groups.index("cls0")
    assert np.abs(mass[:, 1][:, :, words][:, :, :, cls]).max() < 1e-6
    assert mass[:, 0][:, :, words][:, :, :, cls].mean() > 1e-3
    np.testing.assert_allclose(np.nansum(mass[:, 1][:, :, words], axis=-1), 1.0, atol=1e-5)


def test_a_knockout_is_refused_under_a_kernel_without_a_mask_matrix(tmp_path, bert_tokenizer, examples):
    lm = _tiny("bert", bert_tokenizer)
    lm.model.set_attn_implementation("flex_attention")
    with pytest.raises(InterventionError, match="the 'flex_attention' attention kernel does not take"):
        _run(examples, lm, tmp_path, Intervention((Knockout("all", "cls", (1,)),)))
    assert not tmp_path.joinpath("pair").exists() and list(tmp_path.iterdir()) == []


# -- ablation and patching -------------------------------------------------------------------------------

def test_ablation_replaces_the_state_the_model_records(tmp_path, lm, examples):
    """Hidden state 0 (ALBERT's and ELECTRA's projected embeddings), 1 (after DeBERTa's convolution, where
    there is one) and the last (ModernBERT's final norm): the stored state is the ablated one, the layers
    below are untouched and the layers above ran on it."""
    clean = _run(examples, lm, tmp_path)
    seps = clean.rows(role="sep")
    for layer in range(lm.n_layers + 1):
        cache = _run(examples, lm, tmp_path, Intervention(ablations=(Ablate("sep", layer),)))
        assert not cache.states(layer, seps).any()
        for below in range(layer):
            np.testing.assert_array_equal(cache.states(below), clean.states(below))
        if layer < lm.n_layers:  # the layer above ran on the zeros (and was not itself replaced)
            above = cache.states(layer + 1, seps)
            assert (np.abs(above - clean.states(layer + 1, seps)).max(1) > 1e-4).all()
            assert (np.abs(above).max(1) > 1e-4).all()
    last = lm.n_layers  # a value that no norm maps to itself: the corpus mean
    mean = _run(examples, lm, tmp_path, Intervention(ablations=(Ablate("sep", last, "mean", str(clean.path)),)))
    want = clean.states(last, seps).astype(np.float64).mean(0)
    np.testing.assert_allclose(mean.states(last, seps), np.tile(want, (len(seps), 1)), atol=1e-6)


def test_a_deberta_convolution_gives_state_1(tmp_path, bert_tokenizer, examples):
    """DeBERTa-v2 with a convolution after its first block records the convolution's output as state 1:
    a patch there is what the cache stores."""
    from transformers import DebertaV2Model

    config = _config("deberta-v2", bert_tokenizer)
    config.conv_kernel_size = 3
    torch.manual_seed(0)
    lm = prepare_model(DebertaV2Model(config).eval(), bert_tokenizer, name="tiny-deberta-conv")
    assert lm.model.encoder.conv is not None
    clean = _run(examples, lm, tmp_path)
    seps = clean.rows(role="sep")
    mean = _run(examples, lm, tmp_path, Intervention(ablations=(Ablate("sep", 1, "mean", str(clean.path)),)))
    want = clean.states(1, seps).astype(np.float64).mean(0)
    np.testing.assert_allclose(mean.states(1, seps), np.tile(want, (len(seps), 1)), atol=1e-6)
    np.testing.assert_array_equal(mean.states(0), clean.states(0))


# -- norm-based attention --------------------------------------------------------------------------------

def _value_and_output(model, layer: int):
    """(x, W_v, b_v, W_o) of ``layer`` (1-based), written out per family: the value projection's input
    ``x`` from the layer's input state, its weight and bias, and the output projection's weight."""
    kind = model.config.model_type
    d = lambda t: t.detach().double()  # noqa: E731
    if kind in ("bert", "roberta", "electra", "deberta-v2"):
        block = model.encoder.layer[layer - 1]
        v = block.attention.self.value_proj if kind == "deberta-v2" else block.attention.self.value
        return (lambda h: h), d(v.weight), d(v.bias), d(block.attention.output.dense.weight)
    if kind == "distilbert":
        att = model.transformer.layer[layer - 1].attention
        return (lambda h: h), d(att.v_lin.weight), d(att.v_lin.bias), d(att.out_lin.weight)
    if kind == "albert":
        att = model.encoder.albert_layer_groups[0].albert_layers[0].attention  # the shared block
        return (lambda h: h), d(att.value.weight), d(att.value.bias), d(att.dense.weight)
    if kind == "mpnet":
        att = model.encoder.layer[layer - 1].attention.attn
        return (lambda h: h), d(att.v.weight), d(att.v.bias), d(att.o.weight)
    if kind == "modernbert":
        block = model.layers[layer - 1]
        H = model.config.hidden_size
        w = d(block.attn.Wqkv.weight)[2 * H:]  # rows: queries, keys, values
        b = d(block.attn.Wqkv.bias)[2 * H:] if block.attn.Wqkv.bias is not None else torch.zeros(H).double()
        return (lambda h: d(block.attn_norm(h.float()))), w, b, d(block.attn.Wo.weight)
    raise KeyError(kind)


def test_norm_based_attention_equals_a_per_head_loop(tmp_path, lm, examples):
    (path,) = extract(examples, ["pair"], model=lm, out=tmp_path, roles="all", attention_norm=True,
                      batch_tokens=100, **QUIET)
    cache = Cache.open(path)
    ex, norm, groups = cache.attention("norm")
    _, raw, _ = cache.attention("raw")
    model = lm.model
    model.set_attn_implementation("eager")  # the reference reads the weights
    heads = model.config.num_attention_heads
    e = 3
    r = _rendered(lm, examples[e])
    o = _forward(lm, r, output_attentions=True)
    gid = [f"s{s}" if role == "word" else f"{role}{oc}" for role, s, oc in zip(r.role, r.sentence, r.occurrence)]
    for layer in range(1, lm.n_layers + 1):
        x_of, W_v, b_v, W_o = _value_and_output(model, layer)
        x = x_of(o.hidden_states[layer - 1][0]).double()
        dh = W_v.shape[0] // heads
        for h in range(heads):
            sl = slice(h * dh, (h + 1) * dh)
            f = (x @ W_v[sl].T + b_v[sl]) @ W_o[:, sl].T  # (T, hidden): f_h(x_j)
            alpha = o.attentions[layer - 1][0, h].double()
            w = torch.stack([torch.stack([torch.linalg.norm(alpha[i, j] * f[j]) for j in range(len(r))])
                             for i in range(len(r))])
            w = w / w.sum(1, keepdim=True)
            for a, ga in enumerate(groups):
                qs = [i for i, g in enumerate(gid) if g == ga]
                for b, gb in enumerate(groups):
                    ks = [j for j, g in enumerate(gid) if g == gb]
                    want = w[qs][:, ks].sum(1).mean().item()
                    assert norm[list(ex).index(e), layer - 1, h, a, b] == pytest.approx(want, abs=1e-5)
    assert np.abs(norm - raw).max() > 1e-3


# -- a family without an adapter -------------------------------------------------------------------------

def test_a_family_without_an_adapter_extracts_and_is_refused_for_interventions(tmp_path, bert_tokenizer, examples):
    lm = _tiny("mobilebert", bert_tokenizer)
    assert find_adapter(lm.model) is None
    cache = _run(examples, lm, tmp_path / "clean")
    for e, ex in enumerate(examples):
        want = torch.stack(_forward(lm, _rendered(lm, ex)).hidden_states, 2)[0].numpy()
        np.testing.assert_allclose(_states_of(cache, e), want, atol=1e-5, rtol=0)
    missing = r"need an adapter for model type 'mobilebert' and there is none: add probing/adapters/_mobilebert.py"
    with pytest.raises(InterventionError, match="interventions " + missing):
        _run(examples, lm, tmp_path / "ko", Intervention((Knockout("all", "cls", (1,)),)))
    with pytest.raises(AdapterError, match=r"norm-based attention \(--attention-norm\) " + missing):
        _run(examples, lm, tmp_path / "norm", attention_norm=True)
    assert not (tmp_path / "ko").exists() and not (tmp_path / "norm").exists()


def test_the_command_line_names_the_missing_adapter_and_writes_nothing(tmp_path, bert_tokenizer, capsys):
    model_dir = tmp_path / "tiny-mobilebert"
    lm = _tiny("mobilebert", bert_tokenizer)
    lm.model.save_pretrained(model_dir)
    bert_tokenizer.save_pretrained(model_dir)
    out = tmp_path / "out"
    capsys.readouterr()  # saving printed a progress bar
    rc = main(["--model", str(model_dir), "--corpus", "generated:n=4", "--knockout", "from=all,to=sep,layers=1",
               "--out", str(out), "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.splitlines()[0].startswith("error: interventions need an adapter for model type 'mobilebert' and "
                                          "there is none: add probing/adapters/_mobilebert.py")
    assert not out.exists() or list(out.iterdir()) == []
