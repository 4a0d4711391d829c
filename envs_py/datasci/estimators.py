"""The estimator class a program's `build_model` returns, read from its syntax tree (nothing runs).

A measure of exploration: how many distinct classifiers the policy writes.
`estimator_class(program)` follows the value `build_model` returns (its last
`return`): a constructor call gives its class name (`RandomForestClassifier`
for `RandomForestClassifier(n_estimators=50).fit(x, y)`); `.fit(...)` gives
its receiver's; a name gives the value last assigned to it before the
return; a pipeline (`make_pipeline`, `Pipeline([...])`) gives its last step's;
a search or calibration wrapper (`GridSearchCV`, `CalibratedClassifierCV`,
...) the estimator it wraps, and so does a search's `.best_estimator_`.  A
name imported under another (`import ... as RF`) is reported by its own
name.  None when the program does not parse, defines
no `build_model`, or returns something this cannot follow (a helper's
result, say).
"""

from __future__ import annotations

import ast

from envs_py.datasci.extract import parse_tree

# Classes that wrap one estimator, given first or as `estimator=` / `base_estimator=`; the wrapped one is reported.
WRAPPERS = frozenset({"GridSearchCV", "RandomizedSearchCV", "HalvingGridSearchCV", "HalvingRandomSearchCV",
                      "CalibratedClassifierCV", "OneVsRestClassifier", "OneVsOneClassifier"})
_WRAPPED_KEYWORDS = ("estimator", "base_estimator")
_MAX_DEPTH = 16  # names that refer to names: a chain longer than this (or a loop) is not followed


def estimator_class(program: str) -> str | None:
    """The class name of the estimator `program`'s build_model returns, or None (module docstring)."""
    try:
        tree = parse_tree(program)
    except (SyntaxError, ValueError):
        return None
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "build_model"]
    if not functions:
        return None
    function = functions[-1]
    returns = [node for node in ast.walk(function) if isinstance(node, ast.Return) and node.value is not None]
    if not returns:
        return None
    last = max(returns, key=lambda node: node.lineno)
    name = _class_of(last.value, _assignments(function), last.lineno, 0)
    return _imported_names(tree).get(name, name)


def _imported_names(tree: ast.Module) -> dict[str, str]:
    """{alias: name} of every `from ... import name as alias` in the program."""
    return {alias.asname: alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            for alias in node.names if alias.asname}


def _assignments(function: ast.FunctionDef) -> dict[str, list[tuple[int, ast.expr]]]:
    """{name: [(line, value)]} of the function's plain assignments `name = value`, in line order."""
    found: dict[str, list[tuple[int, ast.expr]]] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            targets = [t for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and node.value is not None and isinstance(node.target, ast.Name):
            targets = [node.target]
        else:
            continue
        for target in targets:
            found.setdefault(target.id, []).append((node.lineno, node.value))
    for values in found.values():
        values.sort(key=lambda pair: pair[0])
    return found


def _callee(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _class_of(node: ast.expr, assigned, line: int, depth: int) -> str | None:
    """The class of the estimator `node` evaluates to at `line`, or None."""
    if depth > _MAX_DEPTH:
        return None
    follow = lambda child, at=line: _class_of(child, assigned, at, depth + 1)  # noqa: E731
    if isinstance(node, ast.Name):
        earlier = [(at, value) for at, value in assigned.get(node.id, ()) if at < line]
        return follow(earlier[-1][1], earlier[-1][0]) if earlier else None
    if isinstance(node, ast.Attribute) and node.attr == "best_estimator_":
        return follow(node.value)
    if not isinstance(node, ast.Call):
        return None
    name = _callee(node)
    if name == "fit" and isinstance(node.func, ast.Attribute):
        return follow(node.func.value)
    if name == "make_pipeline":
        steps = [arg for arg in node.args if not isinstance(arg, ast.Starred)]
        return follow(steps[-1]) if steps else None
    if name == "Pipeline":
        return _last_pipeline_step(node, follow)
    if name in WRAPPERS:
        wrapped = node.args[:1] + [k.value for k in node.keywords if k.arg in _WRAPPED_KEYWORDS]
        return (follow(wrapped[0]) or name) if wrapped else name
    if name and name[0].isupper():
        return name
    return None


def _last_pipeline_step(call: ast.Call, follow) -> str | None:
    """The class of `Pipeline([(name, step), ...])`'s last step (given first or as `steps=`)."""
    given = call.args[:1] + [k.value for k in call.keywords if k.arg == "steps"]
    if not given or not isinstance(given[0], (ast.List, ast.Tuple)) or not given[0].elts:
        return "Pipeline"
    last = given[0].elts[-1]
    if isinstance(last, (ast.Tuple, ast.List)) and len(last.elts) >= 2:
        return follow(last.elts[1]) or "Pipeline"
    return "Pipeline"
