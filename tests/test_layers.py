"""The layers import only downward, and no module imports itself through others (imports inside functions count).

    utils/runtime < utils/data < utils/rl < utils/model < inference < utils/trainer < training < train.py, chat.py, bench
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("utils/runtime", "utils/data", "utils/rl", "utils/model", "inference", "utils/trainer", "training", "")


def layer_of(path):
    """The index in LAYERS of a file of the project (the last: the top-level scripts and bench/)."""
    relative = path.relative_to(ROOT).as_posix()
    return next(i for i, layer in enumerate(LAYERS) if relative.startswith(layer))


def project_files():
    return sorted(path for path in ROOT.rglob("*.py")
                  if not {"tests", "build", ".git"} & set(path.relative_to(ROOT).parts) and path.name != "setup.py")


def module_files():
    """{dotted module name: file}."""
    modules = {}
    for path in project_files():
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imports(path, modules):
    """The project files `path` imports (at the top or inside a function)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and modules[name] != path and modules[name].name != "__init__.py":
                found.add(modules[name])
                break
    return found


def test_every_import_goes_down_or_stays_in_its_layer():
    modules = module_files()
    upward = [f"{path.relative_to(ROOT)} imports {target.relative_to(ROOT)}"
              for path in modules.values() for target in imports(path, modules)
              if layer_of(target) > layer_of(path)]
    assert not upward, "\n".join(upward)


def test_no_import_cycle_between_files():
    modules = module_files()
    graph = {path: imports(path, modules) for path in modules.values()}
    done, cycles = set(), []

    def visit(path, trail):
        if path in trail:
            cycles.append(" -> ".join(str(p.relative_to(ROOT)) for p in trail[trail.index(path):] + [path]))
            return
        if path in done:
            return
        for target in graph[path]:
            visit(target, trail + [path])
        done.add(path)

    for path in graph:
        visit(path, [])
    assert not cycles, "\n".join(cycles)


def test_a_layer_that_imports_a_project_file_upward_is_caught(tmp_path):
    """The check itself: a runtime module importing the trainer is reported."""
    modules = module_files()
    runtime_file = ROOT / "utils" / "runtime" / "errors.py"
    planted = tmp_path / "errors.py"
    planted.write_text("from utils.trainer.loop import train_loop\n")
    targets = imports(planted, modules)
    assert targets == {ROOT / "utils" / "trainer" / "loop.py"}
    assert layer_of(runtime_file) < min(layer_of(target) for target in targets)
