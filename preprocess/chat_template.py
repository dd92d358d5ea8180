"""Chat templates rendered in a bounded sandbox: a template from a checkpoint can neither hang nor exhaust memory.

A chat template is a program shipped in a checkpoint (``chat_template.jinja``, a tokenizer config, a GGUF file's
``tokenizer.chat_template``). transformers renders it with jinja2's ``ImmutableSandboxedEnvironment``, which stops
it from reaching Python internals but not from looping for ever (nested loops) or asking for gigabytes
(``'x' * 3000000000``). This module renders it the way transformers does (same environment settings, filters,
globals and variables: the prompts are identical) in a sandbox that also bounds the work:

* every value the template makes (a string, a list, a dict; containers counted with their contents as ``str()`` or
  ``tojson`` would write them) is at most ``MAX_VALUE`` characters, checked before an operation that could make
  a larger one (``*``, ``**``, ``%``, widths and counts passed to filters and string methods) and on every value
  made by a literal, ``~``, ``+``, a filter or a call;
* all values made in one rendering add up to at most ``MAX_WORK`` characters, and the output to ``MAX_OUTPUT``;
* loop iterations, calls and filter applications add up to at most ``MAX_STEPS``, and the rendering takes at
  most ``MAX_SECONDS`` (checked at each of those steps; a step works on bounded values, so it is short);
* the template source is at most ``MAX_TEMPLATE_CHARS``; methods of built-in types are limited to a list of
  read-only ones (``str.split``, ``dict.items``, ...: no ``int.to_bytes``).

It runs in the calling thread: no thread or process is started, no signal is used, so it works the same inside the
Python API, the web demo's worker threads and the captioner's. Over a limit, ``render_chat_template`` raises
``PromptError`` naming the limit.
"""

from __future__ import annotations

import datetime
import functools
import json
import re
import string
import threading
import time
import types
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes as nodes
from jinja2.compiler import CodeGenerator
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from omnijax.common.errors import PromptError

MAX_TEMPLATE_CHARS = 1 << 20  # the template source (real templates: 1 .. 20 kB)
MAX_VALUE = 1 << 23  # characters of any one value the template makes
MAX_OUTPUT = 1 << 23  # characters of the rendered prompt
MAX_WORK = 1 << 26  # characters of all the values made in one rendering
MAX_STEPS = 1 << 20  # loop iterations, calls and filter applications in one rendering
MAX_SECONDS = 5.0  # wall-clock time of one rendering
MAX_INT_BITS = 4096  # integers the template computes
MAX_NESTING = 100  # containers nested in containers

_LOOP_FILTER = "omnijax_counted_loop"


class _OverLimit(Exception):
    """A rendering went past one of the limits (turned into a PromptError by ``render_chat_template``)."""


