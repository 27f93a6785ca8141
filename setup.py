"""Packaging beyond what pyproject.toml can say: the examples ship inside the wheel.

``afterword demo`` runs ``examples/work_control_server.py`` and ``examples/reference_host.py``;
an installed wheel has no source checkout, so the examples directory is mapped to the
``afterword.examples`` package (only in built distributions; an editable install keeps using
the checkout's ``examples/``). Everything else is in pyproject.toml.

The WAL's replay scan has an optional C loop (``afterword/wal/_fastscan.c``, no third-party
source). ``optional=True``: without a compiler or Python headers the build skips it with a
warning and replay uses the pure-Python loop (``afterword/wal/native.py``). The same holds
for the store replay's first pass (``afterword/store/_fastreplay.c``, ``store/native.py``).
"""

from setuptools import Extension, find_packages, setup

setup(
    packages=[*find_packages(include=["afterword", "afterword.*"]), "afterword.examples"],
    package_dir={"afterword.examples": "examples"},
    ext_modules=[
        Extension("afterword.wal._fastscan", ["afterword/wal/_fastscan.c"], optional=True),
        Extension("afterword.store._fastreplay", ["afterword/store/_fastreplay.c"], optional=True),
    ],
    # http/openapi.json is generated from the wire types (python -m afterword.http.openapi).
    # http/ui/templates and http/ui/static are the status page (served from the package: no
    # external assets).
    package_data={
        "afterword": ["py.typed", "wal/_fastscan.pyi", "store/_fastreplay.pyi", "http/openapi.json", "http/ui/templates/*.html", "http/ui/static/*"],
        "afterword.examples": ["*.json", "*.sh"],
    },
)
