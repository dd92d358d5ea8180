"""The limits of a chat template's rendering and the checks that hold them (used by preprocess/chat_template.py).

A rendering has a ``Budget`` (set per thread for its duration: ``current_budget``): steps (loop iterations, calls,
filters), the wall-clock deadline, the characters of all values made, and a memo of container sizes. The checks of
single operations (``check_binop``, ``check_method``, the filter checks of ``bounded_filter``) refuse, before it
runs, an operation whose result would be over ``MAX_VALUE``; ``Budget.check`` measures every value made.
"""

from __future__ import annotations

import functools
import re
import string
import threading
import time
import types
from typing import Any

MAX_TEMPLATE_CHARS = 1 << 20  # the template source (real templates: 1 .. 20 kB)
MAX_VALUE = 1 << 23  # characters of any one value the template makes
MAX_OUTPUT = 1 << 23  # characters of the rendered prompt
MAX_WORK = 1 << 26  # characters of all the values made in one rendering
MAX_STEPS = 1 << 20  # loop iterations, calls and filter applications in one rendering
MAX_SECONDS = 5.0  # wall-clock time of one rendering
MAX_INT_BITS = 4096  # integers the template computes
MAX_NESTING = 100  # containers nested in containers

class OverLimit(Exception):
    """A rendering went past one of the limits (turned into a PromptError by ``render_chat_template``)."""


class Budget:
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
            raise OverLimit(f"it took more than {MAX_STEPS} steps (loop iterations, calls and filters)")
        if time.monotonic() > self.deadline:
            raise OverLimit(f"it ran for more than {MAX_SECONDS:g} s")

    def charge(self, chars: int) -> None:
        self.work += chars
        if self.work > MAX_WORK:
            raise OverLimit(f"the values it made add up to more than {MAX_WORK} characters")

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
            raise OverLimit(f"it nests containers more than {MAX_NESTING} deep")
        total, deepest = 2 + len(value), 0
        for item in (value.items() if isinstance(value, dict) else value):
            for part in (item if isinstance(value, dict) else (item,)):
                size, depth = self._measure(part, level + 1)
                total, deepest = total + size, max(deepest, depth)
            if total > MAX_VALUE:
                break
        if deepest + 1 > MAX_NESTING:
            raise OverLimit(f"it nests containers more than {MAX_NESTING} deep")
        self.sizes[id(value)] = (total, deepest + 1)
        self.keep.append(value)
        return total, deepest + 1

    def check(self, value: Any, what: str = "a value") -> Any:
        """``value`` when it is within MAX_VALUE (charged to the work)."""
        size = self.size(value)
        if size > MAX_VALUE:
            raise OverLimit(f"{what} would be more than {MAX_VALUE} characters")
        self.charge(len(value) if isinstance(value, (str, list, tuple, dict)) else 0)
        return value

    def expect(self, chars: int, what: str) -> None:
        """Refuse an operation whose result would hold more than MAX_VALUE characters, before it runs."""
        if chars > MAX_VALUE:
            raise OverLimit(f"{what} would make a value of more than {MAX_VALUE} characters")


_local = threading.local()


def set_budget(budget: "Budget | None") -> "Budget | None":
    """Make ``budget`` this thread's (None: no limits); returns the one it replaces."""
    previous = current_budget()
    _local.budget = budget
    return previous


def current_budget() -> Budget | None:
    return getattr(_local, "budget", None)


# ---- the bounds of single operations ----------------------------------------------------------------------------

_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0 +\-]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")
_NUMBERS = re.compile(r"\d+")


def printf_widths(fmt: str) -> int:
    """The widths and precisions a printf-style format asks for, added up; a ``*`` (taken from the arguments) is
    refused."""
    total = 0
    for width, precision in _PRINTF.findall(fmt):
        if "*" in (width, precision):
            raise OverLimit("a '*' width in a % format is not allowed")
        total += int(width or 0) + int(precision or 0)
    return total


def format_widths(fmt: str) -> int:
    """The same for a ``str.format`` string: the numbers in its format specs (nested fields are refused)."""
    total = 0
    for _, field, spec, _ in string.Formatter().parse(fmt):
        if field is not None and spec:
            if "{" in spec:
                raise OverLimit("nested fields in a format spec are not allowed")
            total += sum(int(n) for n in _NUMBERS.findall(spec))
    return total


def size_of_items(budget: Budget, items) -> int:
    return sum(budget.size(item) for item in items)


