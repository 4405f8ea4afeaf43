import re

import numpy as np
import pytest

from probing.examples import Example
from probing.formats import (BUILTIN_FORMATS, Format, FormatError, native_template, parse_formats, render,
                             resolve_format, special_token_ids, tokenize_sentences)


#: Formats with literal tokens: an ordinary token where a special token would stand.
LITERAL_FORMATS = ("word_sep=[CLS] {1} ',' <1> {2} [SEP]", "lits=[CLS] ( <alt> {i} ',' ) [SEP]")


def _render(fmt, ex, tok):
    ts = tokenize_sentences(tok, list(ex.sentences))
    return render(fmt, ex, ts, special_token_ids(tok, fmt))


def test_pair_matches_the_tokenizers_own_pair_encoding(bert_tokenizer):
    ex = Example("a", ("Hello, world!", "Unbelievable results."))
    r = _render(Format.parse("pair"), ex, bert_tokenizer)
    ref = bert_tokenizer(ex.sentences[0], ex.sentences[1])
    assert r.input_ids.tolist() == ref["input_ids"]
    assert r.token_type_ids.tolist() == ref["token_type_ids"]


def test_single_matches_the_tokenizers_single_encoding(bert_tokenizer):
    ex = Example("a", ("Hello, world!",))
    r = _render(Format.parse("single"), ex, bert_tokenizer)
    assert r.input_ids.tolist() == bert_tokenizer(ex.sentences[0])["input_ids"]


@pytest.mark.parametrize("name,expected", [
    ("pair", "C a S b S"), ("concat", "C a b S"), ("concat_segments", "C a b S"), ("single", "C a S"),
    ("multi", "C a S b S c S"), ("bertsum", "C a S C b S C c S"), ("no_special", "a b c"),
    ("cls_last", "a S b S c S C"), ("cls_mid", "a S C b S"),
])
def test_builtin_layouts(bert_tokenizer, name, expected):
    ex = Example("x", ("alpha", "beta", "gamma"))
    if name in ("pair", "concat_segments", "cls_mid"):
        ex = Example("x", ("alpha", "beta"))
    if name == "concat":
        ex = Example("x", ("alpha", "beta"))
    r = _render(Format.parse(name), ex, bert_tokenizer)
    toks = bert_tokenizer.convert_ids_to_tokens(r.input_ids.tolist())
    short = {"[CLS]": "C", "[SEP]": "S", "alpha": "a", "beta": "b", "gamma": "c"}
    assert " ".join(short[t] for t in toks) == expected


@pytest.mark.parametrize("name,segments", [
    ("pair", [0, 0, 0, 1, 1]), ("concat", [0, 0, 0, 0]), ("concat_segments", [0, 0, 1, 1]),
    ("bertsum", [0, 0, 0, 1, 1, 1]), ("multi", [0, 0, 0, 1, 1]),
])
def test_segments(bert_tokenizer, name, segments):
    r = _render(Format.parse(name), Example("x", ("alpha", "beta")), bert_tokenizer)
    assert r.token_type_ids.tolist() == segments


def test_multi_with_two_sentences_is_pair(bert_tokenizer):
    ex = Example("x", ("One two.", "Three four five."))
    a, b = _render(Format.parse("multi"), ex, bert_tokenizer), _render(Format.parse("pair"), ex, bert_tokenizer)
    assert a.input_ids.tolist() == b.input_ids.tolist()
    assert a.token_type_ids.tolist() == b.token_type_ids.tolist()


def test_keys_of_words_and_specials(bert_tokenizer):
    ex = Example("x", ("Unbelievably cats.", "Dogs bark."))
    r = _render(Format.parse("pair"), ex, bert_tokenizer)
    toks = bert_tokenizer.convert_ids_to_tokens(r.input_ids.tolist())
    rows = list(zip(toks, r.role, r.sentence.tolist(), r.index.tolist(), r.subword.tolist()))
    assert rows[0] == ("[CLS]", "cls", 0, 0, 0)
    # "unbelievable" is split into subwords of word 0 in sentence 1
    sub = [x for x in rows if x[1] == "word" and x[2] == 1 and x[3] == 0]
    assert len(sub) >= 2 and [x[4] for x in sub] == list(range(len(sub)))
    seps = [x for x in rows if x[1] == "sep"]
    assert [(x[2], x[3]) for x in seps] == [(1, 0), (2, 0)]
    assert r.word_text[1] == r.word_text[2] == "Unbelievably"


