"""The layout is the architecture: each folder is a layer, imports point down only, no circles.

import-linter holds those contracts (pyproject.toml's [tool.importlinter]; `make lint`), and the first test here
runs it. The rest is what import-linter cannot say: that docs/architecture.md numbers the same layers, the imports
of service.py (a lone module cannot be one of its roots), imports by name (it reads import statements only), and
which of the frameworks' names only the adapters use (it sees an outside package by its top-level name alone).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOT_LAYERED = ("tests", "docs")  # the tests and the docs site's hooks may import any layer; no layer imports them
LOADERS = ("import_module", "__import__", "resolve_name")  # called with a module's (or a name's) path
IMPORTLINTER = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
ROOTS = IMPORTLINTER["root_packages"]


def test_the_import_contracts_hold() -> None:
    """Layers, peers, no circles, no import of the tests, uvicorn's and BentoML's private packages: pyproject.toml."""
    run = lint_imports(ROOT)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    lint = Path(sys.executable).with_name("lint-imports")  # import-linter's command, installed beside this Python
    return subprocess.run([lint, "--no-cache"], cwd=root, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("fastinfer/common/errors.py", "import fastinfer.serving.cache", "Layers"),  # upward
        ("fastinfer/front/http.py", "import fastinfer.measure.plots", "Layers"),  # a peer
        ("fastinfer/serving/cache.py", "import tests.images", "tests"),
        ("fastinfer/serving/metrics.py", "import _bentoml_impl", "adapters"),
    ],
)
def test_the_contracts_fail_on_an_import_they_forbid(tmp_path: Path, module: str, line: str, contract: str) -> None:
    """On a copy of the project with one forbidden import added: a contract that checked nothing would pass."""
    for package in ROOTS:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", tmp_path)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "__init__.py").touch()
    (tmp_path / "tests" / "images.py").touch()
    assert lint_imports(tmp_path).returncode == 0  # the copy is what is linted, and it holds
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{line}  # noqa\n")
    run = lint_imports(tmp_path)
    assert run.returncode == 1 and "BROKEN" in run.stdout and contract.lower() in run.stdout.lower(), run.stdout


def test_no_two_modules_import_each_other_even_through_others() -> None:
    """What import-linter's acyclic_siblings leaves out, a package's __init__ and a module below it, included."""
    import grimp

    graph = grimp.build_graph(*ROOTS)
    circles = [
        (module, imported)
        for module in sorted(graph.modules)
        for imported in sorted(graph.find_modules_directly_imported_by(module))
        if graph.chain_exists(importer=imported, imported=module)
    ]
    assert not circles, circles


def layer_numbers() -> dict[str, int]:
    """The layers contract's packages → their layer, numbered from the bottom (service.py: the CLI's layer)."""
    contract = next(c for c in IMPORTLINTER["contracts"] if c["type"] == "layers" and "containers" not in c)
    layers = contract["layers"]
    numbers = {name.strip(): len(layers) - i for i, layer in enumerate(layers) for name in layer.split("|")}
    return {**numbers, "service": numbers["fastinfer.cli"]}


def documented_layers() -> dict[str, int]:
    """docs/architecture.md's Layout table: folder or file → its layer number."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    rows = (re.match(r"(\d+)\s+(\S+)", line) for line in block.splitlines())
    return {row[2]: int(row[1]) for row in rows if row}


def test_the_documented_layout_numbers_the_same_layers() -> None:
    def package(where: str) -> str:
        return where.removesuffix("/").removesuffix(".py").replace("/", ".")

    assert {package(where): number for where, number in documented_layers().items()} == layer_numbers()


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every Python file git tracks or would track (ignored ones aside: the venv, caches)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", "*.py"],
        cwd=root, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    return {module_name(root / name, root): root / name for name in sorted(listed) if (root / name).is_file()}


def layered(module: str) -> bool:
    return module.split(".")[0] not in NOT_LAYERED


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """The modules that are in a layer: all but the tests."""
    return {name: path for name, path in all_modules(root).items() if layered(name)}


def _fstring_start(node: ast.JoinedStr) -> tuple[str, bool]:
    """An f-string's constant start, ``{"constants"}`` folded in, and whether that is the whole string."""
    start = ""
    for part in node.values:
        if isinstance(part, ast.FormattedValue) and part.conversion == -1 and part.format_spec is None:
            part = part.value  # type: ignore[assignment]
        if not (isinstance(part, ast.Constant) and isinstance(part.value, str)):
            return start, False
        start += part.value
    return start, True


