"""Which documents pretraining holds out: a fixed hash of each document's id, the same on every machine, so
text a model pretrained here never saw can be chosen from the file names alone (:mod:`probing.pretrain`,
``bbc:...,pretrain_heldout=F`` of :mod:`probing.corpora`)."""

from __future__ import annotations

import hashlib

__all__ = ["is_heldout", "unit"]


def unit(text: str, salt: str) -> float:
    """A fixed pseudo-random number in [0, 1) for ``text``: the same on every machine and run."""
    return int(hashlib.sha256(f"{salt}:{text}".encode()).hexdigest()[:15], 16) / 16 ** 15


def is_heldout(doc_id: str, heldout_fraction: float) -> bool:
    """Whether pretraining holds out the document ``doc_id`` (e.g. ``"bbc/tech/001"``) at ``[corpus]
    heldout_fraction``: text a model pretrained on that config never saw."""
    return unit(doc_id, "heldout") < heldout_fraction
