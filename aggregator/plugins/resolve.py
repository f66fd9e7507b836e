"""Finding the plugins a config names (entry point, ``package.module:Name`` or
``file.py:Name``) and checking their options against what each one takes, without
building them: what config loading reports with the config's other problems."""

from __future__ import annotations

import collections.abc
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import logging
import sys
import types
import typing
from collections.abc import Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from aggregator.config.paths import PATH_OPTION, beside
from aggregator.config.structuring import describe

log = logging.getLogger(__name__)
ENTRY_POINT_GROUP = "aggregator.plugins"
# Where the built-in plugins' modules were before they moved into the aggregator package: a
# config that still names a module there (``aggregator_plugins.audit:AuditLog``) loads it
# from where it is now, with a warning that names the new spelling.
OLD_BUNDLED = "aggregator_plugins"
BUNDLED = "aggregator.plugins.bundled"


def plugin_problems(specs: Sequence[Any], config_dir: Path | None = None) -> list[str]:
    """What is wrong with the plugins a config names, found without building them (so with
    the config's other problems): a ``use`` that does not load, options the plugin does not
    take or lacks. What a plugin checks of its option values when built comes later."""
    problems: list[str] = []
    for index, spec in enumerate(specs):
        path = f"plugins[{index}]"
        try:
            factory = resolve(spec.use, config_dir)
        except Exception as exc:  # noqa: BLE001 - reported with its key path
            problems.append(f"{path}.use: cannot load {spec.use!r}: {error_text(exc)}")
            continue
        problems.extend(option_problems(factory, spec.use, dict(spec.options), path))
    return problems


def option_problems(factory: Any, use: str, options: dict[str, Any], path: str, *, types: bool = True) -> list[str]:
    """Options ``factory`` does not take, those it requires that are missing and (``types``)
    values not of the type its annotations say, by key path."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # no signature to read: the call will tell
        return []
    if not callable(factory):
        return [f"{path}.use: {use!r} names something that cannot be called"]
    named = {p.name: p for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters)
    taken = ", ".join(named) or "none"
    problems = [
        f"{path}.options.{key}: unknown option ({use} takes: {taken})"
        for key in options
        if key not in named and not takes_any
    ]
    problems += [
        f"{path}.options.{name}: required by {use}"
        for name, parameter in named.items()
        if parameter.default is parameter.empty and name not in options
    ]
    hints = _hints(factory) if types else {}
    for key, value in options.items():
        wrong = _wrong(value, hints[key]) if key in named and key in hints else None
        if wrong is not None:
            where, expected, got = wrong
            problems.append(f"{path}.options.{key}{where}: expected {expected}, got {describe(got)}")
    return problems


def _hints(factory: Any) -> dict[str, Any]:
    """The annotations of what builds a plugin (its ``__init__`` for a class), resolved;
    none when they cannot be."""
    target = factory.__init__ if inspect.isclass(factory) else factory
    try:
        return typing.get_type_hints(target)
    except Exception:  # noqa: BLE001 - a name it cannot resolve: its values are not judged
        return {}


_NAMES: dict[Any, str] = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def _wrong(value: Any, hint: Any) -> tuple[str, str, Any] | None:
    """Where a config value (TOML: strings, numbers, booleans, lists, tables) is not what
    ``hint`` expects ("" or "[2]"), what it expects and the value there; None when it fits,
    or when the hint is beyond these."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        found = [_wrong(value, member) for member in typing.get_args(hint)]
        if None in found:
            return None
        inner = [w for w in found if w is not None and w[0]]  # a list whose item is wrong
        if inner:
            return inner[0]
        return "", " or ".join(dict.fromkeys(w[1] for w in found if w is not None)), value
    if hint is type(None):
        return None if value is None else ("", "nothing", value)
    if hint in _NAMES:
        fits = isinstance(value, hint) and not (hint is int and isinstance(value, bool))
        if hint is float:
            fits = isinstance(value, int | float) and not isinstance(value, bool)
        return None if fits else ("", _NAMES[hint], value)
    if origin in (list, tuple, collections.abc.Sequence) or hint in (list, tuple):
        if not isinstance(value, list):
            return "", "a list", value
        item = (typing.get_args(hint) or (Any,))[0]
        for index, each in enumerate(value):
            wrong = _wrong(each, item)
            if wrong is not None:
                return f"[{index}]{wrong[0]}", wrong[1], wrong[2]
        return None
    if origin in (dict, collections.abc.Mapping) or hint is dict:
        return None if isinstance(value, dict) else ("", "a table", value)
    return None


