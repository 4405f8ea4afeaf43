"""Input formats: a small template language, the built-in formats, and rendering with token keys.

Template language (items separated by white space)::

    [NAME]      a special token of the tokenizer: [CLS] [SEP] [BOS] [EOS] [MASK] [PAD] [UNK]
                ([CLS] is "<s>" for RoBERTa, "[CLS]" for BERT: the tokenizer decides)
    {N}         sentence N of the example (1-based)
    'TEXT'      an ordinary token of the vocabulary (TEXT must be one token of it, e.g. ',' or '|'): a word
                where a special token would stand, with role ``lit`` (a control for a special token)
    <N>         the items after it get token type (segment) id N; the sequence starts at <0>
    ( ... )     a group repeated once per sentence of the example, in order; inside it
    {i}         is the current sentence and
    <alt>       sets the segment id to 0 for odd sentences, 1 for even ones (BertSum's interval segments)

Examples: ``pair`` is ``[CLS] {1} [SEP] <1> {2} [SEP]``; ``multi`` is ``[CLS] ( <alt> {i} [SEP] )``,
which for two sentences is the same sequence as ``pair``.

``native`` is the tokenizer's own template: what ``tokenizer(s1, s2)`` gives (``tokenizer(s1)`` for
one-sentence examples), e.g. BERT's ``[CLS] {1} [SEP] <1> {2} [SEP]`` or RoBERTa's
``[CLS] {1} [SEP] [SEP] {2} [SEP]`` (``<s> a </s></s> b </s>``). It is written in the template language
by :func:`resolve_format` once the tokenizer is known (:func:`native_template`), so its cache records
the concrete template and its tokens get keys like every other format's.

Token keys. Every position of a rendered example gets a key that does not depend on the format:

* words: ``(role="word", sentence=s, index=w, subword=j)``: word ``w`` of sentence ``s`` as the fast
  tokenizer splits that sentence *on its own* (its word ids), and subword ``j`` of that word. Every
  format inserts the same token ids for a sentence, so the same key is the same token in every format.
* special tokens: ``(role, sentence=a, index=j, subword=0)`` where ``role`` is the lower-cased name
  (``cls``, ``sep``, ...), ``a`` is the last sentence before the token (0 if none) and ``j`` counts
  tokens of that role since that sentence. So the ``[SEP]`` that closes sentence 2 has the same key in
  ``pair`` and ``concat``, and ``[CLS]`` at the start has key ``(cls, 0, 0)`` wherever it appears first.
  ``occurrence`` (not part of the key) counts the role from the start of the sequence.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from .examples import Example

#: Template names -> tokenizer attribute. Declared once; used by parsing, validation and help.
SPECIAL_TOKENS: dict[str, str] = {
    "CLS": "cls_token", "SEP": "sep_token", "BOS": "bos_token", "EOS": "eos_token",
    "MASK": "mask_token", "PAD": "pad_token", "UNK": "unk_token",
}

#: The built-in formats: plain data, one place. Names are what ``--formats`` accepts.
BUILTIN_FORMATS: dict[str, str] = {
    "pair": "[CLS] {1} [SEP] <1> {2} [SEP]",
    "concat": "[CLS] ( {i} ) [SEP]",
    "concat_segments": "[CLS] {1} <1> {2} [SEP]",
    "single": "[CLS] {1} [SEP]",
    "single2": "[CLS] {2} [SEP]",
    "multi": "[CLS] ( <alt> {i} [SEP] )",
    "bertsum": "( <alt> [CLS] {i} [SEP] )",
    "no_special": "( {i} )",
    "cls_last": "( <alt> {i} [SEP] ) [CLS]",
    "cls_mid": "{1} [SEP] [CLS] <1> {2} [SEP]",
    "native": "(the tokenizer's own)",
}

#: The built-in whose template comes from the tokenizer (:func:`resolve_format`).
NATIVE = "native"

FORMAT_DESCRIPTIONS: dict[str, str] = {
    "pair": "BERT's sentence-pair input, segments 0/1",
    "concat": "all sentences between one [CLS] and one [SEP], one segment (no middle [SEP])",
    "concat_segments": "no middle [SEP], but segment ids 0/1 kept",
    "single": "sentence 1 alone",
    "single2": "sentence 2 alone",
    "multi": "every sentence followed by [SEP], alternating segments (k=2 gives pair)",
    "bertsum": "[CLS] s [SEP] per sentence, interval segments (Liu & Lapata 2019)",
    "no_special": "the sentences' tokens only",
    "cls_last": "every sentence followed by [SEP], classification token at the end",
    "cls_mid": "classification token between sentence 1 and sentence 2",
    "native": "the tokenizer's own single or pair template, e.g. <s> a </s></s> b </s> for RoBERTa",
}

_TOKEN_RE = re.compile(r"\[[A-Za-z_]+\]|'[^'\s]+'|\{\d+\}|\{i\}|<\d+>|<alt>|\(|\)|\S+")


class FormatError(ValueError):
    """A template is malformed, or cannot be applied to an example or tokenizer."""


class OverflowError_(FormatError):
    """An example is longer than the model accepts."""


@dataclass(frozen=True)
class Item:
    kind: str  # "special" | "sentence" | "segment" | "group"
    value: object = None


@dataclass(frozen=True)
class Format:
    """A named template. ``Format.parse("pair")`` gives a built-in; ``"name=template"`` a custom one.

    >>> Format.parse("pair").template
    '[CLS] {1} [SEP] <1> {2} [SEP]'
    >>> Format.parse("mine=[CLS] {2} [SEP]").name
    'mine'
    """

    name: str
    template: str

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+", self.name):
            raise FormatError(f"format name {self.name!r} may only hold letters, digits and _ . + -")
        unresolved = self.template == BUILTIN_FORMATS[NATIVE]
        object.__setattr__(self, "_items", () if unresolved else _parse(self.template, self.name))

    @property
    def is_unresolved(self) -> bool:
        """True for ``native`` before :func:`resolve_format` has written the tokenizer's template."""
        return self.template == BUILTIN_FORMATS[NATIVE]

    @classmethod
    def parse(cls, spec: str) -> "Format":
        """``"pair"`` (a built-in), ``"name=template"``, or a bare template (named ``custom-<hash>``)."""
        spec = spec.strip()
        if spec in BUILTIN_FORMATS:
            return cls(spec, BUILTIN_FORMATS[spec])
        if "=" in spec and re.fullmatch(r"[A-Za-z0-9_.+-]+", spec.split("=", 1)[0].strip()):
            name, template = spec.split("=", 1)
            return cls(name.strip(), template.strip())
        if any(c in spec for c in "[{("):
            import hashlib

            return cls("custom-" + hashlib.sha256(spec.encode()).hexdigest()[:8], spec)
        raise FormatError(
            f"unknown format {spec!r}: give a built-in ({', '.join(BUILTIN_FORMATS)}), "
            f"'name=TEMPLATE', or a template such as '[CLS] {{1}} [SEP] {{2}} [SEP]'"
        )

    @property
    def items(self) -> tuple[Item, ...]:
        if self.is_unresolved:
            raise FormatError(f"format {self.name!r} is the tokenizer's own template: resolve it against a "
                              "tokenizer first (probing.formats.resolve_format(fmt, tokenizer, n_sentences))")
        return self._items  # type: ignore[attr-defined]

    @property
    def is_variadic(self) -> bool:
        return any(it.kind == "group" for it in self.items)

    def min_sentences(self) -> int:
        named = [it.value for it in self.items if it.kind == "sentence"]
        return max(named) if named else 1

    def expand(self, n_sentences: int) -> list[tuple[str, object, int]]:
        """The concrete sequence for an example with ``n_sentences``: ``(kind, value, segment)`` items,
        kind ``"special"`` (value: name) or ``"sentence"`` (value: 1-based index)."""
        out: list[tuple[str, object, int]] = []
        segment = 0
        for it in self.items:
            if it.kind == "segment":
                segment = int(it.value)
            elif it.kind == "special":
                out.append(("special", it.value, segment))
            elif it.kind == "sentence":
                if it.value > n_sentences:
                    raise FormatError(
                        f"format {self.name!r} ({self.template}) names sentence {{{it.value}}} "
                        f"but the example has {n_sentences} sentence(s)"
                    )
                out.append(("sentence", it.value, segment))
            else:  # group
                for i in range(1, n_sentences + 1):
                    for sub in it.value:
                        if sub.kind == "segment":
                            segment = (i - 1) % 2 if sub.value == "alt" else int(sub.value)
                        elif sub.kind == "special":
                            out.append(("special", sub.value, segment))
                        else:
                            out.append(("sentence", i, segment))
        return out

    def to_json(self) -> dict:
        return {"name": self.name, "template": self.template}


