"""The study's one error type, below every study module so that any of them can raise it."""

from __future__ import annotations


class StudyError(ValueError):
    """A study config is malformed, or a question cannot run on the corpora it was given."""
