"""Input formats: a small template language, the built-in formats, and rendering with token keys.

Template language (items separated by white space)::

    [NAME]      a special token of the tokenizer: [CLS] [SEP] [BOS] [EOS] [MASK] [PAD] [UNK]
                ([CLS] is "<s>" for RoBERTa, "[CLS]" for BERT: the tokenizer decides)
    {N}         sentence N of the example (1-based)
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

_TOKEN_RE = re.compile(r"\[[A-Za-z_]+\]|\{\d+\}|\{i\}|<\d+>|<alt>|\(|\)|\S+")


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
                "[NAME], {N}, <N>, and ( ... ) groups with {i} and <alt>"
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


def _encode(tokenizer, sentences: Sequence[str], offsets: bool):
    """The fast tokenizer on many sentences, no special tokens added, literal special-token text split."""
    kwargs = dict(add_special_tokens=False, return_offsets_mapping=offsets, return_attention_mask=False,
                  return_token_type_ids=False)
    try:
        return tokenizer(list(sentences), split_special_tokens=True, **kwargs)
    except TypeError:  # older transformers without split_special_tokens
        return tokenizer(list(sentences), **kwargs)


def _checked_word_ids(enc, i: int, text: str) -> list:
    """Word ids of sentence ``i`` of ``enc``; a :class:`FormatError` if it has no token or a token outside
    every word."""
    word_ids = enc.word_ids(i)
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
    enc = _encode(tokenizer, sentences, offsets=False)
    return [len(_checked_word_ids(enc, i, text)) for i, text in enumerate(sentences)]


def tokenize_sentences(tokenizer, sentences: Sequence[str]) -> list[TokenizedSentence]:
    """Tokenize many sentences at once with the fast tokenizer. Text that looks like a special token
    (a literal "[SEP]" in a sentence) is split as ordinary text, so a sentence cannot inject one."""
    if not sentences:
        return []
    enc = _encode(tokenizer, sentences, offsets=True)
    word_ids = [_checked_word_ids(enc, i, text) for i, text in enumerate(sentences)]
    # the whole batch as flat arrays: one pass of NumPy instead of loops over every token
    lengths = np.fromiter(map(len, word_ids), dtype=np.int64, count=len(sentences))
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    n = int(bounds[-1])
    if sum(map(len, enc["input_ids"])) != n or sum(map(len, enc["offset_mapping"])) != n:
        raise FormatError("the tokenizer returned ids, offsets and word ids of different lengths")
    ids = np.fromiter(itertools.chain.from_iterable(enc["input_ids"]), dtype=np.int64, count=n)
    words = np.fromiter(itertools.chain.from_iterable(word_ids), dtype=np.int64, count=n)
    offsets = np.fromiter(itertools.chain.from_iterable(itertools.chain.from_iterable(enc["offset_mapping"])),
                          dtype=np.int64, count=2 * n).reshape(n, 2)
    first_token = np.zeros(n, dtype=bool)
    first_token[bounds[:-1]] = True
    if not np.all((words[1:] >= words[:-1]) | first_token[1:]):  # word ids out of order: sentence by sentence
        return [_tokenized(text, ids[a:b], *_word_layout(words[a:b], offsets[a:b]))
                for text, a, b in zip(sentences, bounds[:-1].tolist(), bounds[1:].tolist())]
    new_word = first_token.copy()
    new_word[1:] |= words[1:] != words[:-1]
    at = np.arange(n)
    word_start = np.flatnonzero(new_word)  # first token of each word, over the batch
    word_of_token = np.cumsum(new_word) - 1
    word_bounds = word_of_token[bounds[:-1]].tolist() + [len(word_start)]
    word = (word_of_token - np.repeat(word_of_token[bounds[:-1]], lengths)).astype(np.int32)
    subword = (at - np.maximum.accumulate(np.where(new_word, at, 0))).astype(np.int32)
    starts = offsets[word_start, 0].tolist()
    ends = np.maximum.reduceat(offsets[:, 1], word_start).tolist() if n else []
    b = bounds.tolist()
    return [TokenizedSentence(ids=ids[b[i]:b[i + 1]], word=word[b[i]:b[i + 1]], subword=subword[b[i]:b[i + 1]],
                              word_text=[text[s_:e_] for s_, e_ in zip(starts[word_bounds[i]:word_bounds[i + 1]],
                                                                        ends[word_bounds[i]:word_bounds[i + 1]])])
            for i, text in enumerate(sentences)]


def _tokenized(text: str, ids: np.ndarray, word: np.ndarray, subword: np.ndarray, starts: np.ndarray,
               ends: np.ndarray) -> TokenizedSentence:
    return TokenizedSentence(ids=ids, word=word, subword=subword,
                             word_text=[text[s:e] for s, e in zip(starts.tolist(), ends.tolist())])


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


def special_token_ids(tokenizer, fmt: Format) -> dict[str, int]:
    """The id of every special token the format uses; a clear error if the tokenizer lacks one."""
    names = {v for k, v, _ in fmt.expand(max(fmt.min_sentences(), 1)) if k == "special"}
    ids = {}
    for name in sorted(names):
        attr = SPECIAL_TOKENS[name]
        token = getattr(tokenizer, attr, None)
        token_id = getattr(tokenizer, attr + "_id", None)
        if token is None or token_id is None:
            raise FormatError(
                f"format {fmt.name!r} uses [{name}] but tokenizer "
                f"{getattr(tokenizer, 'name_or_path', type(tokenizer).__name__)!r} has no {attr}"
            )
        ids[name] = int(token_id)
    return ids


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
            r = str(value).lower()
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