def test_final_sep_has_the_same_key_in_pair_and_concat(bert_tokenizer):
    ex = Example("x", ("One.", "Two."))
    a, b = _render(Format.parse("pair"), ex, bert_tokenizer), _render(Format.parse("concat"), ex, bert_tokenizer)

    def key(r):
        return {(ro, s, i) for ro, s, i in zip(r.role, r.sentence.tolist(), r.index.tolist()) if ro == "sep"}

    assert key(b) == {("sep", 2, 0)}
    assert key(b) < key(a)


def test_literal_special_token_text_is_not_a_special_token(bert_tokenizer):
    ts = tokenize_sentences(bert_tokenizer, ["dogs [SEP] cats"])[0]
    assert bert_tokenizer.sep_token_id not in ts.ids.tolist()


def test_roberta_style_tokenizer_uses_its_own_specials(roberta_tokenizer):
    ex = Example("x", ("The cat sat on the mat.", "A dog barked."))
    r = _render(Format.parse("pair"), ex, roberta_tokenizer)
    toks = roberta_tokenizer.convert_ids_to_tokens(r.input_ids.tolist())
    assert toks[0] == "<s>" and toks[-1] == "</s>" and toks.count("</s>") == 2
    assert r.role[0] == "cls" and r.role[-1] == "sep"
    assert [t for t, ro in zip(r.word_text, r.role) if ro == "word"][:2] == ["The", "cat"]


def test_custom_formats_parse():
    f = Format.parse("swap=[CLS] {2} [SEP] <1> {1} [SEP]")
    assert f.name == "swap"
    assert [k for k, _, _ in f.expand(2)] == ["special", "sentence", "special", "sentence", "special"]
    g = Format.parse("[CLS] {1} [SEP]")
    assert g.name.startswith("custom-")
    assert [f.name for f in parse_formats(["pair", "concat"])] == ["pair", "concat"]


@pytest.mark.parametrize("template,message", [
    ("[CLS] [SEP]", "names no sentence"),
    ("[CLS] {1} [FOO]", "unknown special token [FOO]"),
    ("[CLS] {1} {1}", "appears twice"),
    ("[CLS] {0}", "numbered from 1"),
    ("[CLS] ( {i} ( {i} ) )", "nested"),
    ("[CLS] ( [SEP] )", "must contain {i}"),
    ("{i} [SEP]", "inside a ( ... ) group"),
    ("[CLS] {1} hello", "unexpected 'hello'"),
    ("[CLS] ( {i} ", "without ')'"),
    ("{1} ( {i} )", "not both"),
])
def test_malformed_templates_are_clear_errors(template, message):
    with pytest.raises(FormatError, match=re.escape(message)):
        Format("bad", template)


def test_unknown_format_name_lists_builtins():
    with pytest.raises(FormatError, match="pair"):
        Format.parse("nonexistent")


def test_template_naming_a_missing_sentence_is_an_error(bert_tokenizer):
    with pytest.raises(FormatError, match=r"names sentence \{2\} but the example has 1"):
        _render(Format.parse("pair"), Example("x", ("only one",)), bert_tokenizer)


def test_tokenizer_without_a_special_token_is_an_error(bert_tokenizer):
    with pytest.raises(FormatError, match=r"uses \[BOS\] but tokenizer .* has no bos_token"):
        special_token_ids(bert_tokenizer, Format("b", "[BOS] {1}"))


def test_duplicate_format_names_are_rejected():
    with pytest.raises(FormatError, match="unique"):
        parse_formats(["pair", "pair=[CLS] {1} [SEP]"])


def test_every_builtin_parses():
    for name in BUILTIN_FORMATS:
        assert Format.parse(name).template == BUILTIN_FORMATS[name]


# --------------------------------------------------------------------------------------------------
# native: the tokenizer's own template