def _loaded_path(call: ast.Call, loaders: Iterable[str] = LOADERS) -> str | None:
    """The path a loader call is given: a string, or an f-string's constant start (up to its last dot).
    ``loaders``: the names a loader is called by in this file (``from importlib import import_module as load``)."""
    func = call.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if (called not in LOADERS if isinstance(func, ast.Attribute) else called not in loaders) or not call.args:
        return None
    first = call.args[0]
    if isinstance(first, ast.JoinedStr):
        start, whole = _fstring_start(first)
        first = ast.Constant(start) if whole else first
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        if not first.value.startswith("."):
            return first.value
        # import_module(".b", "a"): relative to the package given beside it
        given = [*call.args[1:2], *(k.value for k in call.keywords if k.arg == "package")]
        if not given or not isinstance(given[0], ast.Constant) or not isinstance(given[0].value, str):
            return None
        name = first.value.lstrip(".")
        anchor = given[0].value.split(".")
        anchor = anchor[: len(anchor) - (len(first.value) - len(name)) + 1]
        return ".".join([*anchor, *([name] if name else [])])
    if isinstance(first, ast.JoinedStr) and (start := _fstring_start(first)[0]):
        return start.rpartition(".")[0]
    return None


def _dotted(node: ast.Attribute) -> tuple[str, str]:
    """``a.b.c`` as (root name, "a.b.c"); ("", "") when the chain does not start at a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value  # type: ignore[assignment]
    return (node.id, ".".join([node.id, *reversed(parts)])) if isinstance(node, ast.Name) else ("", "")


def test_every_python_file_is_in_a_layer() -> None:
    """import-linter sees its roots only: a new top-level folder or file would be in no layer, and unchecked.
    (Inside fastinfer/ the contracts see a new package: every one must be in a layer.)"""
    outside = {name.split(".")[0] for name in project_modules()} - {*IMPORTLINTER["root_packages"], "service"}
    assert outside == set(), "add it to root_packages and the layers in pyproject.toml, and to docs/architecture.md"


def test_service_py_imports_only_lower_layers() -> None:
    """service.py is a lone module, not a package, so not one of import-linter's roots: its imports, checked here."""
    tree = ast.parse((ROOT / "service.py").read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    not_below = ["tests", *(name for name, number in layer_numbers().items() if number >= layer_numbers()["service"])]
    assert [m for m in sorted(imported) for p in not_below if m == p or m.startswith(f"{p}.")] == []


def test_the_one_import_by_name_points_down() -> None:
    """import-linter reads import statements only. The one import by name is the backend table's engine ("module:Class",
    opened by fastinfer.catalog.backends): an engine, a layer below the catalog. No other module names a loader
    (called, aliased or assigned)."""
    from fastinfer.catalog.backends import SPECS

    assert {spec.engine.partition(":")[0].rpartition(".")[0] for spec in SPECS.values()} == {"fastinfer.engines"}
    naming = set()
    for name, path in project_modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            said = getattr(node, "attr", None) or getattr(node, "id", None) or getattr(node, "name", None)
            if isinstance(node, (ast.Attribute, ast.Name, ast.alias)) and said in LOADERS:
                naming.add(name)
    assert naming == {"fastinfer.catalog.backends"}


def write(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)


# The frameworks' private names are used in fastinfer/compat/ only, one adapter per framework, each stating
# its assumptions (tests/unit/test_compat_*.py): an upgrade then reads three files, not the whole tree.
ADAPTERS = "fastinfer.compat"
FRAMEWORKS = ("bentoml", "_bentoml_sdk", "_bentoml_impl", "bentoml_cli", "uvicorn", "prometheus_client")
# Private whole: BentoML's implementation packages, and uvicorn, which FastInfer never runs itself (BentoML does).
PRIVATE_PACKAGES = ("_bentoml_sdk", "_bentoml_impl", "bentoml_cli", "uvicorn")
PRIVATE_MODULES = ("prometheus_client.mmap_dict", "prometheus_client.values")  # no leading underscore, not public
DOTTED = re.compile(r"\b_?[A-Za-z]\w*(?:\.\w+)+|\b_bentoml_\w+")  # a dotted name in a string, or a bare private one
UNKNOWN = "*"  # a name computed at run time (a variable, an f-string's rest): under a framework, maybe a private one
LOADER_FUNCTIONS = ("importlib.import_module", "importlib.__import__", "builtins.__import__", "pkgutil.resolve_name")
ATTRIBUTE_FUNCTIONS = ("getattr", "setattr", "hasattr", "delattr")  # (an object, a member's name, ...)


def _private(member: str) -> bool:
    """A private member's name (``_x``, not ``__x__``), or one computed at run time that may be one."""
    return member == UNKNOWN or (member.startswith("_") and not (member.startswith("__") and member.endswith("__")))


def private_name(dotted: str) -> bool:
    """Whether a dotted name is a private one of BentoML, uvicorn or prometheus_client."""
    parts = dotted.split(".")
    if parts[0] not in FRAMEWORKS:
        return False
    return (
        parts[0] in PRIVATE_PACKAGES
        or any(_private(part) for part in parts[1:])
        or any(f"{dotted}.".startswith(f"{m}.") for m in PRIVATE_MODULES)
    )


def _member(node: ast.expr) -> str:
    """The member an attribute function names: its string, an f-string's constant start then UNKNOWN, else UNKNOWN."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        start, whole = _fstring_start(node)
        return start if whole else start + UNKNOWN
    return UNKNOWN


def _module_path(node: ast.expr) -> str | None:
    """A module's path given as an f-string: its constant start, then UNKNOWN (the rest may hold dots); a start
    with no dot yet that begins a framework's name stands for that framework."""
    if not isinstance(node, ast.JoinedStr):
        return None
    start, whole = _fstring_start(node)
    if whole:
        return start.replace(":", ".")
    if "." in start:
        return f"{start.rpartition('.')[0]}.{UNKNOWN}"
    near = [framework for framework in FRAMEWORKS if start and framework.startswith(start)]
    return f"{near[0]}.{UNKNOWN}" if near else None


def _framework_path(node: ast.expr, bound: Mapping[str, str], loaders: Iterable[str]) -> str | None:
    """What ``node`` names as a dotted path from a top-level module, this file's names resolved: an alias
    (``import bentoml as b``), a loader's result (``importlib.import_module("bentoml")``), ``getattr(x, "name")``,
    ``sys.modules["name"]``, ``vars(x)["name"]``. None for anything else (a call's result, a subscript)."""
    if isinstance(node, ast.Name):
        return bound.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        base = _framework_path(node.value, bound, loaders)
        return f"{base}.{node.attr}" if base else None
    if isinstance(node, ast.Subscript):
        base = _framework_path(node.value, bound, loaders)
        if base == "sys.modules":
            given = node.slice
            return (
                given.value if isinstance(given, ast.Constant) and isinstance(given.value, str) else _module_path(given)
            )
        return (
            f"{base.removesuffix('.__dict__')}.{_member(node.slice)}" if base and base.endswith(".__dict__") else None
        )
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    called = func.id if isinstance(func, ast.Name) else ""
    if called in ATTRIBUTE_FUNCTIONS and len(node.args) > 1:
        base = _framework_path(node.args[0], bound, loaders)
        return f"{base}.{_member(node.args[1])}" if base else None
    if called == "vars" and node.args:
        base = _framework_path(node.args[0], bound, loaders)
        return f"{base}.__dict__" if base else None
    named = [k.value for k in node.keywords if k.arg == "name"]  # import_module(name="uvicorn")
    call = ast.Call(func, [*node.args, *named][:1] + node.args[1:], node.keywords)
    loaded = _loaded_path(call, loaders)
    if loaded is None or not call.args:
        return None
    first = call.args[0]
    if isinstance(first, ast.JoinedStr) and not _fstring_start(first)[1]:
        return _module_path(first)
    return loaded.replace(":", ".") or None


def _bindings(tree: ast.Module) -> tuple[dict[str, str], set[str]]:
    """This file's names for a framework's modules and members (``import bentoml as b``, ``from x import y as z``,
    ``m = importlib.import_module("bentoml")``, ``c = m._internal``), and the names its loaders go by
    (``from importlib import import_module as load``, ``load = __import__``)."""
    bound: dict[str, str] = {}
    loaders = set(LOADERS)
    for _ in range(3):  # an assignment may use a name that a later one binds
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                bound |= {alias.asname: alias.name for alias in node.names if alias.asname}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if full in LOADER_FUNCTIONS:
                        loaders.add(alias.asname or alias.name)
                    else:
                        bound[alias.asname or alias.name] = full
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                path = _framework_path(node.value, bound, loaders)
                for target in (t for t in targets if isinstance(t, ast.Name) and path):
                    if path in LOADER_FUNCTIONS or path in loaders:
                        loaders.add(target.id)
                    elif path.split(".")[0] in FRAMEWORKS:  # type: ignore[union-attr]
                        bound[target.id] = path  # type: ignore[assignment]
    return bound, loaders


def private_uses(path: Path, root: Path = ROOT) -> list[str]:
    """Each private framework name ``path`` imports, reaches by attribute (through any alias, loader or
    ``getattr``) or writes in a string (not a docstring)."""
    tree = ast.parse(path.read_text(), str(path))
    where = path.relative_to(root)
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}  # bare strings: prose
    bound, loaders = _bindings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or "", *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Attribute):
            names = [_dotted(node)[1], _framework_path(node, bound, loaders) or ""]
        elif isinstance(node, (ast.Call, ast.Subscript)):
            names = [_framework_path(node, bound, loaders) or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            names = DOTTED.findall(node.value)
        else:
            continue
        found += [f"{where}:{node.lineno} uses {name}" for name in names if private_name(name)]
    return sorted(set(found))


def test_only_the_adapters_use_the_frameworks_private_names() -> None:
    used = [line for name, path in project_modules().items() if not name.startswith(ADAPTERS)
            for line in private_uses(path)]  # fmt: skip
    assert used == [], "move these into fastinfer/compat/ (one adapter per framework), with a test per assumption"


PRIVATE_USES = {
    "from_internal": "from bentoml._internal.context import server_context\n",
    "import_impl": "import _bentoml_impl.worker\n",
    "sdk": "from _bentoml_sdk.io_models import IODescriptor\n",
    "private_module_name": "from bentoml import _internal\n",
    "mmap_dict": "from prometheus_client.mmap_dict import MmapedDict\n",
    "values_as_name": "from prometheus_client import values\n",
    "underscore_name": "from prometheus_client.utils import _floatToGoString\n",
    "any_uvicorn": "import uvicorn\n",
    "attribute_chain": "import bentoml\nCONTEXT = bentoml._internal.context.server_context\n",
    "assignment": "import prometheus_client\nprometheus_client.values.MmapedDict = dict\n",
    "logger_name": 'import logging\nlogging.getLogger("bentoml._internal.server.http_app")\n',
    "command_line": 'def worker(cmdline):\n    return any("_bentoml_impl.worker" in part for part in cmdline)\n',
    "loader": 'import importlib\nimportlib.import_module("uvicorn.config")\n',
    # The hostile review's probes, each missed once:
    "alias": "import bentoml as b\nC = b._internal.configuration.containers.BentoMLContainer\n",
    "alias_assignment": "import prometheus_client as pc\npc.values.MmapedDict = dict\n",
    "loader_no_dot": "import importlib\nimportlib.import_module('uvicorn')\n",
    "dunder_import_no_dot": "m = __import__('uvicorn')\n",
    "loader_f_string": "import importlib\nm = importlib.import_module(f'uvicorn.{x}')\n",
    "getattr": "import bentoml\ninternal = getattr(bentoml, '_internal')\n",
    "loader_result": "import importlib\nc = importlib.import_module('bentoml')._internal\n",
    # and their neighbours:
    "loader_f_string_public_start": "import importlib\nm = importlib.import_module(f'bentoml.{x}')\n",
    "loader_f_string_folded": "import importlib\nm = importlib.import_module(f\"{'bentoml'}.{'_internal'}\")\n",
    "loader_f_string_no_dot": "import importlib\nm = importlib.import_module(f'uvi{x}')\n",
    "loader_keyword": "import importlib\nm = importlib.import_module(name='uvicorn')\n",
    "loader_relative": "import importlib\nm = importlib.import_module('._internal', 'bentoml')\n",
    "loader_alias": "from importlib import import_module as load\nm = load('uvicorn')\n",
    "loader_assigned": "import importlib\nload = importlib.import_module\nm = load('uvicorn')\n",
    "loaded_then_used": "import importlib\nm = importlib.import_module('bentoml')\nc = m._internal\n",
    "resolve_name_class": "import pkgutil\nP = pkgutil.resolve_name('prometheus_client.mmap_dict:MmapedDict')\n",
    "name_reassigned": "import bentoml\nb = bentoml\nc = b._internal\n",
    "member_alias": "from bentoml import server_context as sc\nx = sc._secret\n",
    "getattr_f_string": "import bentoml\ni = getattr(bentoml, f'_int{x}')\n",
    "getattr_variable": "import bentoml\ni = getattr(bentoml, name)\n",
    "setattr": "import prometheus_client\nsetattr(prometheus_client, 'values', None)\n",
    "sys_modules": "import sys\nm = sys.modules['uvicorn']\n",
    "vars": "import bentoml\ni = vars(bentoml)['_internal']\n",
    "module_dict": "import bentoml\ni = bentoml.__dict__['_internal']\n",
}


@pytest.mark.parametrize("case", sorted(PRIVATE_USES))
def test_a_private_name_is_seen_however_it_is_written(case: str, tmp_path: Path) -> None:
    path = tmp_path / "fastinfer" / "front" / f"{case}.py"
    path.parent.mkdir(parents=True)
    path.write_text(PRIVATE_USES[case])
    used = private_uses(path, tmp_path)
    assert used and all(line.startswith(f"fastinfer/front/{case}.py:") for line in used), used


def test_public_names_and_prose_are_not_private_uses(tmp_path: Path) -> None:
    path = tmp_path / "service.py"
    path.write_text(
        '"""Served by _bentoml_impl.worker (BentoML), through uvicorn.protocols."""\n'
        "import bentoml\nfrom bentoml.exceptions import BadInput\nfrom prometheus_client import Counter\n"
        "from prometheus_client.multiprocess import mark_process_dead\n"
        'VERSION = bentoml.__version__\nSAID = "uvicorn\'s keep-alive, bentoml.depends"\n'
        'def f():\n    """Like prometheus_client.values."""\n'
        "import importlib\nimport bentoml as b\nE = b.exceptions.BadInput\nm = importlib.import_module('bentoml')\n"
        "d = m.depends\ng = getattr(bentoml, 'service')\nh = importlib.import_module(f'fastinfer.{x}')\n"
        "c = importlib.import_module(name)\nCOUNTERS = {'_x': 1}\nv = COUNTERS['_x']\n"
    )
    assert private_uses(path, tmp_path) == []


# A class outside the adapters may subclass one an adapter exports (the disk guard subclasses prometheus_client's
# MmapedDict, the front's protocol uvicorn's): each private member of the framework's class that it uses, overrides
# or calls through super() is then an assumption, and that adapter's docstring must name it.


def adapter_exports(root: Path = ROOT) -> dict[str, type]:
    """Each class an adapter exports (its ``__all__``), by its path there: ``fastinfer.compat.uvicorn.Protocol``."""
    exports: dict[str, type] = {}
    for name in project_modules(root):
        if name.startswith(f"{ADAPTERS}."):
            module = importlib.import_module(name)
            objects = {export: getattr(module, export) for export in module.__all__}
            exports |= {f"{name}.{export}": obj for export, obj in objects.items() if isinstance(obj, type)}
    return exports


def framework_bases(cls: type) -> list[type]:
    """A class and its bases, the project's own classes (and ``object``) left out: the framework's side."""
    return [base for base in cls.__mro__ if base is not object and base.__module__.split(".")[0] != "fastinfer"]


def own_members(base: type) -> set[str]:
    """The private members a class defines: methods and class attributes, and the attributes its code sets
    (``self._m = ...``)."""
    members = set(vars(base))
    with contextlib.suppress(OSError, TypeError):  # a class written in C has no source: its vars() alone
        tree = ast.parse(textwrap.dedent(inspect.getsource(base)))
        members |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
    return {member for member in members if _private(member)}


def framework_members(cls: type) -> set[str]:
    """The private members of a framework's class and its bases."""
    return set().union(*(own_members(base) for base in framework_bases(cls)))


def _names_bound(name: str, path: Path, tree: ast.Module) -> dict[str, str]:
    """The names a module binds to other modules' things (imports, ``A = B``) and to its own classes, as paths."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.asname or alias.name.split(".")[0]: alias.name if alias.asname else alias.name.split(".")[0]
                      for alias in node.names}  # fmt: skip
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names |= {alias.asname or alias.name: f"{base}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.ClassDef):
            names[node.name] = f"{name}.{node.name}"
    for node in ast.walk(tree):  # SomeAlias = compat.MmapedDict
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Name, ast.Attribute)):
            root_name, chain = _dotted(node.value) if isinstance(node.value, ast.Attribute) else (node.value.id,) * 2
            if root_name in names:
                for target in (t for t in node.targets if isinstance(t, ast.Name)):
                    names[target.id] = names[root_name] + chain[len(root_name) :]
    return names


def _members_used(cls: ast.ClassDef) -> set[str]:
    """The private members a class body uses on any object (``self._m``, ``super()._init_value``, ``other._f``,
    ``getattr(self, "_m")``) or defines, overriding any of the same name."""
    used = {node.name for node in cls.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    for node in cls.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        used |= {target.id for target in targets if isinstance(target, ast.Name)}
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute):
            used.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ATTRIBUTE_FUNCTIONS:
            used |= {_member(node.args[1])} if len(node.args) > 1 else set()
    return {member for member in used if _private(member)}


def unlisted_private_members(root: Path = ROOT) -> list[str]:
    """For each class outside the adapters that subclasses, at any remove, a class an adapter exports: each
    private member of the framework's class it uses or overrides that the adapter's docstring does not name."""
    exports = adapter_exports(root)
    modules = project_modules(root)
    trees = {name: ast.parse(path.read_text(), str(path)) for name, path in modules.items()}
    names = {name: _names_bound(name, modules[name], tree) for name, tree in trees.items()}
    classes = [
        (name, node) for name, tree in trees.items() for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
    ]
    adapted: dict[str, str] = {}  # a subclass's path → the export it stems from

    def resolve(path: str) -> str:
        for _ in range(20):  # through re-exports: "fastinfer.front.connections.Protocol" is the adapter's Protocol
            module, _, attr = path.rpartition(".")
            following = names.get(module, {}).get(attr)
            if path in exports or path in adapted or following in (None, path):
                return path
            path = following  # type: ignore[assignment]
        return path

    def base_path(module: str, node: ast.expr) -> str:
        root_name, chain = _dotted(node) if isinstance(node, ast.Attribute) else (getattr(node, "id", ""),) * 2
        return names[module].get(root_name, f"{module}.{root_name}") + chain[len(root_name) :]

    changed = True
    while changed:
        changed = False
        for module, cls in classes:
            path = f"{module}.{cls.name}"
            for base in (resolve(base_path(module, b)) for b in cls.bases):
                stem = base if base in exports else adapted.get(base)
                if stem is not None and path not in adapted:
                    adapted[path], changed = stem, True
    wrong = []
    for module, cls in classes:
        stem = adapted.get(f"{module}.{cls.name}")
        if stem is None or module.startswith(f"{ADAPTERS}."):
            continue
        adapter = stem.rpartition(".")[0]
        docstring = ast.get_docstring(trees[adapter]) or ""
        members = framework_members(exports[stem])
        where = modules[module].relative_to(root)
        for member in sorted(_members_used(cls)):
            unknown = UNKNOWN in member
            if (unknown or member in members) and not re.search(rf"(?<!\w){re.escape(member)}(?!\w)", docstring):
                owner = next((b for b in framework_bases(exports[stem]) if member in own_members(b)), exports[stem])
                what = f"a member named at run time ({member}), maybe private, of" if unknown else f"{member} of"
                wrong.append(
                    f"{where}: class {cls.name} uses {what} {owner.__module__}.{owner.__qualname__} (through {stem}), "
                    f"which {adapter.replace('.', '/')}.py's docstring does not name among its assumptions"
                )
    return wrong


def test_a_subclass_of_an_adapters_class_uses_only_the_private_members_the_adapter_names() -> None:
    assert unlisted_private_members() == [], "name each in the adapter's docstring, with a test in test_compat_*.py"


def test_the_subclasses_of_adapters_classes_are_found() -> None:
    """Not vacuous: the disk guard and the front's protocol are seen, with the members they use."""
    exports = adapter_exports()
    tree = ast.parse((ROOT / "fastinfer/serving/disk.py").read_text())
    guard = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "GuardedMmapedDict")
    used = _members_used(guard) & framework_members(exports["fastinfer.compat.prometheus.MmapedDict"])
    assert used == {"_capacity", "_f", "_fname", "_init_value", "_m", "_positions", "_used"}
    tree = ast.parse((ROOT / "fastinfer/front/connections.py").read_text())
    front = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "FrontProtocol")
    assert _members_used(front) & framework_members(exports["fastinfer.compat.uvicorn.Protocol"]) == set()


