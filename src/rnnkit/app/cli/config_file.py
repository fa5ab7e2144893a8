"""Configuration files of a command: ``--config FILE`` (TOML, or YAML) and ``--print-config``.

A configuration file holds the options of the command line as top-level TOML keys, named
as the options without ``--`` (``batch-size = 32``; ``batch_size`` is the same key).
Each value is checked against the option's own definition in the parser — a flag takes
``true``/``false``, an integer option an integer, a number option a number, a string
option a string, and ``choices`` hold — and a bad one is refused in one line naming the
file and the key. The values become what the command line would have set, and count as
given: the refusal of options that do not apply to the task, and the rules of
``--resume`` (an option given is a request, never silently ignored), treat them exactly
as options typed. An option typed on the command line wins over the file.

Why argparse extended by hand, and not a configuration library (``jsonargparse``,
``LightningCLI``): the command line already has, on argparse, the rules a file must
follow too — the per-task and per-cell refusal table (``rnnkit.app.config``), the set of
options given (``cli.main.explicit_options``) that ``--resume`` reads as requests, and one
line on stderr for every mistake. A library would bring its own parser, type system,
error messages (several lines, its own wording) and a YAML dependency, and these rules
would have to be rebuilt on top of it; this module is the ~200 lines that let a file
enter the parser's own rules instead.

Why TOML only: it is in the standard library (``tomllib``, Python 3.11; ``tomli`` before),
its types are those of the options (integer, float, boolean, string) and it has no
implicit conversions — YAML 1.1, as PyYAML reads it, turns ``no`` into false and reads
``1e-3`` as a string. One format also means one file that ``--print-config`` writes and
``--config`` reads back. A file named ``*.yaml``/``*.yml`` is read as YAML all the same
(``yaml.safe_load``, the ``yaml`` extra) for setups that keep their configuration in
YAML: the same keys and the same checks, so a value YAML reads as another type (``1e-3``
is a string to it; write ``1.0e-3``) is refused in one line like any wrong value.
"""

from __future__ import annotations

import argparse
import difflib
import math
import re
import sys
from collections.abc import Iterable
from typing import Any

from rnnkit.data.files import read_run_file
from rnnkit.data.utf8 import decode_utf8
from rnnkit.errors import ConfigError, DataError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10: the same parser, as a package
    import tomli as tomllib

__all__ = [
    "MAX_CONFIG_BYTES",
    "NOT_IN_FILE",
    "apply_config_file",
    "blame",
    "file_actions",
    "read_config_file",
    "render",
    "toml_value",
]

#: Options of one invocation, not of a configuration: never in a file, never printed.
NOT_IN_FILE = frozenset(
    {"help", "config", "print_config", "resume", "overwrite", "quiet", "verbose", "json"}
)
MAX_CONFIG_BYTES = 1 << 20  # a configuration is a few kilobytes


def long_flag(action: argparse.Action) -> str:
    return next(o for o in action.option_strings if o.startswith("--"))


def key_of(action: argparse.Action) -> str:
    """The key of an option in a file: its long flag without ``--`` (``batch-size``)."""
    return long_flag(action)[2:]


def file_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options a configuration file of ``parser``'s command may hold, in order."""
    return [
        a
        for a in parser._actions
        if any(o.startswith("--") for o in a.option_strings) and a.dest not in NOT_IN_FILE
    ]


def read_config_file(path: str) -> dict[str, Any]:
    """The TOML document of ``path`` (YAML when it is named ``*.yaml``/``*.yml``): a regular
    file of at most ``MAX_CONFIG_BYTES``, UTF-8 (a leading byte-order mark is dropped).

    Raises:
        ConfigError: missing, not a regular file, too large, not UTF-8, not TOML (or not a
            YAML mapping); one line naming the file (with the line and column the parser
            gives).
    """
    try:
        raw = read_run_file(path, MAX_CONFIG_BYTES)
    except DataError as exc:
        if exc.message.startswith("larger than"):
            raise ConfigError(
                f"--config {path}: larger than {MAX_CONFIG_BYTES:,} bytes: not a configuration"
            ) from None
        raise ConfigError(f"--config {exc}") from None
    try:
        text = decode_utf8(raw, path)
    except DataError as exc:
        raise ConfigError(str(exc)) from None
    # A byte-order mark (Windows editors write one) is dropped, as every data reader drops
    # it; tomllib refused it ("Invalid statement (at line 1, column 1)"). Dropped after
    # decoding, so the bytes an error counts are the file's (utf-8-sig counted after it).
    text = text.removeprefix("\ufeff")
    if path.endswith((".yaml", ".yml")):
        return _yaml_document(path, text)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:  # arrays nested thousands deep: no traceback
        raise ConfigError(f"{path}: not valid TOML: nested too deeply") from None
    except ValueError as exc:  # int() past sys.get_int_max_str_digits(): 5,000 digits
        raise ConfigError(f"{path}: not valid TOML: {_value_error(exc)}") from None