def _parse(template: str, name: str) -> tuple[Item, ...]:
    if not isinstance(template, str) or not template.strip():
        raise FormatError(f"format {name!r}: empty template")
    items: list[Item] = []
    group: list[Item] | None = None
    seen_sentences: set[int] = set()
    for tok in _TOKEN_RE.findall(template):
        target = group if group is not None else items
        if tok.startswith("[") and tok.endswith("]"):
            special = tok[1:-1].upper()
            if special not in SPECIAL_TOKENS:
                raise FormatError(
                    f"format {name!r}: unknown special token {tok}; known: "
                    + ", ".join(f"[{s}]" for s in SPECIAL_TOKENS)
                )
            target.append(Item("special", special))
        elif len(tok) > 2 and tok[0] == tok[-1] == "'":
            target.append(Item("special", tok))  # a literal: resolved to its token id by special_token_ids
        elif tok == "{i}" or tok == "<alt>":
            if group is None:
                raise FormatError(f"format {name!r}: {tok} may only appear inside a ( ... ) group")
            target.append(Item("sentence", "i") if tok == "{i}" else Item("segment", "alt"))
        elif re.fullmatch(r"\{\d+\}", tok):
            if group is not None:
                raise FormatError(f"format {name!r}: inside a group use {{i}}, not {tok}")
            idx = int(tok[1:-1])
            if idx < 1:
                raise FormatError(f"format {name!r}: sentences are numbered from 1, got {tok}")
            if idx in seen_sentences:
                raise FormatError(f"format {name!r}: sentence {tok} appears twice; token keys would collide")
            seen_sentences.add(idx)
            target.append(Item("sentence", idx))
        elif re.fullmatch(r"<\d+>", tok):
            target.append(Item("segment", int(tok[1:-1])))
        elif tok == "(":
            if group is not None:
                raise FormatError(f"format {name!r}: groups cannot be nested")
            if any(it.kind == "group" for it in items):
                raise FormatError(f"format {name!r}: only one ( ... ) group is allowed")
            group = []
        elif tok == ")":
            if group is None:
                raise FormatError(f"format {name!r}: ')' without '('")
            if not any(it.kind == "sentence" for it in group):
                raise FormatError(f"format {name!r}: a group must contain {{i}}")
            items.append(Item("group", tuple(group)))
            group = None
        else:
            raise FormatError(
                f"format {name!r}: unexpected {tok!r} in template {template!r}; allowed items are "
                "[NAME], 'TEXT', {N}, <N>, and ( ... ) groups with {i} and <alt>"
            )
    if group is not None:
        raise FormatError(f"format {name!r}: '(' without ')'")
    if seen_sentences and any(it.kind == "group" for it in items):
        raise FormatError(f"format {name!r}: a template uses either {{N}} or a ( {{i}} ) group, not both")
    if not seen_sentences and not any(it.kind == "group" for it in items):
        raise FormatError(f"format {name!r}: the template names no sentence")
    return tuple(items)


