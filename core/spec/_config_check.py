"""The pydantic side of ``hyspec.spec.config``: how a key is declared, and how an error is reported.

Every section is a frozen pydantic dataclass (a real ``dataclasses`` dataclass,
so ``dataclasses.replace`` / ``fields`` work) declared with :func:`section`.
pydantic checks types and bounds; what it reports is turned into a
``ConfigError`` whose key is the full dotted path of the offending entry
(``speculative_config.hybrid.methods[1].method``) and whose wording is
hyspec's own ("must be >= 1, got 0", "unknown key (did you mean ...)"),
because a config file is edited by a person who needs to find the line.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import typing
from typing import Annotated, Any, Callable, Iterable, Mapping, NoReturn, Union

from pydantic import BeforeValidator, ConfigDict, Field, Strict, TypeAdapter, ValidationError, ValidationInfo
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic_core import PydanticCustomError

from hyspec.errors import ConfigError

ROOT = "speculative_config"
#: Validation context ``from_dict`` passes: JSON-shaped input, where a mapping builds a section.
FROM_MAPPING = {"from_mapping": True}

# JSON has no int/bool/str coercion: a "4" where a count belongs, or a true, is a mistake.
Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]  # strict floats still take ints (as JSON writes 1 for 1.0)
Bool = Annotated[bool, Strict()]
Text = Annotated[str, Strict(), Field(pattern=r"\S")]


def key(default: Any, doc: str, **bounds: Any) -> Any:
    """A config key: its default, one line of documentation and pydantic bounds (``ge``, ``gt``, ``le``, ``lt``).

    The doc is both the JSON Schema description and ``metadata["doc"]`` (what ``describe()`` renders).
    """
    if isinstance(default, (list, dict, set)):
        raise TypeError("mutable defaults are not allowed in frozen configs; use a tuple")
    return dataclasses.field(default=default, metadata={"doc": doc, "description": doc, **bounds})


def section(path: str) -> Callable[[type], type]:
    """Make ``cls`` a frozen pydantic dataclass whose errors name keys under ``path``; document its keys."""
    def wrap(cls: type) -> type:
        cls._SECTION = path
        cls = pydantic_dataclass(frozen=True, config=ConfigDict(extra="forbid", allow_inf_nan=False))(cls)
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            try:
                init(self, *args, **kwargs)
            except ValidationError as e:
                raise config_error(e, cls, path) from None

        cls.__init__ = __init__
        return _document(cls)
    return wrap


def section_field(cls: type) -> Any:
    """The type of a key holding section ``cls``: null means its defaults; a mapping builds it only in
    ``from_dict`` (a constructor call passes the section object itself)."""
    def accept(value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return cls()
        if isinstance(value, Mapping) and not (info.context or {}).get("from_mapping"):
            invalid("", f"expected a {cls.__name__} (a mapping builds one in SpeculativeConfig.from_dict), "
                        f"got {value!r}")
        return value
    return Annotated[cls, BeforeValidator(accept)]


def invalid(name: str, message: str) -> NoReturn:
    """Fail a rule of a section's ``__post_init__``: ``name`` is the key (relative to the section)."""
    raise PydanticCustomError("hyspec_config", "{message}", {"message": message, "name": name})


def one_of(name: str, value: Any, choices: Iterable[str]) -> None:
    choices = tuple(choices)
    if value not in choices:
        invalid(name, f"must be one of {', '.join(choices)}; got {value!r}{did_you_mean(value, choices)}")


def did_you_mean(word: Any, candidates: Iterable[str]) -> str:
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def validate(cls: type, data: Any, unsupported: Mapping[str, str]) -> Any:
    """Build ``cls`` from JSON-shaped ``data``; unknown keys of the root that ``unsupported`` names are
    refused with its reason."""
    try:
        return _adapter(cls).validate_python(data, context=FROM_MAPPING)
    except ValidationError as e:
        raise config_error(e, cls, cls._SECTION, unsupported) from None


def to_dict(obj: Any) -> dict[str, Any]:
    """The JSON-shaped mapping of a config (nested sections as mappings, tuples as lists)."""
    return _adapter(type(obj)).dump_python(obj, mode="json")


def json_schema(cls: type) -> dict[str, Any]:
    return _adapter(cls).json_schema()


@functools.lru_cache(maxsize=None)
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


# ---------------------------------------------------------------- pydantic's report -> ConfigError

