"""``fastinfer tune``: the search (search.py), what it writes (files.py), the command (__main__.py)."""
