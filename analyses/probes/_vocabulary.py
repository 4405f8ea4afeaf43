"""Which words a bag-of-words target asks about: content words, or function words as a control.

Declared once here and used by every bag-of-words target of :mod:`analyses.probes._runner`:

* :data:`STOP_WORDS`: scikit-learn's ``ENGLISH_STOP_WORDS`` (318 function words: the, to, of, and,
  ...), plus clitic fragments the tokenisation leaves ("s", "t", ...);
* :data:`MAX_SENTENCE_FREQUENCY`: the top frequency band, every word found in more than this fraction
  of the corpus's sentences (BBC's "said", a template word of the generated corpus);
* :func:`content_vocabulary`: the ``size`` most frequent remaining words (``bow_s<i>`` targets);
* :func:`function_vocabulary`: the ``size`` most frequent stop words (``fw_s<i>``: a named
  control; function-word presence mostly tracks sentence length).

Counting is :class:`sklearn.feature_extraction.text.CountVectorizer` (binary, lower-cased, words
``[a-z0-9']+``), so "frequent" means "in many sentences".

>>> sents = ["The cat sat", "The cat ran", "A cat sang", "The dog sat"]
>>> content_vocabulary(sents, 2, max_frequency=0.6)  # "cat" is in 3/4 of the sentences: the top band
['sat', 'dog']
>>> function_vocabulary(sents, 2)
['the', 'a']
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS, CountVectorizer

#: Function words no content target asks about.
STOP_WORDS: frozenset[str] = frozenset(ENGLISH_STOP_WORDS) | frozenset({"s", "t", "d", "ll", "m", "re", "ve"})
#: Words present in more than this fraction of sentences are the top frequency band, left out of content targets.
MAX_SENTENCE_FREQUENCY: float = 0.1
#: Word pattern (lower-cased text): letters, digits and apostrophes.
TOKEN_PATTERN = r"[a-z0-9']+"
_WORDS = re.compile(TOKEN_PATTERN)


def words_of(text: str) -> list[str]:
    """The words of ``text`` as every bag-of-words target sees them (lower-cased, :data:`TOKEN_PATTERN`)."""
    return _WORDS.findall(text.lower())  # what CountVectorizer(token_pattern=TOKEN_PATTERN) sees


def _top(sentences: Sequence[str], size: int, **kw) -> list[str]:
    if size < 1:
        raise ValueError(f"a vocabulary needs size >= 1, got {size=}")
    vec = CountVectorizer(token_pattern=TOKEN_PATTERN, binary=True, lowercase=True, **kw)
    try:
        counts = np.asarray(vec.fit_transform(list(sentences)).sum(axis=0)).ravel()
    except ValueError:  # sklearn: "empty vocabulary" / "max_df corresponds to < documents than min_df"
        return []
    words = vec.get_feature_names_out()
    order = np.lexsort((words, -counts))  # most frequent first, ties alphabetical
    return [str(words[i]) for i in order[:size]]


def content_vocabulary(sentences: Sequence[str], size: int, max_frequency: float = MAX_SENTENCE_FREQUENCY) -> list[str]:
    """The ``size`` words in the most sentences, stop words (:data:`STOP_WORDS`) and words in more than
    ``max_frequency`` of the sentences left out."""
    return _top(sentences, size, stop_words=sorted(STOP_WORDS), max_df=max_frequency)


def function_vocabulary(sentences: Sequence[str], size: int) -> list[str]:
    """The ``size`` stop words (:data:`STOP_WORDS`) in the most sentences."""
    return _top(sentences, size, vocabulary=sorted(STOP_WORDS))


def presence(sentences: Sequence[str], vocabulary: Sequence[str]) -> np.ndarray:
    """``(n_sentences, len(vocabulary))`` 0/1: whether each word occurs in each sentence."""
    vec = CountVectorizer(token_pattern=TOKEN_PATTERN, binary=True, vocabulary=list(vocabulary))
    return np.asarray(vec.transform(list(sentences)).toarray(), dtype=np.int64)