def _keys(r):
    return [(ro, int(s), int(i)) for ro, s, i in zip(r.role, r.sentence, r.index) if ro != "word"]


def test_native_is_berts_pair_template_and_its_encoding(bert_tokenizer):
    assert native_template(bert_tokenizer) == BUILTIN_FORMATS["pair"]
    fmt = resolve_format("native", bert_tokenizer)
    assert fmt.name == "native" and fmt.template == BUILTIN_FORMATS["pair"]
    ex = Example("a", ("Hello, world!", "Unbelievable results."))
    r = _render(fmt, ex, bert_tokenizer)
    ref = bert_tokenizer(*ex.sentences)
    assert r.input_ids.tolist() == ref["input_ids"] and r.token_type_ids.tolist() == ref["token_type_ids"]
    assert _keys(r) == [("cls", 0, 0), ("sep", 1, 0), ("sep", 2, 0)]


def test_native_is_robertas_double_separator(roberta_tokenizer):
    fmt = resolve_format(Format.parse("native"), roberta_tokenizer)
    assert fmt.template == "[CLS] {1} [SEP] [SEP] {2} [SEP]"
    ex = Example("x", ("The cat sat on the mat.", "A dog barked."))
    r = _render(fmt, ex, roberta_tokenizer)
    ref = roberta_tokenizer(*ex.sentences)
    assert r.input_ids.tolist() == ref["input_ids"]
    assert roberta_tokenizer.convert_ids_to_tokens(r.input_ids.tolist()).count("</s>") == 3
    # cls; sep1 and sep1_2 (the two </s> after sentence 1); sep2
    assert _keys(r) == [("cls", 0, 0), ("sep", 1, 0), ("sep", 1, 1), ("sep", 2, 0)]


@pytest.mark.parametrize("tok", ["bert_tokenizer", "roberta_tokenizer"])
def test_native_single_sentence_is_the_single_template(tok, request):
    tokenizer = request.getfixturevalue(tok)
    fmt = resolve_format("native", tokenizer, n_sentences=1)
    assert fmt.template == "[CLS] {1} [SEP]"
    ex = Example("x", ("Economists predicted a recession.",))
    assert _render(fmt, ex, tokenizer).input_ids.tolist() == tokenizer(ex.sentences[0])["input_ids"]


def test_native_text_that_looks_like_a_separator_stays_words(bert_tokenizer):
    """The template comes from the tokenizer's special-tokens mask on placeholder text; a literal
    "[SEP]" in a sentence is split as ordinary text and adds no separator."""
    ex = Example("x", ("[SEP] is text here", "and here"))
    r = _render(resolve_format("native", bert_tokenizer), ex, bert_tokenizer)
    assert r.role.count("sep") == 2 and r.role[1] == "word"


def test_unresolved_native_is_a_clear_error(bert_tokenizer):
    fmt = Format.parse("native")
    with pytest.raises(FormatError, match="resolve_format"):
        fmt.expand(2)
    with pytest.raises(FormatError, match="tokenizer's own template"):
        special_token_ids(bert_tokenizer, fmt)
    assert resolve_format(Format.parse("concat"), bert_tokenizer) == Format.parse("concat")


def test_count_tokens_equals_the_tokenized_lengths_and_checks_the_same(bert_tokenizer):
    from probing.formats import count_tokens

    from .conftest import sample_examples

    ex = sample_examples(12)
    sentences = list(dict.fromkeys(s for e in ex for s in e.sentences)) + ["naïve café [SEP] 1,234.5 x"]
    want = [len(t.ids) for t in tokenize_sentences(bert_tokenizer, sentences)]
    assert count_tokens(bert_tokenizer, sentences) == want
    assert count_tokens(bert_tokenizer, []) == []
    for bad in ("", "   "):
        for f in (count_tokens, tokenize_sentences):
            with pytest.raises(FormatError, match="gives no tokens"):
                f(bert_tokenizer, ["A sentence.", bad])


