"""Figures: plot functions that read result tables only (never caches or models)."""
