"""Interventions at extraction time (probing.interventions) and norm-based attention
(probing.attention_norm), on tiny random BERTs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from probing.cache import Cache
from probing.extract import extract, main
from probing.formats import Format, render, special_token_ids, tokenize_sentences
from probing.interventions import (Ablate, Intervention, InterventionError, Knockout, Patch, knockout_mask,
                                   parse_layer_list, rendered_mask)

QUIET = dict(progress=False, log=lambda *a: None)


def _run(examples, fmt, lm, out, intervention=None, **kw):
    (path,) = extract(examples, [fmt], model=lm, out=out, roles="all", intervention=intervention, **QUIET, **kw)
    return Cache.open(path)


def _rendered(lm, fmt_name, example):
    fmt = Format.parse(fmt_name)
    return render(fmt, example, tokenize_sentences(lm.tokenizer, list(example.sentences)),
                  special_token_ids(lm.tokenizer, fmt))


def _literal_forward(model, r, mask_of_layer):
    """A literal BERT forward (embeddings from the model, then every block written out) for one
    example with no padding; ``mask_of_layer(l)`` gives the (T, T) bool cells masked at layer l."""
    ids = torch.from_numpy(r.input_ids)[None]
    types = torch.from_numpy(r.token_type_ids)[None]

    def lin(m, x):
        return x @ m.weight.double().T + m.bias.double()

    def ln(m, x):
        return torch.nn.functional.layer_norm(x, x.shape[-1:], m.weight.double(), m.bias.double(), m.eps)

    with torch.no_grad():
        h = model.embeddings(input_ids=ids, token_type_ids=types)[0].double()
        states = [h]
        for l, block in enumerate(model.encoder.layer, start=1):
            sa, heads = block.attention.self, model.config.num_attention_heads
            d = h.shape[-1] // heads
            q, k, v = (lin(m, h).reshape(-1, heads, d).transpose(0, 1) for m in (sa.query, sa.key, sa.value))
            scores = q @ k.transpose(1, 2) / d ** 0.5
            scores = scores.masked_fill(torch.from_numpy(mask_of_layer(l))[None], float("-inf"))
            ctx = (scores.softmax(-1) @ v).transpose(0, 1).reshape(-1, heads * d)
            a = ln(block.attention.output.LayerNorm, lin(block.attention.output.dense, ctx) + h)
            inter = torch.nn.functional.gelu(lin(block.intermediate.dense, a))
            h = ln(block.output.LayerNorm, lin(block.output.dense, inter) + a)
            states.append(h)
    return torch.stack(states, 1).numpy()  # (T, layers + 1, hidden)


def _states_of(cache: Cache, example: int) -> np.ndarray:
    rows = cache.rows(example=example)
    order = np.argsort(cache.tokens["position"].to_numpy()[rows])
    return cache.states(None, rows[order])


# -- specs ---------------------------------------------------------------------------------------------

def test_specs_parse_to_values():
    assert parse_layer_list("2-4") == (2, 3, 4)
    assert parse_layer_list("5;2") == (2, 5)
    ko = Knockout.parse("from=all,to=sep,layers=2-3,control=1,seed=7")
    assert (ko.queries, ko.keys, ko.layers, ko.control, ko.seed) == ("all", "sep", (2, 3), True, 7)
    assert Ablate.parse("keys=sep1,layer=2").value == "zero"
    assert Intervention.parse([], [], []) is None


@pytest.mark.parametrize("spec, message", [
    ("from=all,to=pad,layers=1", "unknown group 'pad'"),
    ("from=all,to=sep", "missing layers="),
    ("from=all,to=sep,layers=x", "layers='x' is not an integer"),
    ("from=all,to=sep,layers=3-1", "empty layer range"),
    ("from=all,to=sep,layers=1,control=yes", "control must be 0 or 1"),
    ("from=all,too=sep,layers=1", "'too=sep' is not one of"),
])
def test_bad_knockout_specs_name_the_input(spec, message):
    with pytest.raises(InterventionError, match=message.replace("(", r"\(")):
        Knockout.parse(spec)


def test_bad_specs_on_the_command_line_exit_2_and_write_nothing(tmp_path, capsys):
    rc = main(["--corpus", "generated:n=4", "--knockout", "from=all,to=nowhere,layers=1", "--out", str(tmp_path),
               "--no-progress"])
    assert rc == 2
    assert "error: --knockout to: unknown group 'nowhere'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_the_log_names_the_intervention(tmp_path, tiny_bert, examples):
    logs = []
    extract(examples, ["pair"], model=tiny_bert, out=tmp_path, progress=False, log=logs.append,
            intervention=Intervention((Knockout("all", "sep", (1, 2), control=True),)))
    assert logs[-1].endswith("[pair] intervention: control knockout all->sep@1-2")


def test_layer_out_of_range_is_an_error_before_writing(tmp_path, tiny_bert, examples):
    with pytest.raises(InterventionError, match=r"layers \[3\] out of range; encoder layers are 1..2"):
        _run(examples, "pair", tiny_bert, tmp_path, Intervention((Knockout("all", "sep", (3,)),)))
    assert list(tmp_path.iterdir()) == []


# -- masks ---------------------------------------------------------------------------------------------

def test_groups_reuse_the_role_grammar(tiny_bert, examples):
    r = _rendered(tiny_bert, "pair", examples[0])
    n1 = int((np.asarray(r.role) == "word")[np.asarray(r.sentence) == 1].sum())
    assert np.flatnonzero(rendered_mask(r, "cls")).tolist() == [0]
    assert np.flatnonzero(rendered_mask(r, "sep1")).tolist() == [1 + n1]
    assert np.flatnonzero(rendered_mask(r, "sep")).tolist() == [1 + n1, len(r) - 1]
    assert rendered_mask(r, "s2").sum() == len(r) - n1 - 3


def test_knockout_mask_keeps_the_own_position_and_the_control_matches_its_size(tiny_bert, examples):
    r = _rendered(tiny_bert, "pair", examples[1])
    real = knockout_mask(r, Knockout("all", "sep", (1,)), "ex1")
    seps = np.flatnonzero(rendered_mask(r, "sep"))
    assert not real.diagonal().any()
    assert real[:, seps].sum() == real.sum() == len(r) * 2 - 2  # every query loses both [SEP]s but its own
    control = knockout_mask(r, Knockout("all", "sep", (1,), control=True, seed=3), "ex1")
    np.testing.assert_array_equal(control.sum(1), real.sum(1))  # the same number of keys per query
    words = rendered_mask(r, "word")
    assert words[np.nonzero(control)[1]].all() and not control.diagonal().any()
    again = knockout_mask(r, Knockout("all", "sep", (1,), control=True, seed=3), "ex1")
    other = knockout_mask(r, Knockout("all", "sep", (1,), control=True, seed=4), "ex1")
    np.testing.assert_array_equal(control, again)
    assert (control != other).any()


# -- knockout --------------------------------------------------------------------------------------------

def test_knocking_out_nothing_is_byte_identical_and_recorded(tmp_path, tiny_bert, examples):
    clean = _run(examples, "pair", tiny_bert, tmp_path)
    nothing = Intervention((Knockout("all", "sep3", (1, 2)),))  # pair has no [SEP] after sentence 3
    ko = _run(examples, "pair", tiny_bert, tmp_path, nothing)
    assert ko.path != clean.path and ko.path.parent == clean.path.parent
    assert "intervention" not in clean.manifest
    assert json.loads((clean.path / "request.json").read_text()).keys() == clean.manifest.keys() - {
        "examples_sha256", "skipped", "shards", "n_tokens", "versions", "manifest_sha256"}
    assert ko.manifest["intervention"] == {"knockout": [{"from": "all", "to": "sep3", "layers": [1, 2],
                                                         "control": False, "seed": 0}]}
    a, b = clean.path / "shards" / "00000.npy", ko.path / "shards" / "00000.npy"
    assert a.read_bytes() == b.read_bytes()


def test_knockout_leaving_one_key_equals_a_literal_forward(tmp_path, tiny_bert, examples):
    iv = Intervention((Knockout("cls", "all", (1, 2)),))  # [CLS] may attend to itself only
    cache = _run(examples, "pair", tiny_bert, tmp_path, iv, batch_tokens=200)
    clean = _run(examples, "pair", tiny_bert, tmp_path)
    for e in (0, 5):
        r = _rendered(tiny_bert, "pair", examples[e])
        mask = np.zeros((len(r), len(r)), dtype=bool)
        mask[0, 1:] = True
        want = _literal_forward(tiny_bert.model, r, lambda l: mask)
        np.testing.assert_allclose(_states_of(cache, e), want, atol=2e-5)
        free = _literal_forward(tiny_bert.model, r, lambda l: np.zeros_like(mask))
        np.testing.assert_allclose(_states_of(clean, e), free, atol=2e-5)
        assert np.abs(want[0, 1] - free[0, 1]).max() > 1e-3  # the knockout did change [CLS]


def test_knockout_at_one_layer_only_leaves_the_layers_below(tmp_path, tiny_bert, examples):
    cache = _run(examples, "pair", tiny_bert, tmp_path, Intervention((Knockout("all", "sep", (2,)),)))
    clean = _run(examples, "pair", tiny_bert, tmp_path)
    r = _rendered(tiny_bert, "pair", examples[2])
    seps = rendered_mask(r, "sep")
    mask = seps[None, :] & ~np.eye(len(r), dtype=bool)
    want = _literal_forward(tiny_bert.model, r, lambda l: mask if l == 2 else np.zeros_like(mask))
    np.testing.assert_allclose(_states_of(cache, 2), want, atol=2e-5)
    np.testing.assert_array_equal(_states_of(cache, 2)[:, :2], _states_of(clean, 2)[:, :2])


@pytest.mark.parametrize("max_batch", [1, 256])  # one example (no padding mask) and padded batches
def test_eager_and_sdpa_agree(tmp_path, tiny_bert, examples, max_batch):
    iv = Intervention((Knockout("all", "sep", (1, 2)), Knockout("s1", "s2", (2,), control=True)))
    caches = {}
    for impl in ("eager", "sdpa"):
        tiny_bert.model.set_attn_implementation(impl)
        caches[impl] = _run(examples, "pair", tiny_bert, tmp_path / impl, iv, max_batch=max_batch)
    clean = _run(examples, "pair", tiny_bert, tmp_path / "clean")
    e, s = caches["eager"].states(), caches["sdpa"].states()
    np.testing.assert_allclose(e, s, atol=1e-5)
    assert np.abs(e - clean.states()).max() > 1e-3


# -- patching and ablation -------------------------------------------------------------------------------

def test_patching_a_state_with_itself_is_the_identity(tmp_path, tiny_bert, examples):
    clean = _run(examples, "pair", tiny_bert, tmp_path)
    patched = _run(examples, "pair", tiny_bert, tmp_path, Intervention(patches=(Patch("cls", 1, str(clean.path)),
                                                                                Patch("s2", 0, str(clean.path)))))
    assert patched.path != clean.path
    assert patched.manifest["intervention"]["patch"][0] == {"keys": "cls", "layer": 1, "source": {
        "cache": clean.path.name, "format": "pair"}}
    np.testing.assert_array_equal(patched.states(), clean.states())


def test_patching_cls_of_concat_into_pair(tmp_path, tiny_bert, examples):
    pair = _run(examples, "pair", tiny_bert, tmp_path)
    concat = _run(examples, "concat", tiny_bert, tmp_path)
    patched = _run(examples, "pair", tiny_bert, tmp_path, Intervention(patches=(Patch("cls", 1, str(concat.path)),)))
    cls_p, cls_c, cls_x = (c.rows(role="cls") for c in (pair, concat, patched))
    np.testing.assert_array_equal(patched.states(1, cls_x), concat.states(1, cls_c))
    np.testing.assert_array_equal(patched.states(0), pair.states(0))
    words = pair.rows(role="word")
    np.testing.assert_array_equal(patched.states(1, words), pair.states(1, words))  # same layer, other tokens
    assert np.abs(patched.states(2, cls_x) - pair.states(2, cls_p)).max() > 1e-4  # the layers above ran on it


def test_patch_keys_missing_from_the_source_is_an_error_before_writing(tmp_path, tiny_bert, examples):
    concat = _run(examples, "concat", tiny_bert, tmp_path / "src")
    with pytest.raises(InterventionError,
                       match=r"token sep \(sentence 1, index 0\) of format 'pair' has no counterpart"):
        _run(examples, "pair", tiny_bert, tmp_path / "out", Intervention(patches=(Patch("sep1", 2, str(concat.path)),)))
    assert not (tmp_path / "out").exists()


def test_ablation_sets_zero_or_the_clean_mean(tmp_path, tiny_bert, examples):
    clean = _run(examples, "pair", tiny_bert, tmp_path)
    zero = _run(examples, "pair", tiny_bert, tmp_path, Intervention(ablations=(Ablate("sep", 1),)))
    mean = _run(examples, "pair", tiny_bert, tmp_path,
                Intervention(ablations=(Ablate("sep", 1, "mean", str(clean.path)),)))
    seps = clean.rows(role="sep")
    assert not zero.states(1, seps).any()
    want = clean.states(1, seps).astype(np.float64).mean(0)
    np.testing.assert_allclose(mean.states(1, seps), np.tile(want, (len(seps), 1)), atol=1e-6)
    assert np.abs(mean.states(2) - clean.states(2)).max() > 1e-4
    with pytest.raises(InterventionError, match="value=mean needs source"):
        Ablate("sep", 1, "mean")


# -- norm-based attention --------------------------------------------------------------------------------

def test_norm_based_attention_equals_a_literal_per_head_computation(tmp_path, tiny_bert, examples):
    (path,) = extract(examples, ["pair"], model=tiny_bert, out=tmp_path, roles="all", attention_norm=True, **QUIET)
    cache = Cache.open(path)
    assert cache.manifest["attention_norm"] is True and cache.has_attention
    ex, norm, groups = cache.attention("norm")
    _, raw, _ = cache.attention("raw")
    model = tiny_bert.model
    model.set_attn_implementation("eager")  # the reference needs the weights
    heads = model.config.num_attention_heads
    e = 3
    r = _rendered(tiny_bert, "pair", examples[e])
    with torch.no_grad():
        o = model(input_ids=torch.from_numpy(r.input_ids)[None],
                  token_type_ids=torch.from_numpy(r.token_type_ids)[None], output_hidden_states=True,
                  output_attentions=True)
    gid = [f"s{s}" if role == "word" else f"{role}{oc}" for role, s, oc in zip(r.role, r.sentence, r.occurrence)]
    for l, block in enumerate(model.encoder.layer, start=1):
        x = o.hidden_states[l - 1][0].double()
        W_v, b_v = block.attention.self.value.weight.double(), block.attention.self.value.bias.double()
        W_o = block.attention.output.dense.weight.double()
        d = W_v.shape[0] // heads
        for h in range(heads):
            sl = slice(h * d, (h + 1) * d)
            f = (x @ W_v[sl].T + b_v[sl]) @ W_o[:, sl].T  # (T, hidden): f_h(x_j)
            alpha = o.attentions[l - 1][0, h].double()
            w = torch.stack([torch.stack([torch.linalg.norm(alpha[i, j] * f[j]) for j in range(len(r))])
                             for i in range(len(r))])
            w = w / w.sum(1, keepdim=True)
            for a, ga in enumerate(groups):
                qs = [i for i, g in enumerate(gid) if g == ga]
                for b, gb in enumerate(groups):
                    ks = [j for j, g in enumerate(gid) if g == gb]
                    want = w[qs][:, ks].sum(1).mean().item()
                    assert norm[list(ex).index(e), l - 1, h, a, b] == pytest.approx(want, abs=1e-5)
    assert np.abs(norm - raw).max() > 1e-3


def test_attention_runner_reports_either_weighting(tmp_path, tiny_bert, examples, capsys):
    from analyses.attention import main as attention_main, run_attention

    (path,) = extract(examples, ["pair"], model=tiny_bert, out=tmp_path, roles="all", attention_norm=True, **QUIET)
    cache = Cache.open(path)
    df = run_attention(cache, n_resamples=100, per_head=False, weighting="norm")
    ex, norm, groups = cache.attention("norm")
    row = df[(df["role"] == "cls") & (df["target"] == "sep1") & (df["layer"] == 2)].iloc[0]
    assert row["metric"] == "attention_norm_mass"
    assert row["value"] == pytest.approx(norm[:, 1, :, groups.index("cls0"), groups.index("sep0")].mean(), abs=1e-6)
    (raw_only,) = extract(examples, ["pair"], model=tiny_bert, out=tmp_path / "raw", attention=True, **QUIET)
    assert attention_main([str(raw_only), "--weighting", "norm", "--no-per-head"]) == 2
    assert "holds no norm-based attention; extract with --attention-norm" in capsys.readouterr().err


def test_knocked_out_attention_weights_are_zero_after_the_softmax(tmp_path, tiny_bert, examples):
    iv = Intervention((Knockout("word", "sep", (2,)),))
    (path,) = extract(examples, ["pair"], model=tiny_bert, out=tmp_path, roles="all", attention=True,
                      intervention=iv, **QUIET)
    _, mass, groups = Cache.open(path).attention()
    seps, words = [groups.index(g) for g in ("sep0", "sep1")], [groups.index(g) for g in ("s1", "s2")]
    assert np.abs(mass[:, 1][:, :, words][:, :, :, seps]).max() < 1e-6  # layer 2: words -> [SEP] is gone
    assert mass[:, 0][:, :, words][:, :, :, seps].min() > 1e-3  # layer 1 untouched
    np.testing.assert_allclose(np.nansum(mass[:, 1][:, :, words], axis=-1), 1.0, atol=1e-5)  # still a softmax
