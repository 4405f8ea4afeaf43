"""The seed questions, one module each (``q1.py`` ... ``q8.py``), each declaring a
:class:`~probing.study.questions._base.Question`; :data:`QUESTIONS` lists them in report order.

Adding a question is one module here plus its key in :data:`QUESTIONS` and in a study config's
``[study] questions``.
"""

from __future__ import annotations

from . import q1, q2, q4, q6, q7, q8
from ._base import Question
from .q3 import QUESTION as Q3
from .q5 import QUESTION as Q5

#: The questions answered by a question module, by key, in report order.
QUESTIONS: dict[str, Question] = {q.key: q for q in (q1.QUESTION, q2.QUESTION, Q3, q4.QUESTION, Q5, q6.QUESTION,
                                                     q7.QUESTION, q8.QUESTION)}

__all__ = ["QUESTIONS", "Question"]