class _Budget:
    """What one rendering has used so far; ``sizes`` remembers container sizes by id (``keep`` holds the
    containers so that an id is not reused during the rendering)."""

    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds
        self.steps = 0
        self.work = 0
        self.sizes: dict[int, tuple[int, int]] = {}
        self.keep: list = []

    def step(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise _OverLimit(f"it took more than {MAX_STEPS} steps (loop iterations, calls and filters)")
        if time.monotonic() > self.deadline:
            raise _OverLimit(f"it ran for more than {MAX_SECONDS:g} s")

    def charge(self, chars: int) -> None:
        self.work += chars
        if self.work > MAX_WORK:
            raise _OverLimit(f"the values it made add up to more than {MAX_WORK} characters")

    def size(self, value: Any) -> int:
        """Characters ``value`` takes written out (strings: their length; containers: their contents)."""
        return self._measure(value, 0)[0]

    def depth(self, value: Any) -> int:
        """How deep containers nest in ``value`` (0: not a container)."""
        return self._measure(value, 0)[1]

    def _measure(self, value: Any, level: int) -> tuple[int, int]:
        if isinstance(value, str):
            return len(value), 0
        if not isinstance(value, (list, tuple, dict)):
            return 1, 0
        known = self.sizes.get(id(value))
        if known is not None:
            return known
        if level > MAX_NESTING:
            raise _OverLimit(f"it nests containers more than {MAX_NESTING} deep")
        total, deepest = 2 + len(value), 0
        for item in (value.items() if isinstance(value, dict) else value):
            for part in (item if isinstance(value, dict) else (item,)):
                size, depth = self._measure(part, level + 1)
                total, deepest = total + size, max(deepest, depth)
            if total > MAX_VALUE:
                break
        if deepest + 1 > MAX_NESTING:
            raise _OverLimit(f"it nests containers more than {MAX_NESTING} deep")
        self.sizes[id(value)] = (total, deepest + 1)
        self.keep.append(value)
        return total, deepest + 1

    def check(self, value: Any, what: str = "a value") -> Any:
        """``value`` when it is within MAX_VALUE (charged to the work)."""
        size = self.size(value)
        if size > MAX_VALUE:
            raise _OverLimit(f"{what} would be more than {MAX_VALUE} characters")
        self.charge(len(value) if isinstance(value, (str, list, tuple, dict)) else 0)
        return value

    def expect(self, chars: int, what: str) -> None:
        """Refuse an operation whose result would hold more than MAX_VALUE characters, before it runs."""
        if chars > MAX_VALUE:
            raise _OverLimit(f"{what} would make a value of more than {MAX_VALUE} characters")


_local = threading.local()


def _budget() -> _Budget | None:
    return getattr(_local, "budget", None)


# ---- the bounds of single operations ----------------------------------------------------------------------------

_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0 +\-]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")
_NUMBERS = re.compile(r"\d+")


def _printf_widths(fmt: str) -> int:
    """The widths and precisions a printf-style format asks for, added up; a ``*`` (taken from the arguments) is
    refused."""
    total = 0
    for width, precision in _PRINTF.findall(fmt):
        if "*" in (width, precision):
            raise _OverLimit("a '*' width in a % format is not allowed")
        total += int(width or 0) + int(precision or 0)
    return total


def _format_widths(fmt: str) -> int:
    """The same for a ``str.format`` string: the numbers in its format specs (nested fields are refused)."""
    total = 0
    for _, field, spec, _ in string.Formatter().parse(fmt):
        if field is not None and spec:
            if "{" in spec:
                raise _OverLimit("nested fields in a format spec are not allowed")
            total += sum(int(n) for n in _NUMBERS.findall(spec))
    return total


def _size_of_items(budget: _Budget, items) -> int:
    return sum(budget.size(item) for item in items)


def _replace_size(budget: _Budget, text, old, new, count=-1) -> int:
    text, old, new = str(text), str(old), str(new)
    hits = (len(text) + 1) if not old else text.count(old)
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(text) + hits * max(0, len(new) - len(old))


def _join_size(budget: _Budget, items, sep: str = "") -> int:
    items = list(items)
    return _size_of_items(budget, items) + max(0, len(items) - 1) * len(str(sep))


# method name -> (args -> result size) of the methods of built-in types that can grow a value
_STR_GROWTH = {
    "center": lambda b, s, width, *a: max(len(s), int(width)),
    "ljust": lambda b, s, width, *a: max(len(s), int(width)),
    "rjust": lambda b, s, width, *a: max(len(s), int(width)),
    "zfill": lambda b, s, width: max(len(s), int(width)),
    "expandtabs": lambda b, s, tabsize=8: len(s) + s.count("\t") * max(0, int(tabsize)),
    "replace": lambda b, s, old, new, count=-1: _replace_size(b, s, old, new, count),
    "join": lambda b, s, items: _join_size(b, items, s),
}
_READ_ONLY_METHODS = {
    str: frozenset({"capitalize", "casefold", "count", "endswith", "find", "index", "isalnum", "isalpha", "isascii",
                    "isdecimal", "isdigit", "isidentifier", "islower", "isnumeric", "isprintable", "isspace",
                    "istitle", "isupper", "lower", "lstrip", "partition", "removeprefix", "removesuffix", "rfind",
                    "rindex", "rpartition", "rsplit", "rstrip", "split", "splitlines", "startswith", "strip",
                    "swapcase", "title", "upper"}) | frozenset(_STR_GROWTH),
    dict: frozenset({"get", "items", "keys", "values", "copy"}),
    list: frozenset({"count", "index", "copy"}),
    tuple: frozenset({"count", "index"}),
    int: frozenset({"bit_length", "is_integer", "conjugate", "as_integer_ratio"}),
    float: frozenset({"is_integer", "conjugate", "as_integer_ratio", "hex"}),
}


