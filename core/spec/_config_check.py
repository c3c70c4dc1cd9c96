"""Building and checking the nested config dataclasses of ``hyspec.spec.config``.

The machinery is generic so that config.py holds only the keys, their
defaults, their documentation and their rules.  Every error is a
``ConfigError`` whose key is the full dotted path of the offending entry
(``speculative_config.controller.ewma_alpha``), because a config file is
edited by a person who needs to find the line.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from typing import Any, Iterable, Mapping

from hyspec.errors import ConfigError

ROOT = "speculative_config"


def key(default: Any, doc: str) -> Any:
    """A config key: its default and one line of documentation (rendered by ``describe()``)."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("mutable defaults are not allowed in frozen configs; use a tuple")
    return dataclasses.field(default=default, metadata={"doc": doc})


def fail(obj: Any, name: str, message: str) -> typing.NoReturn:
    raise ConfigError(f"{obj._SECTION}.{name}", message)


# ---------------------------------------------------------------- value checks
# Each reads ``getattr(obj, name)`` and raises naming the full path.  bool is a
# subclass of int in Python; a JSON ``true`` where a count belongs is a mistake.

def check_int(obj: Any, name: str, lo: int | None = None, hi: int | None = None,
              optional: bool = False) -> None:
    value = getattr(obj, name)
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        fail(obj, name, f"expected an integer, got {value!r}")
    if lo is not None and value < lo:
        fail(obj, name, f"must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        fail(obj, name, f"must be <= {hi}, got {value}")


def check_float(obj: Any, name: str, lo: float | None = None, hi: float | None = None,
                lo_open: bool = False, optional: bool = False) -> None:
    value = getattr(obj, name)
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        fail(obj, name, f"expected a finite number, got {value!r}")
    if lo is not None and (value <= lo if lo_open else value < lo):
        fail(obj, name, f"must be {'>' if lo_open else '>='} {lo}, got {value}")
    if hi is not None and value > hi:
        fail(obj, name, f"must be <= {hi}, got {value}")
    object.__setattr__(obj, name, float(value))


def check_bool(obj: Any, name: str) -> None:
    value = getattr(obj, name)
    if not isinstance(value, bool):
        fail(obj, name, f"expected true or false, got {value!r}")


def check_str(obj: Any, name: str, optional: bool = False) -> None:
    value = getattr(obj, name)
    if value is None and optional:
        return
    if not isinstance(value, str) or not value.strip():
        fail(obj, name, f"expected a non-empty string, got {value!r}")


def check_choice(obj: Any, name: str, choices: Iterable[str]) -> None:
    value = getattr(obj, name)
    choices = tuple(choices)
    if value not in choices:
        fail(obj, name, f"must be one of {', '.join(choices)}; got {value!r}{did_you_mean(value, choices)}")


def did_you_mean(word: Any, candidates: Iterable[str]) -> str:
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


# ---------------------------------------------------------------- dict -> dataclass

def build(cls: type, data: Any, path: str, unsupported: Mapping[str, str] | None = None) -> Any:
    """Construct config dataclass ``cls`` from a JSON-shaped mapping found at ``path``.

    Unknown keys are rejected with the closest valid key; keys in
    ``unsupported`` (names vLLM accepts that hyspec does not) with the reason.
    Nested dataclass fields are built recursively so errors carry their path.
    """
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError(path, f"expected an object (JSON mapping), got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        if not isinstance(name, str):
            raise ConfigError(path, f"keys must be strings, got {name!r}")
        if name not in fields:
            if unsupported and name in unsupported:
                raise ConfigError(f"{path}.{name}", f"not supported by hyspec: {unsupported[name]}")
            raise ConfigError(f"{path}.{name}", f"unknown key{did_you_mean(name, fields)}; valid keys: "
                                                f"{', '.join(fields)}")
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            if value is None:
                continue  # a null section means its defaults
            value = build(hint, value, f"{path}.{name}")
        elif _item_dataclass(hint) is not None and value is not None:
            value = _build_items(_item_dataclass(hint), value, f"{path}.{name}")
        kwargs[name] = value
    for name, f in fields.items():
        if name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{path}.{name}", "required")
    return cls(**kwargs)


def _item_dataclass(hint: Any) -> type | None:
    """``X`` for a ``tuple[X, ...]`` hint whose X is a config dataclass."""
    if typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis and dataclasses.is_dataclass(args[0]):
            return args[0]
    return None


def _build_items(item_cls: type, values: Any, path: str) -> tuple[Any, ...]:
    """A JSON list of item configs; a bare string is shorthand for ``{item_cls._SHORTHAND: s}``."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
        raise ConfigError(path, f"expected a list, got {type(values).__name__}")
    items = []
    for i, value in enumerate(values):
        item_path = f"{path}[{i}]"
        if isinstance(value, str):
            value = {item_cls._SHORTHAND: value}
        try:
            items.append(build(item_cls, value, item_path))
        except ConfigError as e:
            # The item's own checks name its generic section; give the index.
            section = item_cls._SECTION
            if e.key.startswith(section):
                message = str(e)[len(e.key) + 2:]
                raise ConfigError(item_path + e.key[len(section):], message) from None
            raise
    return tuple(items)


def to_dict(obj: Any) -> dict[str, Any]:
    """The JSON-shaped mapping of a config dataclass (nested configs as mappings)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            value = to_dict(value)
        elif isinstance(value, tuple):
            value = [to_dict(v) if dataclasses.is_dataclass(v) else v for v in value]
        out[f.name] = value
    return out


# ---------------------------------------------------------------- documentation

def document(cls: type) -> type:
    """Append a "Keys" section, rendered from each field's doc, to the class docstring.

    One source for the key reference: ``help(cls)`` and ``describe()`` agree.
    """
    lines = ["", "Keys:"]
    for f in dataclasses.fields(cls):
        lines.append(f"    {f.name} (default {_default_repr(f.default)}): {f.metadata.get('doc', '')}")
    cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n" + "\n".join(lines) + "\n"
    return cls


def markdown_table(cls: type, prefix: str) -> list[str]:
    rows = [f"| key | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(typing.get_type_hints(cls)[f.name]):
            rows.append(f"| `{prefix}{f.name}` | (section) | {f.metadata.get('doc', '')} |")
            continue
        doc = f.metadata.get("doc", "").replace("|", "\\|")
        rows.append(f"| `{prefix}{f.name}` | `{_default_repr(f.default)}` | {doc} |")
    return rows


def _default_repr(default: Any) -> str:
    if default is dataclasses.MISSING:
        return "required"
    if dataclasses.is_dataclass(default):
        return "{...}"
    if default is None:
        return "null"
    if isinstance(default, bool):
        return "true" if default else "false"
    if isinstance(default, tuple):
        return "[]" if not default else repr(list(default))
    if isinstance(default, str):
        return f'"{default}"'
    return repr(default)