# pydantic's error type -> hyspec's wording ({input}: the value; {type}: its JSON-ish type; the rest: pydantic's ctx)
_MESSAGES = {
    "int_type": "expected an integer, got {input!r}",
    "int_from_float": "expected an integer, got {input!r}",
    "float_type": "expected a finite number, got {input!r}",
    "finite_number": "expected a finite number, got {input!r}",
    "bool_type": "expected true or false, got {input!r}",
    "string_type": "expected a non-empty string, got {input!r}",
    "string_pattern_mismatch": "expected a non-empty string, got {input!r}",
    "greater_than_equal": "must be >= {ge}, got {input}",
    "greater_than": "must be > {gt}, got {input}",
    "less_than_equal": "must be <= {le}, got {input}",
    "less_than": "must be < {lt}, got {input}",
    "dataclass_type": "expected an object (JSON mapping), got {type}",
    "dataclass_exact_type": "expected an object (JSON mapping), got {type}",
    "tuple_type": "expected a list, got {type}",
    "missing_argument": "required",
    "missing": "required",
}


def config_error(error: ValidationError, cls: type, root: str,
                 unsupported: Mapping[str, str] | None = None) -> ConfigError:
    """The first of pydantic's errors as a ConfigError naming the full dotted key."""
    e = error.errors()[0]
    kind, loc, value, ctx = e["type"], e["loc"], e.get("input"), e.get("ctx") or {}
    if kind == "value_error" and isinstance(ctx.get("error"), ConfigError):
        return ctx["error"]  # a rule that already named its key (a section built while resolving defaults)
    if kind == "hyspec_config":
        return ConfigError(_dotted(root, loc + ((ctx["name"],) if ctx["name"] else ())), ctx["message"])
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        name, owner = loc[-1], _section_at(cls, loc[:-1])
        if owner is cls and unsupported and name in unsupported:
            return ConfigError(_dotted(root, loc), f"not supported by hyspec: {unsupported[name]}")
        names = [f.name for f in dataclasses.fields(owner)]
        return ConfigError(_dotted(root, loc), f"unknown key{did_you_mean(name, names)}; valid keys: "
                                               f"{', '.join(names)}")
    if kind == "invalid_key":
        return ConfigError(_dotted(root, loc[:-1]), f"keys must be strings, got {loc[-1]!r}")
    if kind == "literal_error":
        owner = _section_at(cls, loc[:-1])
        choices = typing.get_args(_strip(typing.get_type_hints(owner, include_extras=True)[loc[-1]]))
        return ConfigError(_dotted(root, loc), f"must be one of {', '.join(choices)}; got {value!r}"
                                               f"{did_you_mean(value, choices)}")
    if kind in _MESSAGES:
        return ConfigError(_dotted(root, loc), _MESSAGES[kind].format(input=value, type=type(value).__name__, **ctx))
    return ConfigError(_dotted(root, loc), e["msg"])


def _dotted(root: str, loc: tuple) -> str:
    return root + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)


def _section_at(cls: type, loc: tuple) -> type:
    """The section class found at ``loc`` below ``cls`` (list indices step into the item type)."""
    for part in loc:
        if isinstance(part, str):
            cls = _strip(typing.get_type_hints(cls, include_extras=True)[part])
        if typing.get_origin(cls) is tuple:
            cls = _strip(typing.get_args(cls)[0])
    return cls


def _strip(hint: Any) -> Any:
    """``X`` from ``Annotated[X, ...]`` / ``X | None``."""
    while True:
        if typing.get_origin(hint) is Annotated:
            hint = hint.__origin__
        elif typing.get_origin(hint) is Union:
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        else:
            return hint


# ---------------------------------------------------------------- documentation

def _document(cls: type) -> type:
    """Append a "Keys" section, rendered from each key's doc, to the class docstring.

    One source for the key reference: ``help(cls)`` and ``describe()`` agree.
    """
    lines = ["", "Keys:"]
    for f in dataclasses.fields(cls):
        lines.append(f"    {f.name} (default {_default_repr(f.default)}): {f.metadata.get('doc', '')}")
    cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n" + "\n".join(lines) + "\n"
    return cls


def markdown_table(cls: type, prefix: str) -> list[str]:
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(_strip(typing.get_type_hints(cls, include_extras=True)[f.name])):
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


__all__ = ["Bool", "Float", "Int", "ROOT", "Text", "config_error", "did_you_mean", "invalid", "json_schema",
           "key", "markdown_table", "one_of", "section", "section_field", "to_dict", "validate"]
