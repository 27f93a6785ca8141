"""Packaging beyond what pyproject.toml can say: the examples ship inside the wheel.

``afterword demo`` runs ``examples/work_control_server.py`` and ``examples/reference_host.py``;
an installed wheel has no source checkout, so the examples directory is mapped to the
``afterword.examples`` package (only in built distributions; an editable install keeps using
the checkout's ``examples/``). Everything else is in pyproject.toml.

There is no compiled code: replay runs in Python everywhere (``docs/performance.md``, "One
replay path in Python").
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["afterword", "afterword.*"]), "afterword.examples"],
    package_dir={"afterword.examples": "examples"},
    # http/openapi.json is generated from the wire types (python -m afterword.http.openapi).
    # http/ui/templates and http/ui/static are the status page (served from the package: no
    # external assets).
    package_data={
        "afterword": ["py.typed", "http/openapi.json", "http/ui/templates/*.html", "http/ui/static/*"],
        "afterword.examples": ["*.json", "*.sh"],
    },
)