def native_template(tokenizer, n_sentences: int = 2) -> str:
    """The tokenizer's own template in the template language: what ``tokenizer(s1, s2)`` lays out (or
    ``tokenizer(s1)`` when ``n_sentences`` is 1). Positions come from the fast tokenizer's special-tokens
    mask and sequence ids, never from searching token ids; each special position's id is then named by
    the tokenizer attribute it equals (``cls_token_id`` first, so RoBERTa's ``<s>`` is ``[CLS]`` and its
    ``</s>`` ``[SEP]``), and segment changes by the token type ids.

    >>> from transformers import AutoTokenizer                          # doctest: +SKIP
    >>> native_template(AutoTokenizer.from_pretrained("roberta-base"))   # doctest: +SKIP
    '[CLS] {1} [SEP] [SEP] {2} [SEP]'
    """
    name = getattr(tokenizer, "name_or_path", type(tokenizer).__name__)
    texts = ("a",) if n_sentences == 1 else ("a", "b")
    enc = tokenizer(*texts, return_special_tokens_mask=True, return_token_type_ids=True)
    try:
        sequence = enc.sequence_ids()
    except (AttributeError, ValueError):
        raise FormatError(f"format 'native' needs a fast tokenizer (sequence ids); {name!r} is not one") from None
    ids, mask, types = enc["input_ids"], enc["special_tokens_mask"], enc["token_type_ids"]
    names = {}  # token id -> template name, first attribute wins
    for special, attr in SPECIAL_TOKENS.items():
        token_id = getattr(tokenizer, attr + "_id", None)
        if token_id is not None:
            names.setdefault(int(token_id), special)
    items, segment, seen = [], 0, []
    for t, (token_id, special, seq, typ) in enumerate(zip(ids, mask, sequence, types)):
        if bool(special) != (seq is None):
            raise FormatError(f"tokenizer {name!r}: position {t} of its {len(texts)}-sentence template is "
                              f"{'special' if special else 'not special'} by the special-tokens mask but has "
                              f"sequence id {seq}")
        if typ != segment:
            items.append(f"<{typ}>")
            segment = typ
        if special:
            if int(token_id) not in names:
                raise FormatError(f"tokenizer {name!r} adds special token {tokenizer.convert_ids_to_tokens(token_id)!r}"
                                  f" (id {token_id}), which is none of {', '.join(SPECIAL_TOKENS.values())}")
            items.append(f"[{names[int(token_id)]}]")
        elif not seen or seen[-1] != seq:
            if seq in seen:
                raise FormatError(f"tokenizer {name!r}: sentence {seq + 1} is split in its template")
            seen.append(seq)
            items.append(f"{{{seq + 1}}}")
    if len(seen) != len(texts):
        raise FormatError(f"tokenizer {name!r}: its template holds {len(seen)} of the {len(texts)} sentences")
    return " ".join(items)


def resolve_format(fmt: Format | str, tokenizer, n_sentences: int = 2) -> Format:
    """``fmt`` itself, or for ``native`` the tokenizer's own template (:func:`native_template`): the pair
    template, or the single one when the examples have ``n_sentences`` = 1."""
    fmt = fmt if isinstance(fmt, Format) else Format.parse(fmt)
    if not fmt.is_unresolved:
        return fmt
    return Format(fmt.name, native_template(tokenizer, 1 if n_sentences == 1 else 2))


