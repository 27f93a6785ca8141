"""Which tree a test module belongs in (tests/README.md), decided from what it imports and uses.

``python tests/_layout.py tests/test_new.py`` prints the tree for each file named, with the
evidence; ``tests/unit/test_layout.py`` holds every module to it.

- ``e2e``: the test starts, signals or kills a real process other than pytest's own (directly,
  through the CLI/serve helpers, or through the task supervisor), or drives Node, a browser
  or a built wheel.
- ``service``: otherwise, it runs an in-process service, HTTP app or listener, the worker
  loop, a CLI entry point in-process, or a fake HTTP server.
- ``unit``: neither: pure code and storage.

The evidence is read from the module's syntax tree (imports, attribute reads, fixture names),
never from comments or strings, and from the names it imports out of the shared helper
modules, whose own kinds are listed here by name.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

TREES = ("unit", "service", "e2e")
RANK = {kind: i for i, kind in enumerate(TREES)}

# Imported modules (or their parents) that are evidence by themselves.
MODULES = {
    "subprocess": "e2e",
    "multiprocessing": "e2e",
    "playwright": "e2e",
    "_killhelpers": "e2e",
    "_task_crash_host": "e2e",
    "_node": "e2e",
    "httpx": "service",
    "socket": "service",
    "hypercorn": "service",
    "quart": "service",
    "afterword.http": "service",
    "afterword.cli": "service",
    "afterword.runtime": "service",
    "afterword.app": "service",
    "afterword.worker.loop": "service",
    "fakes.harness": "service",
    "fakes.producer": "service",
    "_world": "service",
    "_ui": "service",
}
# Names imported from a module: (module, name) -> kind.
NAMES = {
    ("_cli", "Server"): "e2e",
    ("_cli", "served"): "e2e",
    ("_cli", "run_cli"): "e2e",
    ("_cli", "run_printed"): "e2e",
    ("_cli", "cli"): "e2e",
    ("_cli", "FakeWebhook"): "service",
    ("_service", "free_port"): "service",
    ("afterword.tasks", "ProcessSupervisor"): "e2e",
    ("afterword.tasks", "TaskRuntime"): "e2e",
    ("afterword.tasks.supervisor", "ProcessSupervisor"): "e2e",
    ("afterword.tasks.runtime", "TaskRuntime"): "e2e",
    ("afterword", "open_service"): "service",
    ("afterword", "ContinuationService"): "service",
    ("afterword.worker", "Worker"): "service",
    ("tools.killtest", "run_killtest"): "e2e",  # SIGKILLs real serve processes
    ("tools.killtest.tasks", "run_tasks_killtest"): "e2e",  # the same with MCP Tasks
}
FAKE_SERVERS = {"FakeServer", "FakeSlack", "FakeWebhook", "FakeOpenAI", "FakeAnthropic"}
# Attribute reads on a name: (name, attribute) -> kind.
ATTRIBUTES = {
    ("sys", "executable"): "e2e",
    ("os", "fork"): "e2e",
    ("os", "kill"): "e2e",
    ("os", "killpg"): "e2e",
}
# Attribute reads by name alone: an app's in-process test client, the service's opener.
ATTRIBUTE_NAMES = {"test_client": "service", "test_app": "service", "open_service": "service"}
# Fixtures (a test's parameter names) from conftest.py.
FIXTURES = {"node": "e2e", "hook": "service"}


def evidence(source: str, tests_dir: Path) -> dict[str, str]:
    """What in ``source`` says which tree it needs: {what: kind}."""
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                _module(alias.name, found, tests_dir)
        elif isinstance(node, ast.ImportFrom) and node.module:
            _module(node.module, found, tests_dir)
            for alias in node.names:
                kind = NAMES.get((node.module, alias.name))
                if node.module == "fakes" and alias.name in FAKE_SERVERS:
                    kind = "service"
                if kind:
                    found[f"{node.module}.{alias.name}"] = kind
        elif isinstance(node, ast.Attribute):
            owner = node.value.id if isinstance(node.value, ast.Name) else ""
            kind = ATTRIBUTES.get((owner, node.attr)) or ATTRIBUTE_NAMES.get(node.attr)
            if kind:
                found[f"{owner}.{node.attr}" if owner else f".{node.attr}"] = kind
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
            for arg in node.args.args:
                kind = FIXTURES.get(arg.arg)
                if kind:
                    found[f"fixture {arg.arg}"] = kind
    return found


def _module(name: str, found: dict[str, str], tests_dir: Path) -> None:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        kind = MODULES.get(".".join(parts[:i]))
        if kind:
            found[name] = kind
            return
    name = name.removeprefix("tests.")
    if name.startswith("test_"):  # another test module: what it needs, this one needs too
        other = next(tests_dir.rglob(name + ".py"), None)
        if other is not None:
            found[name] = kind_of(other, tests_dir)


def kind_of(path: Path, tests_dir: Path) -> str:
    found = evidence(path.read_text(), tests_dir)
    return max(found.values(), key=RANK.__getitem__, default="unit")


def main(argv: list[str]) -> int:
    tests_dir = Path(__file__).resolve().parent
    for arg in argv:
        path = Path(arg)
        found = evidence(path.read_text(), tests_dir)
        kind = max(found.values(), key=RANK.__getitem__, default="unit")
        why = ", ".join(sorted(what for what, k in found.items() if k == kind)) or "no server, no process"
        print(f"{path.name}: tests/{kind}/  ({why})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