def with_path_defaults(factory: Any, options: dict[str, Any], config_dir: Path | None) -> dict[str, Any]:
    """``options`` with each path-like option the config leaves out (``path``, ``file``,
    ``..._dir``) set to the plugin's own relative default beside the config file, as a
    given one would be: a plugin's default file is not where the proxy happens to start."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return options
    filled = dict(options)
    for name, parameter in parameters.items():
        default = parameter.default
        if name not in filled and PATH_OPTION.fullmatch(name) and isinstance(default, str) and default:
            filled[name] = beside(config_dir, default)
    return filled


def error_text(exc: BaseException) -> str:
    """An exception as a user reads it: its message, and its type when the message alone
    would not say what went wrong."""
    text = str(exc)
    if isinstance(exc, LookupError | ImportError | OSError) and text:
        return text
    if isinstance(exc, SyntaxError):
        return f"a syntax error in {exc.filename} line {exc.lineno}: {exc.msg}"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def resolve(use: str, config_dir: Path | None) -> Any:
    _OldBundled.install()
    if ":" not in use:
        found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == use]
        if not found:
            known = sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
            raise LookupError(f"no plugin named {use!r} (installed: {', '.join(known) or 'none'})")
        return found[0].load()
    where, _, attr = use.rpartition(":")
    if where.endswith(".py"):
        file = Path(where)
        if not file.is_absolute() and config_dir is not None:
            file = config_dir / file
        spec = importlib.util.spec_from_file_location(f"aggregator_plugin_{file.stem}", file)
        if spec is None or spec.loader is None:
            raise LookupError(f"cannot import {file}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(_moved(where, attr))
    if not hasattr(module, attr):
        raise LookupError(f"{where} has no {attr!r}")
    return getattr(module, attr)


class _OldBundled(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports of ``aggregator_plugins`` and ``aggregator_plugins.X``, in a plugin written when the
    built-in plugins installed under that name (one that builds on ``RateLimit``), get the modules
    of ``aggregator.plugins.bundled`` themselves, not copies, with a warning naming the new path.
    Installed once, when a plugin is first resolved: no top-level package is installed for it."""

    def __init__(self) -> None:
        self.specs: dict[str, importlib.machinery.ModuleSpec | None] = {}  # a module's own, while aliased

    @classmethod
    def install(cls) -> None:
        if not any(isinstance(finder, cls) for finder in sys.meta_path):
            sys.meta_path.insert(0, cls())  # before the path finder, which would load copies

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != OLD_BUNDLED and not fullname.startswith(OLD_BUNDLED + "."):
            return None
        now = BUNDLED + fullname.removeprefix(OLD_BUNDLED)
        if importlib.util.find_spec(now) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=fullname == OLD_BUNDLED)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        now = BUNDLED + spec.name.removeprefix(OLD_BUNDLED)
        log.warning("a plugin imports %s, which has moved: import %s instead", spec.name, now)
        module = importlib.import_module(now)
        self.specs[module.__name__] = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        # The import system set the old name's spec on the module: give it its own back.
        module.__spec__ = self.specs.pop(module.__name__)


def _moved(where: str, attr: str) -> str:
    """The module ``where`` names, under the built-in plugins' new path if it names the old."""
    if where != OLD_BUNDLED and not where.startswith(OLD_BUNDLED + "."):
        return where
    now = BUNDLED + where.removeprefix(OLD_BUNDLED)
    log.warning("plugin %s:%s has moved: write use = %r", where, attr, f"{now}:{attr}")
    return now
