"""Structuring raw TOML/JSON data into the model with cattrs, strictly.

Every type has a hook that refuses what it does not expect with a message a human
understands (``expected a string, got a number (3)``), and cattrs' exception trees are
flattened into one ``key.path: message`` line per problem. A problem under a field whose
metadata is ``masking.SECRET`` says what kind of value was given, never the value.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, get_args, get_origin

import attrs
import cattrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError, IterableValidationError

from aggregator.config.model import (
    DiscoveryConfig,
    Duration,
    IssuerConfig,
    ItemOverride,
    KindPolicy,
    ProfileConfig,
    RuleSet,
    ServerConfig,
    Start,
    Transport,
)
from aggregator.config.upstream_auth import UpstreamAuth, UpstreamOAuthConfig
from aggregator.config.validation import check_discovery


def _structure_str(value: object, _: type) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {describe(value)}")
    return value


def _structure_float(value: object, _: type) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {describe(value)}")
    return float(value)


_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def _structure_duration(value: object, _: type) -> Duration:
    """Seconds: a number, or a string with a unit ("30s", "10m", "2h", "1d", "500ms"); "off": 0."""
    if isinstance(value, str):
        if value.strip().lower() in ("off", "never"):
            return Duration(0.0)
        match = _DURATION.fullmatch(value)
        if match is None:
            raise ValueError(f'expected a duration such as "30s", "10m", "2h" or "off", got {describe(value)}')
        return Duration(float(match.group(1)) * _UNIT_SECONDS[match.group(2)])
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f'expected a duration (seconds, or a string such as "10m"), got {describe(value)}')
    return Duration(float(value))


def _structure_int(value: object, _: type) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {describe(value)}")
    return value


def _structure_bool(value: object, _: type) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {describe(value)}")
    return value


def _structure_args(value: object, _: type) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list of strings, got {describe(value)}")
    problems = []
    for index, item in enumerate(value):
        if not isinstance(item, str):
            problems.append(f"[{index}]: expected a string, got {describe(item)}")
    if problems:
        raise _PathErrors(problems)
    return tuple(value)


def _structure_str_map(value: object, _: type) -> dict[str, str]:
    if not isinstance(value, dict):
        raise TypeError(f"expected a table of strings, got {describe(value)}")
    problems = [
        f".{key}: expected a string, got {describe(item)}" for key, item in value.items() if not isinstance(item, str)
    ]
    if problems:
        raise _PathErrors(problems)
    return dict(value)


def _structure_claim_match(value: object, _: type) -> dict[str, tuple[str, ...]]:
    """A profile's ``match``: claim -> the values of which it must hold one."""
    if not isinstance(value, dict):
        raise TypeError(f"expected a table of claims, each a list of strings, got {describe(value)}")
    out: dict[str, tuple[str, ...]] = {}
    problems = []
    for key, item in value.items():
        if isinstance(item, str):
            item = [item]
        if not isinstance(item, list) or not item or not all(isinstance(each, str) for each in item):
            problems.append(f".{key}: expected a string or a non-empty list of strings, got {describe(item)}")
            continue
        out[key] = tuple(item)
    if problems:
        raise _PathErrors(problems)
    return out


def _one_of(*allowed: str) -> Callable[[object, type], str]:
    """A hook for a ``Literal`` of strings: the value, if it is one of ``allowed``."""
    expected = f"{', '.join(allowed[:-1])} or {allowed[-1]}" if len(allowed) == 2 else ", ".join(allowed)

    def structure(value: object, _: type) -> str:
        if not isinstance(value, str) or value not in allowed:
            raise ValueError(f"expected {'one of ' if len(allowed) > 2 else ''}{expected}, got {describe(value)}")
        return value

    return structure


