"""The lesson stays a lesson (docs/tests.md): its five files check their input in one idiom, import nothing above
them, and the project's imports draw no circle. Its sizes (lines, prose, width) are test_file_sizes.py's, outside
`-m lesson`, so that a line a learner adds to a lesson file never turns the lesson's own tests red."""
import ast
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LESSON = ("softmax_grpo.py", "lopti.py", "ppo.py", "rollout.py", "train.py")
# what each lesson file may import of the project: the lesson files below it, fast/ (rollout) and, for the loop
# that runs it (train.py), harness/
ALLOWED = {"softmax_grpo.py": set(), "lopti.py": set(), "ppo.py": set(), "rollout.py": {"fast"},
           "train.py": {"softmax_grpo", "lopti", "ppo", "rollout", "harness", "fast"}}


def project_imports(path):
    """The top-level names of the project's own modules that one file imports (anywhere in it, lazily too)."""
    own = {name.removesuffix(".py") for name in os.listdir(ROOT)
           if name.endswith(".py") or os.path.isfile(os.path.join(ROOT, name, "__init__.py"))}
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in found if name.split(".")[0] in own}


@pytest.mark.parametrize("name", LESSON)
def test_a_lesson_file_checks_its_input_in_one_idiom(name):
    # plain `if ...: raise`: no table of (condition, message) pairs looped over, no list of problems searched
    source = open(os.path.join(ROOT, name)).read()
    assert "for bad, message in" not in source and "next(problem" not in source


def test_train_py_says_where_the_harness_lives():
    # module-qualified calls (run.start(config)): at most 4 names imported bare from harness/
    bare = [alias.name for node in ast.parse(open(os.path.join(ROOT, "train.py")).read()).body
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("harness.")
            for alias in node.names]
    assert len(bare) <= 4, bare


@pytest.mark.parametrize("name", LESSON)
def test_a_lesson_file_imports_nothing_above_it(name):
    above = {module for module in project_imports(os.path.join(ROOT, name))
             if module.split(".")[0] not in ALLOWED[name]}
    assert not above, f"{name} imports {sorted(above)}"


def modules():
    """{module name: path} of every tracked Python file of the project outside tests/ (git ls-files: a run folder's
    files, a virtual environment or any other untracked .py is not the project's code); without git, every .py."""
    try:
        listed = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                                check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        listed = [os.path.relpath(os.path.join(folder, file), ROOT) for folder, subfolders, files in os.walk(ROOT)
                  for file in files if file.endswith(".py") and not folder.startswith(os.path.join(ROOT, "."))]
    found = {}
    for relative in listed:
        if relative.split("/")[0] not in ("tests",) and not relative.startswith("."):
            found[relative.removesuffix(".py").replace("/", ".").removesuffix(".__init__")] = os.path.join(ROOT, relative)
    return found


def test_the_project_imports_draw_no_circle():
    files = modules()
    def module_of(imported):  # "a.b" a module, or "a.b" the name b of module a
        return imported if imported in files else imported.rsplit(".", 1)[0]
    # a module's own package (its __init__) is not an arrow: Python loads it first, whatever the module imports
    edges = {name: {module_of(imported) for imported in project_imports(path)} & set(files)
             - {name} - {name.rsplit(".", 1)[0]} for name, path in files.items()}
    state, circles = {}, []

    def visit(name, trail):
        state[name] = "open"
        for target in sorted(edges[name]):
            if state.get(target) == "open":
                circles.append(trail[trail.index(target):] + [target])
            elif target not in state:
                visit(target, trail + [target])
        state[name] = "done"
    for name in sorted(files):
        if name not in state:
            visit(name, [name])
    assert not circles, " ; ".join(" -> ".join(circle) for circle in circles)


def test_only_the_lab_imports_the_lab():
    """The two wings (docs/tests.md): lab/ (the results ledger, the referee studies) may use the learner's scripts,
    never the other way round; only the lab, the benchmarks (whose logs carry the ledger's provenance) and the tests
    import it."""
    users = {name: sorted(module for module in project_imports(path) if module.split(".")[0] == "lab")
             for name, path in modules().items() if name.split(".")[0] not in ("lab", "benchmarks")}
    assert not {name: found for name, found in users.items() if found}
