"""The project uses the frameworks it runs on through their supported APIs only.

Every underscore attribute the project's code reads or writes must be one the project defines itself:
a private attribute of Django, asgiref, Channels, channels_redis, Daphne, Twisted, autobahn, psycopg (or
any other library) would have to be re-audited at every upgrade. The check parses every Python module
of the project (the apps, the site, the client, the benchmarks and the tests) and looks at

* attribute names starting with one underscore (``x._cache``; name-mangled ``_Class__name`` included),
* underscore names imported from a module that is not the project's (``from asyncio.events import _x``),
* underscore names given to ``getattr`` / ``setattr`` / ``hasattr`` / ``delattr`` as a string,

and accepts a name only when the project itself defines it (a function, method or class, an assignment
or annotation, a parameter or a keyword) or when it is in :data:`ALLOWED` with the reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT_DIRS = (
    "openclaw_site",
    "gateway",
    "devices_app",
    "approvals_app",
    "sessions_app",
    "native_harness",
    "workers_app",
    "operator_ui",
    "openclaw_client",
    "bench",
    "tests",
)
PROJECT_PACKAGES = frozenset(PROJECT_DIRS) | {"manage"}
ACCESSORS = frozenset({"getattr", "setattr", "hasattr", "delattr"})

# Underscore names of libraries that their documentation makes public, each with where it says so.
ALLOWED = {
    # Django documents the model ``_meta`` API ("Model _meta API", docs/ref/models/meta).
    "_meta": "Django's documented Model _meta API",
    # Django documents ``Model._state`` (its ``adding`` and ``db``) in the model instance reference.
    "_state": "Django's documented Model._state (ref/models/instances)",
    # Python's own, not a library's: named tuples' (urllib's SplitResult among them) documented method.
    "_replace": "collections.namedtuple's documented method",
}


def _modules() -> list[Path]:
    files = [ROOT / "manage.py"]
    for directory in PROJECT_DIRS:
        files += [p for p in (ROOT / directory).rglob("*.py") if "migrations" not in p.parts or directory == "tests"]
    return sorted(files)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _attribute_definitions(tree: ast.AST) -> set[str]:
    """Underscore attributes this module defines on its own classes and objects: methods and class-level
    names of its classes, and what its methods set on ``self`` / ``cls``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    names.add(item.name)
                elif isinstance(item, ast.Assign):
                    names.update(t.id for t in item.targets if isinstance(t, ast.Name))
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store | ast.Del)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            names.add(node.attr)
    return {name for name in names if _private(name)}


def _module_definitions(tree: ast.AST) -> set[str]:
    """Underscore names a module defines at its top level (reached from other modules as ``module._x``)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return {name for name in names if _private(name)}


def _imports_the_project(node: ast.ImportFrom) -> bool:
    return node.level > 0 or (node.module or "").split(".")[0] in PROJECT_PACKAGES


def _project_module_aliases(tree: ast.AST) -> set[str]:
    """Local names bound to the project's own modules (``from gateway import lifecycle``)."""
    aliases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (
            node.level > 0 or (node.module or "").split(".")[0] in PROJECT_PACKAGES
        ):
            aliases.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PROJECT_PACKAGES:
                    aliases.add(alias.asname or alias.name.split(".")[0])
    return aliases


def _library_imports(tree: ast.AST) -> set[str]:
    return {
        name.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
        if node.module.split(".")[0] not in PROJECT_PACKAGES
        for name in node.names
        if _private(name.name)
    }


def _uses(tree: ast.AST) -> list[tuple[int, str, bool]]:
    """(line, name, whether it is read off one of the project's own modules) of every underscore attribute."""
    modules = _project_module_aliases(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            of_module = isinstance(node.value, ast.Name) and node.value.id in modules
            found.append((node.lineno, node.attr, of_module))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ACCESSORS
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
        ):
            found.append((node.lineno, node.args[1].value, False))
    return found


def test_the_project_touches_no_underscore_attribute_it_does_not_define_itself():
    trees = {path: ast.parse(path.read_text(encoding="utf-8"), filename=str(path)) for path in _modules()}
    tests = ROOT / "tests"
    module_names = set().union(*(_module_definitions(tree) for tree in trees.values()))
    # Test doubles define the private names of what they stand in for: they vouch for tests only.
    in_code = set().union(*(_attribute_definitions(t) for p, t in trees.items() if not p.is_relative_to(tests)))
    anywhere = in_code | set().union(*(_attribute_definitions(tree) for tree in trees.values()))
    problems = []
    for path, tree in trees.items():
        where = path.relative_to(ROOT)
        attributes = anywhere if path.is_relative_to(tests) else in_code
        for name in sorted(_library_imports(tree)):
            if name not in ALLOWED:
                problems.append(f"{where}: imports {name} from a library")
        for line, name, of_module in _uses(tree):
            if name in ALLOWED or (name in module_names if of_module else name in attributes):
                continue
            problems.append(f"{where}:{line}: {name}")
    assert not problems, "underscore attributes of libraries:\n" + "\n".join(problems)


def test_the_check_finds_what_it_is_for():
    tree = ast.parse(
        "from asyncio.events import _set_running_loop\n"
        "from django.db import connections\n"
        "def f(transport, channel):\n"
        "    connections._connections\n"
        "    getattr(channel, '_HTTPChannel__first_line', 0)\n"
        "    return transport._tempDataLen\n"
    )
    assert _library_imports(tree) == {"_set_running_loop"}
    assert {name for _line, name, _of_module in _uses(tree)} == {
        "_connections",
        "_HTTPChannel__first_line",
        "_tempDataLen",
    }
    assert not _attribute_definitions(tree) & {"_connections", "_HTTPChannel__first_line", "_tempDataLen"}