def _yaml_document(path: str, text: str) -> dict[str, Any]:
    """The top-level mapping of a YAML file (``yaml.safe_load``: no object construction)."""
    try:
        import yaml
    except ImportError:
        raise ConfigError(
            f"{path}: reading YAML needs PyYAML (pip install 'rnnkit[yaml]'), or write TOML"
        ) from None

    class UniqueKeys(yaml.SafeLoader):
        """``safe_load``'s loader, with a key given twice refused (as TOML refuses it):
        PyYAML kept the last value in silence."""

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: list[Any] = []
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<`: its keys may be given
                    continue
                key = self.construct_object(key_node, deep=deep)
                if key in seen:  # (a list, not a set: a key may be unhashable, said below)
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} given twice", key_node.start_mark
                    )
                seen.append(key)
            return super().construct_mapping(node, deep)

    try:
        document = yaml.load(text, Loader=UniqueKeys)  # a SafeLoader: no objects built
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid YAML: nested too deeply") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid YAML: {_value_error(exc)}") from None
    if document is None:
        return {}
    if not isinstance(document, dict) or not all(isinstance(k, str) for k in document):
        raise ConfigError(f"{path}: a YAML configuration is a mapping of option names")
    return document


def _value_error(exc: ValueError) -> str:
    """The words for a parser's bare ``ValueError``: Python's ``int()`` refuses a literal
    of over 4,300 digits (``sys.get_int_max_str_digits``), inside tomllib and PyYAML."""
    return "an integer with too many digits" if "digits" in str(exc) else str(exc)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"[:60]
    if isinstance(value, str):
        return f"the string {value!r}"[:60]
    if isinstance(value, list):
        return "an array"
    return f"a {type(value).__name__}"  # TOML dates and times


def _check_value(action: argparse.Action, value: Any, where: str) -> Any:
    """``value`` as the option ``action`` would have parsed it, or a ``ConfigError``."""
    if isinstance(action, argparse._StoreTrueAction):
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: must be true or false, got {_kind(value)}")
        return value
    if action.nargs not in (None, "?") or not isinstance(action, argparse._StoreAction):
        raise ConfigError(f"{where}: is not an option a file can set")  # none such today
    if action.type is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: must be an integer, got {_kind(value)}")
    elif action.type is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: must be a number, got {_kind(value)}")
        try:
            value = float(value)
        except OverflowError:
            raise ConfigError(f"{where}: is too large for a number") from None
    elif action.type is None:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: must be a string, got {_kind(value)}")
        if "\0" in value:  # no command line can hold one; no path or name either
            raise ConfigError(f"{where}: contains a NUL character")
    else:
        raise ConfigError(f"{where}: is not an option a file can set")  # none such today
    if action.choices is not None and value not in action.choices:
        options = ", ".join(str(c) for c in action.choices)
        raise ConfigError(f"{where}: must be one of {options}, got {value!r}")
    return value


def apply_config_file(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    explicit: Iterable[str],
    path: str,
) -> dict[str, str]:
    """Set on ``args`` every option of the file ``path`` that the command line did not
    give (``explicit``: the destinations argv set). Every key of the file is checked,
    overridden or not. Returns the options taken from the file, by their destination and
    long flag (``{"hidden": "hidden", "--hidden": "hidden"}``, the key as written), for
    :func:`blame` and for the caller's set of options given.

    Raises:
        ConfigError: the file cannot be read, or a key is unknown, not an option of a
            file, given twice (``batch-size`` and ``batch_size``), a table, or of the
            wrong type or value; one line naming the file and the key.
    """
    data = read_config_file(path)
    by_key: dict[str, argparse.Action] = {}
    for action in file_actions(parser):
        for option in action.option_strings:
            if option.startswith("--"):
                by_key[option[2:]] = action
                by_key[option[2:].replace("-", "_")] = action
    invocation = {
        o[2:]
        for a in parser._actions
        if a.dest in NOT_IN_FILE
        for o in a.option_strings
        if o.startswith("--")
    }
    given = set(explicit)
    seen: dict[str, str] = {}
    origins: dict[str, str] = {}
    for key, value in data.items():
        where = f"{path}: {key}"
        if isinstance(value, dict):
            raise ConfigError(
                f"{where}: is a table; options are top-level keys (hidden = 256, not a [section])"
            )
        found = by_key.get(key)
        if found is None:
            if key.replace("_", "-") in invocation:
                raise ConfigError(
                    f"{where}: --{key.replace('_', '-')} is not a configuration option "
                    "(give it on the command line)"
                )
            close = difflib.get_close_matches(key, list(by_key), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"{where}: unknown option{hint}")
        action = found
        if action.dest in seen:
            raise ConfigError(f"{path}: {seen[action.dest]} and {key} are the same option")
        seen[action.dest] = key
        value = _check_value(action, value, where)
        if action.dest in given:
            continue  # the command line wins
        setattr(args, action.dest, value)
        origins[action.dest] = key
        origins[long_flag(action)] = key
    return origins


_LEADING_NAME = re.compile(r"(--[a-z][a-z0-9-]*|[a-z][a-z0-9_]*)")


def blame(exc: ConfigError, origins: dict[str, str], path: str | None) -> ConfigError:
    """``exc`` naming the file and key when the option it is about (its first word, a
    ``--flag`` or a field name) came from the configuration file ``path``.

    >>> str(blame(ConfigError("--hidden must be ≥ 1, got 0"), {"--hidden": "hidden"}, "a.toml"))
    'a.toml: hidden: --hidden must be ≥ 1, got 0'
    >>> str(blame(ConfigError("--lr must be > 0, got 0"), {"--hidden": "hidden"}, "a.toml"))
    '--lr must be > 0, got 0'
    """
    match = _LEADING_NAME.match(str(exc))
    if path is None or match is None or match.group(1) not in origins:
        return exc
    return ConfigError(f"{path}: {origins[match.group(1)]}: {exc}")


def toml_value(value: Any) -> str:
    r"""``value`` (a string, integer, float or boolean) as TOML that reads back equal.

    >>> print(toml_value('a"b\\c\tz'))
    "a\"b\\c\tz"
    >>> toml_value(1e-05), toml_value(float("inf")), toml_value(True), toml_value(3)
    ('1e-05', 'inf', 'true', '3')
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value)  # 'inf', '-inf', '1e-05', '0.002': all TOML floats
    if isinstance(value, str):
        out = []
        for ch in value:
            code = ord(ch)
            if ch in '"\\':
                out.append("\\" + ch)
            elif code < 0x20 or code == 0x7F:  # TOML forbids raw control characters
                out.append({"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(ch, f"\\u{code:04X}"))
            elif 0xD800 <= code <= 0xDFFF:  # a lone surrogate (undecodable file name)
                raise ConfigError(f"{value!r} cannot be written as UTF-8 text")
            else:
                out.append(ch)
        return '"' + "".join(out) + '"'
    raise TypeError(f"no TOML form for {type(value).__name__}")


def render(parser: argparse.ArgumentParser, values: dict[str, Any], header: Iterable[str]) -> str:
    """A TOML configuration: the comment lines ``header``, then, group by group of the
    parser's help, ``key = value`` for every option in ``values`` (its destination →
    value; None: unset, written as a comment), in the parser's order."""
    lines = [f"# {line}".rstrip() for line in header]
    for group in parser._action_groups:
        shown = [a for a in group._group_actions if a.dest in values and a.option_strings]
        if not shown:
            continue
        lines += ["", f"# {group.title}"]
        for action in shown:
            value = values[action.dest]
            key = key_of(action)
            lines.append(f"# {key} (not set)" if value is None else f"{key} = {toml_value(value)}")
    return "\n".join(lines) + "\n"
