"""The layout is the architecture: each folder is a layer, imports point down only, no circles.

import-linter holds the contracts (pyproject.toml's [tool.importlinter]; `make lint`), the frameworks' private
modules included, and the first test runs it. The rest is what it cannot say: circles through a package's
__init__, that docs/architecture.md numbers the same layers, service.py's imports (a lone module is no root),
imports by name, and the frameworks' private names that are no module (a member, a string, ``getattr``).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Mapping
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
IMPORTLINTER = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
PROJECT = [name for name in IMPORTLINTER["root_packages"] if (ROOT / name).is_dir()]  # bentoml's a root too
CONTRACTS = {contract["type"]: contract for contract in IMPORTLINTER["contracts"]}  # the last of each type
LOADERS = ("import_module", "__import__", "resolve_name")  # called with a module's (or a name's) path


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    lint = Path(sys.executable).with_name("lint-imports")  # import-linter's command, installed beside this Python
    env = {**os.environ, "COLUMNS": "1000"}  # one line per contract
    return subprocess.run([lint, "--no-cache", "--no-logo"], cwd=root, env=env, capture_output=True, text=True)


def test_the_import_contracts_hold() -> None:
    run = lint_imports(ROOT)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]


PLANTED = {  # a forbidden import for each contract
    "fastinfer/common/errors.py": "import fastinfer.serving.cache",  # upward, and a circle of siblings
    "fastinfer/__init__.py": "import fastinfer.common",
    "fastinfer/newpackage/__init__.py": "",  # in no layer
    "fastinfer/serving/cache.py": "import tests",
    "runners/drain.py": "import service",
    "fastinfer/serving/metrics.py": "from prometheus_client import values",
    "fastinfer/front/http.py": "from bentoml._internal.context import server_context",
}


def test_every_contract_fails_on_an_import_it_forbids(tmp_path: Path) -> None:
    """On a copy of the project: a contract that checked nothing would pass."""
    for package in PROJECT:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", tmp_path)
    assert lint_imports(tmp_path).returncode == 0  # the copy is what is linted, and it holds
    for name, line in PLANTED.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        with (tmp_path / name).open("a") as module:
            module.write(f"\n{line}  # noqa\n")
    out = lint_imports(tmp_path).stdout
    verdicts = re.findall(r"^(.+) (KEPT|BROKEN)", out, re.MULTILINE)
    assert len(verdicts) == len(IMPORTLINTER["contracts"]) and {v for _, v in verdicts} == {"BROKEN"}, out


def circles(graph: grimp.ImportGraph) -> list[tuple[str, str]]:
    return [
        (module, imported)
        for module in sorted(graph.modules)
        for imported in sorted(graph.find_modules_directly_imported_by(module))
        if graph.chain_exists(importer=imported, imported=module)
    ]


def test_no_two_modules_import_each_other_even_through_others() -> None:
    """What acyclic_siblings leaves out: a package's __init__ and a module below it."""
    assert circles(grimp.build_graph(*PROJECT)) == []
    planted = grimp.ImportGraph()
    planted.add_import(importer="a", imported="a.b.c")
    planted.add_import(importer="a.b.c", imported="a")
    assert circles(planted) == [("a", "a.b.c"), ("a.b.c", "a")]


def layer_numbers() -> dict[str, int]:
    """The layers contract's packages → their layer, numbered from the bottom (service.py: the CLI's layer)."""
    layers = next(c for c in IMPORTLINTER["contracts"] if c["type"] == "layers" and "containers" not in c)["layers"]
    numbers = {name.strip(): len(layers) - i for i, layer in enumerate(layers) for name in layer.split("|")}
    return {**numbers, "service": numbers["fastinfer.cli"]}


def test_the_documented_layout_numbers_the_same_layers() -> None:
    block = (ROOT / "docs" / "architecture.md").read_text().split("## Layout", 1)[1].split("```", 2)[1]
    rows = (re.match(r"(\d+)\s+(\S+)", line) for line in block.splitlines())
    documented = {row[2].removesuffix("/").removesuffix(".py").replace("/", "."): int(row[1]) for row in rows if row}
    assert documented == layer_numbers()