def _table_of(converter: cattrs.Converter, cls: type, what: str) -> Callable[[object, type], dict[str, Any]]:
    """A hook for ``Mapping[str, cls]``: each entry structured, problems by key path."""

    def structure(value: object, _: type) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise TypeError(f"expected a table of {what}, got {describe(value)}")
        out: dict[str, Any] = {}
        problems: list[str] = []
        for key, item in value.items():
            try:
                out[key] = converter.structure(item, cls)
            except Exception as exc:  # noqa: BLE001 - every problem is reported
                problems += [line.replace("$", f".{key}", 1) for line in _flatten(exc, "$")]
        if problems:
            raise _PathErrors(problems)
        return out

    return structure


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True)
    converter.register_structure_hook(str, _structure_str)
    converter.register_structure_hook(float, _structure_float)
    converter.register_structure_hook(int, _structure_int)
    converter.register_structure_hook(bool, _structure_bool)
    converter.register_structure_hook_func(lambda t: t == tuple[str, ...], _structure_args)
    converter.register_structure_hook_func(
        lambda t: t == tuple[str, ...] | None, lambda v, _: None if v is None else _structure_args(v, _)
    )
    converter.register_structure_hook_func(lambda t: t == Mapping[str, str], _structure_str_map)
    converter.register_structure_hook_func(lambda t: t == Mapping[str, tuple[str, ...]], _structure_claim_match)
    converter.register_structure_hook_func(
        lambda t: t == Transport, _one_of("stdio", "streamable-http", "sse", "websocket")
    )
    converter.register_structure_hook_func(lambda t: t == Literal["mcp", "llm"], _one_of("mcp", "llm"))
    converter.register_structure_hook_func(lambda t: t == Start, _one_of("eager", "lazy"))
    converter.register_structure_hook_func(
        lambda t: t == Start | None, lambda v, _: None if v is None else _one_of("eager", "lazy")(v, _)
    )
    converter.register_structure_hook(Duration, _structure_duration)
    converter.register_structure_hook_func(
        lambda t: t == Duration | None, lambda v, _: None if v is None else _structure_duration(v, _)
    )
    converter.register_structure_hook_func(
        lambda t: t == Mapping[str, ItemOverride], _table_of(converter, ItemOverride, "overrides")
    )
    converter.register_structure_hook_func(
        lambda t: t == Mapping[str, RuleSet], _table_of(converter, RuleSet, "servers")
    )
    converter.register_structure_hook_func(
        lambda t: t == Literal["shared", "per-session"], _one_of("shared", "per-session")
    )
    converter.register_structure_hook_func(lambda t: t == UpstreamAuth, _one_of("static", "token-exchange", "oauth"))
    # A nested table given as something else (`tools = 5`): said so, not as a Python error.
    converter.register_structure_hook(DiscoveryConfig, _discovery_of(converter))
    for cls in (ItemOverride, KindPolicy, RuleSet, UpstreamOAuthConfig, IssuerConfig):  # each before those that hold it
        converter.register_structure_hook(cls, _tables_only(converter.get_structure_hook(cls)))
    converter.register_structure_hook_factory(_is_array_of_tables, lambda t: _array_of_tables(converter, t))
    return converter


def _is_array_of_tables(kind: Any) -> bool:
    """A key that holds an array of tables (``[[auth.issuers]]``): ``tuple[SomeConfig, ...]``."""
    args = get_args(kind)
    return get_origin(kind) is tuple and len(args) == 2 and args[1] is Ellipsis and attrs.has(args[0])


def _array_of_tables(converter: cattrs.Converter, kind: Any) -> Callable[[object, type], tuple[Any, ...]]:
    """Without this, a string there (``issuers = "https://..."``) is iterated, one error per
    character, and a table (``issuers = {issuer = ...}``) by its keys: either is one error."""
    item = get_args(kind)[0]

    def structure(value: object, _: type) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise _NotAnArrayOfTables(value)
        problems: list[str] = []
        out = []
        for index, each in enumerate(value):
            try:
                out.append(converter.structure(each, item))
            except Exception as exc:  # noqa: BLE001 - every problem is reported
                problems += _flatten(exc, f"[{index}]")
        if problems:
            raise _PathErrors(problems)
        return tuple(out)

    return structure


class _NotAnArrayOfTables(TypeError):
    """An array-of-tables key given something else; the message names the key (``_flatten``)."""

    def __init__(self, value: object) -> None:
        super().__init__(describe(value))


def _discovery_of(converter: cattrs.Converter) -> Callable[[object, type], DiscoveryConfig]:
    """A hook for a discovery table: every problem in it at once (unknown keys, types and
    ranges), each with its key."""

    def structure(value: object, _: type) -> DiscoveryConfig:
        if not isinstance(value, dict):
            raise TypeError(f"expected a table, got {describe(value)}")
        problems: list[str] = []
        given: dict[str, Any] = {}
        for key, item in value.items():
            if key not in _DISCOVERY_KEYS:
                problems.append("." + unknown_key("", key, _DISCOVERY_KEYS))  # relative to the table
                continue
            try:
                given[key] = converter.structure(item, _DISCOVERY_KEYS[key])
            except Exception as exc:  # noqa: BLE001 - every problem is reported
                problems += _flatten(exc, f".{key}")
        table = DiscoveryConfig(**given)
        problems += check_discovery(table, "")
        if problems:
            raise _PathErrors(problems)
        return table

    return structure


_DISCOVERY_KEYS: dict[str, type] = {
    "mode": str,
    "budget_tokens": int,
    "max_result_tokens": int,
    "keep_results_for": float,
}


def _tables_only(hook: Callable[[Any, type], Any]) -> Callable[[Any, type], Any]:
    def structure(value: Any, cls: type) -> Any:
        if not isinstance(value, dict):
            raise TypeError(f"expected a table, got {describe(value)}")
        return hook(value, cls)

    return structure


def structure_table(value: Any, cls: type, path: str) -> tuple[Any, list[str], set[str]]:
    """Structure one table into ``cls``; return it, its problems (key paths) and the keys
    at fault.

    A key whose value has the wrong type or shape is reported and left at its default, and
    the rest is structured again, so that the value checks that follow (ranges, and what
    depends on several keys) see every well-typed key and report their problems in the
    same run (see ``without_follow_ons``).
    """
    if not isinstance(value, dict):
        return cls(), [f"{path}: expected a table, got {describe(value)}"], set()
    try:
        return _converter.structure(value, cls), [], set()
    except Exception as exc:  # noqa: BLE001 - every structuring problem is reported
        problems = _flatten(exc, path)
        failed = exc
    broken: set[str] = set()
    for sub in getattr(failed, "exceptions", ()):
        if isinstance(sub, ForbiddenExtraKeysError):
            broken |= set(sub.extra_fields)
        for note in getattr(sub, "__notes__", ()):
            if getattr(note, "name", None) is not None:
                broken.add(note.name)
    try:
        return _converter.structure({k: v for k, v in value.items() if k not in broken}, cls), problems, broken
    except Exception:  # noqa: BLE001 - already reported above
        return cls(), problems, set(value)


