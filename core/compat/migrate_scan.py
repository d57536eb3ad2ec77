"""Which Hugging Face Accelerate names a script uses, and whether acc has each of them.

`scan_source(text)` reads a script with `ast` (nothing is executed) and returns every Accelerate name it uses,
with its line, in four kinds:

    import          `from accelerate.utils import set_seed`, `import accelerate`, `accelerate.__version__`
                    stored as "accelerate.utils:set_seed", "accelerate", "accelerate:__version__"
    attribute       an attribute read (or set) on an Accelerator / PartialState / AcceleratorState object
                    stored as "Accelerator.state", "PartialState.split_between_processes"
    keyword         a keyword argument to a callable imported from Accelerate: "accelerate:Accelerator(log_with=)"
    method_keyword  a keyword argument to a method of such an object: "Accelerator.unwrap_model(keep_fp32_wrapper=)"

Objects are recognised by name (`accelerator`, `accel`, `self.accelerator`, `<x>.accelerator` except
`torch.accelerator`) and by what they were bound from (`Accelerator(...)`, `PartialState()`, `AcceleratorState()`,
`accelerator.state`). `Checker` then looks each name up in the installed acc by introspection: the module path is
mapped (`accelerate` -> `acc`, `accelerate.big_modeling` -> `acc.big_modeling` or else `acc.big_model`), names are
looked up with `getattr`, attributes with `hasattr` on the acc class (plus the `self.X = ...` attributes its
methods set), keywords with `inspect.signature`. A name that exists in acc counts as present.

Importing this module is cheap (standard library only); checking names imports acc's modules, and so torch.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

KINDS = ("import", "attribute", "keyword", "method_keyword")


ROOTS = ("accelerate", "acc")  # scripts already moved to acc are checked the same way


# Accelerate modules acc names differently: the first candidate that exists in acc is used (for checking and by
# --write). Every other `accelerate.X` maps to `acc.X`.
MODULE_RENAMES: dict[str, tuple[str, ...]] = {
    "accelerate.big_modeling": ("acc.big_modeling", "acc.big_model"),
}


# The classes whose objects' attributes are checked, and where Accelerate defines them.
OWNERS: dict[str, tuple[str, str]] = {
    "Accelerator": ("accelerate", "Accelerator"),
    "PartialState": ("accelerate.state", "PartialState"),
    "AcceleratorState": ("accelerate.state", "AcceleratorState"),
    "GradientState": ("accelerate.state", "GradientState"),
}


# Attributes whose value is itself such an object.
OWNER_ATTRIBUTES: dict[tuple[str, str], str] = {
    ("Accelerator", "state"): "AcceleratorState",
    ("Accelerator", "gradient_state"): "GradientState",
}


# Expressions taken to be an Accelerator without seeing where they came from.
DEFAULT_OBJECTS: dict[str, str] = {"accelerator": "Accelerator", "accel": "Accelerator",
                                   "self.accelerator": "Accelerator"}


TRAINING_METHODS = ("prepare", "prepare_model")  # an Accelerator calling one of these makes a training script


# Uses inside `if <test mentioning one of these>:` are test-only (Accelerate's examples import mocked data
# loaders under `if os.environ.get("TESTING_MOCKED_DATALOADERS")`): listed, but not counted by coverage.
TEST_ONLY_GUARD = re.compile(r"\bTESTING_[A-Z_]+")


class MigrateError(Exception):
    """A script cannot be read or parsed; the message names the file and the cause."""


@dataclass(frozen=True, order=True)
class Use:
    line: int
    kind: str
    name: str
    test_only: bool = False

    @property
    def display(self) -> str:
        return display_name(self.kind, self.name)


def display_name(kind: str, name: str) -> str:
    """How a stored name reads for a person: "accelerate.utils.set_seed", "Accelerator(log_with=)"."""
    if kind in ("import", "keyword"):
        module, _, rest = name.partition(":")
        if kind == "keyword" and module in ROOTS and rest.startswith(tuple(OWNERS)):
            return rest  # Accelerator(log_with=) rather than accelerate.Accelerator(log_with=)
        return f"{module}.{rest}" if rest else module
    return name


@dataclass
class Hit:
    """A known behaviour difference found in a script."""

    line: int
    id: str
    message: str


@dataclass
class Scan:
    """What `scan_source` found in one script."""

    uses: list[Use]
    training_script: bool
    tree: ast.Module = field(repr=False)
    source: str = field(repr=False)
    owners: Callable[[ast.AST], str | None] = field(repr=False)
    parents: dict[ast.AST, ast.AST] = field(repr=False)

    def names(self, *, include_test_only: bool = False) -> list[tuple[str, str]]:
        """Distinct (kind, name) pairs, sorted."""
        return sorted({(u.kind, u.name) for u in self.uses if include_test_only or not u.test_only})


def read_source(path: str | Path) -> str:
    """The text of a Python file (its coding cookie honoured); MigrateError for anything that is not one."""
    path = Path(path)
    if not path.exists():
        raise MigrateError(f"{path}: no such file")
    if path.is_dir():
        raise MigrateError(f"{path}: is a directory (give the Python files, e.g. {path}/*.py)")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise MigrateError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    return decode_source(data, str(path))


def decode_source(data: bytes, label: str) -> str:
    if b"\0" in data:
        raise MigrateError(f"{label}: not a Python source file (it holds binary data)")
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        text = data.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError) as exc:
        raise MigrateError(f"{label}: not a Python source file (cannot be decoded: {exc})") from None
    return text[1:] if text.startswith("\ufeff") else text


def parse_source(text: str, label: str = "<script>") -> ast.Module:
    try:
        return ast.parse(text, filename=label)
    except SyntaxError as exc:
        where = f"{label}:{exc.lineno}" if exc.lineno else label
        raise MigrateError(f"{where}: not valid Python: {exc.msg}") from None
    except ValueError as exc:  # e.g. null bytes
        raise MigrateError(f"{label}: not a Python source file ({exc})") from None


def root_module(module: str) -> str:
    return module.split(".", 1)[0]


def _key(node: ast.AST) -> str | None:
    """'accelerator' for a name, 'self.accelerator' for an attribute of a name; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return None


