"""probing: measure what input formatting does to the representations of BERT-like encoders.

The pipeline runs one way: corpus -> examples -> formats -> extract -> cache -> analyses -> results
-> figures -> report. This package owns everything up to the cache; ``analyses`` reads caches and
writes tidy tables; ``figures`` reads tables only.
"""

__version__ = "0.1.0"