def _word_layout_by_loops(word_ids, offsets):
    """The per-token loops tokenize_sentences used before _word_layout (monotonic word ids)."""
    dense = {w: j for j, w in enumerate(dict.fromkeys(word_ids))}
    word = np.asarray([dense[w] for w in word_ids], dtype=np.int32)
    subword = np.zeros(len(word), dtype=np.int32)
    for t in range(1, len(word)):
        if word[t] == word[t - 1]:
            subword[t] = subword[t - 1] + 1
    n_words = int(word[-1]) + 1
    starts, ends = [None] * n_words, [0] * n_words
    for t, w in enumerate(word):
        s, e = offsets[t]
        if starts[w] is None:
            starts[w] = s
        ends[w] = max(ends[w], e)
    return word, subword, starts, ends


def test_word_layout_equals_the_per_token_loops():
    from probing.formats import _word_layout

    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 30))
        word_ids = np.cumsum(rng.choice([0, 1, 1, 2], size=n)) + int(rng.integers(0, 3))  # repeats and skips
        ends = np.cumsum(rng.integers(1, 5, size=n))
        offsets = np.stack([ends - rng.integers(1, 3, size=n).clip(max=ends), ends], axis=1)
        got = _word_layout(word_ids, offsets)
        want = _word_layout_by_loops(word_ids.tolist(), offsets.tolist())
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, np.asarray(w))
    # word ids out of order (the loops assumed order): dense in order of first appearance, spans per word
    word, subword, starts, ends = _word_layout(np.array([4, 9, 9, 4]), np.array([[0, 2], [3, 5], [5, 7], [8, 9]]))
    assert word.tolist() == [0, 1, 1, 0] and subword.tolist() == [0, 0, 1, 0]
    assert starts.tolist() == [0, 3] and ends.tolist() == [9, 7]


def test_tokenize_sentences_in_one_batch_equals_each_sentence_by_the_loops(bert_tokenizer, roberta_tokenizer):
    """The batch-at-once layout against the per-token loops applied to each sentence's own encoding."""
    from .conftest import sample_examples

    sentences = list(dict.fromkeys(s for e in sample_examples(30, k=4) for s in e.sentences))
    sentences += ["naïve café [SEP] 1,234.5 x", "x", "Don't!!! (really)", "unbelievable supercalifragilistic"]
    for tok in (bert_tokenizer, roberta_tokenizer):
        got = tokenize_sentences(tok, sentences)
        assert len(got) == len(sentences)
        for text, ts in zip(sentences, got):
            enc = tok([text], add_special_tokens=False, return_offsets_mapping=True, split_special_tokens=True)
            word, subword, starts, ends = _word_layout_by_loops(enc.word_ids(0), enc["offset_mapping"][0])
            np.testing.assert_array_equal(ts.ids, enc["input_ids"][0])
            np.testing.assert_array_equal(ts.word, word)
            np.testing.assert_array_equal(ts.subword, subword)
            assert ts.word_text == [text[s:e] for s, e in zip(starts, ends)]
            assert ts.ids.dtype == np.int64 and ts.word.dtype == ts.subword.dtype == np.int32


class _Encoding(dict):
    """What tokenize_sentences reads of a transformers BatchEncoding: ids, offsets, word ids per sentence."""

    def __init__(self, rows):
        super().__init__(input_ids=[r[0] for r in rows], offset_mapping=[r[1] for r in rows])
        self._words = [r[2] for r in rows]

    def word_ids(self, i):
        return list(self._words[i])


def test_tokenize_sentences_copes_with_word_ids_out_of_order_and_unequal_lengths():
    rows = {"ab cd": ([5, 6, 7], [(0, 1), (3, 5), (1, 2)], [0, 1, 0]),  # word 0 comes back after word 1
            "ef": ([8], [(0, 2)], [3])}

    def tokenizer(sentences, **kw):
        return _Encoding([rows[s] for s in sentences])

    a, b = tokenize_sentences(tokenizer, ["ab cd", "ef"])
    assert a.ids.tolist() == [5, 6, 7] and a.word.tolist() == [0, 1, 0] and a.subword.tolist() == [0, 0, 0]
    assert a.word_text == ["ab", "cd"]
    assert b.ids.tolist() == [8] and b.word.tolist() == [0] and b.word_text == ["ef"]
    rows["ef"] = ([8, 9], [(0, 2)], [3])  # more ids than word ids: an error, not misaligned arrays
    with pytest.raises(FormatError, match="different lengths"):
        tokenize_sentences(tokenizer, ["ab cd", "ef"])


