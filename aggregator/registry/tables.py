"""A registry entry turned into a ``[servers.KEY]`` table: the runner's command at the
pinned version (``npx -y pkg@1.2.3`` for npm, ``uvx pkg==1.2.3`` for PyPI, ``docker run -i
--rm image:tag`` for OCI) or a remote's ``url`` and transport, the package's arguments, and
the environment variables and headers it takes as ``${VAR}`` references, each described in
a comment.

Rules: no secret value is ever written (an input marked secret is always ``${VAR}``, whatever
value or default the registry gave it); every name, version and argument is checked
(``identifiers``) before it is written; a registry's ``{name}`` placeholders become
``${NAME}`` variables the proxy expands at load. Free text from the registry reaches the
file only inside comments, one line each, control characters escaped.

Pure: no I/O; imports ``entries`` and ``identifiers`` beside it.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable

import attrs

from aggregator.registry.entries import Argument, Input, Package, Remote, ServerEntry
from aggregator.registry.identifiers import (
    ENV_NAME,
    RegistryError,
    check_env_name,
    check_flag,
    check_header_name,
    check_package,
    check_remote_url,
    check_word,
    escaped,
    oci_tag,
    shown,
    unsafe_reason,
    unseen,
)

RUNNERS = ("npm", "pypi", "oci")
MARK = "# from an MCP registry: "  # the first comment line above a table this writes
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_-]*)\}")
_DEFAULT_FORBIDDEN = set("${}")  # what a ${VAR:-default} cannot hold
# The runner options a registry's runtimeArguments may use, each with whether it takes a
# value: an allow-list, since each runner has many options that fetch something else
# (npm --package, uvx --from / --with / --index-url) or loosen a container (docker -v,
# --network, --privileged, --cap-add, a positional standing for the image).
RUNTIME_OPTIONS: dict[str, dict[str, bool]] = {
    "npm": {"-q": False, "--quiet": False, "--silent": False, "--prefer-offline": False},
    "pypi": {"-q": False, "--quiet": False, "--offline": False, "--no-cache": False, "--isolated": False},
    "oci": {
        "-e": True,
        "--env": True,
        "-w": True,
        "--workdir": True,
        "--init": False,
        "--read-only": False,
        "-t": False,
        "--tty": False,
    },
}
_RUNNER_NAMES = {"npm": "npx", "pypi": "uvx", "oci": "docker run"}
_KEY_PREFIXES = ("mcp-server-", "server-", "mcp-")
_KEY_SUFFIXES = ("-mcp-server", "-server", "-mcp")


@attrs.frozen(kw_only=True)
class Installation:
    """What ``aggregator add`` writes and tells: the table's text (comments included, ending
    with a newline), the command line it runs (shell-quoted, for a person), the variables to
    set (required ones) and notes (optional inputs left out)."""

    key: str
    text: str
    runs: str
    variables: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def default_key(name: str) -> str:
    """The ``[servers.KEY]`` key for a registry name: its last part, lower case, without the
    usual ``mcp-server-`` / ``server-`` / ``-mcp`` decorations
    (``io.github.modelcontextprotocol/server-memory`` -> ``memory``)."""
    base = name.rsplit("/", 1)[-1].lower()
    base = re.sub(r"[^a-z0-9.-]+", "-", base).strip("-.")
    for prefix in _KEY_PREFIXES:
        if base.startswith(prefix) and len(base) > len(prefix):
            base = base[len(prefix) :]
            break
    for suffix in _KEY_SUFFIXES:
        if base.endswith(suffix) and len(base) > len(suffix):
            base = base[: -len(suffix)]
            break
    if not base or not base[0].isalpha():
        base = "server-" + base if base else "server"
    return base[:64]


def installation(entry: ServerEntry, key: str, source: str) -> Installation:
    """The table for ``entry`` under ``[servers.KEY]``: its first package a runner here can
    start (npm, PyPI, OCI over stdio), else its first remote. RegistryError when it has
    neither, or when what it names fails a check."""
    builder = _Builder(entry, key, source)
    package = next((p for p in entry.packages if p.registry_type in RUNNERS and p.transport == "stdio"), None)
    if package is not None:
        return builder.package(package)
    if entry.remotes:
        return builder.remote(entry.remotes[0])
    offered = ", ".join(entry.transports) or "no packages or remotes"
    raise RegistryError(
        f"{entry.name} {entry.version}: nothing here can run it (it offers {offered}; this writes npm, PyPI"
        " and OCI packages over stdio, and remote streamable-http or sse servers)"
    )


def comment(text: str) -> str:
    """``text`` as one comment line's content: control, format and separator characters
    (line breaks, zero-width and bidi controls too) escaped."""
    return escaped(text)


def toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def toml_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def variable_for(name: str) -> str:
    """An environment variable name for a registry's placeholder or label (``api_key`` ->
    ``API_KEY``, ``file-path`` -> ``FILE_PATH``)."""
    upper = re.sub(r"[^A-Za-z0-9_]", "_", name).upper()
    return upper if ENV_NAME.fullmatch(upper) else f"V_{upper}"


class _Builder:
    """Collects one table's lines, the variables it needs and its notes."""

    def __init__(self, entry: ServerEntry, key: str, source: str) -> None:
        self.entry = entry
        self.key = key
        self.head = [
            MARK + comment(f"{entry.name} {entry.version} ({source})"),
            "# " + comment(entry.description),
        ]
        self.body: list[str] = []
        self.variables: dict[str, None] = {}
        self.notes: list[str] = []
        self.described: dict[str, str] = {}  # variable -> what it is, for the comments
        self.left_out: list[str] = []  # commented lines, after args, for optional arguments

    # --- packages ---------------------------------------------------------------------

    def package(self, package: Package) -> Installation:
        where = f"{self.entry.name}: {package.path.split(': ', 1)[-1]}"
        spec = check_package(package.registry_type, package.identifier, package.version, where)
        tag = oci_tag(package.identifier) if package.registry_type == "oci" else None
        version = package.version or self.entry.version
        if tag is not None and tag != version:
            self.notes.append(f"warning: the image's tag {tag} is not the entry's version {version}")
        runtime = self.runtime(package)
        arguments = self.arguments(package.package_arguments)
        env_lines, names = self.environment(package.environment)
        if package.registry_type == "npm":
            command, args = "npx", ["-y", *runtime, spec, *arguments]
        elif package.registry_type == "pypi":
            command, args = "uvx", [*runtime, spec, *arguments]
        else:  # oci: the container sees only the variables passed to it by name
            passed = [word for name in names for word in ("-e", name)]
            command, args = "docker", ["run", "-i", "--rm", *runtime, *passed, spec, *arguments]
        self.body.insert(0, f"command = {toml_string(command)}")
        self.body.insert(1, f"args = [{', '.join(toml_string(a) for a in args)}]")
        self.body[2:2] = self.left_out
        self.body += env_lines
        return self.done(shlex.join([command, *args]))

    def runtime(self, package: Package) -> list[str]:
        """The runner's own options the package asks for, each one of the few that change
        neither what is fetched and run nor how a container is isolated (``RUNTIME_OPTIONS``);
        a positional one is refused (it would stand where the package or image is)."""
        allowed = RUNTIME_OPTIONS[package.registry_type]
        words: list[str] = []
        for argument in package.runtime_arguments:
            where = f"{self.entry.name}: {argument.input.path.split(': ', 1)[-1]}"
            runner = _RUNNER_NAMES[package.registry_type]
            if argument.positional:
                raise RegistryError(
                    f"{where}: a positional runtime argument is refused (it would stand where {runner} expects"
                    " the package or image)"
                )
            flag = argument.input.name
            if flag not in allowed:
                known = ", ".join(sorted(allowed)) or "none"
                raise RegistryError(
                    f"{where}.name: {shown(flag)} is refused: a runtime option given to {runner} is one of {known}"
                    " (others can change what is fetched or how it is isolated)"
                )
            given = argument.input
            if allowed[flag]:
                words += self.arguments([argument])
            elif given.value is not None or given.default is not None or given.secret:
                raise RegistryError(f"{where}: {shown(flag)} takes no value; refused")
            elif given.required:
                words.append(flag)
            else:
                self.notes.append(f"optional runtime option {flag} left out (a commented line shows it)")
                self.left_out.append(
                    f"# to pass the optional runtime option {flag}: add {toml_string(flag)} to args"
                    + _about(given.description)
                )
        return words

    def arguments(self, arguments: Iterable[Argument]) -> list[str]:
        words: list[str] = []
        for argument in arguments:
            positional, given = argument.positional, argument.input
            label = given.value_hint or given.name.lstrip("-")
            value = self.value_of(given, label or "argument")
            if value is None and not (given.secret or given.required):  # optional, left out
                shown_words = [] if positional else [check_flag(given.name, self.entry.name)]
                shown_words.append("${" + variable_for(label or "argument") + "}")
                words_text = ", ".join(toml_string(word) for word in shown_words)
                self.left_out.append(
                    f"# to pass the optional argument {comment(label)}: add {words_text} to args"
                    + _about(given.description)
                )
            if positional:
                if value is not None:
                    words.append(value)
                continue
            flag = check_flag(given.name, f"{self.entry.name}: {given.path.split(': ', 1)[-1]}.name")
            if value is not None:
                words += [flag, value]
            elif given.required:
                words.append(flag)
        return words

    def value_of(self, given: Input, label: str) -> str | None:
        """What an argument's value is written as: its fixed value or default (checked, its
        placeholders as variables), ``${LABEL}`` when it is secret or required and has none;
        None (and a note) when it is optional and has none."""
        where = f"{self.entry.name}: {given.path.split(': ', 1)[-1]}"
        variable = variable_for(label)
        literal = given.value if given.value is not None else given.default
        if given.secret or literal is None:
            if not (given.secret or given.required):
                self.notes.append(f"optional argument {label} left out (a commented line shows it)")
                return None
            self.need(variable, given.description or f"the {label} argument", secret=given.secret)
            return "${" + variable + "}"
        return self.template(literal, given, where, word=True)

    def template(self, text: str, given: Input, where: str, *, word: bool) -> str:
        """``text`` with each ``{name}`` placeholder of ``given``'s variables as ``${NAME}``
        (``${NAME:-default}`` when the variable has a default and is not secret); the rest
        checked as a command-line word (``word``) or as a header value (where any
        placeholder is taken for a variable)."""
        names = [m.group(1) for m in _PLACEHOLDER.finditer(text) if m.group(1) in given.variables or not word]
        bare = _PLACEHOLDER.sub(lambda m: "x" if m.group(1) in names else m.group(0), text)
        if word:
            check_word(bare, where)
        else:
            reason = _header_reason(bare)
            if reason is not None:
                raise RegistryError(f"{where}: {shown(text)} is refused: {reason}")
        written = {}
        for name in names:
            variable = variable_for(name)
            known = given.variables.get(name, Input(name=name))
            secret = given.secret or known.secret
            default = known.default if known.default is not None else known.value
            if not secret and default is not None and _default_reason(default) is None:
                written[name] = "${" + variable + ":-" + default + "}"
                continue
            written[name] = "${" + variable + "}"
            self.need(variable, known.description or f"{{{name}}} in {given.name or 'a value'}", secret=secret)
        return _PLACEHOLDER.sub(lambda m: written.get(m.group(1), m.group(0)), text)

    def environment(self, inputs: Iterable[Input]) -> tuple[list[str], list[str]]:
        lines: list[str] = []
        names: list[str] = []
        for given in inputs:
            where = f"{self.entry.name}: {given.path.split(': ', 1)[-1]}"
            name = check_env_name(given.name, where)
            about = comment(given.description) if given.description else "no description given"
            kind = "secret, required" if given.secret and given.required else "secret" if given.secret else None
            kind = kind or ("required" if given.required else "optional")
            literal = given.value if given.value is not None else given.default
            if given.secret or given.required:
                lines += [f"# {name} ({kind}): {about}", f'env.{name} = "${{{name}}}"']
                self.need(name, None, secret=given.secret)
            elif literal is not None and _default_reason(literal) is None:
                lines += [f"# {name} ({kind}): {about}", f'env.{name} = "${{{name}:-{literal}}}"']
            else:
                lines += [f"# {name} ({kind}): {about}", f'# env.{name} = "${{{name}}}"']
                self.notes.append(f"optional variable {name} left out (a commented line shows it)")
                continue
            names.append(name)
        return lines, names

    # --- remotes ----------------------------------------------------------------------

    def remote(self, remote: Remote) -> Installation:
        where = f"{self.entry.name}: {remote.path.split(': ', 1)[-1]}"
        scheme, _, rest = remote.url.partition("://")
        authority = rest.split("/", 1)[0]
        if "{" in scheme or "{" in authority:
            raise RegistryError(f"{where}.url: {shown(remote.url)} is refused: a placeholder in its scheme or host")
        carrier = Input(name="url", variables=remote.variables)
        bare = _PLACEHOLDER.sub(lambda m: "x" if m.group(1) in remote.variables else m.group(0), remote.url)
        if "{" in bare or "}" in bare:
            raise RegistryError(f"{where}.url: {shown(remote.url)} has a placeholder its variables do not define")
        check_remote_url(bare, where)
        url = self.template(remote.url, carrier, f"{where}.url", word=False)
        self.body.append(f"url = {toml_string(url)}")
        if remote.transport == "sse":
            self.body.append('transport = "sse"')
        for header in remote.headers:
            self.header(header)
        return self.done(f"{remote.transport} {url}")

    def header(self, given: Input) -> None:
        where = f"{self.entry.name}: {given.path.split(': ', 1)[-1]}"
        name = check_header_name(given.name, where)
        about = comment(given.description) if given.description else "no description given"
        variable = variable_for(name)
        if given.secret:  # only ever a variable: no part of a secret's value is written
            value = "${" + variable + "}"
            self.need(variable, f"the whole {name} header" + _about(given.description), secret=True)
        elif given.value is not None and _PLACEHOLDER.search(given.value):
            value = self.template(given.value, given, f"{where}.value", word=False)
        elif given.required or given.value is None:
            if not given.required:
                self.body += [f"# header {name} (optional): {about}", f'# headers.{toml_key(name)} = "${{{variable}}}"']
                self.notes.append(f"optional header {name} left out (a commented line shows it)")
                return
            value = "${" + variable + "}"
            self.need(variable, f"the {name} header", secret=False)
        else:
            value = self.template(given.value, given, f"{where}.value", word=False)
        kind = "secret" if given.secret else "required" if given.required else "optional"
        self.body += [f"# header {name} ({kind}): {about}", f"headers.{toml_key(name)} = {toml_string(value)}"]

    # --- the end ----------------------------------------------------------------------

    def need(self, variable: str, what: str | None, *, secret: bool) -> None:
        self.variables[variable] = None
        if what is not None and variable not in self.described:
            self.described[variable] = comment(what) + (" (secret)" if secret else "")

    def done(self, runs: str) -> Installation:
        described = [f"# set {name}: {self.described[name]}" for name in self.variables if name in self.described]
        lines = [*self.head, *described, f"[servers.{toml_key(self.key)}]", *self.body]
        return Installation(
            key=self.key,
            text="\n".join(lines) + "\n",
            runs=runs,
            variables=tuple(self.variables),
            notes=tuple(self.notes),
        )


def _about(description: str) -> str:
    return f" ({comment(description)})" if description else ""


def _default_reason(value: str) -> str | None:
    """Why ``value`` cannot be written as a ``${VAR:-default}`` default (None: it can)."""
    if _DEFAULT_FORBIDDEN & set(value):
        return "it holds $, { or }"
    return unsafe_reason(value)


def _header_reason(value: str) -> str | None:
    if len(value) > 4096:
        return "it is longer than 4096 characters"
    if any(char != " " and unseen(char) for char in value):
        return "it holds a control character or whitespace other than a space"
    if "$" in value or "`" in value:
        return "it holds $ or `"
    return None
