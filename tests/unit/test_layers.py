"""The layout is the architecture: each folder is a layer, imports point down only, no circles.

Every import of the project's own code counts, wherever it is written: at the top, inside a
function, under ``if TYPE_CHECKING`` (a type-only import still couples the two modules), through
``importlib.import_module`` / ``__import__`` / ``pkgutil.resolve_name`` (an f-string by its constant
prefix), a ``"module:Class"`` string naming a class to import later (the backend table names its
engines so), and ``import a`` then ``a.b.c.name``. Every Python file of the project but the tests is
in a layer, and none imports the tests.
"""

from __future__ import annotations

import ast
import re
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOT_LAYERED = ("tests", "docs")  # the tests and the docs site's hooks may import any layer; no layer imports them
CLASS_PATH = re.compile(r"([A-Za-z_][\w.]*):[A-Za-z_][\w.]*")  # "a.b:Class" or "a.b:Class.attr"
LOADERS = ("import_module", "__import__", "resolve_name")  # called with a module's (or a name's) path

# Bottom to top, numbered as docs/architecture.md's Layout numbers them (checked below). A module may import its own
# package and the layers below its own; packages that share a layer are peers and import neither each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("fastinfer",),  # the package's __init__ alone: its version
    ("fastinfer.common",),
    ("fastinfer.compat",),  # the frameworks' private names, one adapter each (checked below)
    ("fastinfer.engines",),
    ("fastinfer.catalog",),
    ("fastinfer.serving",),
    ("fastinfer.measure", "fastinfer.front"),
    ("build_models", "runners"),
    ("service", "fastinfer.cli", "examples"),
    ("load_tests",),  # it serves "service:FastInfer" to measure it
)


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


def _loaded_path(call: ast.Call) -> str | None:
    """The path a loader call is given: a string, or an f-string's constant start (up to its last dot)."""
    func = call.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if called not in LOADERS or not call.args:
        return None
    first = call.args[0]
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
    if isinstance(first, ast.JoinedStr) and first.values and isinstance(first.values[0], ast.Constant):
        return str(first.values[0].value).rpartition(".")[0]
    return None


def _dotted(node: ast.Attribute) -> tuple[str, str]:
    """``a.b.c`` as (root name, "a.b.c"); ("", "") when the chain does not start at a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value  # type: ignore[assignment]
    return (node.id, ".".join([node.id, *reversed(parts)])) if isinstance(node, ast.Name) else ("", "")


def imports_of(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The project modules that ``name`` (at ``path``) imports, anywhere in its source."""
    known = set(known)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    # ``import a.b`` binds the name ``a``: a chain ``a.x.y`` from it reaches module a.x too.
    bound = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names if alias.asname is None}  # fmt: skip
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # ``from a import b``: b is a module when it is one of ours, else a name in a.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        elif isinstance(node, ast.Call) and (loaded := _loaded_path(node)) is not None:
            targets = [loaded.partition(":")[0]]
        elif isinstance(node, ast.Attribute) and (chain := _dotted(node))[0] in bound:
            targets = [chain[1]]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and CLASS_PATH.fullmatch(node.value):
            # A "a.b:Class" path imported later; only when a.b is one of ours exactly, so that other
            # strings with a colon are not taken for imports.
            module = CLASS_PATH.fullmatch(node.value)[1]  # type: ignore[index]
            targets = [module] if module in known else []
        else:
            continue
        for target in targets:
            while target and target not in known:  # ``import a.b.c`` of a name: its module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def layer_of(module: str, layers: tuple[tuple[str, ...], ...] = LAYERS) -> tuple[int, str]:
    """(layer index, package) of a module: the longest package prefix that names it."""
    best: tuple[int, str] | None = None
    for index, packages in enumerate(layers):
        for package in packages:
            inside = module == package or (package != "fastinfer" and module.startswith(package + "."))
            if inside and (best is None or len(package) > len(best[1])):
                best = (index, package)
    if best is None:
        raise AssertionError(f"{module} is in no layer: add its package to LAYERS (and to docs/architecture.md)")
    return best