def _check_method(budget: _Budget, func, args: tuple) -> None:
    """Methods of built-in types: only the read-only ones of ``_READ_ONLY_METHODS``, with growing ones bounded."""
    if not isinstance(func, (types.BuiltinMethodType, types.MethodWrapperType)):
        return
    owner = getattr(func, "__self__", None)
    if owner is None or isinstance(owner, types.ModuleType):
        return
    name = getattr(func, "__name__", "")
    kind = next((t for t in _READ_ONLY_METHODS if isinstance(owner, t)), type(owner))
    if name not in _READ_ONLY_METHODS.get(kind, ()):
        raise _OverLimit(f"it calls {kind.__name__}.{name}, which chat templates may not call")
    if kind is str and name in _STR_GROWTH:
        try:
            size = _STR_GROWTH[name](budget, owner, *args)
        except (TypeError, ValueError):
            return  # the call itself raises the same error
        budget.expect(size, f"str.{name}")


def _check_binop(budget: _Budget, operator: str, left, right) -> None:
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                budget.expect(budget.size(seq) * max(n, 0), "'*'")
        if isinstance(left, int) and isinstance(right, int):
            if abs(left).bit_length() + abs(right).bit_length() > MAX_INT_BITS:
                raise _OverLimit(f"'*' would make an integer of more than {MAX_INT_BITS} bits")
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
        if max(abs(left).bit_length() - 1, 1) * right > MAX_INT_BITS and abs(left) > 1:
            raise _OverLimit(f"'**' would make an integer of more than {MAX_INT_BITS} bits")
    elif operator == "%" and isinstance(left, str):
        args = right if isinstance(right, tuple) else (right,)
        budget.expect(len(left) + _printf_widths(left) + _size_of_items(budget, args), "'%'")


# filter name -> (budget, value, *args, **kwargs) -> None, raising when the result could be over MAX_VALUE
def _indent_check(b, s, width=4, first=False, blank=False):
    pad = len(width) if isinstance(width, str) else int(width)
    b.expect(len(str(s)) + (str(s).count("\n") + 1) * pad, "indent")