# ---------------------------------------------------------------------------------------------------
# The host path: the Rust tokenizer called directly, and whole shards laid out with array operations


def _mixed_sentence_counts():
    from tests.conftest import sample_examples

    out = [Example(f"k{k}-{e.id}", e.sentences[:k]) for k in (1, 2, 3) for e in sample_examples(9, k=3)]
    out.append(Example("odd", ("naïve café — 3.5%", "[SEP] [CLS] literal", "x")))
    return out[::2] + out[1::2]  # sentence counts interleaved


@pytest.mark.parametrize("tok_name", ["bert_tokenizer", "roberta_tokenizer"])
def test_the_direct_rust_call_gives_what_the_transformers_call_gives(request, tmp_path, tok_name):
    from transformers import AutoTokenizer

    from probing import formats as F

    tok = request.getfixturevalue(tok_name)
    if F._backend(tok) is None:  # the fixture's wrapper object (tokenizer_object=...): load it as users do
        assert tok_name == "roberta_tokenizer"
        tok.save_pretrained(tmp_path)
        tok = AutoTokenizer.from_pretrained(tmp_path)
    assert F._backend(tok) is not None  # the direct call is what runs for these tokenizers
    sents = list(dict.fromkeys(s for e in _mixed_sentence_counts() for s in e.sentences))
    ids, word_ids, offsets = F._encode(tok, sents, offsets=True)
    backend = tok.backend_tokenizer  # the state under which the direct call runs (else it is not taken)
    assert backend.encode_special_tokens is True and backend.truncation is None and backend.padding is None
    ref = tok(sents, add_special_tokens=False, split_special_tokens=True, return_offsets_mapping=True)
    assert ids == ref["input_ids"]
    assert word_ids == [ref.word_ids(i) for i in range(len(sents))]
    assert [list(map(tuple, o)) for o in offsets] == [list(map(tuple, o)) for o in ref["offset_mapping"]]
    sep = tok.convert_tokens_to_ids(tok.sep_token)
    assert all(sep not in row for row in ids)  # literal special-token text is split, never the token itself


