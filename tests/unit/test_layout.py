"""The package's floor plan, checked: import paths are file paths, layers stay in their lanes.

* Redis is reached only through the storage layer (`magic.store`): no other module imports
  redis or builds run keys;
* the five services never import each other, and nothing imports the CLI (`magic.cli`);
* no import cycle, counting imports made inside functions;
* a project module imported inside a function says why (a heavy dependency deferred);
* each service's process imports only what its dependency extra installs (the controller and
  the reward service and the code judge carry no torch).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "services" / "magic"
SERVICES = ("controller", "rollout", "reward", "codejudge", "learner")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "pb" not in p.parts}
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def imports(tree: ast.AST) -> list[tuple[ast.stmt, str, bool]]:
    """(statement, imported module or `module.name`, inside a function) of every import."""
    out = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                out.extend((child, alias.name, in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                out.extend((child, f"{child.module}.{alias.name}", in_function) for alias in child.names)
                out.append((child, child.module, in_function))
            visit(child, inner)

    visit(tree, False)
    return out


def project_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name, tree in TREES.items():
        edges[name] = {target for _, target, _ in imports(tree) if target in MODULES and target != name}
    return edges


def test_import_paths_are_file_paths():
    import magic

    assert Path(magic.__file__).resolve() == PACKAGE / "__init__.py"
    assert not (ROOT / "setup.py").exists(), "no mapping of the package onto another folder"


def test_redis_is_reached_only_through_the_storage_layer():
    offenders = sorted(
        f"{name} imports {target}"
        for name, tree in TREES.items()
        if not name.startswith("magic.store")
        for _, target, _ in imports(tree)
        if target.split(".")[0] == "redis"
    )
    assert offenders == []
    builders = sorted(
        name
        for name, tree in TREES.items()
        if not name.startswith(("magic.store", "magic.protocol"))
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "RunKeys"
    )
    assert builders == [], "run keys are built in the storage layer (RunChannels, RunStore)"


def layer(module: str) -> str:
    """`magic.store.steps` -> "store" ("" for the package itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_services_do_not_import_each_other_and_nothing_imports_the_cli():
    edges = project_edges()
    for name, targets in edges.items():
        assert "magic.cli" not in targets, f"{name} imports the CLI"
        own = layer(name)
        if own in SERVICES:
            others = sorted(t for t in targets if layer(t) in SERVICES and layer(t) != own)
            assert others == [], f"{name} imports another service: {others}"


def test_no_import_cycles():
    edges = project_edges()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges[v]:
                cycles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    assert cycles == []


def test_project_modules_imported_inside_functions_say_why():
    """A function-local import of the project's own code defers a heavy dependency: the import
    (or the comment line right above it, or the first import of its run) says so."""
    silent = []
    for name, tree in TREES.items():
        lines = MODULES[name].read_text().splitlines()
        for node, target, in_function in imports(tree):
            if not in_function or not target.startswith("magic") or not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            first = node.lineno - 1
            while first > 0 and lines[first - 1].strip().startswith(("from magic", "import magic")):
                first -= 1  # a run of imports is explained once
            explained = any("#" in lines[i] for i in range(first, node.end_lineno)) or (first > 0 and lines[first - 1].strip().startswith("#"))
            if not explained:
                silent.append(f"{MODULES[name].relative_to(ROOT)}:{node.lineno} {target}")
    assert sorted(set(silent)) == []


def requirement_closure(extra: str | None) -> tuple[set[str], set[str]]:
    """(the distributions the base dependencies and `extra` name directly, every distribution they
    install with their own requirements), as installed here."""
    from importlib.metadata import PackageNotFoundError, requires

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    direct = {norm(Requirement(d).name) for d in meta["dependencies"] + (meta["optional-dependencies"][extra] if extra else [])}
    todo, dists = list(direct), set()
    while todo:
        name = todo.pop()
        if name in dists:
            continue
        dists.add(name)
        try:
            todo += [norm(Requirement(r).name) for r in requires(name) or [] if "extra ==" not in r]
        except PackageNotFoundError:
            continue
    return direct, dists


def norm(name: str) -> str:
    return name.lower().replace("_", "-")


def modules_of(dists: set[str]) -> set[str]:
    return {module for module, owners in packages_distributions().items() if any(norm(d) in dists for d in owners)}


def loaded(code: str) -> set[str]:
    """Top-level modules loaded by a fresh interpreter running `code`."""
    probe = f"import json, sys; {code}; print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    return set(json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout))


ENTRY = {"controller": "magic.controller.app", "rollout": "magic.rollout.worker", "reward": "magic.reward.worker", "codejudge": "magic.codejudge.service", "learner": "magic.learner.worker", None: "magic.cli"}


@pytest.mark.parametrize("service", [*SERVICES, None], ids=[*SERVICES, "cli"])
def test_a_service_imports_only_what_its_extra_installs(service):
    """What the service's process loads, beyond what its dependencies load themselves (optional
    integrations of theirs that happen to be installed here), comes from its dependencies."""
    direct, closure = requirement_closure(service)
    by_dependencies = loaded("import " + ", ".join(sorted(m for m in modules_of(direct) if not m.startswith("_"))))
    service_loads = loaded(f"import {ENTRY[service]}")
    third_party = set(packages_distributions()) - {"magic"}
    missing = sorted((service_loads - by_dependencies) & third_party - modules_of(closure))
    assert missing == [], f"{ENTRY[service]} imports modules its extra does not install: {missing}"
    if service in ("controller", "reward", "codejudge", None):
        assert "torch" not in service_loads
