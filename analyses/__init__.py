"""Analyses: pure metric functions of arrays, and thin runners that read caches and write tidy tables."""