def guarded_by(node: ast.AST, parents: dict[ast.AST, ast.AST], pattern: re.Pattern,
                cache: dict[ast.AST, bool] | None = None) -> bool:
    """Whether `node` is in the body (or else branch) of an `if` whose test matches `pattern`."""
    cache = {} if cache is None else cache
    child, parent = node, parents.get(node)
    while parent is not None:
        if isinstance(parent, ast.If) and child is not parent.test:
            if parent not in cache:
                cache[parent] = bool(pattern.search(ast.unparse(parent.test)))
            if cache[parent]:
                return True
        child, parent = parent, parents.get(parent)
    return False


class _Scanner:
    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self.imported: dict[str, tuple[str, tuple[str, ...]]] = {}  # local name -> (module, attribute path)
        self.objects: dict[str, str] = dict(DEFAULT_OBJECTS)  # expression key -> owner class
        self.uses: set[Use] = set()
        self.training = False
        self._guards: dict[ast.AST, bool] = {}

    # -- what a name or expression refers to

    def ref(self, node: ast.AST) -> tuple[str, tuple[str, ...]] | None:
        """(module, attribute path) for an expression that names something imported from Accelerate."""
        if isinstance(node, ast.Name):
            return self.imported.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.ref(node.value)
            if base is not None:
                return base[0], base[1] + (node.attr,)
        return None

    def owner(self, node: ast.AST) -> str | None:
        """The Accelerate class of the object an expression evaluates to, when it can be told."""
        key = _key(node)
        if key is not None:
            if key in self.objects:
                return self.objects[key]
            if key.endswith(".accelerator") and not key.startswith("torch."):
                return "Accelerator"
        if isinstance(node, ast.Call):
            ref = self.ref(node.func)
            if ref is not None and ref[1] and ref[1][-1] in OWNERS:
                return ref[1][-1]
        if isinstance(node, ast.Attribute):
            base = self.owner(node.value)
            if base is not None:
                return OWNER_ATTRIBUTES.get((base, node.attr))
        return None

    # -- passes

    def collect_imports(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and root_module(node.module) in ROOTS:
                for alias in node.names:
                    if alias.name != "*":
                        self.imported[alias.asname or alias.name] = (node.module, (alias.name,))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if root_module(alias.name) in ROOTS:
                        if alias.asname:
                            self.imported[alias.asname] = (alias.name, ())
                        else:  # `import accelerate.utils` binds `accelerate`
                            self.imported[root_module(alias.name)] = (root_module(alias.name), ())

    def collect_objects(self) -> None:
        bound: dict[str, str] = {}
        foreign: set[str] = set()
        for node in ast.walk(self.tree):
            pairs: list[tuple[ast.AST, ast.AST]] = []
            if isinstance(node, ast.Assign):
                pairs = [(t, node.value) for t in node.targets]
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                pairs = [(node.target, node.value)]
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                pairs = [(node.optional_vars, node.context_expr)]
            for target, value in pairs:
                key = _key(target)
                if key is None:
                    continue
                owner = self.owner(value)
                if owner is not None:
                    bound[key] = owner
                elif key in DEFAULT_OBJECTS and self._foreign(value):
                    foreign.add(key)  # `accelerator = torch.accelerator.current_accelerator()`, "gpu", ...
        for key in foreign - set(bound):
            self.objects.pop(key, None)
        self.objects.update(bound)
        # a second round: objects bound from objects found in the first (`state = accelerator.state`)
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                key, owner = _key(node.targets[0]), self.owner(node.value)
                if key is not None and owner is not None:
                    self.objects.setdefault(key, owner)

    @staticmethod
    def _foreign(value: ast.AST) -> bool:
        if isinstance(value, ast.Constant):
            return True
        node = value
        while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
            node = node.func if isinstance(node, ast.Call) else node.value
        return isinstance(node, ast.Name) and node.id == "torch"

    def add(self, node: ast.AST, kind: str, name: str) -> None:
        test_only = guarded_by(node, self.parents, TEST_ONLY_GUARD, self._guards)
        self.uses.add(Use(getattr(node, "lineno", 0), kind, name, test_only))

    def collect_uses(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and root_module(node.module) in ROOTS:
                for alias in node.names:
                    self.add(node, "import", node.module if alias.name == "*" else f"{node.module}:{alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if root_module(alias.name) in ROOTS:
                        self.add(node, "import", alias.name)
            elif isinstance(node, ast.Attribute):
                self._attribute(node)
            elif isinstance(node, ast.Call):
                self._call(node)

    def _attribute(self, node: ast.Attribute) -> None:
        if node.attr.startswith("__") and node.attr != "__version__":
            return
        owner = self.owner(node.value)
        if owner is not None:
            self.add(node, "attribute", f"{owner}.{node.attr}")
            return
        ref = self.ref(node)
        if ref is None:
            return
        parent = self.parents.get(node)
        if isinstance(parent, ast.Attribute) and self.ref(parent) is not None:
            return  # only the longest chain counts: accelerate.utils.set_seed, not also accelerate.utils
        self.add(node, "import", f"{ref[0]}:{'.'.join(ref[1])}")

    def _call(self, node: ast.Call) -> None:
        keywords = [k.arg for k in node.keywords if k.arg is not None]
        ref = self.ref(node.func)
        if ref is not None and ref[1]:
            for kw in keywords:
                self.add(node, "keyword", f"{ref[0]}:{'.'.join(ref[1])}({kw}=)")
            return
        if isinstance(node.func, ast.Attribute):
            owner = self.owner(node.func.value)
            if owner is None:
                return
            for kw in keywords:
                self.add(node, "method_keyword", f"{owner}.{node.func.attr}({kw}=)")
            if owner == "Accelerator" and node.func.attr in TRAINING_METHODS:
                self.training = True


def scan_source(text: str, label: str = "<script>") -> Scan:
    """Every Accelerate name `text` uses (see the module docstring), sorted by line."""
    tree = parse_source(text, label)
    scanner = _Scanner(tree)
    scanner.collect_imports()
    scanner.collect_objects()
    scanner.collect_uses()
    return Scan(sorted(scanner.uses), scanner.training, tree, text, scanner.owner, scanner.parents)


def scan_file(path: str | Path) -> Scan:
    return scan_source(read_source(path), str(path))


def acc_module_candidates(module: str) -> tuple[str, ...]:
    """The acc modules an Accelerate module path maps to, in the order they are tried."""
    if root_module(module) == "acc":
        return (module,)
    for old, new in MODULE_RENAMES.items():
        if module == old or module.startswith(old + "."):
            return tuple(n + module[len(old):] for n in new)
    return ("acc" + module[len("accelerate"):],)


def acc_module_name(module: str) -> str:
    """The acc module an Accelerate module path maps to: the first candidate that exists, else the first."""
    import importlib.util

    candidates = acc_module_candidates(module)
    for candidate in candidates:
        try:
            if importlib.util.find_spec(candidate) is not None:
                return candidate
        except (ImportError, ValueError):
            continue
    return candidates[0]


_MISSING = object()


class Checker:
    """Looks names up in the installed acc (importing its modules, and torch, as needed). Results are cached."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str], bool] = {}
        self._members: dict[type, set[str]] = {}

    def present(self, kind: str, name: str) -> bool:
        key = (kind, name)
        if key not in self._cache:
            self._cache[key] = self._check(kind, name)
        return self._cache[key]

    def missing(self, uses: Iterable[Use], *, implied: bool = False) -> list[Use]:
        """The uses whose name acc lacks. Without `implied`, leave out those that follow from another missing name
        of the same uses: a keyword of a missing method or callable (`Accelerator.log(step=)` when
        `Accelerator.log` is missing), a member of a missing name (`accelerate.DistributedType.XLA`), an
        attribute of an object whose class acc lacks (`PartialState.device`)."""
        uses = list(uses)
        absent = [u for u in uses if not self.present(u.kind, u.name)]
        if implied:
            return absent
        names = {(u.kind, u.name) for u in absent}
        return [u for u in absent if not self.implied(u.kind, u.name, names)]

    def implied(self, kind: str, name: str, missing: set[tuple[str, str]]) -> bool:
        """Whether name's absence follows from one of `missing` (or from its class's absence)."""
        if kind in ("keyword", "method_keyword"):
            target, _ = _split_keyword(name)
            return ("import" if kind == "keyword" else "attribute", target) in missing
        if kind == "attribute":
            return self._owner_class(name.partition(".")[0]) is _MISSING
        module, _, path = name.partition(":")
        parts = path.split(".") if path else []
        return any(("import", f"{module}:{'.'.join(parts[:i])}") in missing for i in range(1, len(parts)))

    def _check(self, kind: str, name: str) -> bool:
        if kind == "import":
            module, _, path = name.partition(":")
            return self._resolve(module, path.split(".") if path else []) is not _MISSING
        if kind == "attribute":
            owner, _, attr = name.partition(".")
            cls = self._owner_class(owner)
            return cls is not _MISSING and self._has_member(cls, attr)
        if kind == "keyword":
            target, kw = _split_keyword(name)
            module, _, path = target.partition(":")
            obj = self._resolve(module, path.split("."))
            return obj is not _MISSING and _accepts(obj, kw)
        if kind == "method_keyword":
            target, kw = _split_keyword(name)
            owner, _, method = target.partition(".")
            cls = self._owner_class(owner)
            if cls is _MISSING or not self._has_member(cls, method):
                return False
            return _accepts(getattr(cls, method, None), kw)
        raise ValueError(f"unknown kind {kind!r} (one of {', '.join(KINDS)})")

    def _resolve(self, module: str, path: list[str]) -> Any:
        import importlib

        for candidate in acc_module_candidates(module):
            try:
                obj: Any = importlib.import_module(candidate)
            except Exception:  # absent, or failing to import: either way the script cannot use it
                continue
            for part in path:
                try:
                    obj = getattr(obj, part)
                except Exception:
                    if not isinstance(obj, type(sys)):
                        obj = _MISSING
                        break
                    try:  # a submodule not imported yet
                        obj = importlib.import_module(f"{obj.__name__}.{part}")
                    except Exception:
                        obj = _MISSING
                        break
            if obj is not _MISSING:
                return obj
        return _MISSING

    def _owner_class(self, owner: str) -> Any:
        if owner not in OWNERS:
            return _MISSING
        module, attr = OWNERS[owner]
        cls = self._resolve(module, [attr])
        return self._resolve("accelerate", [attr]) if cls is _MISSING else cls

    def _has_member(self, cls: Any, name: str) -> bool:
        if hasattr(cls, name):
            return True
        if not isinstance(cls, type):
            return False
        if cls not in self._members:
            self._members[cls] = _instance_attributes(cls)
        return name in self._members[cls]


def _split_keyword(name: str) -> tuple[str, str]:
    target, _, rest = name.partition("(")
    return target, rest[:-2] if rest.endswith("=)") else rest


def _accepts(obj: Any, keyword: str) -> bool:
    """Whether `obj(keyword=...)` works: in its signature, and not among the arguments it takes only as None
    (an `_unsupported_arguments` attribute, e.g. Accelerator's `log_with` until acc has trackers)."""
    import inspect

    if keyword in getattr(obj, "_unsupported_arguments", ()):
        return False
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return True  # cannot be told (a builtin, a property): counted as present
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            return True
        if parameter.name == keyword and parameter.kind is not inspect.Parameter.POSITIONAL_ONLY:
            return True
    return False


def _instance_attributes(cls: type) -> set[str]:
    """Attributes instances of `cls` get without the class defining them: `self.X = ...` in its methods (and its
    bases'), annotations and slots."""
    import inspect
    import textwrap

    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is object:
            continue
        names.update(getattr(klass, "__annotations__", {}) or {})
        slots = klass.__dict__.get("__slots__", ())
        names.update([slots] if isinstance(slots, str) else slots)
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                    and isinstance(node.value, ast.Name) and node.value.id == "self"):
                names.add(node.attr)
    return names