@pytest.mark.parametrize("method", ["_encode_plus", "__call__"])
def test_a_tokenizer_class_with_its_own_encoding_takes_the_transformers_call(bert_tokenizer, method):
    from probing import formats as F

    base = type(bert_tokenizer)

    def prefixing(self, text, *args, **kwargs):  # changes the text before the Rust tokenizer sees it
        return getattr(super(Prefixing, self), method)(["zebra " + t for t in text], *args, **kwargs)

    Prefixing = type("Prefixing", (base,), {method: prefixing})
    tok = Prefixing.from_pretrained(bert_tokenizer.name_or_path)
    assert F._backend(tok) is None and F._backend(bert_tokenizer) is not None
    ids, _, _ = F._encode(tok, ["hello there"], offsets=False)
    # the class's own call ran
    assert ids == bert_tokenizer(["zebra hello there"], add_special_tokens=False)["input_ids"]
    assert ids != bert_tokenizer(["hello there"], add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("tok_name", ["bert_tokenizer", "roberta_tokenizer"])
def test_render_many_lays_out_what_render_does(request, tok_name):
    from probing.formats import render_many, tokenize_flat

    tok = request.getfixturevalue(tok_name)
    data = _mixed_sentence_counts()
    unique = list(dict.fromkeys(s for e in data for s in e.sentences))
    row = {s: i for i, s in enumerate(unique)}
    flat, each = tokenize_flat(tok, unique), tokenize_sentences(tok, unique)
    checked = 0
    for name in [*BUILTIN_FORMATS, *LITERAL_FORMATS]:
        fmt = resolve_format(name, tok)
        specials = special_token_ids(tok, fmt)
        kept = [e for e in data if e.n_sentences >= fmt.min_sentences()]
        layout = render_many(fmt, kept, [row[s] for e in kept for s in e.sentences], flat, specials)
        assert len({e.n_sentences for e in kept}) >= 2 and len(layout) == len(kept)
        for e, got in zip(kept, layout.rendered()):
            want = render(fmt, e, [each[row[s]] for s in e.sentences], specials)
            for field in ("input_ids", "token_type_ids", "sentence", "index", "subword", "occurrence"):
                a, b = getattr(want, field), getattr(got, field)
                assert a.dtype == b.dtype and a.tolist() == b.tolist(), (name, e.id, field)
            assert got.role == want.role and got.word_text == want.word_text, (name, e.id)
            checked += 1
        # stored positions and padding straight from the layout
        stored = layout.split(layout.positions_of(["cls", "word"]))
        for r, pos in zip(layout.rendered(), stored):
            assert pos.tolist() == [t for t, role in enumerate(r.role) if role in ("cls", "word")]
        batch = [len(kept) - 1, 0, 2]
        from probing.forward import pad_arrays

        T = int(layout.lengths[batch].max()) + 3
        for a, b in zip(layout.padded(batch, 7, T), pad_arrays(layout.rendered(batch), 7, T)):
            np.testing.assert_array_equal(a, b)
    assert checked > 100
    assert flat.words(np.arange(int(flat.word_bounds[-1]))) == [w for ts in each for w in ts.word_text]
    assert "naïve" in flat.words(np.arange(int(flat.word_bounds[-1])))


def test_a_literal_is_an_ordinary_token_where_a_special_token_would_stand(bert_tokenizer):
    ex = Example("e", ("The cat sat.", "It was warm."), {})
    pair = _render(Format.parse("pair"), ex, bert_tokenizer)
    lit = _render(Format.parse(LITERAL_FORMATS[0]), ex, bert_tokenizer)
    comma = bert_tokenizer.convert_tokens_to_ids(",")
    t = pair.role.index("sep")  # the middle [SEP]
    assert lit.role[t] == "lit" and int(lit.input_ids[t]) == comma
    assert (int(lit.sentence[t]), int(lit.index[t])) == (1, 0)  # keyed like the [SEP] it stands for
    assert lit.token_type_ids.tolist() == pair.token_type_ids.tolist()
    assert [r for i, r in enumerate(lit.role) if i != t] == [r for i, r in enumerate(pair.role) if i != t]
    assert len(lit) == len(pair)


def test_a_three_sentence_control_has_multi_s_length_and_no_inner_sep(bert_tokenizer):
    ex = Example("e", ("One here.", "Two here.", "Three here."), {})
    multi = _render(Format.parse("multi"), ex, bert_tokenizer)
    ctl = _render(Format.parse("ctl=[CLS] {1} ',' {2} ',' {3} [SEP]"), ex, bert_tokenizer)
    assert len(ctl) == len(multi)
    assert ctl.role.count("sep") == 1 and ctl.role.count("lit") == 2 and multi.role.count("sep") == 3


@pytest.mark.parametrize("template,message", [
    ("[CLS] {1} 'unbelievableness' {2} [SEP]", "one ordinary token"),  # several word pieces
    ("[CLS] {1} '[SEP]' {2} [SEP]", "one ordinary token"),  # a special token's text is not a literal
])
def test_a_literal_must_be_one_ordinary_token(bert_tokenizer, template, message):
    with pytest.raises(FormatError, match=message):
        special_token_ids(bert_tokenizer, Format.parse(f"x={template}"))


def test_a_literal_is_stored_and_chosen_by_lit_i(tmp_path, tiny_bert):
    from analyses.selection import choice_rows
    from probing.cache import Cache
    from probing.extract import extract

    from .conftest import sample_examples

    (path,) = extract(sample_examples(6, k=2), [LITERAL_FORMATS[0]], model=tiny_bert, out=tmp_path,
                      roles=["cls", "sep", "word", "lit"], progress=False, log=lambda *a: None)
    cache = Cache.open(path)
    examples, rows = choice_rows(cache, "lit1")
    assert len(examples) == 6 and set(cache.tokens.loc[rows, "role"]) == {"lit"}
    assert (cache.tokens.loc[rows, "token"] == ",").all()