def parse_formats(specs: Iterable[str] | str) -> list[Format]:
    """Parse a list of format specs (or one comma-free string per format). Names must be unique."""
    if isinstance(specs, str):
        specs = [specs]
    out = [f if isinstance(f, Format) else Format.parse(f) for f in specs]
    names = [f.name for f in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise FormatError(f"format names must be unique; repeated: {dupes}")
    return out


# ---------------------------------------------------------------------------------------------------
# Rendering

#: Columns of the token table that identify a token across formats.
KEY_COLUMNS: tuple[str, ...] = ("example", "role", "sentence", "index", "subword")


@dataclass
class TokenizedSentence:
    """One sentence tokenized on its own (no special tokens): ids, word index and subword index per
    token, and the text of each word (from the fast tokenizer's offsets)."""

    ids: np.ndarray  # (n_tokens,) int64
    word: np.ndarray  # (n_tokens,) int32
    subword: np.ndarray  # (n_tokens,) int32
    word_text: list[str]  # one per word


def _backend(tokenizer):
    """The Rust tokenizer behind ``tokenizer`` where calling it directly gives what the transformers call
    gives, else None. That holds when the class encodes through the library's own batch method (a
    subclass that overrides it may change the text first: such tokenizers take the transformers call)."""
    try:
        import tokenizers
    except ImportError:  # pragma: no cover - transformers' fast tokenizers need it
        return None
    backend = getattr(tokenizer, "_tokenizer", None)
    if not isinstance(backend, tokenizers.Tokenizer):
        return None
    library = ("transformers.tokenization_utils_tokenizers", "transformers.tokenization_utils_fast",
               "transformers.tokenization_utils_base")
    for name in ("__call__", "_call_one", "_encode_plus", "_batch_encode_plus"):
        method = getattr(type(tokenizer), name, None)
        if method is not None and getattr(method, "__module__", None) not in library:
            return None
    return backend


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off for the block (and back on after, if it was on). Making a
    list or tuple per token triggers a collection every 700 of them, each scanning the young objects,
    and a full collection of the whole heap every so often: two thirds of the conversion's time (0.27 s
    against 0.09 s for 37,541 sentences on the 2-core machine)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _encode(tokenizer, sentences: Sequence[str], offsets: bool) -> tuple[list, list, list | None]:
    """The fast tokenizer on many sentences, no special tokens added, literal special-token text split:
    per sentence its ids, word ids and (with ``offsets``) character offsets, as lists.

    The Rust tokenizer is called directly where :func:`_backend` allows: transformers' call converts
    every encoding to a dict of lists first, which costs more than the tokenizing on a machine with
    many cores. The transformers call on the first sentence sets the Rust tokenizer the way that call
    does (special-token text split, no truncation, no padding); the direct call is used only when that
    is then its state, so both give the same tokens (``tests/test_formats.py`` compares them)."""
    kwargs = dict(add_special_tokens=False, return_offsets_mapping=offsets, return_attention_mask=False,
                  return_token_type_ids=False)
    backend = _backend(tokenizer)
    if backend is not None:
        try:
            tokenizer(list(sentences[:1]), split_special_tokens=True, **kwargs)
        except TypeError:  # older transformers without split_special_tokens: its own call below
            backend = None
    if (backend is not None and getattr(backend, "encode_special_tokens", False) is True
            and backend.truncation is None and backend.padding is None):
        encodings = backend.encode_batch(list(sentences), add_special_tokens=False)
        with _collector_paused():  # millions of small lists and tuples, none of them in a cycle
            return ([e.ids for e in encodings], [e.word_ids for e in encodings],
                    [e.offsets for e in encodings] if offsets else None)
    try:
        enc = tokenizer(list(sentences), split_special_tokens=True, **kwargs)
    except TypeError:  # older transformers without split_special_tokens
        enc = tokenizer(list(sentences), **kwargs)
    return (enc["input_ids"], [enc.word_ids(i) for i in range(len(sentences))],
            enc["offset_mapping"] if offsets else None)


def _checked_word_ids(word_ids: list, text: str) -> list:
    """``word_ids`` of sentence ``text``; a :class:`FormatError` if it has no token or a token outside
    every word."""
    if not word_ids:
        raise FormatError(f"sentence {text!r} gives no tokens")
    if None in word_ids:
        raise FormatError(f"sentence {text!r}: the tokenizer returned tokens outside any word")
    return word_ids


def count_tokens(tokenizer, sentences: Sequence[str]) -> list[int]:
    """Tokens of each sentence as :func:`tokenize_sentences` gives them (same call, same checks), without
    the offsets and per-token word bookkeeping: what planning needs, at about half the cost."""
    if not sentences:
        return []
    _, word_ids, _ = _encode(tokenizer, sentences, offsets=False)
    return [len(_checked_word_ids(w, text)) for w, text in zip(word_ids, sentences)]


@dataclass
class TokenizedFlat:
    """Many sentences tokenized on their own, as flat arrays: sentence ``i``'s tokens are
    ``bounds[i]:bounds[i + 1]`` of ``ids``, ``word`` and ``subword`` (as in :class:`TokenizedSentence`),
    and its words are ``word_bounds[i]:word_bounds[i + 1]`` of ``word_start``/``word_end`` (character
    spans in ``sentences[i]``). Word texts are cut from the sentences only when asked for (:meth:`words`):
    an extraction that stores no word needs none."""

    ids: np.ndarray  # (n_tokens,) int64
    word: np.ndarray  # (n_tokens,) int32
    subword: np.ndarray  # (n_tokens,) int32
    bounds: np.ndarray  # (n_sentences + 1,) int64
    sentences: Sequence[str]
    word_start: np.ndarray  # (n_words,) int64
    word_end: np.ndarray  # (n_words,) int64
    word_bounds: np.ndarray  # (n_sentences + 1,) int64

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def words(self, g: np.ndarray | Sequence[int]) -> list[str]:
        """The texts of words ``g`` (indices over all sentences' words)."""
        g = np.asarray(g, dtype=np.int64)
        sentence = np.searchsorted(self.word_bounds, g, side="right") - 1
        texts = self.sentences
        return [texts[s][a:b]
                for s, a, b in zip(sentence.tolist(), self.word_start[g].tolist(), self.word_end[g].tolist())]

    def sentence(self, i: int) -> "TokenizedSentence":
        a, b = int(self.bounds[i]), int(self.bounds[i + 1])
        return TokenizedSentence(ids=self.ids[a:b], word=self.word[a:b], subword=self.subword[a:b],
                                 word_text=self.words(np.arange(self.word_bounds[i], self.word_bounds[i + 1])))