def upward_imports(graph: Mapping[str, set[str]], layers: tuple[tuple[str, ...], ...] = LAYERS) -> list[str]:
    """Every import that does not point down (or stay inside its own package)."""
    wrong = []
    for module, targets in sorted(graph.items()):
        level, package = layer_of(module, layers)
        for target in sorted(targets):
            if not layered(target):
                wrong.append(f"{module} imports {target} (the tests are in no layer)")
                continue
            target_level, target_package = layer_of(target, layers)
            if target_package != package and target_level >= level:
                wrong.append(f"{module} imports {target} ({target_package} is not below {package})")
    return wrong


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Import circles between modules (each found once, from its smallest module)."""
    found: list[list[str]] = []

    def walk(start: str, node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt == start:
                found.append([*path, start])
            elif nxt > start and nxt not in path:
                walk(start, nxt, [*path, nxt])

    for start in sorted(graph):
        walk(start, start, [start])
    return found


def project_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Each layered module → the project modules it imports (the tests among them, if any)."""
    known = all_modules(root)
    return {name: imports_of(name, path, known) for name, path in project_modules(root).items()}


def test_every_import_points_down() -> None:
    assert upward_imports(project_graph()) == []


def test_no_two_modules_import_each_other_even_through_others() -> None:
    assert circles(project_graph()) == []


def test_every_module_is_in_a_layer() -> None:
    for module in project_modules():
        layer_of(module)  # raises naming the module that is in none


def test_the_graph_is_read_whole() -> None:
    """The checks see the imports that matter: a function-level one, a type-only one, a class path."""
    graph = project_graph()
    assert "fastinfer.front.image_routes" in graph["service"]
    assert "fastinfer.engines.torch_model" in graph["fastinfer.engines.pytorch"]  # inside a function
    assert "build_models.context" in graph["build_models.exporters"]  # under TYPE_CHECKING
    assert "build_models.__main__" in graph["fastinfer.cli"]  # the CLI composes the build
    assert "fastinfer.engines.openvino" in graph["fastinfer.catalog.backends"]  # "module:Class" in the table
    assert len(graph) > 60