def _tojson_check(b, value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    pad = len(indent) if isinstance(indent, str) else int(indent or 0)
    if pad > 64:
        raise _OverLimit("tojson's indent is over 64")
    extra = sum(len(str(s)) for s in separators) if separators else 2
    b.expect(b.size(value) * (6 + extra + pad * b.depth(value)), "tojson")


_FILTER_CHECKS = {
    "batch": lambda b, value, linecount, fill_with=None: b.expect(b.size(value) + int(linecount), "batch"),
    "slice": lambda b, value, slices, fill_with=None: b.expect(b.size(value) + int(slices), "slice"),
    "center": lambda b, value, width=80: b.expect(len(str(value)) + int(width), "center"),
    "format": lambda b, value, *args, **kwargs: b.expect(
        len(str(value)) + _printf_widths(str(value)) + _size_of_items(b, args) + _size_of_items(b, kwargs.values()),
        "format"),
    "indent": _indent_check,
    "join": lambda b, value, d="", attribute=None: b.expect(_join_size(b, value, d), "join"),
    "replace": lambda b, s, old, new, count=None: b.expect(_replace_size(b, s, old, new,
                                                                         -1 if count is None else count), "replace"),
    "sum": lambda b, iterable, attribute=None, start=0: b.expect(_size_of_items(b, iterable) + b.size(start), "sum"),
    "tojson": _tojson_check,
    "wordwrap": lambda b, s, width=79, break_long_words=True, wrapstring=None, *a: b.expect(
        len(str(s)) * (1 + len(wrapstring or "\n")), "wordwrap"),
    "lipsum": lambda b, *a, **k: None,
}


def _bounded_filter(name: str, func):
    """``func`` (a filter) with its inputs checked before and its result after."""
    check = _FILTER_CHECKS.get(name)
    passes = getattr(func, "jinja_pass_arg", None)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        budget = _budget()
        if budget is None:
            return func(*args, **kwargs)
        budget.step()
        if check is not None:
            value_args = args[1:] if passes is not None else args  # context / environment first
            try:
                check(budget, *value_args, **kwargs)
            except (TypeError, ValueError):
                pass  # a wrong argument: the filter itself raises the same error
        return budget.check(func(*args, **kwargs), f"the {name} filter's result")

    return wrapper


def _counted(iterable):
    """A loop's iterable, one step per iteration."""
    budget = _budget()
    if budget is None:
        yield from iterable
        return
    for item in iterable:
        budget.step()
        yield item


# ---- the environment ---------------------------------------------------------------------------------------------

class _BoundedCodeGenerator(CodeGenerator):
    """Every container literal and ``~`` concatenation goes through ``environment.sized``."""

    def _sized(self, visit, node, frame) -> None:
        self.write("environment.sized(")
        visit(node, frame)
        self.write(")")

    def visit_List(self, node, frame):
        self._sized(super().visit_List, node, frame)

    def visit_Dict(self, node, frame):
        self._sized(super().visit_Dict, node, frame)

    def visit_Tuple(self, node, frame):
        if node.ctx == "load":
            self._sized(super().visit_Tuple, node, frame)
        else:
            super().visit_Tuple(node, frame)

    def visit_Concat(self, node, frame):
        self._sized(super().visit_Concat, node, frame)


class _Generation(jinja2.ext.Extension):
    """transformers' ``{% generation %}`` tag (it marks assistant text for training masks): renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


class _Namespace(Namespace):
    """transformers' namespace (no underscore attributes). Written out as ``<Namespace>``: its attributes can change
    after it is put in a container, so it does not count their size."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check_name(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check_name(name)
        budget = _budget()
        if budget is not None:
            budget.check(value, f"namespace attribute {name!r}")
        Namespace.__setitem__(self, name, value)

    def __repr__(self) -> str:
        return "<Namespace>"

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot store underscore-prefixed attributes on a "
                                                  f"namespace, got {name!r}")


