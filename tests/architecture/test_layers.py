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


def test_brain_loads_no_engine_server_or_orchestrator() -> None:
    mods = loaded_by("import backends.kvcache")
    assert not tops(mods) & HEAVY, sorted(tops(mods) & HEAVY)
    assert ours(mods, "kvflow_orch") - ours(mods, "kvflow_orch.protocol") == {"kvflow_orch"}
    assert ours(mods, "backends") - ours(mods, "backends.kvcache") == {"backends"}


def test_simulator_loads_no_torch_engine_or_server() -> None:
    mods = loaded_by("import backends.sim, backends.sim.simulate, backends.sim.sweep, backends.sim.replay")
    assert not tops(mods) & (HEAVY - {"numpy"}), sorted(tops(mods) & HEAVY)
    for host in ("backends.local", "backends.server", "backends.sglang_kvflow", "backends.vllm_kvflow"):
        assert not ours(mods, host), f"the simulator loaded {host}"
    dsl = {m for m in ours(mods, "kvflow_orch") if m.split(".")[1:2] in (["builder"], ["runtime"], ["langgraph"],
                                                                         ["cli"], ["tracker"])}
    assert not dsl, f"the simulator loaded orchestrator modules {sorted(dsl)}"


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
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = list(path.relative_to(ROOT).parts[:-1])  # a module's package; an __init__'s own
    out: set[str] = set()
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names if alias.name.startswith("_"))
    return out


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
    banned = ("kvflow_orch.builder", "kvflow_orch.runtime", "kvflow_orch.tracker", "kvflow_orch.asg",
              "kvflow_orch.langgraph", "kvflow_orch.cli", "kvflow_orch.clients", "workflows")
    bad = {m for m in imports_of(path) if m.startswith(banned) or m == "kvflow_orch"}
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


HOSTS = ("backends.local", "backends.server", "backends.sglang_kvflow", "backends.vllm_kvflow", "backends.sim")


@pytest.mark.parametrize("path", modules_under("backends"), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_host_imports_another_host(path: Path) -> None:
    own = ".".join(path.relative_to(ROOT).parts[:2])
    bad = {m for m in imports_of(path) if m.startswith(HOSTS) and not m.startswith(own)}
    assert not bad, f"{path.relative_to(ROOT)} ({own}) imports {sorted(bad)}"


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


def test_traffic_learner_loads_only_the_standard_library_the_contract_and_the_brain() -> None:
    mods = loaded_by("import backends.learn")
    stdlib = {m for m in tops(mods) if m in sys.stdlib_module_names or m.startswith("_sysconfigdata")}
    assert not tops(mods) - stdlib - PYDANTIC - {"kvflow_orch", "backends"}, sorted(tops(mods) - stdlib)
    assert ours(mods, "kvflow_orch") - ours(mods, "kvflow_orch.protocol") == {"kvflow_orch"}
    for host in HOSTS:
        assert not ours(mods, host), f"the learner loaded {host}"
