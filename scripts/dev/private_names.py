"""Every use of a private name (``_name``) outside the module that defines it: ``python scripts/dev/private_names.py``.

An AST scan of gagpo_gym/, wrappers/, agents/, scripts/ and tests/ (no code is imported). It reports

* ``from X import _name`` and ``import X._mod`` / ``from X._mod import ...``: a private name, or a private module
  used from outside its package;
* ``module._name``: a private attribute of an imported module;
* ``obj._name`` where ``obj`` is not ``self``, ``cls``, ``super()`` or ``type(self)``;
* ``getattr``/``setattr``/``hasattr``/``delattr`` (and ``monkeypatch.setattr``, ``mock.patch.object``) with a private
  name as a string, and ``mock.patch("pkg.mod._name")``-style dotted targets.

Dunders (``__name__``) and a lone ``_`` are not private names. A use counts as a violation when the name belongs to
the project: an import from a project module, an attribute of a project module, or an attribute whose name some
project module defines (a private function, class, module-level or class-level assignment, or ``self._x = ...``)
while the module that uses it does not, or that nothing in the project defines and THIRD_PARTY does not list (a
stale use of a renamed member). Third-party privates (``torch._dynamo``, THIRD_PARTY's ``_orig_mod``,
``config._attn_implementation``...) are listed apart, not counted. The exit status is 1
when there are violations. tests/test_layering.py asserts that there are none.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gagpo_gym", "wrappers", "agents")  # importable from the repository root
LOOSE = ("scripts", "tests")  # no packages: a file imports the files of its own folder by bare name
SCANNED = PACKAGES + LOOSE

ATTR_FUNCTIONS = {"getattr", "setattr", "hasattr", "delattr"}  # f(obj, "name", ...)
ATTR_METHODS = {"setattr", "delattr", "object"}  # monkeypatch.setattr(obj, "name"), mock.patch.object(obj, "name")
PATCH_TARGETS = {"patch", "setattr", "delattr"}  # mock.patch("a.b._c"), monkeypatch.setattr("a.b._c", value)

# Private attributes of third-party objects that the project reads on purpose (not counted). An ``obj._name`` whose
# name is neither defined in the project nor listed here counts as a violation: the receiver is most likely a
# project object whose private member was renamed or moved (a stale use), and a new third-party private should be
# a decision, recorded here.
THIRD_PARTY = {
    "_attn_implementation": "transformers PretrainedConfig",
    "_orig_mod": "torch.compile's OptimizedModule",
    "_cliff": "gymnasium CliffWalkingEnv",
    "_max_episode_steps": "gymnasium TimeLimit",
    "_facts": "textworld PddlState",
    "_vars_by_name": "textworld PddlState",
    "_vars_by_type": "textworld PddlState",
    "_var_counts": "textworld PddlState",
    "_entity_infos": "textworld PddlEnv",
}


def is_private(name: str) -> bool:
    return name.startswith("_") and name != "_" and not (name.startswith("__") and name.endswith("__"))


@dataclass(frozen=True, order=True)
class Use:
    path: str  # relative to the repository root
    line: int
    name: str
    kind: str
    where: str = ""  # the project module(s) defining the name, or the third-party module

    def __str__(self) -> str:
        where = f"; {self.where}" if self.where else ""
        return f"{self.path}:{self.line}: {self.name} ({self.kind}{where})"


@dataclass(frozen=True)
class Module:
    path: Path
    names: tuple[str, ...]  # the dotted names it is imported by: agents.gagpo; scripts.bench.checkouts and checkouts
    package: str  # the dotted package holding it ("" for a bare-name module of scripts/ or tests/)
    rel: str  # its path relative to the repository root


def project_files(root: Path = ROOT) -> Iterator[Path]:
    for top in SCANNED:
        for path in sorted((root / top).rglob("*.py")):
            if "__pycache__" not in path.parts:
                yield path


def module_of(path: Path, root: Path = ROOT) -> Module:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    dotted = ".".join(parts)
    names = [dotted]
    if parts[0] in LOOSE and len(parts) >= 2:
        names.append(parts[-1])  # `from checkouts import ...` from a bench script, `import agent_helpers` from a test
    is_package = path.name == "__init__.py"
    package = dotted if is_package else ".".join(parts[:-1])
    return Module(path, tuple(names), package, path.relative_to(root).as_posix())


def _is_selflike(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in {"self", "cls", "mcs", "metacls"}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id == "super":
            return True
        if node.func.id == "type" and len(node.args) == 1:
            return _is_selflike(node.args[0])
    return False


def defined_privates(tree: ast.Module) -> set[str]:
    """The private names a module defines: at module level, in class bodies, and as ``self._x`` / ``cls._x``."""
    names: set[str] = set()

    def targets(node: ast.AST) -> Iterable[ast.expr]:
        if isinstance(node, ast.Assign):
            yield from node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            yield node.target

    def flatten(target: ast.expr) -> Iterable[ast.expr]:
        if isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                yield from flatten(elt)
        elif isinstance(target, ast.Starred):
            yield from flatten(target.value)
        else:
            yield target

    def scope(body: list[ast.stmt]) -> None:  # module or class level
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
                if isinstance(node, ast.ClassDef):
                    scope(node.body)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
                nested = [getattr(node, f, []) for f in ("body", "orelse", "finalbody")]
                nested += [h.body for h in getattr(node, "handlers", [])]
                for block in nested:
                    scope(block)
            for target in targets(node):
                for t in flatten(target):
                    if isinstance(t, ast.Name):
                        names.add(t.id)

    scope(tree.body)
    for node in ast.walk(tree):
        for target in targets(node):
            for t in flatten(target):
                if isinstance(t, ast.Attribute) and _is_selflike(t.value):
                    names.add(t.attr)
    return {n for n in names if is_private(n)}


class _Scanner(ast.NodeVisitor):
    def __init__(self, module: Module, rel: str, index: dict[str, Module], owners: dict[str, set[str]], own: set[str]):
        self.module, self.rel, self.index, self.owners, self.own = module, rel, index, owners, own
        self.aliases: dict[str, str] = {}  # local name -> dotted module it is bound to (by an import)
        self.violations: list[Use] = []
        self.third_party: list[Use] = []

    # -- helpers -------------------------------------------------------------------------------------------------
    def _project(self, dotted: str) -> Module | None:
        """The project module a dotted name is, or lies in (``agents.gagpo.GAGPOAgent`` -> agents.gagpo)."""
        parts = dotted.split(".")
        for n in range(len(parts), 0, -1):
            found = self.index.get(".".join(parts[:n]))
            if found is not None:
                return found
        return None

    def _mine(self, target: Module) -> bool:
        return target.path == self.module.path

    def _report(self, node: ast.AST, name: str, kind: str, project: bool, where: str) -> None:
        use = Use(self.rel, getattr(node, "lineno", 0), name, kind, where)
        (self.violations if project else self.third_party).append(use)

    def _private_module_outside(self, dotted: str) -> str | None:
        """The first private component of a project dotted name that this module may not reach, if any."""
        parts = dotted.split(".")
        for i, part in enumerate(parts):
            if not is_private(part):
                continue
            owner = self._project(".".join(parts[: i + 1]))
            if owner is None or not owner.names[0].endswith(part) and part not in owner.names:
                return None  # not a project module but an attribute: judged elsewhere
            home = owner.path.parent.parent if owner.path.name == "__init__.py" else owner.path.parent
            if not self.module.path.is_relative_to(home):
                return part
        return None

    def _attribute_name(self, node: ast.AST, name: str, obj: ast.expr, kind: str) -> None:
        if not is_private(name) or _is_selflike(obj):
            return
        base = obj
        while isinstance(base, ast.Attribute):
            base = base.value
        if isinstance(base, ast.Name) and base.id in self.aliases and obj is base:
            dotted = self.aliases[base.id]
            target = self._project(dotted)
            if target is not None:
                if not self._mine(target):
                    self._report(node, name, f"private attribute of module {dotted}{kind}", True, "")
                return
            self._report(node, name, f"private attribute of module {dotted}{kind}", False, dotted.split(".")[0])
            return
        if name in self.own:
            return  # defined by this module: its own business
        owners = self.owners.get(name)
        if owners:
            self._report(node, name, f"private attribute of an object{kind}", True, "defined in " + ", ".join(owners))
        elif name in THIRD_PARTY:
            self._report(node, name, f"private attribute of an object{kind}", False, THIRD_PARTY[name])
        else:
            where = "defined nowhere in the project, nor a known third-party private"
            self._report(node, name, f"private attribute of an object{kind}", True, where)

    # -- imports -------------------------------------------------------------------------------------------------
    def _resolve_from(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = self.module.package.split(".") if self.module.package else []
        if node.level > 1:
            base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname:
                self.aliases[alias.asname] = alias.name
            else:
                root = alias.name.split(".")[0]
                self.aliases[root] = root
            self._check_module_path(node, alias.name)

    def _check_module_path(self, node: ast.AST, dotted: str) -> None:
        if self._project(dotted) is not None:
            private = self._private_module_outside(dotted)
            if private:
                owner = self._project(dotted)
                assert owner is not None
                where = f"{owner.rel}, from outside its folder"
                self._report(node, private, f"private module, imported as {dotted}", True, where)
        else:
            private = next((p for p in dotted.split(".") if is_private(p)), None)
            if private:
                self._report(node, private, f"private module in import of {dotted}", False, dotted.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        source = self._resolve_from(node)
        self._check_module_path(node, source)
        target = self._project(source)
        for alias in node.names:
            if alias.name == "*":
                continue
            full = f"{source}.{alias.name}" if source else alias.name
            if full in self.index or self._project(full) is not None and self._project(full) is not target:
                self.aliases[alias.asname or alias.name] = full  # a module
            elif target is None:
                self.aliases.setdefault(alias.asname or alias.name, full)  # perhaps a third-party module
            if not is_private(alias.name):
                continue
            if full in self.index:
                private = self._private_module_outside(full)
                if private:
                    owner = self.index[full]
                    self._report(
                        node, alias.name, f"private module {owner.rel}, imported from outside its folder", True, ""
                    )
            elif target is not None:
                if not self._mine(target):
                    self._report(node, alias.name, f"imported from {source}", True, target.names[0])
            else:
                self._report(node, alias.name, f"imported from {source}", False, source.split(".")[0])
        self.generic_visit(node)

    # -- attributes ----------------------------------------------------------------------------------------------
    def visit_Attribute(self, node: ast.Attribute) -> None:
        self._attribute_name(node, node.attr, node.value, "")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        args = node.args
        string = [a.value if isinstance(a, ast.Constant) and isinstance(a.value, str) else None for a in args[:2]]
        by_string = (isinstance(func, ast.Name) and name in ATTR_FUNCTIONS) or (
            isinstance(func, ast.Attribute) and name in ATTR_METHODS
        )
        if by_string and len(args) >= 2 and string[1] is not None:
            self._attribute_name(node, string[1], args[0], f", via {name}()")
        elif isinstance(func, ast.Attribute) and name in PATCH_TARGETS and args and string[0] and "." in string[0]:
            parts = string[0].split(".")
            target = self._project(string[0])
            private = next((p for p in parts if is_private(p)), None)
            if private and target is not None and not self._mine(target):
                self._report(node, private, f"patched by name in {name}({string[0]!r})", True, target.names[0])
            elif private and target is None and parts[0] not in self.index:
                self._report(node, private, f"patched by name in {name}({string[0]!r})", False, parts[0])
        self.generic_visit(node)


def scan(root: Path = ROOT) -> tuple[list[Use], list[Use]]:
    """(violations, third-party privates) over the scanned folders, each sorted by file and line."""
    trees: dict[Path, ast.Module] = {}
    modules: dict[Path, Module] = {}
    index: dict[str, Module] = {}
    for path in project_files(root):
        trees[path] = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        modules[path] = module = module_of(path, root)
        for name in module.names:
            index.setdefault(name, module)
    own = {path: defined_privates(tree) for path, tree in trees.items()}
    owners: dict[str, set[str]] = {}
    for path, names in own.items():
        for name in names:
            owners.setdefault(name, set()).add(modules[path].names[0])
    owners_sorted = {name: sorted(mods) for name, mods in owners.items()}
    violations: list[Use] = []
    third_party: list[Use] = []
    for path, tree in trees.items():
        rel = path.relative_to(root).as_posix()
        scanner = _Scanner(modules[path], rel, index, owners_sorted, own[path])  # type: ignore[arg-type]
        scanner.visit(tree)
        violations += scanner.violations
        third_party += scanner.third_party
    return sorted(set(violations)), sorted(set(third_party))


def main(argv: list[str] | None = None) -> int:
    violations, third_party = scan()
    print(f"Private names used outside the module that defines them ({len(violations)}):")
    for use in violations:
        print(f"  {use}")
    print(f"\nThird-party private names (not counted, {len(third_party)}):")
    for use in third_party:
        print(f"  {use}")
    print(f"\n{len(violations)} violation(s)")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