def documented_layers() -> dict[str, int]:
    """docs/architecture.md's Layout table: folder or file → its layer number."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    rows = (re.match(r"(\d+)\s+(\S+)", line) for line in block.splitlines())
    return {row[2]: int(row[1]) for row in rows if row}


def test_the_documented_layout_numbers_the_same_layers() -> None:
    def package(where: str) -> str:
        return where.removesuffix("/").removesuffix(".py").replace("/", ".")

    documented = {package(where): number for where, number in documented_layers().items()}
    tested = {name: index for index, names in enumerate(LAYERS) for name in names if name != "fastinfer"}
    assert documented == tested


def write(root: Path, files: Mapping[str, str]) -> dict[str, set[str]]:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    return project_graph(root)


def test_the_checks_catch_an_upward_import_a_peer_import_and_a_circle(tmp_path: Path) -> None:
    graph = write(
        tmp_path,
        {
            "fastinfer/__init__.py": "",
            "fastinfer/common/__init__.py": "",
            "fastinfer/common/errors.py": "from fastinfer.serving import pipeline\n",  # up
            "fastinfer/serving/__init__.py": "",
            "fastinfer/serving/pipeline.py": "from . import cache\n",
            "fastinfer/serving/cache.py": "if False:\n    from fastinfer.serving.pipeline import X\n",  # circle
            "fastinfer/front/__init__.py": "",
            "fastinfer/front/http.py": "import fastinfer.measure.plots\n",  # a peer
            "fastinfer/measure/__init__.py": "",
            "fastinfer/measure/plots.py": "from fastinfer.common.errors import E\n",  # down: fine
            "fastinfer/catalog/__init__.py": "",
            "fastinfer/catalog/table.py": 'ENGINE = "fastinfer.front.http:Lane"\nNAME = "fastinfer"\n',  # up, later
            "fastinfer/engines/__init__.py": "import importlib\nimportlib.import_module('runners.base')\n",  # up
            "runners/__init__.py": "",
            "runners/base.py": "",
            "tests/test_x.py": "import service\n",  # tests are not layered
        },
    )
    assert "tests.test_x" not in graph
    assert upward_imports(graph) == [
        "fastinfer.catalog.table imports fastinfer.front.http (fastinfer.front is not below fastinfer.catalog)",
        "fastinfer.common.errors imports fastinfer.serving.pipeline (fastinfer.serving is not below fastinfer.common)",
        "fastinfer.engines imports runners.base (runners is not below fastinfer.engines)",
        "fastinfer.front.http imports fastinfer.measure.plots (fastinfer.measure is not below fastinfer.front)",
    ]
    assert circles(graph) == [["fastinfer.serving.cache", "fastinfer.serving.pipeline", "fastinfer.serving.cache"]]


HIDDEN_IMPORTS = {
    "in_a_function": "def f():\n    from fastinfer.front import http as h\n    return h\n",
    "relative": "from ..front import http\n",
    "relative_package": "from .. import front\n",
    "dunder_import": "m = __import__('fastinfer.front.http')\n",
    "import_module_relative": "import importlib\nm = importlib.import_module('.http', 'fastinfer.front')\n",
    "import_module_top_level": "import importlib\ndef registry():\n    return importlib.import_module('runners')\n",
    "import_module_f_string": "import importlib\nlane = importlib.import_module(f'fastinfer.front.{n}')\n",
    "resolve_name": "import pkgutil\nsend = pkgutil.resolve_name('fastinfer.front.http.send_json')\n",
    "attribute_chain": "import fastinfer.common\ndef f():\n    return fastinfer.front.http.send_json()\n",
    "class_attribute_path": "TARGET = 'fastinfer.front.http:Lane.answer'\n",
    "the_tests": "from tests.images import photo\n",
}


@pytest.mark.parametrize("case", sorted(HIDDEN_IMPORTS))
def test_an_upward_import_is_seen_however_it_is_written(case: str, tmp_path: Path) -> None:
    """Each way a hostile review slipped a serving/ → front/ (or runners/, or tests/) import past."""
    graph = write(
        tmp_path,
        {
            "fastinfer/__init__.py": "",
            "fastinfer/common/__init__.py": "",
            "fastinfer/serving/__init__.py": "",
            "fastinfer/front/__init__.py": "",
            "fastinfer/front/http.py": "def send_json(): ...\n",
            "runners/__init__.py": "",
            "tests/__init__.py": "",
            "tests/images.py": "def photo(): ...\n",
            "fastinfer/serving/innocent.py": 'PATH = "service.py"\nLOGGER = "fastinfer.front"\nTIME = "12:30"\n',
            f"fastinfer/serving/{case}.py": HIDDEN_IMPORTS[case],
        },
    )
    wrong = upward_imports(graph)
    assert wrong and all(line.startswith(f"fastinfer.serving.{case} imports ") for line in wrong), wrong


# The frameworks' private names are used in fastinfer/compat/ only, one adapter per framework, each stating
# its assumptions (tests/unit/test_compat_*.py): an upgrade then reads three files, not the whole tree.
ADAPTERS = "fastinfer.compat"
FRAMEWORKS = ("bentoml", "_bentoml_sdk", "_bentoml_impl", "bentoml_cli", "uvicorn", "prometheus_client")
# Private whole: BentoML's implementation packages, and uvicorn, which FastInfer never runs itself (BentoML does).
PRIVATE_PACKAGES = ("_bentoml_sdk", "_bentoml_impl", "bentoml_cli", "uvicorn")
PRIVATE_MODULES = ("prometheus_client.mmap_dict", "prometheus_client.values")  # no leading underscore, not public
DOTTED = re.compile(r"\b_?[A-Za-z]\w*(?:\.\w+)+|\b_bentoml_\w+")  # a dotted name in a string, or a bare private one


def private_name(dotted: str) -> bool:
    """Whether a dotted name is a private one of BentoML, uvicorn or prometheus_client."""
    parts = dotted.split(".")
    if parts[0] not in FRAMEWORKS:
        return False
    private_part = any(part.startswith("_") and not part.startswith("__") for part in parts[1:])
    return (
        parts[0] in PRIVATE_PACKAGES or private_part or any(f"{dotted}.".startswith(f"{m}.") for m in PRIVATE_MODULES)
    )


def private_uses(path: Path, root: Path = ROOT) -> list[str]:
    """Each private framework name ``path`` imports, reaches by attribute or writes in a string (not a docstring)."""
    tree = ast.parse(path.read_text(), str(path))
    where = path.relative_to(root)
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}  # bare strings: prose
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or "", *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Attribute):
            names = [_dotted(node)[1]]
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
    )
    assert private_uses(path, tmp_path) == []
