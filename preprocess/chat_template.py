"""Chat templates rendered in a bounded sandbox: a template from a checkpoint can neither hang nor exhaust memory.

A chat template is a program shipped in a checkpoint (``chat_template.jinja``, a tokenizer config, a GGUF file's
``tokenizer.chat_template``). transformers renders it with jinja2's ``ImmutableSandboxedEnvironment``, which stops
it from reaching Python internals but not from looping for ever (nested loops) or asking for gigabytes
(``'x' * 3000000000``). This module renders it the way transformers does (same environment settings, filters,
globals and variables: the prompts are identical) in a sandbox that also bounds the work (the limits and the
checks: preprocess/chat_template_bounds.py):

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
import threading

import jinja2
import jinja2.ext
import jinja2.nodes as nodes
from jinja2.compiler import CodeGenerator
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from omnijax.common.errors import PromptError
from omnijax.preprocess.chat_template_bounds import (MAX_OUTPUT, MAX_SECONDS, MAX_TEMPLATE_CHARS, Budget,
                                                     OverLimit, bounded_filter, check_binop, check_method, counted,
                                                     current_budget, format_widths, set_budget, size_of_items)

_LOOP_FILTER = "omnijax_counted_loop"


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
        budget = current_budget()
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
        raise OverLimit("lipsum is limited to 100 paragraphs of 1000 words")
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
        self.filters = {name: bounded_filter(name, f) for name, f in self.filters.items()}
        self.filters[_LOOP_FILTER] = counted
        self.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_TemplateDict(),
                            namespace=_Namespace, lipsum=_lipsum)

    def _parse(self, source, name, filename):
        """The template's syntax tree with each ``for`` loop's iterable passed through the step counter."""
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):
            loop.iter = nodes.Filter(loop.iter, _LOOP_FILTER, [], [], None, None).set_lineno(loop.lineno)
        return tree

    def sized(self, value):
        budget = current_budget()
        return value if budget is None else budget.check(value)

    def concat(self, parts):  # joins output, macro bodies, {% set %} blocks; the total is checked before joining
        budget = current_budget()
        if budget is None:
            return "".join(parts)
        kept, total = [], 0
        for part in parts:
            total += len(part)
            if total > MAX_OUTPUT:
                raise OverLimit(f"its output would be more than {MAX_OUTPUT} characters")
            kept.append(part)
        budget.charge(total)
        return "".join(kept)

    def _finalize(self, value):
        budget = current_budget()
        if budget is not None:
            budget.step()
            budget.check(value, "an output value")
        return value

    def call_binop(self, context, operator, left, right):
        budget = current_budget()
        if budget is None:
            return super().call_binop(context, operator, left, right)
        budget.step()
        check_binop(budget, operator, left, right)
        return budget.check(super().call_binop(context, operator, left, right), f"the result of {operator!r}")

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's signature)
        budget = current_budget()
        if budget is None:
            return super().call(__context, __obj, *args, **kwargs)
        budget.step()
        check_method(budget, __obj, args)
        return budget.check(super().call(__context, __obj, *args, **kwargs), "a call's result")

    def wrap_str_format(self, value):
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        fmt = value.__self__

        @functools.wraps(wrapper)
        def bounded(*args, **kwargs):
            budget = current_budget()
            if budget is not None:
                budget.expect(len(fmt) + format_widths(fmt) + size_of_items(budget, args)
                              + size_of_items(budget, kwargs.values()), "str.format")
            return wrapper(*args, **kwargs)

        return bounded


_ENV = BoundedSandbox()
_COMPILE_LOCK = threading.Lock()


@functools.lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    """The compiled template. Compiling folds constant expressions (filters of constants are run): under a budget
    too, so that a constant over a limit is left to the rendering, which refuses it."""
    with _COMPILE_LOCK:
        previous = set_budget(Budget(MAX_SECONDS))
        try:
            return _ENV.from_string(source)
        finally:
            set_budget(previous)


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
    previous = set_budget(Budget(seconds))
    try:
        return template.render(**variables)
    except OverLimit as e:
        raise PromptError(f"the chat template was stopped: {e} (a broken or hostile chat template?)") from None
    except (RecursionError, MemoryError) as e:
        raise PromptError(f"the chat template was stopped: {type(e).__name__} (a broken or hostile chat "
                          f"template?)") from None
    except Exception as e:  # jinja errors, the template's own checks (raise_exception), type errors in it
        raise PromptError(f"the chat template rejected these messages: {e}") from e
    finally:
        set_budget(previous)
