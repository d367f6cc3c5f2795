"""The layering rules of ARCHITECTURE.md, checked two ways.

* Dynamically: each layer is imported in a fresh interpreter and the modules it loaded are
  compared with what the layer may use (a lazy import that fires at import time shows up here).
* Statically: the import statements of every module under a package are read with ``ast`` (an
  import hidden inside a function still counts, because it would run in the same process; one
  under ``if TYPE_CHECKING:`` does not, because it never runs).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYDANTIC = {"pydantic", "pydantic_core", "typing_extensions", "annotated_types", "typing_inspection"}
HEAVY = {"torch", "fastapi", "starlette", "uvicorn", "httpx", "networkx", "langgraph", "langchain_core",
         "numpy", "safetensors", "tokenizers", "gguf", "sglang", "prometheus_client"}


HOSTS = ("backends.local", "backends.server", "backends.sglang_kvflow", "backends.vllm_kvflow", "backends.sim")
COMPOSITION = ("kvflow_orch.cli", "kvflow_orch.harness")
"""The composition layers: the CLI (flags) and the harness (the library code it and the benchmarks,
examples and tests call). The only code besides the hosts themselves that imports hosts."""
EMBEDDED_ENGINE = {"kvflow_orch/clients/local.py": ("backends.local",)}
"""The one host import below the composition layers: ``backend="local"`` starts the embedded engine
in-process, lazily (ARCHITECTURE.md's runtime row)."""


def loaded_by(code: str) -> set[str]:
    """Module names ``code`` adds to ``sys.modules`` in a fresh interpreter (beyond what the
    interpreter itself loads at start-up: site hooks, the editable-install finder)."""
    return _modules_after(code) - _modules_after("pass")


def _modules_after(code: str) -> set[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def tops(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


def ours(modules: set[str], package: str) -> set[str]:
    return {m for m in modules if m == package or m.startswith(package + ".")}


def test_contract_loads_only_pydantic_and_the_standard_library() -> None:
    mods = loaded_by("import kvflow_orch.protocol")
    stdlib = {m for m in tops(mods) if m in sys.stdlib_module_names or m.startswith("_sysconfigdata")}
    foreign = tops(mods) - stdlib - PYDANTIC - {"kvflow_orch"}
    assert not foreign, f"the wire contract pulled in {sorted(foreign)}"
    assert ours(mods, "kvflow_orch") - ours(mods, "kvflow_orch.protocol") == {"kvflow_orch"}
    assert not ours(mods, "backends")


def test_step_math_is_a_leaf_of_the_standard_library() -> None:
    # every layer may import it (backends included), so it may import nothing of ours
    mods = loaded_by("import kvflow_orch.stepmath")
    stdlib = {m for m in tops(mods) if m in sys.stdlib_module_names or m.startswith("_sysconfigdata")}
    assert tops(mods) - stdlib == {"kvflow_orch"}, sorted(tops(mods) - stdlib)
    assert ours(mods, "kvflow_orch") - ours(mods, "kvflow_orch.stepmath") == {"kvflow_orch"}
    for path in modules_under("kvflow_orch/stepmath"):
        foreign = {m for m in imports_of(path) if m.split(".")[0] not in sys.stdlib_module_names
                   and m.split(".")[0] != "__future__" and not m.startswith("kvflow_orch.stepmath")}
        assert not foreign, f"{path.relative_to(ROOT)} imports {sorted(foreign)}"


def test_brain_loads_no_engine_server_or_orchestrator() -> None:
    mods = loaded_by("import backends.kvcache")
    assert not tops(mods) & HEAVY, sorted(tops(mods) & HEAVY)
    assert ours(mods, "kvflow_orch") - ours(mods, "kvflow_orch.protocol") == {"kvflow_orch"}
    assert ours(mods, "backends") - ours(mods, "backends.kvcache") == {"backends"}


def test_simulator_loads_no_torch_engine_or_server() -> None:
    mods = loaded_by("import backends.sim, backends.sim.simulate, backends.sim.replay, backends.sim.scaleout")
    assert not tops(mods) & (HEAVY - {"numpy"}), sorted(tops(mods) & HEAVY)
    for host in ("backends.local", "backends.server", "backends.sglang_kvflow", "backends.vllm_kvflow"):
        assert not ours(mods, host), f"the simulator loaded {host}"
    dsl = {m for m in ours(mods, "kvflow_orch") if m.split(".")[1:2] in (["builder"], ["runtime"], ["langgraph"],
                                                                         ["cli"], ["harness"], ["tracker"])}
    assert not dsl, f"the simulator loaded orchestrator modules {sorted(dsl)}"


def test_the_runtime_loads_no_host_until_it_starts_one() -> None:
    mods = loaded_by("import kvflow_orch.runtime, kvflow_orch.context, kvflow_orch.clients, kvflow_orch.langgraph")
    for host in HOSTS:
        assert not ours(mods, host), f"the runtime loaded {host} at import"
    assert not {m for layer in COMPOSITION for m in ours(mods, layer)}, "the runtime loaded a composition layer"


def test_dsl_compiles_without_torch_or_any_backend() -> None:
    mods = loaded_by(
        "from kvflow_orch import Workflow, START, END\n"
        "wf = Workflow('w'); wf.add_agent('a', system='s', prompt='p', output='o')\n"
        "wf.add_edge(START, 'a'); wf.add_edge('a', END); wf.compile().tracker().steps()"
    )
    assert not tops(mods) & {"torch", "fastapi", "uvicorn", "httpx", "langgraph", "sglang"}, sorted(tops(mods) & HEAVY)
    assert not ours(mods, "backends")


# ---- static rules ------------------------------------------------------------------------
def imports_of(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports (relative imports resolved)."""
    return imports_of_tree(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), path)


def imports_of_tree(tree: ast.AST, path: Path) -> set[str]:
    out: set[str] = set()
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node, path)
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names if alias.name.startswith("_"))
    return out


def _absolute(node: ast.ImportFrom, path: Path) -> str:
    """The module a ``from ... import`` in ``path`` reads from (relative imports resolved)."""
    package = list(path.relative_to(ROOT).parts[:-1])  # a module's package; an __init__'s own
    base = package[: len(package) - node.level + 1] if node.level else []
    return ".".join(base + ([node.module] if node.module else []))


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` except those under ``if TYPE_CHECKING:`` (annotations only)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def modules_under(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("path", modules_under("backends"), ids=lambda p: str(p.relative_to(ROOT)))
def test_backends_import_only_the_contract_of_the_orchestrator(path: Path) -> None:
    # of the orchestrator, backends use the contract, the step math (kvflow_orch.stepmath) and,
    # in the simulator, the hint builder and START/END
    banned = ("kvflow_orch.builder", "kvflow_orch.runtime", "kvflow_orch.tracker", "kvflow_orch.asg",
              "kvflow_orch.langgraph", "kvflow_orch.cli", "kvflow_orch.harness", "kvflow_orch.clients", "workflows")
    bad = {m for m in imports_of(path) if m.startswith(banned) or m == "kvflow_orch"}
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


@pytest.mark.parametrize("path", modules_under("backends"), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_host_imports_another_host(path: Path) -> None:
    own = ".".join(path.relative_to(ROOT).parts[:2])
    bad = {m for m in imports_of(path) if m.startswith(HOSTS) and not m.startswith(own)}
    assert not bad, f"{path.relative_to(ROOT)} ({own}) imports {sorted(bad)}"


def _within(module: str, packages: tuple[str, ...] | set[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _below_composition(path: Path) -> bool:
    return not _within(".".join(path.relative_to(ROOT).with_suffix("").parts), COMPOSITION)


@pytest.mark.parametrize("path", [p for p in modules_under("kvflow_orch") + modules_under("workflows")
                                  if _below_composition(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_cli_and_the_harness_import_hosts(path: Path) -> None:
    """The orchestrator and the workflows import no host and neither composition layer; the one
    exception is the embedded engine the runtime starts for ``backend="local"``."""
    allowed = EMBEDDED_ENGINE.get(str(path.relative_to(ROOT)), ())
    bad = {m for m in imports_of(path) if _within(m, HOSTS + COMPOSITION) and not _within(m, allowed)}
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


@pytest.mark.parametrize("path", modules_under("kvflow_orch/harness"), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_harness_never_imports_the_cli(path: Path) -> None:
    bad = {m for m in imports_of(path) if _within(m, ("kvflow_orch.cli",))}
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}: the CLI calls the harness, not the reverse"


def _subcommand_modules() -> set[str]:
    """The CLI modules that are sub-commands: they define both ``add_arguments`` and ``main``."""
    out = set()
    for path in modules_under("kvflow_orch/cli"):
        defined = {n.name for n in ast.parse(path.read_text(encoding="utf-8")).body if isinstance(n, ast.FunctionDef)}
        if {"add_arguments", "main"} <= defined:
            out.add(path.stem)
    return out


def cli_misuses(path: Path, subcommands: set[str]) -> list[str]:
    """What ``path`` takes from the CLI beyond running it: ``kvflow_orch.cli.main``, or a sub-command
    module's ``main`` / ``add_arguments``. Library code lives in the harness."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package_names: set[str] = set()  # names bound to kvflow_orch.cli
    module_names: set[str] = set()  # names bound to a sub-command module
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "kvflow_orch":
            package_names |= {a.asname or a.name for a in node.names if a.name == "cli"}
        elif isinstance(node, ast.ImportFrom) and node.module == "kvflow_orch.cli":
            for a in node.names:
                if a.name in subcommands:
                    module_names.add(a.asname or a.name)
                elif a.name != "main":
                    out.append(f"from kvflow_orch.cli import {a.name}")
        elif isinstance(node, ast.ImportFrom) and _within(node.module or "", ("kvflow_orch.cli",)):
            sub = node.module.split(".")[2]
            extra = [a.name for a in node.names if a.name not in ("main", "add_arguments")]
            if sub not in subcommands or extra:
                out.append(f"from {node.module} import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Import):
            out += [f"import {a.name}" for a in node.names
                    if _within(a.name, ("kvflow_orch.cli",))
                    and a.name.split(".")[2:3] not in ([], *[[s] for s in subcommands])]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id in package_names and node.attr not in {"main", *subcommands}:
                out.append(f"{node.value.id}.{node.attr}")
            elif node.value.id in module_names and node.attr not in ("main", "add_arguments"):
                out.append(f"{node.value.id}.{node.attr}")
    return out


@pytest.mark.parametrize("path", modules_under("benchmarks") + modules_under("examples") + modules_under("tests"),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_benchmarks_examples_and_tests_only_run_the_cli(path: Path) -> None:
    """They import library code from the harness (or a host directly, as a benchmark of that host
    does), never from the CLI."""
    misuses = cli_misuses(path, _subcommand_modules())
    assert not misuses, f"{path.relative_to(ROOT)} uses {misuses}"


def test_no_private_module_is_imported_across_packages() -> None:
    offenders = []
    for folder in ("kvflow_orch", "backends", "workflows", "benchmarks", "examples"):
        for path in modules_under(folder):
            importer = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            for name in imports_of(path):
                parts = name.split(".")
                private = [i for i, p in enumerate(parts) if p.startswith("_") and not p.startswith("__")]
                if not private:
                    continue
                owner = ".".join(parts[: private[0]])  # the package whose private module this is
                if owner and not (importer + ".").startswith(owner + "."):
                    offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offenders, "\n".join(offenders)


# ---- one-way edges -----------------------------------------------------------------------
GRAPH_LAYER = ("constants", "errors", "nodes", "builder", "asg", "tracker", "_steps", "_expected", "branch_stats",
               "export", "hinting")
"""The vocabulary, the DSL and the graph: what the runtime and the LangGraph adapter build on."""
ABOVE_THE_GRAPH = ("kvflow_orch.runtime", "kvflow_orch.context", "kvflow_orch.clients", "kvflow_orch.langgraph",
                   "kvflow_orch.cli")


def _deprecated_shim(node: ast.AST) -> bool:
    """A function that warns ``DeprecationWarning`` before anything else: an old name kept for its
    callers, whose import may point back up the layers."""
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    calls = (n for n in ast.walk(node) if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("warn"))
    return any("DeprecationWarning" in ast.unparse(call) for call in calls)


def _imports_outside_shims(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if _deprecated_shim(node):
            node.body = []  # type: ignore[attr-defined]
    return imports_of_tree(tree, path)


@pytest.mark.parametrize("name", GRAPH_LAYER)
def test_the_graph_layer_imports_nothing_built_on_it(name: str) -> None:
    """The ASG is built by the DSL and by the LangGraph adapter, never the other way round (only a
    deprecated shim such as ``AgentStepGraph.from_langgraph`` may still reach the adapter)."""
    path = ROOT / "kvflow_orch" / f"{name}.py"
    bad = {m for m in _imports_outside_shims(path) if m.startswith(ABOVE_THE_GRAPH)}
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_no_module_imports_a_private_name_of_another_even_for_annotations() -> None:
    """``from .runtime import _Execution`` couples a module to another's internals, even under
    ``if TYPE_CHECKING:``; private *modules* of one's own package stay importable."""
    offenders = []
    for folder in ("kvflow_orch", "backends", "workflows", "benchmarks", "examples"):
        for path in modules_under(folder):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if not isinstance(node, ast.ImportFrom):
                    continue
                module = _absolute(node, path)
                for alias in node.names:
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    submodule = (ROOT / module.replace(".", "/") / f"{alias.name}.py").exists()
                    if private and not submodule:
                        offenders.append(f"{path.relative_to(ROOT)} imports {module}.{alias.name}")
    assert not offenders, "\n".join(offenders)


OPTIONAL = ("networkx", "torch", "backends.local", "langgraph", "langchain_core", "sglang", "vllm")
"""What may be imported inside a function: dependencies a user may not have or not want loaded
(``backends.local`` loads torch)."""


def test_imports_sit_at_module_top_unless_an_optional_dependency_needs_them_lazy() -> None:
    """Outside the composition layers (the CLI loads each sub-command's modules on demand, the
    harness each scenario's workflows and engines)."""
    offenders = []
    for path in modules_under("kvflow_orch"):
        if path.relative_to(ROOT).parts[1] in ("cli", "harness"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) or _deprecated_shim(func):
                continue
            for node in ast.walk(func):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = [_absolute(node, path)]
                else:
                    continue
                lazy = [n for n in names if not n.startswith(OPTIONAL)]
                if lazy:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} ({func.name}) imports {lazy} lazily")
    assert not offenders, "\n".join(offenders)


def test_traffic_learner_loads_only_the_standard_library_the_contract_the_step_math_and_the_brain() -> None:
    mods = loaded_by("import backends.learn")
    stdlib = {m for m in tops(mods) if m in sys.stdlib_module_names or m.startswith("_sysconfigdata")}
    assert not tops(mods) - stdlib - PYDANTIC - {"kvflow_orch", "backends"}, sorted(tops(mods) - stdlib)
    assert ours(mods, "kvflow_orch") - ours(mods, "kvflow_orch.protocol") - ours(mods, "kvflow_orch.stepmath") == {
        "kvflow_orch"}
    for host in HOSTS:
        assert not ours(mods, host), f"the learner loaded {host}"
