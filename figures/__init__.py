"""Figures: plot functions that read result tables only (never caches or models)."""

import sys as _sys

if getattr(_sys, "argv", [None])[:1] == ["-m"]:  # Python is locating a module to run: refuse a library module
    from probing.module_guard import refuse_library_run

    refuse_library_run()
del _sys