def project_modules() -> dict[str, Path]:
    """Every Python file git tracks or would track, but the tests and the docs site's hooks (in no layer)."""
    git = ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", "*.py"]
    paths = map(Path, subprocess.run(git, cwd=ROOT, capture_output=True, text=True, check=True).stdout.split())
    return {".".join(path.with_suffix("").parts).removesuffix(".__init__"): ROOT / path for path in paths
            if path.parts[0] not in ("tests", "docs") and (ROOT / path).is_file()}  # fmt: skip


def test_every_python_file_is_in_a_layer() -> None:
    """import-linter sees its roots only: a new top-level folder or file would be in no layer, and unchecked."""
    outside = {name.split(".")[0] for name in project_modules()} - {*PROJECT, "service"}
    assert outside == set(), "add it to root_packages and the layers in pyproject.toml, and to docs/architecture.md"


def test_service_py_imports_only_lower_layers() -> None:
    tree = ast.parse((ROOT / "service.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    for node in (node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module):
        imported |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    not_below = ["tests", *(name for name, number in layer_numbers().items() if number >= layer_numbers()["service"])]
    assert [m for m in sorted(imported) for p in not_below if m == p or m.startswith(f"{p}.")] == []


def test_the_one_import_by_name_points_down() -> None:
    """import-linter reads import statements only. The one import by name is the backend table's engine
    ("module:Class"): a layer below the catalog. No other module names a loader (called, aliased or assigned)."""
    from fastinfer.catalog.backends import SPECS

    assert {spec.engine.partition(":")[0].rpartition(".")[0] for spec in SPECS.values()} == {"fastinfer.engines"}
    naming = set()
    for name, path in project_modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            said = getattr(node, "attr", None) or getattr(node, "id", None) or getattr(node, "name", None)
            if isinstance(node, (ast.Attribute, ast.Name, ast.alias)) and said in LOADERS:
                naming.add(name)
    assert naming == {"fastinfer.catalog.backends"}


# The frameworks' private names are used in fastinfer/compat/ only, one adapter per framework stating its assumptions
# (tests/unit/test_compat_*.py): an upgrade reads three files. import-linter holds their modules; here, the rest.
ADAPTERS = "fastinfer.compat."
PRIVATE = CONTRACTS["forbidden"]["forbidden_modules"]  # private though not underscored: uvicorn, mmap_dict, ...
FRAMEWORKS = {*CONTRACTS["private_modules"]["packages_with_private_modules"], *(m.split(".")[0] for m in PRIVATE)}
IN_STRINGS = re.compile(r"\b_?[A-Za-z]\w*(?:\.\w+)+|\b_bentoml_\w+")  # a dotted name, or a bare BentoML package
BY_NAME = ("getattr", "setattr", "hasattr", "delattr", "vars")  # (an object, a member's name): vars() gives them all
COMPUTED = "<computed>"  # a member named at run time: maybe a private one


def private(member: str) -> bool:
    return (member.startswith("_") and not (member.startswith("__") and member.endswith("__"))) or member == COMPUTED


def private_name(dotted: str) -> bool:
    parts = dotted.split(".")
    in_private = any(dotted == module or dotted.startswith(f"{module}.") for module in PRIVATE)
    return parts[0] in FRAMEWORKS and (in_private or any(map(private, parts[1:])) or "__dict__" in parts)


def dotted(node: ast.expr, bound: Mapping[str, str]) -> str:
    """``b.x.y`` as a path from a top-level name, this file's aliases followed; "" for a call's result, a subscript."""
    if isinstance(node, ast.Attribute):
        return f"{base}.{node.attr}" if (base := dotted(node.value, bound)) else ""
    return bound.get(node.id, node.id) if isinstance(node, ast.Name) else ""


def member(call: ast.Call) -> str:
    """The member ``getattr(x, name)`` names, if a constant."""
    given = call.args[1] if call.args[1:] else None
    return given.value if isinstance(given, ast.Constant) and isinstance(given.value, str) else COMPUTED


def bindings(tree: ast.Module, package: str = "") -> dict[str, str]:
    """The names a module binds to paths: imports (relative ones from ``package``) and ``alias = a.b``."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound |= {alias.asname: alias.name for alias in node.names if alias.asname}
        elif isinstance(node, ast.ImportFrom):
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            base = ".".join([*anchor, *([node.module] if node.module else [])])
            bound |= {alias.asname or alias.name: f"{base}.{alias.name}" for alias in node.names}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and (path := dotted(node.value, bound)) and path.split(".")[0] != "self":
            bound |= {target.id: path for target in node.targets if isinstance(target, ast.Name)}
    return bound


def private_uses(path: Path) -> list[str]:
    """Each private framework name ``path`` imports, reaches by attribute or by name, or writes in a string."""
    tree = ast.parse(path.read_text(), str(path))
    prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}  # docstrings
    bound, found = bindings(tree), set()
    for node in ast.walk(tree):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and not node.level:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Attribute):
            names = [dotted(node, bound)]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") in BY_NAME and node.args:
            names = [f"{dotted(node.args[0], bound)}.{member(node)}"]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            names = [*IN_STRINGS.findall(node.value), node.value]
        found |= {f"{path}:{node.lineno} uses {name}" for name in names if private_name(name)}
    return sorted(found)


def test_only_the_adapters_use_the_frameworks_private_names() -> None:
    used = [use for name, path in project_modules().items() if not name.startswith(ADAPTERS)
            for use in private_uses(path)]  # fmt: skip
    assert used == [], "move these into fastinfer/compat/ (one adapter per framework), with a test per assumption"


PROBE = """\
from prometheus_client.utils import _floatToGoString
C = b._internal.configuration.containers.BentoMLContainer
x = sc._secret
logging.getLogger("bentoml._internal.server.http_app")
running = any("_bentoml_impl" in part for part in cmdline)
m = sys.modules["uvicorn"]
i = getattr(bentoml, name)
v = vars(pc)
import bentoml, bentoml as b, prometheus_client as pc; from bentoml import server_context as sc
def f(self):
    \"""Served by _bentoml_impl.worker, through uvicorn.protocols: prose.\"""
    return bentoml.__version__, b.exceptions.BadInput, getattr(bentoml, "service"), self._m, getattr(self, name)
SAID = "uvicorn's keep-alive, bentoml.depends"  # and comments: _bentoml_impl.worker
"""


def test_a_private_name_is_seen_and_a_public_one_is_not(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(PROBE)
    assert {int(use.split(":")[1].split()[0]) for use in private_uses(tmp_path / "m.py")} == set(range(1, 9))


# A class outside the adapters may subclass one that an adapter exports (the disk guard prometheus_client's
# MmapedDict, the front's protocol uvicorn's): each private member of the framework's class that it uses or
# overrides is an assumption too, which the adapter's docstring must name.


def framework_members(cls: type) -> set[str]:
    """The private members of a framework's class and its bases: their attributes and what their code sets."""
    members: set[str] = set()
    for base in (base for base in cls.__mro__ if base.__module__.split(".")[0] not in ("fastinfer", "builtins")):
        members |= set(vars(base))
        with contextlib.suppress(OSError, TypeError):  # a class written in C has no source
            tree = ast.parse(textwrap.dedent(inspect.getsource(base)))
            members |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
    return set(filter(private, members))


def members_used(cls: ast.ClassDef) -> set[str]:
    """The private names a class defines (overriding) or uses on any object (``self._m``, ``super()._f()``)."""
    used = {getattr(node, "name", "") for node in cls.body}  # and the class attributes, and the uses:
    used |= {t.id for n in cls.body for t in getattr(n, "targets", [getattr(n, "target", n)]) if hasattr(t, "id")}
    used |= {node.attr for node in ast.walk(cls) if isinstance(node, ast.Attribute)}
    used |= {member(n) for n in ast.walk(cls) if isinstance(n, ast.Call) and getattr(n.func, "id", "") in BY_NAME}
    return set(filter(private, used))


def adapted_members(modules: Mapping[str, Path]) -> dict[str, dict[str, bool]]:
    """Each class outside the adapters stemming from one they export → the framework's private members it uses,
    each with whether the adapter's docstring names it."""
    adapters = [importlib.import_module(f"{ADAPTERS}{p.stem}") for p in (ROOT / "fastinfer/compat").glob("[!_]*.py")]
    exports = {f"{m.__name__}.{n}": getattr(m, n) for m in adapters for n in m.__all__}
    trees = {name: ast.parse(path.read_text()) for name, path in modules.items() if not name.startswith(ADAPTERS)}
    classes = {
        f"{name}.{n.name}": n for name, tree in trees.items() for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
    }
    bound = {name: {c.rpartition(".")[2]: c for c in classes if c.startswith(f"{name}.")} for name in trees}
    for name, tree in trees.items():
        bound[name] |= bindings(tree, name if modules[name].name == "__init__.py" else name.rpartition(".")[0])

    def resolve(path: str) -> str:  # through aliases, own classes and re-exports
        for _ in range(20):
            module, _, attr = path.rpartition(".")
            path = bound.get(module, {}).get(attr, path) if path not in exports else path
        return path

    stems: dict[str, str] = {}  # a subclass's path → the export it stems from, at any remove
    while new := {path: base if base in exports else stems[base] for path, cls in classes.items() if path not in stems
                  for base in (resolve(dotted(b, bound[path.rpartition(".")[0]])) for b in cls.bases)
                  if base in exports or base in stems}:  # fmt: skip
        stems |= new
    found = {}
    for path, stem in stems.items():
        framework, doc = framework_members(exports[stem]), importlib.import_module(stem.rpartition(".")[0]).__doc__
        used = {m for m in members_used(classes[path]) if m in framework or m == COMPUTED}
        found[path] = {m: bool(re.search(rf"(?<!\w){re.escape(m)}(?!\w)", doc or "")) for m in used}
    return found


def test_a_subclass_of_an_adapters_class_uses_only_the_private_members_the_adapter_names() -> None:
    found = adapted_members(project_modules())
    unnamed = {path: sorted(m for m, named in used.items() if not named) for path, used in found.items()}
    assert not any(unnamed.values()), f"name each in the adapter's docstring, with a test in test_compat_*: {unnamed}"
    guard = {"_capacity", "_f", "_fname", "_init_value", "_m", "_positions", "_used"}
    assert set(found["fastinfer.serving.disk.GuardedMmapedDict"]) == guard  # not vacuous: what the guard uses is seen
    assert "fastinfer.front.connections.FrontProtocol" in found


SUBCLASSES = """\
from fastinfer.compat.prometheus import MmapedDict
from fastinfer.compat import uvicorn as u
from ..compat.uvicorn import HttpToolsProtocol as H
from fastinfer.front.base import Base
Renamed = MmapedDict
class A(MmapedDict):
    def f(self): return super()._read_all_values()
class B(MmapedDict):
    def _read_all_values(self): ...
class C(Renamed):
    _read_all_values = None
class D(u.Protocol):
    def f(self, name): return getattr(self, name)
class E(H):
    def f(self, other): return other._get_upgrade()
class F(Base):
    def f(self): return self._get_upgrade(), self._should_upgrade()
class Named(MmapedDict):
    def f(self): return self._m
"""


def test_a_subclass_using_an_unnamed_private_member_is_seen(tmp_path: Path) -> None:
    (tmp_path / "base.py").write_text("from fastinfer.compat.uvicorn import Protocol\nclass Base(Protocol): ...\n")
    (tmp_path / "g.py").write_text(SUBCLASSES)
    found = adapted_members({"fastinfer.front.base": tmp_path / "base.py", "fastinfer.front.g": tmp_path / "g.py"})
    unnamed = {path.rpartition(".")[2]: {m for m, named in used.items() if not named} for path, used in found.items()}
    expected = {"Base": set(), "Named": set(), "F": {"_get_upgrade"}, "E": {"_get_upgrade"}, "D": {COMPUTED}}
    assert unnamed == expected | {name: {"_read_all_values"} for name in "ABC"}
