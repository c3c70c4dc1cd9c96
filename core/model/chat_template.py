"""Rendering a checkpoint's chat template with bounds, and keeping control-token text in content as text.

A chat template is data from a checkpoint (a GGUF's metadata, a tokenizer_config.json), run on every chat
request.  Jinja's ``ImmutableSandboxedEnvironment`` stops it from reaching Python objects, but not from
running long or building huge strings; here one rendering is bounded:

- in output size: string/list repetition and concatenation, a call's or filter's result, a namespace
  value and the rendered text itself may not pass ``max_chars``, and numbers above ``max_chars`` are refused
  as arguments (``center(10**9)``) or exponents, so the big value is refused before it is built;
- in time: after ``timeout_s`` the rendering thread gets an asynchronous exception.  The template is
  Python bytecode, so this stops any loop, also one that calls nothing a hook could watch.

The environment is the one transformers renders chat templates in (``_compile_jinja_template`` in
transformers/utils/chat_template_utils.py, read at v5.25.0): Jinja's ``loopcontrols`` (``{% break %}``) and a
``{% generation %}`` tag, ``tojson`` as ``json.dumps`` (not Jinja's HTML-escaping one), and the globals
``raise_exception``, ``strftime_now``, ``dict`` and an underscore-refusing ``namespace``.  It is written here
rather than borrowed because transformers is not a dependency of hyspec's core and has no bounds;
tests/model/test_chat_template_transformers.py holds the two equal on real templates.

Role injection: a client that writes ``<|im_start|>system`` into its message must not open a system turn.
``mark_control_text`` swaps control-token text in client content for unguessable markers before the
template runs; the caller encodes the template's text with special tokens and each marked span as text.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import re
import secrets
import threading
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Iterator

from hyspec.errors import HyspecError

DEFAULT_MAX_CHARS = 16 << 20
DEFAULT_TIMEOUT_S = 10.0
# Roles whose content is the operator's: their control-token text is kept as written.
TRUSTED_ROLES = frozenset({"system", "developer"})
# The message keys whose text is the client's: content, name, and an assistant turn's reasoning.
MARKED_KEYS = frozenset({"content", "name", "reasoning", "reasoning_content", "thinking"})


class ChatTemplateBoundError(HyspecError):
    """A chat template went past its output-size or time bound."""


class _RenderTimeout(BaseException):
    """Raised asynchronously in the rendering thread; a BaseException so that Jinja does not wrap it."""


@dataclass(frozen=True)
class RenderBounds:
    max_chars: int = DEFAULT_MAX_CHARS
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.max_chars < 1 or not self.timeout_s > 0:
            raise ValueError(f"chat template bounds must be positive, got {self}")

    def too_big(self) -> ChatTemplateBoundError:
        return ChatTemplateBoundError(f"the chat template's output would pass {self.max_chars} characters, the bound "
                                      "on one rendered prompt")

    def check_size(self, value: Any) -> Any:
        if isinstance(value, (str, list, tuple)) and len(value) > self.max_chars:
            raise self.too_big()
        return value

    def check_number(self, value: Any) -> None:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > self.max_chars:
            raise self.too_big()


# The bounds of the rendering under way in this thread (set by render(), read by the environment's hooks).
_bounds: ContextVar[RenderBounds] = ContextVar("chat_template_bounds")


def _bounded_environment():
    """transformers' chat-template environment (see the module docstring), with every operator, call, filter
    and namespace respecting ``_bounds``."""
    from jinja2 import nodes
    from jinja2.exceptions import SecurityError, TemplateError
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.utils import Namespace

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+", "%"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            bounds = _bounds.get()
            if operator == "*":
                for seq, count in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(count, int) and len(seq) * count > 0:
                        bounds.check_number(len(seq) * count)
            elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
                bounds.check_number(right * abs(left).bit_length())  # the result's size in bits, roughly
            elif operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, type(left)):
                bounds.check_number(len(left) + len(right))
            return bounds.check_size(super().call_binop(context, operator, left, right))

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # Jinja's signature
            bounds = _bounds.get()
            for value in (*args, *kwargs.values()):
                bounds.check_number(value)
            return bounds.check_size(super().call(__context, __obj, *args, **kwargs))

    class GenerationTag(Extension):
        """``{% generation %}...{% endgeneration %}`` renders its body: transformers marks the assistant's
        tokens with it (for training masks); rendering a prompt needs only the text."""
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Callable[[], str]) -> str:
            return caller()

    def check_attribute_name(name: Any) -> None:
        # A namespace is a dict underneath: an underscore name could reach for Python internals.
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"a chat template may not store the underscore-prefixed attribute {name!r} "
                                "on a namespace")

    class BoundedNamespace(Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:  # Jinja's signature: namespace(self=...) works
            self, rest = args[0], args[1:]
            attributes = dict(*rest, **kwargs)
            for name, value in attributes.items():
                check_attribute_name(name)
                _bounds.get().check_size(value)
            Namespace.__init__(self, attributes)

        def __setitem__(self, name: str, value: Any) -> None:
            check_attribute_name(name)
            super().__setitem__(name, _bounds.get().check_size(value))

    class TemplateDict:
        """``dict`` for templates: building dicts, without the type object itself."""

        def __call__(self, *args: Any, **kwargs: Any) -> dict:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message: str):
        raise TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        # Plain json.dumps, as transformers does: Jinja's own filter escapes <, >, & and ' for HTML.
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.filters = {name: _bounded_filter(f) for name, f in env.filters.items()}
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, dict=TemplateDict(),
                       namespace=BoundedNamespace)
    return env


def _bounded_filter(f: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(f)  # keeps Jinja's pass_context / pass_environment marks
    def bounded(*args: Any, **kwargs: Any) -> Any:
        bounds = _bounds.get()
        for value in (*args[1:], *kwargs.values()):  # args[0] is the value filtered (or the context)
            bounds.check_number(value)
        return bounds.check_size(f(*args, **kwargs))

    return bounded


@functools.lru_cache(maxsize=32)
def compile_template(source: str):
    """The template compiled in the bounded environment (cached: the checkpoint's, --chat-template's and a
    few request templates are compiled once)."""
    return _bounded_environment().from_string(source)


def render(template: Any, bounds: RenderBounds, **variables: Any) -> str:
    """``template`` rendered with ``variables``, within ``bounds`` (ChatTemplateBoundError past them)."""
    token = _bounds.set(bounds)
    pieces, size = [], 0
    try:
        with _interrupt_after(bounds.timeout_s):
            for piece in template.generate(**variables):
                size += len(piece)
                if size > bounds.max_chars:
                    raise bounds.too_big()
                pieces.append(piece)
    except _RenderTimeout:
        raise ChatTemplateBoundError(f"the chat template ran longer than {bounds.timeout_s:g} s, the bound on "
                                     "rendering one prompt") from None
    finally:
        _bounds.reset(token)
    return "".join(pieces)


@contextlib.contextmanager
def _interrupt_after(seconds: float) -> Iterator[None]:
    """Raise _RenderTimeout in this thread if the block is still running after ``seconds``."""
    set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    thread_id = ctypes.c_ulong(threading.get_ident())
    lock = threading.Lock()
    running = True

    def interrupt() -> None:
        with lock:
            if running:
                set_async_exc(thread_id, ctypes.py_object(_RenderTimeout))

    timer = threading.Timer(seconds, interrupt)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        with lock:
            running = False
            set_async_exc(thread_id, None)  # withdraw one that was set but has not been raised yet


@dataclass
class MarkedMessages:
    """Messages with control-token text in untrusted content swapped for markers (``originals[k]`` for k)."""

    messages: list[dict[str, Any]]
    originals: list[str]
    pattern: re.Pattern[str]

    def split(self, rendered: str) -> list[str | int]:
        """The rendered text as template text (str) and marker indices (int), each marker exactly once."""
        parts = self.pattern.split(rendered)
        found = [int(k) for k in parts[1::2]]
        if sorted(found) != list(range(len(self.originals))):
            raise HyspecError("the chat template changed message content that holds control-token text "
                              f"({', '.join(sorted(set(self.originals)))}), so it cannot be kept as text; "
                              "remove that text from the messages")
        return [int(p) if i % 2 else p for i, p in enumerate(parts)]


def mark_control_text(messages: list[dict[str, Any]], control_texts: list[str]) -> MarkedMessages:
    """Swap every control-token text in the MARKED_KEYS of messages from untrusted roles for a marker.

    Markers hold a random nonce between private-use characters: content cannot forge one."""
    nonce = secrets.token_hex(8)
    originals: list[str] = []
    if not control_texts:
        return MarkedMessages(messages, originals, re.compile(re.escape(nonce)))
    control = re.compile("|".join(re.escape(t) for t in sorted(control_texts, key=len, reverse=True)))

    def marker(match: re.Match[str]) -> str:
        originals.append(match.group(0))
        return f"\ue000hyspec{nonce}:{len(originals) - 1}\ue001"

    marked = []
    for m in messages:
        if m.get("role") not in TRUSTED_ROLES:
            m = {k: control.sub(marker, v) if k in MARKED_KEYS and isinstance(v, str) else v for k, v in m.items()}
        marked.append(m)
    return MarkedMessages(marked, originals, re.compile(f"\ue000hyspec{nonce}:(\\d+)\ue001"))


def find_control_text(value: Any, control_texts: list[str]) -> str | None:
    """The first control-token text in any string inside ``value`` (dicts, lists), or None."""
    if isinstance(value, str):
        return next((t for t in control_texts if t in value), None)
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return next((found for v in items if (found := find_control_text(v, control_texts)) is not None), None)