def test_each_private_member_an_adapter_names_is_used() -> None:
    """Nothing more is listed than is used: by the adapter itself or by a subclass of what it exports."""
    exports = adapter_exports()
    modules = project_modules()
    trees = {name: ast.parse(path.read_text(), str(path)) for name, path in modules.items()}
    used: set[str] = set()
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and (name.startswith(ADAPTERS) or node.attr.startswith("_")):
                used.add(node.attr)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                used.add(node.name)
    for adapter in (name for name in modules if name.startswith(f"{ADAPTERS}.")):
        members = set().union(*(framework_members(cls) for path, cls in exports.items() if path.startswith(adapter)))
        named = {
            m for m in members if re.search(rf"(?<!\w){re.escape(m)}(?!\w)", ast.get_docstring(trees[adapter]) or "")
        }
        assert named <= used, f"{adapter}'s docstring names {sorted(named - used)}, which nothing uses"


IN_G = "class G(MmapedDict):\n    def f(self):\n        "  # a method of a subclass of the adapter's MmapedDict
SUBCLASS_PRIVATE_USES = {
    "self_attribute": IN_G + "return self._read_all_values()\n",
    "super_call": IN_G + "return super()._read_all_values()\n",
    "override": "class G(MmapedDict):\n    def _read_all_values(self):\n        return []\n",
    "class_attribute_override": "class G(MmapedDict):\n    _read_all_values = None\n",
    "other_instance": "class G(MmapedDict):\n    def f(self, other):\n        return other._read_all_values()\n",
    "alias_of_self": IN_G + "me = self\n        return me._read_all_values()\n",
    "getattr": IN_G + "return getattr(self, '_read_all_values')()\n",
    "getattr_computed": IN_G + "return getattr(self, f'_{n}')\n",
    "subclass_of_subclass": "class A(MmapedDict):\n    pass\n"
    + IN_G.replace("MmapedDict", "A")
    + "self._read_all_values()\n",
    "module_alias": "from fastinfer.compat import uvicorn as u\nclass G(u.Protocol):\n    def _get_upgrade(s): ...\n",
    "relative_import": "from ..compat.uvicorn import HttpToolsProtocol as H\n"
    + IN_G.replace("MmapedDict", "H")
    + "self._start_asgi_task()\n",
    "other_module": "from fastinfer.front.base import Base\n"
    + IN_G.replace("MmapedDict", "Base")
    + "self._get_upgrade()\n",
    "renamed_base": "Base = MmapedDict\n" + IN_G.replace("MmapedDict", "Base") + "self._read_all_values()\n",
}


@pytest.mark.parametrize("case", sorted(SUBCLASS_PRIVATE_USES))
def test_a_subclass_using_an_unnamed_private_member_fails(case: str, tmp_path: Path) -> None:
    files = {f"fastinfer/compat/{name}.py": (ROOT / f"fastinfer/compat/{name}.py").read_text()
             for name in ("__init__", "bentoml", "uvicorn", "prometheus")}  # fmt: skip
    header = "from fastinfer.compat.prometheus import MmapedDict\n"
    write(
        tmp_path,
        {
            **files,
            "fastinfer/__init__.py": "",
            "fastinfer/front/__init__.py": "",
            "fastinfer/front/base.py": "from fastinfer.compat.uvicorn import Protocol\nclass Base(Protocol): ...\n",
            "fastinfer/front/named.py": header + "class N(MmapedDict):\n    def f(self):\n        return self._m\n",
            f"fastinfer/front/{case}.py": header + SUBCLASS_PRIVATE_USES[case],
        },
    )
    wrong = unlisted_private_members(tmp_path)
    assert wrong and all(line.startswith(f"fastinfer/front/{case}.py: class G uses ") for line in wrong), wrong
    assert all("fastinfer/compat/" in line and "docstring does not name" in line for line in wrong), wrong