def tokenize_sentences(tokenizer, sentences: Sequence[str]) -> list[TokenizedSentence]:
    """Tokenize many sentences at once with the fast tokenizer. Text that looks like a special token
    (a literal "[SEP]" in a sentence) is split as ordinary text, so a sentence cannot inject one."""
    flat = tokenize_flat(tokenizer, sentences)
    return [flat.sentence(i) for i in range(len(flat))]


def tokenize_flat(tokenizer, sentences: Sequence[str]) -> TokenizedFlat:
    """:func:`tokenize_sentences` as flat arrays (:class:`TokenizedFlat`), what :func:`render_many` reads."""
    sentences = list(sentences)
    if not sentences:
        empty = np.zeros(0, np.int64)
        return TokenizedFlat(empty, np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(1, np.int64), [],
                             empty, empty, np.zeros(1, np.int64))
    input_ids, all_word_ids, offset_lists = _encode(tokenizer, sentences, offsets=True)
    word_ids = [_checked_word_ids(w, text) for w, text in zip(all_word_ids, sentences)]
    # the whole batch as flat arrays: one pass of NumPy instead of loops over every token
    lengths = np.fromiter(map(len, word_ids), dtype=np.int64, count=len(sentences))
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    n = int(bounds[-1])
    if sum(map(len, input_ids)) != n or sum(map(len, offset_lists)) != n:
        raise FormatError("the tokenizer returned ids, offsets and word ids of different lengths")
    ids = np.fromiter(itertools.chain.from_iterable(input_ids), dtype=np.int64, count=n)
    words = np.fromiter(itertools.chain.from_iterable(word_ids), dtype=np.int64, count=n)
    offsets = np.fromiter(itertools.chain.from_iterable(itertools.chain.from_iterable(offset_lists)),
                          dtype=np.int64, count=2 * n).reshape(n, 2)
    del input_ids, all_word_ids, word_ids, offset_lists
    first_token = np.zeros(n, dtype=bool)
    first_token[bounds[:-1]] = True
    if not np.all((words[1:] >= words[:-1]) | first_token[1:]):  # word ids out of order: sentence by sentence
        parts = [_word_layout(words[a:b], offsets[a:b]) for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())]
        word_counts = [len(p[2]) for p in parts]
        return TokenizedFlat(ids, np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                             bounds, sentences, np.concatenate([p[2] for p in parts]).astype(np.int64),
                             np.concatenate([p[3] for p in parts]).astype(np.int64),
                             np.concatenate([[0], np.cumsum(word_counts)]).astype(np.int64))
    new_word = first_token.copy()
    new_word[1:] |= words[1:] != words[:-1]
    at = np.arange(n)
    word_start = np.flatnonzero(new_word)  # first token of each word, over the batch
    word_of_token = np.cumsum(new_word) - 1
    word_bounds = np.concatenate([word_of_token[bounds[:-1]], [len(word_start)]]).astype(np.int64)
    word = (word_of_token - np.repeat(word_of_token[bounds[:-1]], lengths)).astype(np.int32)
    subword = (at - np.maximum.accumulate(np.where(new_word, at, 0))).astype(np.int32)
    return TokenizedFlat(ids, word, subword, bounds, sentences, offsets[word_start, 0].copy(),
                         np.maximum.reduceat(offsets[:, 1], word_start), word_bounds)


