"""Standalone, torch-only reproductions of catalogued cases; each file is pasteable into an upstream issue.

Every module has `bug()` and `fix()` returning plain JSON-able observations, and runs on its own:
`python -m toolkit.standalone.c08_lru_recompute` (or `python path/to/file.py`). `toolkit.bugs` loads them by case id.
"""
