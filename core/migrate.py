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

`DIFFERENCES` is the table of known behaviour differences (README, "Coming from Accelerate" / "What behaves
differently"), reported by pattern; see its comment for how to add one.

Importing this module is cheap (standard library only); checking names imports acc's modules, and so torch.
"""

from __future__ import annotations

import ast
import io
import json
import re
import sys
import tokenize
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

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


# ------------------------------------------------------------------------------------------------- reading


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


# ------------------------------------------------------------------------------------------------- scanning


def _root(module: str) -> str:
    return module.split(".", 1)[0]


def _key(node: ast.AST) -> str | None:
    """'accelerator' for a name, 'self.accelerator' for an attribute of a name; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return None


def _guarded_by(node: ast.AST, parents: dict[ast.AST, ast.AST], pattern: re.Pattern,
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
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _root(node.module) in ROOTS:
                for alias in node.names:
                    if alias.name != "*":
                        self.imported[alias.asname or alias.name] = (node.module, (alias.name,))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if _root(alias.name) in ROOTS:
                        if alias.asname:
                            self.imported[alias.asname] = (alias.name, ())
                        else:  # `import accelerate.utils` binds `accelerate`
                            self.imported[_root(alias.name)] = (_root(alias.name), ())

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
        test_only = _guarded_by(node, self.parents, TEST_ONLY_GUARD, self._guards)
        self.uses.add(Use(getattr(node, "lineno", 0), kind, name, test_only))

    def collect_uses(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _root(node.module) in ROOTS:
                for alias in node.names:
                    self.add(node, "import", node.module if alias.name == "*" else f"{node.module}:{alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if _root(alias.name) in ROOTS:
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


# ------------------------------------------------------------------------------------------------- checking


def acc_module_candidates(module: str) -> tuple[str, ...]:
    """The acc modules an Accelerate module path maps to, in the order they are tried."""
    if _root(module) == "acc":
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


# ------------------------------------------------------------------------------------- behaviour differences

# Known behaviour differences, reported where a script's code matches. The README ("Coming from Accelerate" /
# "What behaves differently", and the checkpoint comment of the quick tour) is the source of truth: every entry
# quotes it in "readme" (a test checks the quote is still there), and "message" says only what the README says.
#
# To add one: append a dict with
#   id        short name (shown in the report)
#   readme    a phrase of the README entry it encodes (whitespace is not significant)
#   match     a list of patterns; the entry is reported on every line one of them matches
#   requires  (optional) patterns that must each match somewhere in the script
#   unless    (optional) patterns none of which may match anywhere in the script
#   message   what to tell the user
# A pattern is a one-key dict; the keys are the matchers of PATTERNS below:
#   {"method": "load_state"}            accelerator.load_state(...) (a call on an Accelerator object)
#   {"call": "set_epoch"}               any call of that name: x.set_epoch(...), set_epoch(...)
#   {"prepares": REGEX}                 an argument of accelerator.prepare / prepare_scheduler named like REGEX
#   {"use": REGEX}                      a scanned name (as displayed) matching REGEX
#   {"keyword": {"name": "split_batches", "value": True}}   a keyword (with a literal value, optional) passed to
#                                       a callable imported from Accelerate or a method of an Accelerate object
#   {"unguarded_method": {"method": M, "guard": G}}   accelerator.M(...) not inside `if <... G ...>:`
#   {"scaled_by": {"factor": F, "where": REGEX}}      `... * accelerator.F` in a keyword argument or an assignment
#                                       whose name matches REGEX
#   {"skip_loop": REGEX}                `if step < resume_step: ... continue` (a name matching REGEX compared
#                                       with < or <=, in an `if` whose body continues the loop)
DIFFERENCES: list[dict[str, Any]] = [
    {
        "id": "split-batches-ignored",
        "readme": "`Accelerator(split_batches=True)` is ignored as in 1.15",
        "match": [{"keyword": {"name": "split_batches", "value": True}}],
        "message": "Accelerator(split_batches=True) is ignored, as Accelerate 1.15 ignores it (acc warns): to split "
                   "batches pass dataloader_config=DataLoaderConfiguration(split_batches=True)",
    },
    {
        "id": "resume-skip-twice",
        "readme": "the data continue with\nthe next batch and the script must not skip",
        "match": [{"skip_loop": r"(?i)resume|skip"}, {"call": "skip_first_batches"}],
        "requires": [{"method": "load_state"}, {"keyword": {"name": "use_stateful_dataloader", "value": True}}],
        "message": "with use_stateful_dataloader=True acc's load_state continues the data loaders at the saved batch "
                   "(exact resume, no torchdata needed), so skipping the batches already trained here skips them "
                   "a second time: remove the skip",
    },
    {
        "id": "reduce-scale",
        "readme": "`reduce(scale=)` applies only on XLA",
        "match": [{"keyword": {"name": "scale"}}],
        "requires": [{"method": "reduce"}],
        "message": "reduce(scale=...) is applied on XLA only, as Accelerate documents (acc warns elsewhere): "
                   "multiply the result instead",
    },
    {
        "id": "checkpoints",
        "readme": "**Checkpoints never run code**",
        "match": [{"method": "load_state"}],
        "message": "acc's load_state reads acc checkpoints (safetensors and a manifest); a checkpoint written by "
                   "Accelerate's save_state is not loaded (its pickled RNG-state files are refused): load its "
                   "model weights with load_checkpoint_and_dispatch or load_state_dict instead",
    },
    {
        "id": "gather-object",
        "readme": "**gather_object** of an object that is not a list returns each process's object",
        "match": [{"call": "gather_object"}],
        "message": "gather_object of an object that is not a list returns each process's object; Accelerate 1.15 "
                   "iterates it (a dict gives its keys, a string its characters): lists behave the same",
    },
    {
        "id": "deepspeed-clipping",
        "readme": "**DeepSpeed does not clip unless asked**",
        "match": [{"use": r"(?i)deepspeed"}],
        "unless": [{"method": "clip_grad_norm_"}],
        "message": "on DeepSpeed acc does not clip unless asked (it writes gradient_clipping: 0; DeepSpeed clips "
                   "to norm 1.0 when its config is silent): pass --gradient-clipping or call clip_grad_norm_",
    },
]


def _calls(scan: Scan) -> Iterator[ast.Call]:
    for node in ast.walk(scan.tree):
        if isinstance(node, ast.Call):
            yield node


def _method_calls(scan: Scan, method: str) -> Iterator[ast.Call]:
    for node in _calls(scan):
        if (isinstance(node.func, ast.Attribute) and node.func.attr == method
                and scan.owners(node.func.value) == "Accelerator"):
            yield node


def _m_method(scan: Scan, method: str) -> list[int]:
    return [n.lineno for n in _method_calls(scan, method)]


def _m_call(scan: Scan, name: str) -> list[int]:
    return [n.lineno for n in _calls(scan)
            if (isinstance(n.func, ast.Attribute) and n.func.attr == name)
            or (isinstance(n.func, ast.Name) and n.func.id == name)]


def _terminal(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _m_prepares(scan: Scan, pattern: str) -> list[int]:
    regex = re.compile(pattern)
    lines = []
    for method in ("prepare", "prepare_scheduler"):
        for call in _method_calls(scan, method):
            args = [a.value if isinstance(a, ast.Starred) else a for a in call.args]
            if any((name := _terminal(a)) is not None and regex.search(name) for a in args):
                lines.append(call.lineno)
    return lines


def _m_use(scan: Scan, pattern: str) -> list[int]:
    regex = re.compile(pattern)
    return [u.line for u in scan.uses if regex.search(u.display)]


def _m_keyword(scan: Scan, spec: dict[str, Any]) -> list[int]:
    wanted = f"({spec['name']}=)"
    lines = {u.line for u in scan.uses if u.kind in ("keyword", "method_keyword") and u.name.endswith(wanted)}
    if "value" not in spec:
        return sorted(lines)
    out = []
    for call in _calls(scan):
        if call.lineno in lines:
            for kw in call.keywords:
                if (kw.arg == spec["name"] and isinstance(kw.value, ast.Constant)
                        and kw.value.value == spec["value"]):
                    out.append(call.lineno)
    return out


def _m_unguarded_method(scan: Scan, spec: dict[str, Any]) -> list[int]:
    guard = re.compile(rf"\b{re.escape(spec['guard'])}\b")
    return [c.lineno for c in _method_calls(scan, spec["method"]) if not _guarded_by(c, scan.parents, guard)]


def _m_scaled_by(scan: Scan, spec: dict[str, Any]) -> list[int]:
    where = re.compile(spec["where"])
    lines = []
    for node in ast.walk(scan.tree):
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)):
            continue
        if not any(isinstance(side, ast.Attribute) and side.attr == spec["factor"]
                   and scan.owners(side.value) == "Accelerator" for side in (node.left, node.right)):
            continue
        parent = scan.parents.get(node)
        while parent is not None and not isinstance(parent, (ast.stmt, ast.keyword)):
            parent = scan.parents.get(parent)
        names: list[str] = []
        if isinstance(parent, ast.keyword) and parent.arg:
            names = [parent.arg]
        elif isinstance(parent, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
            names = [n for t in targets for n in [_terminal(t)] if n]
        if any(where.search(n) for n in names):
            lines.append(node.lineno)
    return lines


def _m_skip_loop(scan: Scan, pattern: str) -> list[int]:
    regex = re.compile(pattern)
    lines = []
    for node in ast.walk(scan.tree):
        if not isinstance(node, ast.If):
            continue
        compares = [c for c in ast.walk(node.test) if isinstance(c, ast.Compare)
                    and any(isinstance(op, (ast.Lt, ast.LtE)) for op in c.ops)]
        if not any(regex.search(name) for c in compares for part in [c.left, *c.comparators]
                   for name in [_terminal(part)] if name):
            continue
        if any(isinstance(s, ast.Continue) for stmt in node.body for s in ast.walk(stmt)):
            lines.append(node.lineno)
    return lines


PATTERNS: dict[str, Callable[[Scan, Any], list[int]]] = {
    "method": _m_method,
    "call": _m_call,
    "prepares": _m_prepares,
    "use": _m_use,
    "keyword": _m_keyword,
    "unguarded_method": _m_unguarded_method,
    "scaled_by": _m_scaled_by,
    "skip_loop": _m_skip_loop,
}


def _match(scan: Scan, pattern: dict[str, Any]) -> list[int]:
    (kind, arg), = pattern.items()
    return PATTERNS[kind](scan, arg)


def differences(scan: Scan, table: list[dict[str, Any]] | None = None) -> list[Hit]:
    """The known behaviour differences `scan`'s script runs into, by line."""
    hits = []
    for entry in DIFFERENCES if table is None else table:
        if not all(_match(scan, p) for p in entry.get("requires", [])):
            continue
        if any(_match(scan, p) for p in entry.get("unless", [])):
            continue
        lines = sorted({line for p in entry["match"] for line in _match(scan, p)})
        hits.extend(Hit(line, entry["id"], entry["message"]) for line in lines)
    return sorted(hits, key=lambda h: (h.line, h.id))


# ------------------------------------------------------------------------------------------------- rewriting


@dataclass
class Change:
    line: int
    before: str
    after: str


def _line_starts(text: str) -> list[int]:
    starts = [0]
    for m in re.finditer(r"\r\n|\r|\n", text):
        starts.append(m.end())
    return starts


def rewrite_imports(text: str, label: str = "<script>") -> tuple[str, list[Change], list[str]]:
    """`text` with its Accelerate imports changed to acc's, and nothing else changed; the changed lines and the
    notes about imports that could not be rewritten."""
    tree = parse_source(text, label)
    starts = _line_starts(text)

    def offset(line: int, col: int) -> int:  # ast columns count UTF-8 bytes
        start = starts[line - 1]
        end = starts[line] if line < len(starts) else len(text)
        return start + len(text[start:end].encode("utf-8")[:col].decode("utf-8", errors="ignore"))

    used_names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    used_names |= {n.value.id for n in ast.walk(tree)
                   if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
    edits: list[tuple[int, int, str]] = []
    notes: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _root(node.module) == "accelerate":
            begin = offset(node.lineno, node.col_offset)
            m = re.compile(r"from(?:\s|\\\r?\n)+([A-Za-z_]\w*(?:\s*\.\s*[A-Za-z_]\w*)*)").match(text, begin)
            if m is None:  # pragma: no cover - ast and the regex disagree about an import statement
                notes.append(f"line {node.lineno}: could not find the module name; left unchanged")
                continue
            edits.append((m.start(1), m.end(1), acc_module_name(node.module)))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _root(alias.name) != "accelerate":
                    continue
                new = acc_module_name(alias.name)
                if alias.asname:
                    replacement = f"{new} as {alias.asname}"
                elif alias.name == "accelerate":
                    replacement = "acc as accelerate" if "accelerate" in used_names else "acc"
                elif "accelerate" not in used_names:
                    replacement = new
                elif new.split(".", 1)[1] == alias.name.split(".", 1)[1]:
                    replacement = f"{new}, acc as accelerate"  # accelerate.utils.X keeps working
                else:
                    notes.append(f"line {alias.lineno}: `import {alias.name}` left unchanged: acc names it {new}, "
                                 f"so the code's `{alias.name}.` must change too")
                    continue
                edits.append((offset(alias.lineno, alias.col_offset),
                              offset(alias.end_lineno, alias.end_col_offset), replacement))
    if not edits:
        return text, [], notes
    new_text = text
    for begin, end, replacement in sorted(edits, reverse=True):
        new_text = new_text[:begin] + replacement + new_text[end:]
    changes = _changed_lines(text, new_text, sorted(edits))
    return new_text, changes, notes


def _changed_lines(old: str, new: str, edits: list[tuple[int, int, str]]) -> list[Change]:
    old_lines = re.split(r"\r\n|\r|\n", old)
    new_lines = re.split(r"\r\n|\r|\n", new)
    starts = _line_starts(old)
    lines = sorted({max(i for i, s in enumerate(starts) if s <= begin) for begin, _, _ in edits})
    # edits never add or remove line breaks, so line numbers agree between old and new
    return [Change(i + 1, old_lines[i].strip(), new_lines[i].strip()) for i in lines]


# ------------------------------------------------------------------------------------------------- reports


@dataclass
class Report:
    path: str
    scan: Scan
    missing: list[Use]
    hits: list[Hit]
    changes: list[Change] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        def use(u: Use) -> dict[str, Any]:
            return {"line": u.line, "kind": u.kind, "name": u.display, "test_only": u.test_only}

        return {
            "path": self.path,
            "training_script": self.scan.training_script,
            "uses": [use(u) for u in self.scan.uses],
            "missing": [use(u) for u in self.missing],
            "differences": [{"line": h.line, "id": h.id, "message": h.message} for h in self.hits],
            "rewritten": [{"line": c.line, "before": c.before, "after": c.after} for c in self.changes],
            "notes": self.notes,
        }


def check_file(path: str | Path, checker: Checker | None = None) -> Report:
    scan = scan_file(path)
    checker = checker or Checker()
    return Report(str(path), scan, checker.missing(scan.uses), differences(scan))


def format_report(report: Report) -> str:
    rows = [(u.line, "missing", u.kind, u.display + ("  (test-only)" if u.test_only else "")) for u in report.missing]
    rows += [(h.line, "differs", h.id, h.message) for h in report.hits]
    names = {(u.kind, u.name) for u in report.scan.uses}
    missing = {(u.kind, u.name) for u in report.missing}
    if missing:
        head = f"{report.path}: {len(missing)} of the {len(names)} Accelerate names it uses are missing in acc"
    elif names:
        head = f"{report.path}: every Accelerate name it uses exists in acc ({len(names)} names)"
    else:
        head = f"{report.path}: uses no Accelerate name"
    if report.hits:
        head += f"; {len(report.hits)} known difference(s)"
    width = max([len(str(r[0])) for r in rows], default=1)
    lines = [head] + [f"  {path_line(report.path, line, width)}  {what:<8} {kind:<16} {text}"
                      for line, what, kind, text in sorted(rows, key=lambda r: (r[0], r[1] != "missing"))]
    return "\n".join(lines)


def path_line(path: str, line: int, width: int) -> str:
    return f"{path}:{str(line).ljust(width)}"


# ------------------------------------------------------------------------------------------------- coverage

TARGET_PERCENT = 95.0  # what migration should reach: training scripts per corpus that run after the import change


def load_usage(path: str | Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise MigrateError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MigrateError(f"{path}: not a usage file (invalid JSON: {exc})") from None


def coverage(data: dict[str, Any], checker: Checker | None = None) -> list[dict[str, Any]]:
    """Per corpus of a usage file (tests/data/accelerate_usage.json): the training scripts none of whose names is
    missing in the installed acc, and how many files use each missing name (names whose absence follows from
    another's are not counted, see `Checker.missing`). Test-only names are not counted."""
    checker = checker or Checker()
    results = []
    for corpus in data["corpora"]:
        files = corpus["files"]
        training = [f for f in files if f["training_script"]]
        clean, missing_by_file = [], {}
        distinct: set[tuple[str, str]] = set()
        for f in files:
            names = {(kind, name) for kind, name in f["uses"]}
            distinct |= names
            missing = {n for n in names if not checker.present(*n)}
            missing_by_file[f["path"]] = sorted(n for n in missing if not checker.implied(*n, missing))
            if f["training_script"] and not missing:
                clean.append(f["path"])
        # keyed by the displayed name: `accelerate.state.is_initialized` is one name whether the script wrote
        # `from accelerate.state import is_initialized` or `accelerate.state.is_initialized()`
        counts: Counter = Counter(n for m in missing_by_file.values() for n in {display_name(*k) for k in m})
        training_counts: Counter = Counter(n for f in training
                                           for n in {display_name(*k) for k in missing_by_file[f["path"]]})
        present = {n for n in distinct if checker.present(*n)}
        results.append({
            "name": corpus["name"], "repository": corpus["repository"], "commit": corpus["commit"],
            "files": len(files), "training_scripts": len(training), "clean_training_scripts": clean,
            "percent": 100.0 * len(clean) / len(training) if training else 100.0,
            "distinct_names": len(distinct), "distinct_present": len(present),
            "missing": counts, "missing_in_training": training_counts,
        })
    return results


def format_coverage(results: list[dict[str, Any]], top: int = 30) -> str:
    lines = [f"Training scripts (files calling accelerator.prepare / prepare_model) whose every Accelerate name exists "
             f"in acc; target {TARGET_PERCENT:g} %", ""]
    header = ("corpus", "commit", "clean / training scripts", "files", "distinct names present")
    table = [header] + [(r["name"], r["commit"][:8],
                         f"{len(r['clean_training_scripts'])} / {r['training_scripts']} ({r['percent']:.1f} %)",
                         str(r["files"]), f"{r['distinct_present']} / {r['distinct_names']}") for r in results]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    for r in results:
        if r["clean_training_scripts"]:
            lines.append(f"  {r['name']}: clean: {', '.join(r['clean_training_scripts'])}")
    total: Counter = Counter()
    for r in results:
        total.update(r["missing"])
    lines += ["", f"Most used missing names (files using each; {len(total)} distinct missing names in all)"]
    header = ("rank", "name", *(r["name"] for r in results), "total")
    table = [header] + [(str(i), name, *(str(r["missing"].get(name, 0)) for r in results), str(n))
                        for i, (name, n) in enumerate(sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))[:top], 1)]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`python -m acc.migrate --coverage USAGE.json` prints the coverage table; `python -m acc.migrate SCRIPT...`
    checks scripts (as `acc migrate`)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m acc.migrate", description=main.__doc__)
    parser.add_argument("scripts", nargs="*")
    parser.add_argument("--coverage", metavar="USAGE_JSON", help="print the coverage table of a usage file")
    parser.add_argument("--top", type=int, default=30, help="how many missing names to list (default 30)")
    args = parser.parse_args(argv)
    try:
        if args.coverage:
            print(format_coverage(coverage(load_usage(args.coverage)), top=args.top))
            return 0
        if not args.scripts:
            parser.error("give SCRIPT... or --coverage USAGE_JSON")
        checker = Checker()
        reports = [check_file(p, checker) for p in args.scripts]
    except MigrateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for report in reports:
        print(format_report(report))
    return 1 if any(r.missing for r in reports) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