def _word_layout(word_ids: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per token: the word index (the tokenizer's word ids renumbered densely in order of first appearance:
    they can skip numbers, e.g. a pre-tokenized word that produced no token) and the subword index (0 at
    the first token of a run of one word, counting up along the run); per word: its character span, from
    the start of its first token to the largest end of its tokens."""
    n = len(word_ids)
    at = np.arange(n)
    uniq, first, inverse = np.unique(word_ids, return_index=True, return_inverse=True)
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(uniq))
    word = rank[inverse.reshape(-1)].astype(np.int32)
    run_start = np.ones(n, dtype=bool)
    run_start[1:] = word[1:] != word[:-1]
    subword = (at - np.maximum.accumulate(np.where(run_start, at, 0))).astype(np.int32)
    starts = offsets[np.sort(first), 0]
    ends = np.zeros(len(uniq), dtype=np.int64)
    np.maximum.at(ends, word, offsets[:, 1])
    return word, subword, starts, ends


def is_literal(name: str) -> bool:
    """Whether a special item's name is a quoted literal (``"','"``) rather than a special token (``"SEP"``)."""
    return len(name) > 2 and name[0] == name[-1] == "'"


def role_of(name: str) -> str:
    """The role of a special item: ``lit`` for a literal, else the lower-cased name (``cls``, ``sep``, ...)."""
    return "lit" if is_literal(name) else name.lower()


def literal_token_id(tokenizer, fmt: Format, name: str) -> int:
    """The id of literal ``name`` (``"','"``): the text must be exactly one ordinary token of the vocabulary,
    so that the literal stands where one special token would."""
    text = name[1:-1]
    model = getattr(tokenizer, "name_or_path", type(tokenizer).__name__)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    if len(ids) != 1 or ids[0] in special or ids[0] == getattr(tokenizer, "unk_token_id", None):
        pieces = tokenizer.convert_ids_to_tokens(ids) if ids else []
        raise FormatError(f"format {fmt.name!r}: literal {name} is {len(ids)} token(s) {pieces} of tokenizer "
                          f"{model!r}; a literal must be one ordinary token of its vocabulary (e.g. ',' or '|')")
    return int(ids[0])


def special_token_ids(tokenizer, fmt: Format) -> dict[str, int]:
    """The id of every special token (and literal) the format uses; a clear error if the tokenizer lacks one,
    or has it only in name (:func:`unsaved_special_token`): the rows labelled with it would hold another
    token's states."""
    names = {v for k, v, _ in fmt.expand(max(fmt.min_sentences(), 1)) if k == "special"}
    model = getattr(tokenizer, "name_or_path", type(tokenizer).__name__)
    ids = {}
    for name in sorted(names):
        if is_literal(name):
            ids[name] = literal_token_id(tokenizer, fmt, name)
            continue
        attr = SPECIAL_TOKENS[name]
        token = getattr(tokenizer, attr, None)
        token_id = getattr(tokenizer, attr + "_id", None)
        if token is None or token_id is None:
            raise FormatError(f"format {fmt.name!r} uses [{name}] but tokenizer {model!r} has no {attr}")
        why = unsaved_special_token(tokenizer, str(token), int(token_id))
        if why is not None:
            raise FormatError(f"format {fmt.name!r} uses [{name}] but the {attr} {str(token)!r} of model {model!r} "
                              f"is not in its vocabulary: {why}, so the rows labelled [{name}] would not hold "
                              f"{str(token)!r}'s states. Give the model's own tokenizer files")
        ids[name] = int(token_id)
    return ids


def unsaved_special_token(tokenizer, token: str, token_id: int) -> str | None:
    """Why ``token`` (id ``token_id``) is not a token of the tokenizer's saved vocabulary, or None when it is.

    A vocabulary saved without e.g. ``[SEP]`` loads without complaint: transformers adds the special token the
    tokenizer config names, under a new id (an embedding row trained as another token, or none at all) or under
    an id the saved files give it that is an ordinary word piece of this vocabulary. The token counts as saved
    when the vocabulary itself (the fast tokenizer's model, without added tokens) has it at ``token_id``, or,
    for a token kept beside the vocabulary (an added token), when the saved added tokens (``tokenizer.json``'s
    or ``tokenizer_config.json``'s, which transformers keeps in ``init_kwargs``) list it at ``token_id``. A
    tokenizer without a fast backend is not checked."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    vocab = getattr(backend, "model", None)
    if vocab is None:
        return None
    saved_id = vocab.token_to_id(token)
    if saved_id == token_id:
        return None
    ordinary = vocab.id_to_token(token_id)
    if ordinary is not None:
        return f"its id {token_id} is the vocabulary's ordinary token {ordinary!r}"
    if saved_id is not None:
        return f"the vocabulary has it as id {saved_id}, but the tokenizer gives id {token_id}"
    saved = (getattr(tokenizer, "init_kwargs", None) or {}).get("added_tokens_decoder") or {}
    if str(saved.get(token_id, "")) == token:
        return None
    return (f"the tokenizer added it when it was loaded, as id {token_id} after the "
            f"{backend.get_vocab_size(with_added_tokens=False)} saved tokens")


@dataclass
class Rendered:
    """One example in one format: model inputs and one key per position."""

    input_ids: np.ndarray  # (T,) int64
    token_type_ids: np.ndarray  # (T,) int64
    role: list[str]  # (T,)
    sentence: np.ndarray  # (T,) int32: own sentence for words, the last sentence before for specials
    index: np.ndarray  # (T,) int32: word index for words, count within the gap for specials
    subword: np.ndarray  # (T,) int32
    occurrence: np.ndarray  # (T,) int32: count of this role from the start of the sequence
    word_text: list[str]  # (T,) "" for special tokens

    def __len__(self) -> int:
        return len(self.input_ids)


def render(fmt: Format, example: Example, sentences: Sequence[TokenizedSentence],
           specials: dict[str, int]) -> Rendered:
    """Lay out ``example`` (its sentences already tokenized) in ``fmt``."""
    seq = fmt.expand(example.n_sentences)
    ids: list[np.ndarray] = []
    types: list[np.ndarray] = []
    role: list[str] = []
    sent: list[np.ndarray] = []
    index: list[np.ndarray] = []
    sub: list[np.ndarray] = []
    occ: list[int | np.ndarray] = []
    text: list[str] = []
    last_sentence = 0
    gap_count: dict[str, int] = {}
    role_count: dict[str, int] = {}
    for kind, value, segment in seq:
        if kind == "special":
            r = role_of(str(value))
            j = gap_count.get(r, 0)
            gap_count[r] = j + 1
            o = role_count.get(r, 0)
            role_count[r] = o + 1
            ids.append(np.asarray([specials[value]], dtype=np.int64))
            types.append(np.asarray([segment], dtype=np.int64))
            role.append(r)
            sent.append(np.asarray([last_sentence], dtype=np.int32))
            index.append(np.asarray([j], dtype=np.int32))
            sub.append(np.zeros(1, dtype=np.int32))
            occ.append(np.asarray([o], dtype=np.int32))
            text.append("")
        else:
            ts = sentences[value - 1]
            n = len(ts.ids)
            ids.append(ts.ids)
            types.append(np.full(n, segment, dtype=np.int64))
            role.extend(["word"] * n)
            sent.append(np.full(n, value, dtype=np.int32))
            index.append(ts.word)
            sub.append(ts.subword)
            o = role_count.get("word", 0)
            role_count["word"] = o + n
            occ.append(np.arange(o, o + n, dtype=np.int32))
            text.extend(ts.word_text[w] for w in ts.word)
            last_sentence = value
            gap_count = {}
    return Rendered(
        input_ids=np.concatenate(ids), token_type_ids=np.concatenate(types), role=role,
        sentence=np.concatenate(sent), index=np.concatenate(index), subword=np.concatenate(sub),
        occurrence=np.concatenate(occ), word_text=text,
    )


#: Role names by code: words, every special token of the template language, and ``lit`` (a literal token)
#: (``probing.planning.ROLES``).
ROLE_NAMES: tuple[str, ...] = ("word",) + tuple(name.lower() for name in SPECIAL_TOKENS) + ("lit",)
_ROLE_OBJECTS = np.asarray(ROLE_NAMES, dtype=object)  # role codes -> names in one take


@dataclass
class _Piece:
    """One item of a format expanded for k sentences, with what every token it lays down shares."""

    sentence: int  # 1-based sentence for a sentence item, 0 for a special token
    token_id: int
    segment: int
    role: int  # index into ROLE_NAMES
    key_sentence: int  # the ``sentence`` column: own sentence, or the last one before a special token
    gap: int  # the ``index`` column of a special token
    occurrence: int  # the ``occurrence`` column of a special token


def _pieces(fmt: Format, k: int, specials: dict[str, int]) -> list[_Piece]:
    """``fmt.expand(k)`` with each special token's key columns, counted as :func:`render` counts them."""
    out, last, gap, count = [], 0, {}, {}
    for kind, value, segment in fmt.expand(k):
        if kind == "special":
            r = role_of(str(value))
            out.append(_Piece(0, specials[value], segment, ROLE_NAMES.index(r), last, gap.get(r, 0), count.get(r, 0)))
            gap[r] = gap.get(r, 0) + 1
            count[r] = count.get(r, 0) + 1
        else:
            out.append(_Piece(int(value), -1, segment, 0, int(value), 0, 0))
            last, gap = int(value), {}
    return out


def ranges(bounds: np.ndarray, parts: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.concatenate([np.arange(bounds[p], bounds[p + 1]) for p in parts])`` without a Python loop, and
    the length of each part."""
    p = np.asarray(parts, dtype=np.int64)
    n = bounds[p + 1] - bounds[p]
    return np.repeat(bounds[p] - np.cumsum(n) + n, n) + np.arange(int(n.sum())), n


@dataclass
class Layout:
    """Many examples rendered at once (:func:`render_many`): example ``i``'s positions are
    ``bounds[i]:bounds[i + 1]`` of every per-token array (the columns of :class:`Rendered`, with ``role``
    as codes into :data:`ROLE_NAMES` and each word token's word as an index into ``tokenized``'s words,
    -1 for a special token: role names and word texts are made only when asked for)."""

    bounds: np.ndarray  # (n + 1,) int64
    input_ids: np.ndarray  # int64
    token_type_ids: np.ndarray  # int64
    role: np.ndarray  # int64 codes into ROLE_NAMES
    sentence: np.ndarray  # int32, and so on as in Rendered
    index: np.ndarray
    subword: np.ndarray
    occurrence: np.ndarray
    word_of: np.ndarray  # int64: the word (over all of tokenized's words) of a word token, -1 for a special token
    tokenized: TokenizedFlat

    def role_names(self, positions: np.ndarray) -> list[str]:
        return _ROLE_OBJECTS[self.role[positions]].tolist()

    def word_texts(self, positions: np.ndarray) -> list[str]:
        """The word text at each flat position, "" at special tokens."""
        g = self.word_of[positions]
        out = [""] * len(g)
        is_word = np.flatnonzero(g >= 0)
        for i, text in zip(is_word.tolist(), self.tokenized.words(g[is_word])):
            out[i] = text
        return out

    def __len__(self) -> int:
        return len(self.bounds) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.bounds)

    def padded(self, examples: Sequence[int], pad_id: int, T: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(input_ids, token_type_ids, attention_mask)`` of ``examples``, each ``(B, T)`` int64, padded with
        ``pad_id``: what :func:`probing.forward.pad_arrays` gives for their :class:`Rendered`, in one gather."""
        ex = np.asarray(examples, dtype=np.int64)
        src, n = ranges(self.bounds, ex)
        rows = np.repeat(np.arange(len(ex)), n)
        cols = np.arange(len(src)) - np.repeat(np.cumsum(n) - n, n)
        ids = np.full((len(ex), T), pad_id, dtype=np.int64)
        types = np.zeros((len(ex), T), dtype=np.int64)
        mask = np.zeros((len(ex), T), dtype=np.int64)
        ids[rows, cols], types[rows, cols], mask[rows, cols] = self.input_ids[src], self.token_type_ids[src], 1
        return ids, types, mask

    def rendered(self, examples: Sequence[int] | None = None) -> list[Rendered]:
        """One :class:`Rendered` per example (all, or ``examples``), its arrays views into these."""
        b = self.bounds.tolist()
        out = []
        for i in (range(len(self)) if examples is None else examples):
            at = slice(b[i], b[i + 1])
            span = np.arange(b[i], b[i + 1])
            out.append(Rendered(input_ids=self.input_ids[at], token_type_ids=self.token_type_ids[at],
                                role=self.role_names(span), sentence=self.sentence[at], index=self.index[at],
                                subword=self.subword[at], occurrence=self.occurrence[at],
                                word_text=self.word_texts(span)))
        return out

    def positions_of(self, roles: Iterable[str]) -> np.ndarray:
        """The flat positions whose role is in ``roles``, ascending (so example by example)."""
        return np.flatnonzero(np.isin(self.role, [ROLE_NAMES.index(r) for r in roles]))

    def split(self, at: np.ndarray) -> list[np.ndarray]:
        """Flat positions ``at`` (ascending) as positions within each example, one array per example."""
        cut = np.searchsorted(at, self.bounds)
        return [at[a:b] - s for a, b, s in zip(cut[:-1].tolist(), cut[1:].tolist(), self.bounds[:-1].tolist())]


def render_many(fmt: Format, examples: Sequence[Example], sentence_rows: Sequence[int] | np.ndarray,
                tokenized: TokenizedFlat, specials: dict[str, int]) -> Layout:
    """What :func:`render` gives for each of ``examples``, as one :class:`Layout` (``.rendered()`` gives
    the list), laid out for all examples at once with array operations. ``sentence_rows``: the rows of
    ``tokenized`` holding the examples' sentences, example after example (each example's sentences in
    order). The same tokens and keys as :func:`render` (``tests/test_formats.py`` compares them over every
    built-in format and mixed sentence counts)."""
    n = len(examples)
    counts = np.fromiter((len(e.sentences) for e in examples), dtype=np.int64, count=n)
    sentence_rows = np.asarray(sentence_rows, dtype=np.int64)
    if len(sentence_rows) != int(counts.sum()):
        raise ValueError(f"{len(sentence_rows)} sentence rows for {int(counts.sum())} sentences")
    first = np.cumsum(counts) - counts  # each example's first entry in sentence_rows
    sizes = np.diff(tokenized.bounds)
    per_k = {}
    lengths = np.zeros(n, dtype=np.int64)
    for k in np.unique(counts).tolist():
        rows = np.flatnonzero(counts == k)
        pieces = _pieces(fmt, k, specials)
        sent = sentence_rows[first[rows][:, None] + np.arange(k)]  # (R, k)
        which = np.asarray([p.sentence for p in pieces], dtype=np.int64)  # (J,) 0 for specials
        src = np.where(which > 0, sent[:, np.maximum(which - 1, 0)], -1)  # (R, J) tokenized row, -1 special
        piece_len = np.where(src >= 0, sizes[np.maximum(src, 0)], 1)
        lengths[rows] = piece_len.sum(1)
        per_k[k] = (rows, pieces, src, piece_len)
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    total = int(bounds[-1])
    ids = np.empty(total, dtype=np.int64)
    types = np.empty(total, dtype=np.int64)
    role = np.empty(total, dtype=np.int64)
    sentence = np.empty(total, dtype=np.int32)
    index = np.empty(total, dtype=np.int32)
    subword = np.empty(total, dtype=np.int32)
    occurrence = np.empty(total, dtype=np.int32)
    word_of = np.full(total, -1, dtype=np.int64)  # global word of each word token
    for rows, pieces, src, piece_len in per_k.values():
        J = len(pieces)
        col = {f: np.asarray([getattr(p, f) for p in pieces], dtype=np.int64)
               for f in ("token_id", "segment", "role", "key_sentence", "gap", "occurrence")}
        is_word = src >= 0
        # words laid down before each piece of an example: its word tokens' occurrence starts there
        word_base = np.cumsum(np.where(is_word, piece_len, 0), axis=1) - np.where(is_word, piece_len, 0)
        start = bounds[rows][:, None] + np.cumsum(piece_len, axis=1) - piece_len  # (R, J) first token
        flat_len = piece_len.ravel()
        m = int(flat_len.sum())
        piece = np.repeat(np.arange(flat_len.size), flat_len)
        offset = np.arange(m) - np.repeat(np.cumsum(flat_len) - flat_len, flat_len)
        at = start.ravel()[piece] + offset
        j = piece % J
        word = is_word.ravel()[piece]
        s = src.ravel()[piece]
        tok = np.where(word, tokenized.bounds[np.maximum(s, 0)] + offset, 0)
        ids[at] = np.where(word, tokenized.ids[tok], col["token_id"][j])
        types[at] = col["segment"][j]
        role[at] = col["role"][j]
        sentence[at] = col["key_sentence"][j]
        index[at] = np.where(word, tokenized.word[tok], col["gap"][j])
        subword[at] = np.where(word, tokenized.subword[tok], 0)
        occurrence[at] = np.where(word, word_base.ravel()[piece] + offset, col["occurrence"][j])
        word_of[at] = np.where(word, tokenized.word_bounds[np.maximum(s, 0)] + tokenized.word[tok], -1)
    return Layout(bounds, ids, types, role, sentence, index, subword, occurrence, word_of, tokenized)
