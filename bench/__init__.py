"""Benchmarks of afterword's durability layer.

``python -m bench.compare`` measures afterword side by side with the disk's own limit, SQLite
and LMDB in one run; ``python -m pytest bench`` runs the pytest-benchmark suites. Both keep
their files in temporary directories on the same file system as the repository.
"""
