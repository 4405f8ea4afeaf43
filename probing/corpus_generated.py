"""The generated corpus: template sentences on five topics, no optional package needed (see
:func:`generated_corpus`)."""

from __future__ import annotations

import random
import re
from typing import Any, Mapping

from probing.corpus_pairs import (
    check_k_pairing, check_negatives, check_positive, n_words, nsp_negatives, same_article_candidates,
)
from probing.examples import Example, Label

__all__ = ["MAX_DRAWS", "generated_corpus"]

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


#: Draws of a template sentence before :func:`generated_corpus` gives up finding one that no other document
#: of the corpus has (the templates allow thousands of sentences per topic: a collision is rare).
MAX_DRAWS = 1000


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
    document has one); ``"other_topic"``, a fresh sentence of a random other topic.
    Ids are ``"doc0007:1"`` (document, group).

    No sentence belongs to two documents: a drawn sentence that another document already has is drawn
    again (a rare collision of the templates; corpora without one are unchanged by this rule), and a fresh
    replacement is one that no document has; so a split or bootstrap by document never puts the same text
    on both sides.

    >>> ex = generated_corpus(n_examples=6, k=2, seed=0)
    >>> len(ex), sum(e.labels["is_next"] for e in ex), ex == generated_corpus(n_examples=6, k=2, seed=0)
    (6, 3, True)
    >>> all(e.labels["topic_s2"] == e.labels["topic"] for e in ex)
    True
    """
    check_k_pairing(k, pairing)
    check_positive("n_examples", n_examples)
    check_negatives(negatives)
    rng = random.Random(seed)
    topics = tuple(_TOPIC_WORDS)
    count = {t: 0 for t in topics}
    docs: list[tuple[str, str, list[str]]] = []  # (doc id, topic, sentences)
    rows: list[tuple[str, int]] = []  # (doc index, group)
    protagonists: list[str] = []
    owner: dict[str, int] = {}  # sentence -> the document that has it

    def fresh(topic: str, name: str, doc: int) -> str:
        """A template sentence no other document has (drawn again on a collision), now ``doc``'s."""
        for _ in range(MAX_DRAWS):
            text = _fill(rng.choice(_TEMPLATES), _TOPIC_WORDS[topic], name, rng)
            if owner.setdefault(text, doc) == doc:
                return text
        raise ValueError(f"generated corpus: no new {topic} sentence in {MAX_DRAWS} draws; use fewer examples")

    while len(rows) < n_examples:
        fewest = min(count.values())
        topic = rng.choice([t for t in topics if count[t] == fewest])
        n_groups = min(rng.randint(2, 4), n_examples - len(rows))
        name = rng.choice(_NAMES)
        sentences = [fresh(topic, name, len(docs)) for _ in range(n_groups * k)]
        docs.append((f"doc{len(docs):04d}", topic, sentences))
        protagonists.append(name)
        rows.extend((len(docs) - 1, g) for g in range(n_groups))
        count[topic] += n_groups

    nsp = k >= 2 and pairing == "nsp"
    eligible = None
    if nsp and negatives == "same_article":
        eligible = [i for i, (d, g) in enumerate(rows) if same_article_candidates(len(docs[d][2]), g * k, k)]
    negs = nsp_negatives(len(rows), rng, eligible) if nsp else set()
    examples = []
    for i, (d, g) in enumerate(rows):
        doc_id, topic, sentences = docs[d]
        group = list(sentences[g * k:(g + 1) * k])
        labels: dict[str, Label] = {"topic": topic, "doc": doc_id, "n_words": n_words(group[0])}
        if k >= 2:
            last_topic = topic
            if i in negs:
                if negatives == "same_article":
                    group[-1] = sentences[rng.choice(same_article_candidates(len(sentences), g * k, k))]
                else:  # a fresh sentence (of the topic, or of another), another protagonist, no document's
                    if negatives == "other_topic":
                        last_topic = rng.choice([t for t in topics if t != topic])
                    name = rng.choice([x for x in _NAMES if x != protagonists[d]])
                    group[-1] = fresh(last_topic, name, -1 - i)  # an owner of its own: no document has it
            labels["is_next"] = int(i not in negs)
            labels.update({f"topic_s{j}": topic for j in range(2, k)})
            labels[f"topic_s{k}"] = last_topic
        examples.append(Example(f"{doc_id}:{g}", tuple(group), labels))
    return examples