class _TemplateDict:
    """transformers' ``dict`` global: calling it and ``fromkeys``, nothing else."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


def _lipsum(n=5, html=True, min=20, max=100):
    if int(n) > 100 or int(max) > 1000:
        raise _OverLimit("lipsum is limited to 100 paragraphs of 1000 words")
    from jinja2.utils import generate_lorem_ipsum

    return generate_lorem_ipsum(n, html, min, max)


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """transformers' chat template environment (trim_blocks, lstrip_blocks, loop controls, its ``tojson``,
    ``raise_exception``, ``strftime_now``, ``dict`` and ``namespace``) with the bounds of the module docstring.
    Outside ``render_chat_template`` (no budget set) it behaves as the plain environment."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def __init__(self):
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols],
                         finalize=self._finalize)
        self.filters["tojson"] = _tojson
        self.filters = {name: _bounded_filter(name, f) for name, f in self.filters.items()}
        self.filters[_LOOP_FILTER] = _counted
        self.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_TemplateDict(),
                            namespace=_Namespace, lipsum=_lipsum)

    def _parse(self, source, name, filename):
        """The template's syntax tree with each ``for`` loop's iterable passed through the step counter."""
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):
            loop.iter = nodes.Filter(loop.iter, _LOOP_FILTER, [], [], None, None).set_lineno(loop.lineno)
        return tree

    def sized(self, value):
        budget = _budget()
        return value if budget is None else budget.check(value)

    def concat(self, parts):  # joins output, macro bodies, {% set %} blocks; the total is checked before joining
        budget = _budget()
        if budget is None:
            return "".join(parts)
        kept, total = [], 0
        for part in parts:
            total += len(part)
            if total > MAX_OUTPUT:
                raise _OverLimit(f"its output would be more than {MAX_OUTPUT} characters")
            kept.append(part)
        budget.charge(total)
        return "".join(kept)

    def _finalize(self, value):
        budget = _budget()
        if budget is not None:
            budget.step()
            budget.check(value, "an output value")
        return value

    def call_binop(self, context, operator, left, right):
        budget = _budget()
        if budget is None:
            return super().call_binop(context, operator, left, right)
        budget.step()
        _check_binop(budget, operator, left, right)
        return budget.check(super().call_binop(context, operator, left, right), f"the result of {operator!r}")

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's signature)
        budget = _budget()
        if budget is None:
            return super().call(__context, __obj, *args, **kwargs)
        budget.step()
        _check_method(budget, __obj, args)
        return budget.check(super().call(__context, __obj, *args, **kwargs), "a call's result")

    def wrap_str_format(self, value):
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        fmt = value.__self__

        @functools.wraps(wrapper)
        def bounded(*args, **kwargs):
            budget = _budget()
            if budget is not None:
                budget.expect(len(fmt) + _format_widths(fmt) + _size_of_items(budget, args)
                              + _size_of_items(budget, kwargs.values()), "str.format")
            return wrapper(*args, **kwargs)

        return bounded


_ENV = BoundedSandbox()
_COMPILE_LOCK = threading.Lock()


@functools.lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    """The compiled template. Compiling folds constant expressions (filters of constants are run): under a budget
    too, so that a constant over a limit is left to the rendering, which refuses it."""
    with _COMPILE_LOCK:
        previous = _budget()
        _local.budget = _Budget(MAX_SECONDS)
        try:
            return _ENV.from_string(source)
        finally:
            _local.budget = previous


def check_template_source(source, where: str) -> None:
    """Raise ``PromptError`` when a chat template is not a string of at most MAX_TEMPLATE_CHARS characters."""
    if not isinstance(source, str):
        raise PromptError(f"the chat template of {where} is not text")
    if len(source) > MAX_TEMPLATE_CHARS:
        raise PromptError(f"the chat template of {where} is {len(source)} characters long; at most "
                          f"{MAX_TEMPLATE_CHARS} are accepted")


def render_chat_template(source: str, variables: dict, *, seconds: float = MAX_SECONDS) -> str:
    """``source`` (a chat template) rendered with ``variables`` (messages, add_generation_prompt, special tokens,
    ...) within the limits of the module docstring. Raises PromptError when the template is too long, does not
    compile, raises (``raise_exception``, an undefined value used wrongly, ...) or goes past a limit."""
    check_template_source(source, "this checkpoint")
    try:
        template = _compile(source)
    except jinja2.TemplateSyntaxError as e:
        raise PromptError(f"the chat template does not compile: {e.message} (line {e.lineno})") from e
    previous = _budget()
    _local.budget = _Budget(seconds)
    try:
        return template.render(**variables)
    except _OverLimit as e:
        raise PromptError(f"the chat template was stopped: {e} (a broken or hostile chat template?)") from None
    except (RecursionError, MemoryError) as e:
        raise PromptError(f"the chat template was stopped: {type(e).__name__} (a broken or hostile chat "
                          f"template?)") from None
    except Exception as e:  # jinja errors, the template's own checks (raise_exception), type errors in it
        raise PromptError(f"the chat template rejected these messages: {e}") from e
    finally:
        _local.budget = previous