def without_follow_ons(problems: list[str], path: str, broken: set[str]) -> list[str]:
    """The value checks' problems for a table, less those a broken key may have caused:
    a problem about the whole table (``servers.a: needs either command or url``, when
    ``command`` had the wrong type) or about a broken key itself waits for the next run."""
    if not broken:
        return problems
    kept = []
    for problem in problems:
        rest = problem[len(path) + 1 :] if problem.startswith(path + ".") else None
        if rest is not None and re.split(r"[.\[:]", rest, maxsplit=1)[0] not in broken:
            kept.append(problem)
    return kept


class _PathErrors(Exception):
    """Problems inside one value, each already prefixed with its sub-path."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


_converter = _make_converter()


def unknown_key(path: str, key: str, valid: Iterable[str]) -> str:
    """The problem of ``key`` in the table at ``path``, which takes only ``valid`` keys,
    naming the valid one it is nearest to when one is near (a misspelling):
    ``proxy.seperator: unknown key; did you mean `separator`?``."""
    keys = sorted(valid)
    # Keys are lower case: a key in another case (MAX_JSON_DEPTH) is compared as such too.
    near = difflib.get_close_matches(key, keys, n=1) or difflib.get_close_matches(key.lower(), keys, n=1)
    where = f"{path}.{key}" if path else key
    return f"{where}: unknown key" + (f"; did you mean `{near[0]}`?" if near else "")


def config_keys(cls: type) -> list[str]:
    """The keys a table structured into ``cls`` may have (not those loading fills in)."""
    return [field.name for field in attrs.fields(cls) if (cls, field.name) not in _FILLED_BY_LOADING]


# Fields set by loading, not by the config: the [servers.NAME] / [profiles.NAME] key, and
# what ${VAR} put into a server's keys.
_FILLED_BY_LOADING = {(ServerConfig, "name"), (ServerConfig, "interpolated"), (ProfileConfig, "name")}


def describe(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def describe_secret(value: Any) -> str:
    """``describe`` for the value of a secret: its kind, never the value itself."""
    return _unquoted(describe(value))


def _flatten(exc: BaseException, path: str, secret: bool = False) -> list[str]:
    """Turn a cattrs exception tree into `path: message` lines; under a secret field (``SECRET``)
    without the value they quote."""
    if isinstance(exc, ForbiddenExtraKeysError):
        return [unknown_key(path, key, config_keys(exc.cl)) for key in sorted(exc.extra_fields)]
    if isinstance(exc, ClassValidationError | IterableValidationError):
        lines: list[str] = []
        for sub in exc.exceptions:
            note = _note_of(sub)
            hidden = secret or (isinstance(exc, ClassValidationError) and _is_secret(exc.cl, note))
            lines.extend(_flatten(sub, path + note, hidden))
        return lines
    if isinstance(exc, _PathErrors):
        lines = [f"{path}{problem}" for problem in exc.problems]
    elif isinstance(exc, KeyError):
        lines = [f"{path}: required key is missing"]
    elif isinstance(exc, _NotAnArrayOfTables):
        lines = [f"{path}: expected an array of tables ([[{path}]]), got {exc}"]
    else:
        lines = [f"{path}: {exc}"]
    return [_unquoted(line) for line in lines] if secret else lines


def _is_secret(cls: type, note: str) -> bool:
    """Whether the attribute ``note`` (``.name``) of ``cls`` holds secrets."""
    if not note.startswith(".") or not attrs.has(cls):
        return False
    field = attrs.fields_dict(cls).get(note[1:])
    return field is not None and bool(field.metadata.get("secret"))


# What ``describe`` quotes: a string (its repr, single or double quoted) and a number.
_QUOTED = re.compile(r"""the string (?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")|a number \([^()]*\)""")


def _unquoted(line: str) -> str:
    """A problem line of a secret field, its quoted values replaced by their kind."""
    hidden, count = _QUOTED.subn(lambda match: "a string" if match.group().startswith("the") else "a number", line)
    return f"{hidden}; it is not shown, as it is a secret" if count else hidden


def _note_of(exc: BaseException) -> str:
    for note in getattr(exc, "__notes__", ()):
        # cattrs notes: "Structuring class X @ attribute name" / "... @ index 2" / "@ key k"
        name = getattr(note, "name", None)
        if name is not None:
            return f".{name}"
        index = getattr(note, "index", None)
        if index is not None:
            return f"[{index}]"
        text = str(note)
        if " @ attribute " in text:
            return "." + text.rsplit(" @ attribute ", 1)[1]
    return ""
