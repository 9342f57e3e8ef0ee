"""Config files and options checked before anything is built, each problem one line naming where it came from.

    -c FILE ...   every file: at most 1 MiB of UTF-8, valid YAML (the line of a syntax error), plain data
                  (no ``!!python`` or custom tags), no key twice in a mapping, no aliases expanding past
                  100,000 values, not empty, a mapping; no two of them naming different tasks
    class_path    in any file, section or option (model, data, callbacks, logger, strategy, plugins ...):
                  a class of the suite, Lightning, torch or a library the suite documents, checked before
                  anything is imported or built (``subprocess.Popen``, ``os.system`` are refused); a lab's own
                  package only by the consent of the person typing: ``--trust_package NAME`` on the command
                  line (repeatable), recorded in the run's config.yaml, never taken from a file
    a bad value   ``model.init_args.top_k=0 (configs/lm/tiny.yaml); valid: >= 1``: the bounds come from the
                  ``Annotated[int, Ge(1)]`` in the class signature (jsonargparse checks them while parsing)
    a typo        ``--trainer.max_stepz``: "did you mean --trainer.max_steps?"

The origin of a value is the last source that set it, in command-line order: a ``-c`` file or an option
(``command line``); a value nobody set is the class default.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import math
import re
import sys
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from annotated_types import Ge, Gt, Interval, Le, Lt

from experiments.reliability.errors import SuiteError, jsonargparse_line
from experiments.reliability.layout import task_name
from fileio.checks import InputError, utf8_text

CONFIG_FLAGS = ("-c", "--config")
_PARSER_KEY = re.compile(r'Parser key "([^"]+)"')
_INPUT_VALUE = re.compile(r"input_value=('(?:[^'\\]|\\.)*'|[^,\]]+)")
_UNRECOGNIZED = re.compile(r"unrecognized arguments: (.*)")
_NOT_ACCEPTED = re.compile(r"Option '([^']+)' is not accepted")


#################################################################################
#                               The -c files                                     #
#################################################################################


def config_paths(argv: Iterable[str]) -> list[str]:
    """The files given with ``-c FILE`` / ``--config FILE`` / ``--config=FILE``, in order."""
    args, paths = list(argv), []
    for i, arg in enumerate(args):
        if arg in CONFIG_FLAGS and i + 1 < len(args):
            paths.append(args[i + 1])
        elif arg.startswith(("--config=", "-c=")):
            paths.append(arg.split("=", 1)[1])
    return paths


MAX_CONFIG_BYTES = 1 << 20  # the suite's configs are a few KB; a run's saved config.yaml tens of KB
MAX_YAML_NODES = 100_000  # values after anchors and aliases expand (a "billion laughs" file: 10**9 and more)
YAML_TAG = "tag:yaml.org,2002:"  # the standard tags (str, int, map ...); anything else is refused


def _check_yaml_nodes(root: yaml.Node, path: str) -> None:
    """Refuses what ``yaml.safe_load`` would accept but a config must not hold: a value that is not plain data
    (a ``!!python/...`` or any custom tag), the same key twice in one mapping (YAML keeps the last silently),
    anchors whose aliases expand past :data:`MAX_YAML_NODES` values, and recursive aliases.

    The walk runs over the composed node graph, where an alias is the anchored node itself, so counting the
    expansion costs one visit per distinct node.
    """
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def where(node: yaml.Node) -> str:
        return f"config {path} at line {node.start_mark.line + 1}"

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise SuiteError(f"{where(node)}: an alias refers to its own anchor; valid: plain YAML without recursion")
        if not node.tag.startswith(YAML_TAG) or node.tag.startswith(YAML_TAG + "python/"):
            raise SuiteError(
                f"{where(node)}: the tag {node.tag.replace(YAML_TAG, '!!')!r} asks for a Python object; valid: plain "
                "YAML values (strings, numbers, lists, mappings), classes as class_path: NAME"
            )
        active.add(key)
        total = 1
        if isinstance(node, yaml.MappingNode):
            seen: dict[object, int] = {}
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.value != "<<":
                    if k.value in seen:
                        raise SuiteError(
                            f"{where(k)}: the key {k.value!r} appears twice in one mapping (first at line "
                            f"{seen[k.value]}); valid: each key once (YAML would silently keep the last)"
                        )
                    seen[k.value] = k.start_mark.line + 1
                total += size(k) + size(v)
        elif isinstance(node, yaml.SequenceNode):
            total += sum(size(v) for v in node.value)
        active.discard(key)
        sizes[key] = total
        if total > MAX_YAML_NODES:
            raise SuiteError(
                f"{where(node)}: anchors and aliases expand to more than {MAX_YAML_NODES:,} values; valid: a config "
                "without aliases that multiply (a 'billion laughs' file)"
            )
        return total

    size(root)


def read_config(path: str) -> dict[str, Any]:
    """A config file as a mapping; a one-line :class:`SuiteError` naming the file if it is not one.

    Refused before any of it is used: a file over :data:`MAX_CONFIG_BYTES`, bytes that are not UTF-8, YAML
    syntax errors (with the line), the checks of :func:`_check_yaml_nodes` (Python tags, duplicate keys,
    expanding aliases), an empty file, a top level that is not a mapping, and a ``class_path`` outside
    :data:`CLASS_PACKAGES` (:func:`check_class_paths`).
    """
    file = Path(path)
    if not file.is_file():
        raise SuiteError(f"config file {path} does not exist" if not file.exists() else f"config {path} is not a file")
    if (size := file.stat().st_size) > MAX_CONFIG_BYTES:
        raise SuiteError(f"config {path} is {size:,} bytes; valid: a YAML config of at most {MAX_CONFIG_BYTES:,} bytes")
    try:
        text = file.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise SuiteError(f"config {path} is not UTF-8 text") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        if root is not None:
            _check_yaml_nodes(root, path)
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise SuiteError(f"config {path} is not valid YAML{where}: {problem}") from None
    except RecursionError:
        raise SuiteError(f"config {path} is nested too deeply to read; valid: a YAML mapping of options") from None
    if data is None:
        raise SuiteError(f"config {path} is empty; valid: a YAML mapping of options (see configs/lm/tiny.yaml)")
    if not isinstance(data, dict):
        raise SuiteError(f"config {path} holds a YAML {type(data).__name__}, not a mapping of options")
    check_class_paths(data, path)
    return data


#################################################################################
#                      Which classes a config may name                          #
#################################################################################

# Top-level packages whose classes a config may name (``class_path``): the suite's own, Lightning, PyTorch and
# the libraries the suite documents. A path elsewhere (``subprocess.Popen``, ``os.system``, ``builtins.eval``,
# a module a file drops beside the config) is refused before anything is imported.
CLASS_PACKAGES = (
    "experiments", "models", "datamodules", "fileio", "tests",
    "lightning", "pytorch_lightning", "lightning_fabric", "torch", "torchvision", "torchmetrics",
    "timm", "transformers", "diffusers", "lm_eval", "olmo_eval",
)  # fmt: skip
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
# Sections whose plain string value (or list items) jsonargparse takes as a class path ("model: pkg.Class").
_CLASS_SECTIONS = ("model", "data", "callbacks", "logger", "strategy", "plugins", "profiler", "optimizer",
                   "lr_scheduler", "accelerator")  # fmt: skip


TRUST_OPTION = "trust_package"
_trusted: tuple[str, ...] = ()  # the packages the running command's own command line names (--trust_package)


def command_line_values(argv: Iterable[str], name: str) -> list[str]:
    """Every value the command line itself gives the list option ``--name``: ``--name A``, ``--name=A``,
    ``--name+=A``, ``--name=[A, B]``, in order, each once; what a ``-c`` file says is not looked at."""
    args, values = list(argv), []
    for i, arg in enumerate(args):
        option, sep, value = arg.partition("=")
        if option.removesuffix("+") != f"--{name}":
            continue
        if not sep:
            value = args[i + 1] if i + 1 < len(args) else ""
        values += [v.strip().strip("'\"") for v in value.strip().strip("[]").split(",") if v.strip()]
    return list(dict.fromkeys(values))


def trust_packages(argv: Iterable[str]) -> list[str]:
    """Takes the consent of the person typing: the packages ``--trust_package`` names on the command line, whose
    classes configs may then name (checked: top-level package names, not the standard library, whose classes
    run commands and open files). Replaces the consent of any earlier command in this process.

    Raises:
        SuiteError: ``--trust_package 'subprocess' (command line) is the standard library; valid: ...``.
    """
    global _trusted
    names = command_line_values(argv, TRUST_OPTION)
    for name in names:
        if not re.fullmatch(r"[A-Za-z_]\w*", name) or name in sys.stdlib_module_names or name == "__main__":
            what = "the standard library" if name in sys.stdlib_module_names else "not a top-level package name"
            raise SuiteError(
                f"--{TRUST_OPTION} {name!r} (command line) is {what}; valid: the top-level name of a package of "
                "your own (letters, digits, _), e.g. --trust_package mylab"
            )
    _trusted = tuple(names)
    return names


def check_class_path(class_path: str, where: str) -> None:
    """Refuses a class path outside :data:`CLASS_PACKAGES` and the packages the command line trusts
    (``--trust_package``), or one that does not name a class there, without importing anything outside them.

    Raises:
        SuiteError: ``class_path 'subprocess.Popen' (mine.yaml, trainer.callbacks) is outside the suite ...``.
    """
    packages = (*CLASS_PACKAGES, *_trusted)
    valid = (
        f"valid: a class of {', '.join(packages)}, or of a package of your own named with --{TRUST_OPTION} NAME "
        "on the command line"
    )
    top = class_path.split(".", 1)[0]
    if top not in packages or not _DOTTED.fullmatch(class_path):
        raise SuiteError(f"class_path {class_path!r} ({where}) is outside the suite and its libraries; {valid}")
    target = _import(class_path)
    if target is None:
        return  # not importable: jsonargparse names it ("does not exist"); nothing outside the list was imported
    module = str(getattr(target, "__module__", "") or "").split(".", 1)[0]
    if not inspect.isclass(target) or (module and module not in packages):
        kind = "a class" if inspect.isclass(target) else type(target).__name__
        raise SuiteError(
            f"class_path {class_path!r} ({where}) is {kind} from {getattr(target, '__module__', '?')}, not a class of "
            f"the suite or its libraries; {valid}"
        )


def check_class_paths(config: Any, origin: str, section: str = "") -> None:
    """Every ``class_path`` in a config (and the shorthand ``model: pkg.Class``, ``callbacks: [pkg.Class]``)
    through :func:`check_class_path`; ``origin`` is the file or "command line"."""
    if isinstance(config, dict):
        for key, value in config.items():
            name = f"{section}.{key}" if section else str(key)
            if key == "class_path" and isinstance(value, str):
                check_class_path(value, f"{origin}, {section or 'top level'}")
            elif isinstance(value, str) and str(key) in _CLASS_SECTIONS and _DOTTED.fullmatch(value):
                check_class_path(value, f"{origin}, {name}")
            else:
                check_class_paths(value, origin, name)
    elif isinstance(config, list):
        last = section.rsplit(".", 1)[-1]
        for i, value in enumerate(config):
            if isinstance(value, str) and last in _CLASS_SECTIONS and _DOTTED.fullmatch(value):
                check_class_path(value, f"{origin}, {section}[{i}]")
            else:
                check_class_paths(value, origin, f"{section}[{i}]")


def check_argument_class_paths(argv: Iterable[str]) -> None:
    """The class paths the command line gives: ``--X.class_path=NAME``, ``--model=NAME``,
    ``--trainer.callbacks+=NAME``, and mappings written inline (``--trainer.callbacks='[{class_path: ...}]'``)."""
    args = list(argv)
    for i, arg in enumerate(args):
        if not arg.startswith("--") or arg.startswith("--config"):
            continue
        option, sep, value = arg[2:].partition("=")
        if not sep:
            value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else ""
        option = option.removesuffix("+")
        last = option.rsplit(".", 1)[-1]
        if last == "class_path" or (last in _CLASS_SECTIONS and _DOTTED.fullmatch(value.strip())):
            if value.strip():
                check_class_path(value.strip(), f"command line, --{option}")
        elif "class_path" in value:
            try:
                parsed = yaml.safe_load(value)
            except yaml.YAMLError:
                continue  # jsonargparse reports it
            check_class_paths({last: parsed}, f"command line, --{option}")


def check_parsed_class_paths(config: Any) -> None:
    """The last word before anything is built: every ``class_path`` of the parsed config (whatever its source:
    files, options, a run's saved config read back, defaults) through :func:`check_class_path`."""
    for key, value in _leaves(config):
        if key.split(".")[-1] == "class_path" and isinstance(value, str):
            check_class_path(value, f"the parsed config, {key.rsplit('.', 1)[0]}")


def _task_of(config: dict[str, Any]) -> str | None:
    model = config.get("model")
    class_path = model.get("class_path") if isinstance(model, dict) else model if isinstance(model, str) else None
    return task_name(str(class_path)) if class_path else None


def check_argument_text(argv: Iterable[str]) -> None:
    """Refuses a command-line value holding bytes that are not UTF-8 (typed in another encoding, they reach
    Python as lone surrogates that jsonargparse cannot handle), naming its option and the position.

    Raises:
        SuiteError: ``--data.init_args.prompts holds a byte that is not UTF-8 at character 6 (...)``.
    """
    option = "a command-line argument"
    for arg in argv:
        name, sep, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
        try:
            utf8_text(value if sep else arg, f"{name if sep else option} (command line)")
        except InputError as err:
            raise SuiteError(str(err)) from None
        option = arg if arg.startswith("-") and not sep else "a command-line argument"


# Options that give permission: to replace what exists (``--overwrite``), to resume a run with other settings
# (``--resume_with_changes``). Only the person typing the command gives them: a config file is often someone
# else's, so a ``-c`` file that says ``overwrite: true`` is refused, and the value the command uses is the
# command line's (:func:`command_line_flag`).
PERMISSION_FLAGS = ("overwrite", "resume_with_changes")


def command_line_flag(argv: Iterable[str], name: str) -> bool:
    """Whether the command line itself sets the yes/no option ``--name`` (the last of ``--name`` / ``--no_name``);
    what a ``-c`` file says is not looked at."""
    value = False
    for arg in argv:
        if arg == f"--{name}":
            value = True
        elif arg == f"--no_{name}":
            value = False
    return value


def _check_no_permission(data: dict[str, Any], path: str) -> None:
    """Refuses a config file granting a :data:`PERMISSION_FLAGS` permission (a saved config records false)."""
    for name in PERMISSION_FLAGS:
        if data.get(name) not in (None, False):
            raise SuiteError(
                f"{name}: {data[name]!r} ({path}) is a permission a config file cannot give (a config is often "
                f"someone else's); valid: {name}: false or left out, and --{name} typed on the command line"
            )


def check_config_files(argv: Iterable[str]) -> None:
    """Reads every ``-c`` file once (see :func:`read_config`), checks the class paths the command line names,
    refuses a file that grants a permission (:data:`PERMISSION_FLAGS`) and two files of different tasks."""
    argv = list(argv)
    check_argument_text(argv)
    check_argument_class_paths(argv)
    first: tuple[str, str] | None = None
    for path in config_paths(argv):
        data = read_config(path)
        _check_no_permission(data, path)
        task = _task_of(data)
        if task is None:
            continue  # an overlay: scheme, trainer, sizes
        if first is None:
            first = (path, task)
        elif task != first[1]:
            raise SuiteError(
                f"config {path} is a {task!r} config but {first[0]} is a {first[1]!r} config: one run trains one task; "
                "valid: one task config plus overlays (configs/norm/*.yaml, configs/trainer/*.yaml)"
            )


#################################################################################
#                        Where a value came from                                 #
#################################################################################


def _sets(config: Any, parts: list[str]) -> bool:
    """Whether the nested mapping ``config`` holds the dotted key (``init_args`` may be left out in YAML)."""
    if not parts:
        return True
    if not isinstance(config, dict):
        return False
    head, rest = parts[0], parts[1:]
    if head in config:
        return _sets(config[head], rest)
    return head == "init_args" and _sets(config, rest)


def origin_of(key: str, argv: Iterable[str]) -> str:
    """The last source in ``argv`` that set ``key``: a config file, "command line", or "default"."""
    args, origin = list(argv), "default"
    parts = key.split(".")
    for i, arg in enumerate(args):
        if arg in CONFIG_FLAGS and i + 1 < len(args):
            try:
                if _sets(read_config(args[i + 1]), parts):
                    origin = args[i + 1]
            except SuiteError:
                continue
        elif arg.startswith("--") and not arg.startswith("--config"):
            option = arg[2:].split("=", 1)[0]
            short = option.replace(".init_args.", ".")
            if key == option or key.startswith(option + ".") or key.replace(".init_args.", ".") == short:
                origin = "command line"
    return origin


def _leaves(config: Any, prefix: str = "") -> Iterable[tuple[str, Any]]:
    """(dotted key, value) of every leaf of a parsed config (jsonargparse Namespaces, dicts, lists)."""
    items = vars(config).items() if hasattr(config, "__dict__") and not isinstance(config, type) else None
    if isinstance(config, dict):
        items = config.items()
    if items is not None:
        for name, value in items:
            yield from _leaves(value, f"{prefix}.{name}" if prefix else str(name))
    elif isinstance(config, list | tuple):
        for i, value in enumerate(config):
            yield from _leaves(value, f"{prefix}[{i}]")
    else:
        yield prefix, config


def check_finite_numbers(config: Any, defaults: Any, argv: Iterable[str]) -> None:
    """Refuses ``inf`` / ``nan`` a user gave for any number of the config (pydantic's bounds let ``inf`` pass
    ``> 0``): a learning rate, a weight decay, a size. A parameter whose own default is infinite (``max_loss``:
    no limit) may be set to ``inf``.

    Raises:
        SuiteError: ``model.init_args.optim.lr=inf (command line) is not a finite number; valid: ...``.
    """
    argv = list(argv)
    default = dict(_leaves(defaults))
    for key, value in _leaves(config):
        if not isinstance(value, float) or math.isfinite(value):
            continue
        if isinstance(default.get(key), float) and math.isinf(value) and default[key] == value:
            continue  # e.g. divergence.max_loss=inf, the parameter's own "no limit"
        origin = origin_of(key.split("[")[0], argv)
        bound = declared_bound(key, argv)
        valid = f"finite numbers {bound}" if bound else "finite numbers"
        raise SuiteError(f"{key}={value} ({origin}) is not a finite number; valid: {valid}")


# Messages that the model's own checks raise at instantiation, and the config key each one names.
_NAMED_KEYS = (
    (re.compile(r"^unknown norm_scheme "), "model.init_args.trunk.norm_scheme"),
    (re.compile(r"^trunk (\w+) "), "model.init_args.trunk.{0}"),
    (re.compile(r"^((?:model|data)\.init_args\.\w+)[=\[]"), "{0}"),
)


def add_origin(message: str, argv: Iterable[str]) -> str:
    """``message`` with the file (or "command line") that set the value it complains about, when a check
    that runs after parsing (a model's constructor) raised it: ``unknown norm_scheme 'x' (mine.yaml); ...``."""
    argv = list(argv)
    for pattern, template in _NAMED_KEYS:
        match = pattern.match(message)
        if match is None:
            continue
        origin = origin_of(template.format(*match.groups()), argv)
        if origin == "default" or origin in message:
            return message
        head, sep, tail = message.partition(";")
        return f"{head} ({origin}){sep}{tail}"
    return message


#################################################################################
#                     Bounds declared in class signatures                        #
#################################################################################


def _describe_bound(meta: Any) -> str | None:
    if isinstance(meta, Interval):
        low = (meta.ge, "[") if meta.ge is not None else (meta.gt, "(")
        high = (meta.le, "]") if meta.le is not None else (meta.lt, ")")
        if low[0] is not None and high[0] is not None:
            return f"in {low[1]}{low[0]}, {high[0]}{high[1]}"
        meta = next(iter(meta))  # one-sided: the single bound it holds
    for kind, sign in ((Ge, ">="), (Gt, ">"), (Le, "<="), (Lt, "<")):
        if isinstance(meta, kind):
            return f"{sign} {next(iter(dataclasses.astuple(meta)))}"
    return None


def bound_text(annotation: Any) -> str | None:
    """ "in [0, 1)", ">= 1 or null" ... for an ``Annotated`` type (optionally inside ``X | None``)."""
    nullable = False
    if typing.get_origin(annotation) is tuple:  # (0.9, 0.95)-style pairs: the bound of an element
        annotation = next(iter(typing.get_args(annotation)), annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        nullable = type(None) in args
        annotation = next((a for a in args if a is not type(None)), annotation)
    if typing.get_origin(annotation) is not typing.Annotated:
        return None
    texts = [t for meta in annotation.__metadata__ if (t := _describe_bound(meta))]
    if not texts:
        return None
    return " and ".join(texts) + (" or null" if nullable else "")


def _hints(target: Any) -> dict[str, Any]:
    function = target.__init__ if inspect.isclass(target) else target
    try:
        return typing.get_type_hints(function, include_extras=True)
    except Exception:  # noqa: BLE001 - an unresolvable annotation: no bound to report
        return {}


def _import(class_path: str) -> Any:
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def _resolve(key: str, argv: list[str]) -> tuple[Any, str] | None:
    """(class or dataclass, field) that ``key`` (``model.init_args.trunk.norm_eps``) ends in, if importable."""
    parts = key.split(".")
    if not parts or parts[0] not in ("model", "data"):
        return None
    target = _import(_class_path(parts[0], argv) or "")
    fields = [p for p in parts[1:] if p != "init_args"]
    for depth, field in enumerate(fields):
        if target is None:
            return None
        if depth == len(fields) - 1:
            return target, field
        annotation = _hints(target).get(field)
        args = typing.get_args(annotation) if typing.get_origin(annotation) is not typing.Annotated else ()
        target = next((a for a in (annotation, *args) if inspect.isclass(a) and dataclasses.is_dataclass(a)), None)
    return None


def _class_path(section: str, argv: list[str]) -> str | None:
    found = None
    for path in config_paths(argv):
        try:
            value = read_config(path).get(section)
        except SuiteError:
            continue
        class_path = value.get("class_path") if isinstance(value, dict) else value if isinstance(value, str) else None
        found = class_path or found
    for arg in argv:
        if arg.startswith(f"--{section}.class_path=") or (arg.startswith(f"--{section}=") and "{" not in arg):
            found = arg.split("=", 1)[1]
    return found


def declared_bound(key: str, argv: list[str]) -> str | None:
    """The bound the class signature declares for ``key``, as text; None if there is none or it is unknown."""
    resolved = _resolve(key, argv)
    if resolved is None:
        return None
    target, field = resolved
    return bound_text(_hints(target).get(field))


#################################################################################
#                        Parse errors as one line                                #
#################################################################################

_PYDANTIC_WORDS = [
    ("greater than or equal to", ">="),
    ("less than or equal to", "<="),
    ("greater than", ">"),
    ("less than", "<"),
]


def _pydantic_bound(text: str) -> str | None:
    match = re.search(r"Input should be ([^\[\n]+?)\s*(?:\[|$)", text, re.M)
    if not match:
        return None
    phrase = match[1].strip()
    for words, sign in _PYDANTIC_WORDS:
        if phrase.startswith(words):
            return f"{sign} {phrase[len(words) :].strip()}"
    return phrase


def explain_parse_error(text: str, argv: list[str], candidates: Iterable[str] = ()) -> str:
    """The one line for a jsonargparse error report: the bad value with its origin and what would be valid.

    Args:
        text: the error's message.
        argv: the command line (after the subcommand), for the origin of a value and the classes in play.
        candidates: option names (``--trainer.max_steps``) a misspelt one is compared with.
    """
    keys = _PARSER_KEY.findall(text)
    bound = _pydantic_bound(text)
    if keys and bound is not None:
        key = _full_key(keys)
        value = _INPUT_VALUE.search(text)
        shown = value[1].strip("'") if value else "?"
        valid = declared_bound(key, argv) or bound
        return f"{key}={shown} ({origin_of(key, argv)}); valid: {valid}"
    line = jsonargparse_line(text)
    if match := _UNRECOGNIZED.search(line):
        bad = match[1].split()[0].split("=", 1)[0]
        return line + _did_you_mean(bad, candidates, argv)
    if match := _NOT_ACCEPTED.search(line):
        section = keys[0].split(".")[0] if keys else line.split(":", 1)[0]
        return line + _did_you_mean(f"--{section}.init_args.{match[1]}", candidates, argv)
    return line


def _full_key(keys: list[str]) -> str:
    """``model.init_args.optim.lr`` from jsonargparse's nested report keys ``["model", "optim.lr"]``."""
    if len(keys) >= 2 and keys[0] in ("model", "data"):
        inner = keys[-1] if keys[-1].startswith("init_args.") else f"init_args.{keys[-1]}"
        return f"{keys[0]}.{inner}"
    return keys[-1]


def class_options(section: str, argv: list[str], prefix: str | None = None) -> list[str]:
    """``--model.init_args.<param>`` for every parameter of the configured class, nested dataclasses included."""
    target = _import(_class_path(section, argv) or "")
    if target is None:
        return []
    options, prefix = [], prefix or f"--{section}.init_args"
    for name, annotation in _hints(target).items():
        if name == "return":
            continue
        options.append(f"{prefix}.{name}")
        nested = typing.get_args(annotation) if typing.get_origin(annotation) is not typing.Annotated else ()
        for cls in (annotation, *nested):
            if inspect.isclass(cls) and dataclasses.is_dataclass(cls):
                options += [f"{prefix}.{name}.{f.name}" for f in dataclasses.fields(cls)]
    return options


def _did_you_mean(bad: str, candidates: Iterable[str], argv: list[str]) -> str:
    """ "; did you mean --trainer.max_steps?" when an option of the same section is spelt almost alike."""
    pool = [*candidates, *class_options("model", argv), *class_options("data", argv)]
    parent, _, leaf = bad.lstrip("-").rpartition(".")
    siblings: dict[str, str] = {}
    for option in pool:
        name = option.lstrip("-")
        for form in {name, name.replace(".init_args.", ".")}:  # jsonargparse may report --trunk.x for model's
            form_parent, _, form_leaf = form.rpartition(".")
            if form_parent == parent or form_parent.endswith(f".{parent}"):
                siblings.setdefault(form_leaf, option)
    close = difflib.get_close_matches(leaf, list(siblings), n=1, cutoff=0.75)
    return f"; did you mean {siblings[close[0]]}?" if close else ""
