"""The one page of answers that opens a study's report.

Each question gets one line in the asker's own words and an :class:`Answer`: plain words with one number
and the yardstick that says whether the number is large, and a word for how sure the study is. An answer
has at most :data:`MAX_WORDS` words and the page's answers together at most :data:`MAX_PAGE_WORDS`; the
evidence, the rules and the provenance follow further down the report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from .rules import Confidence

#: Most words one answer may have, and all the answers of a page together.
MAX_WORDS = 60
MAX_PAGE_WORDS = 500

#: The words a reader sees for each confidence level (:func:`probing.study.rules.confidence`).
CONFIDENCE_WORDS: dict[str, str] = {
    "high": "confident",
    "moderate": "fairly confident",
    "low": "not sure",
}

_MARKUP = re.compile(r"[`*_\[\]]")


def word_count(text: str) -> int:
    """Words a reader reads: whitespace-separated items that hold a letter or a digit (markup and lone
    punctuation are not words).

    >>> word_count("Yes: `concat` scores 2.3 points less (CI −0.4 to +5.0) — see Q8.")
    12
    """
    return sum(1 for w in _MARKUP.sub("", text).split() if any(c.isalnum() for c in w))


@dataclass(frozen=True)
class Answer:
    """A plain answer: ``text`` (with one number and its yardstick), ``confidence`` (high, moderate or
    low) and ``preset``: the preset of the run the numbers come from (``quick`` answers are announced)."""

    text: str
    confidence: Confidence
    preset: str = "default"

    def __post_init__(self) -> None:
        if self.confidence not in CONFIDENCE_WORDS:
            raise ValueError(f"confidence must be one of {sorted(CONFIDENCE_WORDS)}, got {self.confidence!r}")

    @property
    def words(self) -> int:
        return word_count(self.text)

    def line(self) -> str:
        """The answer as the page prints it: the text and the confidence word."""
        return f"{self.text} *({CONFIDENCE_WORDS[self.confidence]})*"


def not_measured(what: str, preset: str = "default") -> Answer:
    """The answer of a question whose tables this run did not produce."""
    return Answer(f"Not measured in this run: {what}.", "low", preset)


@dataclass(frozen=True)
class PageItem:
    key: str        # "Q1"
    asked: str      # the asker's question
    answer: Answer
    anchor: str     # the report anchor of the question's evidence


def check_page(items: Sequence[PageItem]) -> list[str]:
    """The limits the page breaks, in words (empty when it keeps them)."""
    problems = [f"{it.key}: {it.answer.words} words (at most {MAX_WORDS})" for it in items
                if it.answer.words > MAX_WORDS]
    total = sum(it.answer.words for it in items)
    if total > MAX_PAGE_WORDS:
        problems.append(f"all answers: {total} words (at most {MAX_PAGE_WORDS})")
    return problems


def answer_page(model_line: str, items: Sequence[PageItem], preset_line: str = "") -> str:
    """The answers in markdown: the model in one line, then each question (the asker's words, linked to its
    evidence) with its answer."""
    out = ["## Answers", "", model_line]
    if preset_line:
        out += ["", preset_line]
    out.append("")
    for it in items:
        out.append(f"**{it.key}. {it.asked}** [evidence](#{it.anchor})  ")
        out.append(it.answer.line())
        out.append("")
    return "\n".join(out)