def _replace_size(budget: Budget, text, old, new, count=-1) -> int:
    text, old, new = str(text), str(old), str(new)
    hits = (len(text) + 1) if not old else text.count(old)
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(text) + hits * max(0, len(new) - len(old))


def _join_size(budget: Budget, items, sep: str = "") -> int:
    items = list(items)
    return size_of_items(budget, items) + max(0, len(items) - 1) * len(str(sep))


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


def check_method(budget: Budget, func, args: tuple) -> None:
    """Methods of built-in types: only the read-only ones of ``_READ_ONLY_METHODS``, with growing ones bounded."""
    if not isinstance(func, (types.BuiltinMethodType, types.MethodWrapperType)):
        return
    owner = getattr(func, "__self__", None)
    if owner is None or isinstance(owner, types.ModuleType):
        return
    name = getattr(func, "__name__", "")
    kind = next((t for t in _READ_ONLY_METHODS if isinstance(owner, t)), type(owner))
    if name not in _READ_ONLY_METHODS.get(kind, ()):
        raise OverLimit(f"it calls {kind.__name__}.{name}, which chat templates may not call")
    if kind is str and name in _STR_GROWTH:
        try:
            size = _STR_GROWTH[name](budget, owner, *args)
        except (TypeError, ValueError):
            return  # the call itself raises the same error
        budget.expect(size, f"str.{name}")


def check_binop(budget: Budget, operator: str, left, right) -> None:
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                budget.expect(budget.size(seq) * max(n, 0), "'*'")
        if isinstance(left, int) and isinstance(right, int):
            if abs(left).bit_length() + abs(right).bit_length() > MAX_INT_BITS:
                raise OverLimit(f"'*' would make an integer of more than {MAX_INT_BITS} bits")
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
        if max(abs(left).bit_length() - 1, 1) * right > MAX_INT_BITS and abs(left) > 1:
            raise OverLimit(f"'**' would make an integer of more than {MAX_INT_BITS} bits")
    elif operator == "%" and isinstance(left, str):
        args = right if isinstance(right, tuple) else (right,)
        budget.expect(len(left) + printf_widths(left) + size_of_items(budget, args), "'%'")


# filter name -> (budget, value, *args, **kwargs) -> None, raising when the result could be over MAX_VALUE
def _indent_check(b, s, width=4, first=False, blank=False):
    pad = len(width) if isinstance(width, str) else int(width)
    b.expect(len(str(s)) + (str(s).count("\n") + 1) * pad, "indent")


def _tojson_check(b, value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    pad = len(indent) if isinstance(indent, str) else int(indent or 0)
    if pad > 64:
        raise OverLimit("tojson's indent is over 64")
    extra = sum(len(str(s)) for s in separators) if separators else 2
    b.expect(b.size(value) * (6 + extra + pad * b.depth(value)), "tojson")


_FILTER_CHECKS = {
    "batch": lambda b, value, linecount, fill_with=None: b.expect(b.size(value) + int(linecount), "batch"),
    "slice": lambda b, value, slices, fill_with=None: b.expect(b.size(value) + int(slices), "slice"),
    "center": lambda b, value, width=80: b.expect(len(str(value)) + int(width), "center"),
    "format": lambda b, value, *args, **kwargs: b.expect(
        len(str(value)) + printf_widths(str(value)) + size_of_items(b, args) + size_of_items(b, kwargs.values()),
        "format"),
    "indent": _indent_check,
    "join": lambda b, value, d="", attribute=None: b.expect(_join_size(b, value, d), "join"),
    "replace": lambda b, s, old, new, count=None: b.expect(_replace_size(b, s, old, new,
                                                                         -1 if count is None else count), "replace"),
    "sum": lambda b, iterable, attribute=None, start=0: b.expect(size_of_items(b, iterable) + b.size(start), "sum"),
    "tojson": _tojson_check,
    "wordwrap": lambda b, s, width=79, break_long_words=True, wrapstring=None, *a: b.expect(
        len(str(s)) * (1 + len(wrapstring or "\n")), "wordwrap"),
    "lipsum": lambda b, *a, **k: None,
}


def bounded_filter(name: str, func):
    """``func`` (a filter) with its inputs checked before and its result after."""
    check = _FILTER_CHECKS.get(name)
    passes = getattr(func, "jinja_pass_arg", None)

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        budget = current_budget()
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


def counted(iterable):
    """A loop's iterable, one step per iteration."""
    budget = current_budget()
    if budget is None:
        yield from iterable
        return
    for item in iterable:
        budget.step()
        yield item
