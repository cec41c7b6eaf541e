"""A right-hand side of your own as a pure function of its tensors, found through a registry token.

odeint's general path is one custom operator (torch.ops.paraseq.user_odeint), so that its adaptive
loop, whose control flow depends on the data, is one opaque node under torch.compile. An operator
takes tensors and numbers, not functions: the function is registered here under an int token
(a constant of the compiled graph), and the tensors it uses are operator inputs. The operator calls
the function with those inputs substituted for the tensors it reads, so it differentiates a pure
function of (t, y, tensors).

Where the tensors are found (in this order):
  * an nn.Module (func itself, the owner of a bound method, or a module a closure cell or a global
    holds): its parameters() and buffers(), substituted in the modules' parameter and buffer
    dictionaries (a tensor shared by several modules at each of its places);
  * a Python function (or the function of a bound method): closure cells holding tensors
    (func.__closure__), tensor default arguments (__defaults__, __kwdefaults__), and the globals
    its own code names (func.__code__.co_names) that hold tensors or modules.
Tensors read from elsewhere (an attribute of a non-module object, a function the function calls)
are not found; in eager mode odeint refuses a function whose result requires grad
through such a tensor. The substitution writes closure cells, defaults and those globals for the
duration of a call: one function must not be integrated from two threads at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import sys
import types
import weakref

import torch
from torch import nn


def _weak(value):
    """A zero-argument callable that returns value, holding it weakly where Python allows."""
    if value is None:
        return lambda: None
    try:
        return weakref.ref(value)
    except TypeError:  # builtins and some callables cannot be weakly referenced
        return lambda: value


class UserFunction:
    """func's places of tensors (the plan), resolved again for every call from weak references."""

    def __init__(self, owner, function):
        # owner: the module of a bound method (or of func itself) or None; function: the Python
        # function (None when func is a module called as itself, or a callable object).
        self._owner, self._function = _weak(owner), _weak(function)
        self.called_as_module = function is None and isinstance(owner, nn.Module)

    def callable(self):
        owner, function = self._owner(), self._function()
        if self.called_as_module:
            return owner
        return types.MethodType(function, owner) if owner is not None else function

    def alive(self):
        return (self._owner() is not None) if self.called_as_module else self._function() is not None


def split(func):
    """(owner, function): the pieces odeint registers for func."""
    if isinstance(func, nn.Module):
        return func, None
    if isinstance(func, types.MethodType):
        return func.__self__, func.__func__
    return None, func


def _global_names(function, kind):
    """The names of the globals of `kind` (a type) that function's own code reads."""
    names = function.__code__.co_names
    found = function.__globals__
    return [name for name in names if name in found and isinstance(found[name], kind)]


def _modules_and_function(owner, function):
    modules = [owner] if isinstance(owner, nn.Module) else []
    if isinstance(function, types.FunctionType):
        for cell in function.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:  # a cell not assigned yet
                continue
            if isinstance(value, nn.Module):
                modules.append(value)
        modules += [function.__globals__[name] for name in _global_names(function, nn.Module)]
    return modules, function if isinstance(function, types.FunctionType) else None


def found_tensors(owner, function):
    """The tensors func uses that odeint finds, in the order the operator receives them."""
    modules, function = _modules_and_function(owner, function)
    tensors = []
    for module in modules:
        tensors += [p for _, p in module.named_parameters()] + [b for _, b in module.named_buffers()]
    if function is not None:
        tensors += [value for _, value in _closure_tensors(function)]
        tensors += [d for d in function.__defaults__ or () if torch.is_tensor(d)]
        tensors += [d for d in (function.__kwdefaults__ or {}).values() if torch.is_tensor(d)]
        tensors += [function.__globals__[name] for name in _global_names(function, torch.Tensor)]
    return tensors


def _closure_tensors(function):
    """(cell, tensor) of every closure cell of function that holds a tensor, in order."""
    found = []
    for cell in function.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:  # a cell not filled yet
            continue
        if torch.is_tensor(value):
            found.append((cell, value))
    return found


def _module_slots(modules):
    """(dict, key, tensor) of every parameter and buffer of the modules, shared ones at each place."""
    slots = []
    for module in modules:
        for sub in module.modules():
            for store in (sub._parameters, sub._buffers):
                slots += [(store, key, value) for key, value in store.items() if value is not None]
    return slots


@contextlib.contextmanager
def substituted(entry, tensors):
    """func, with `tensors` in the places found_tensors took them from, until the block ends: a loop
    that calls func many times with the same tensors substitutes them once."""
    func = entry.callable()
    if func is None or not entry.alive():
        raise RuntimeError("odeint: the function registered for this integration no longer exists (it was garbage "
                           "collected); keep a reference to it while its integration or gradient runs")
    owner, function = split(func)
    modules, function = _modules_and_function(owner, function)
    tensors = iter(tensors)
    replacement = {}  # id of a module tensor -> its substitute (shared tensors: one substitute)
    for module in modules:
        for _, value in itertools.chain(module.named_parameters(), module.named_buffers()):
            replacement[id(value)] = next(tensors)
    slots = [(store, key, value) for store, key, value in _module_slots(modules) if id(value) in replacement]
    cells, defaults, kwdefaults, global_tensors = [], None, None, []
    if function is not None:
        cells = [(cell, value, next(tensors)) for cell, value in _closure_tensors(function)]
        if function.__defaults__:
            defaults = function.__defaults__
            function.__defaults__ = tuple(next(tensors) if torch.is_tensor(d) else d for d in defaults)
        if function.__kwdefaults__:
            kwdefaults = function.__kwdefaults__
            function.__kwdefaults__ = {k: next(tensors) if torch.is_tensor(d) else d for k, d in kwdefaults.items()}
        global_tensors = [(name, function.__globals__[name], next(tensors))
                          for name in _global_names(function, torch.Tensor)]
    try:
        for store, key, value in slots:
            store[key] = replacement[id(value)]
        for cell, _, new in cells:
            cell.cell_contents = new
        for name, _, new in global_tensors:
            function.__globals__[name] = new
        yield func
    finally:
        for store, key, value in slots:
            store[key] = value
        for cell, old, _ in cells:
            cell.cell_contents = old
        for name, old, _ in global_tensors:
            function.__globals__[name] = old
        if defaults is not None:
            function.__defaults__ = defaults
        if kwdefaults is not None:
            function.__kwdefaults__ = kwdefaults


def call_with(entry, t, y, tensors):
    """func(t, y) with `tensors` in the places found_tensors took them from."""
    with substituted(entry, tensors) as func:
        return func(t, y)


# ---- what a trace depends on -------------------------------------------------------------------------

_PRIMITIVES = (int, float, complex, bool, str, bytes, type(None))
_FINGERPRINT_DEPTH = 4  # functions a function calls through its globals and closures, followed this deep


class _Unfingerprintable(Exception):
    """A value whose effect on a trace cannot be told from a cheap key (a list, an arbitrary object)."""


def _value_key(value, depth, seen):
    if isinstance(value, _PRIMITIVES):
        return (type(value).__name__, value)
    if torch.is_tensor(value):
        return ("tensor", tuple(value.shape), value.dtype, value.device.type)
    if isinstance(value, nn.Module):
        return _module_key(value, depth, seen)
    if isinstance(value, types.FunctionType) and _library_function(value):
        return ("object", id(value))
    if isinstance(value, (types.FunctionType, types.MethodType)):
        return _function_key(value, depth, seen)
    if isinstance(value, (types.ModuleType, type, types.BuiltinFunctionType)) or callable(value) and \
            type(value).__module__.startswith("torch"):
        return ("object", id(value))  # a Python module, a class, a builtin or one of torch's functions
    if isinstance(value, tuple):
        return ("tuple",) + tuple(_value_key(item, depth, seen) for item in value)
    raise _Unfingerprintable(type(value).__name__)


def _library_function(function):
    """True for a function of torch, numpy or the standard library: its code is fixed, so its identity keys it."""
    top = (function.__module__ or "").partition(".")[0]
    return top in ("torch", "numpy", "paraseq") or top in sys.stdlib_module_names


def _module_key(module, depth, seen):
    parts = []
    for name, sub in module.named_modules():
        attributes = tuple(sorted((key, _value_key(value, depth, seen)) for key, value in vars(sub).items()
                                  if not key.startswith("_") and not isinstance(value, (nn.Module, torch.Tensor))))
        tensors = tuple((key, None if value is None else (tuple(value.shape), value.dtype, value.device.type))
                        for store in (sub._parameters, sub._buffers) for key, value in store.items())
        parts.append((name, type(sub), sub.training, attributes, tensors))
    return ("module", tuple(parts))


def _function_key(function, depth, seen):
    if isinstance(function, types.MethodType):
        return ("method", _value_key(function.__self__, depth, seen), _function_key(function.__func__, depth, seen))
    if id(function) in seen or depth <= 0:
        if depth <= 0 and id(function) not in seen:
            raise _Unfingerprintable("calls nested too deeply")
        return ("function", id(function.__code__))
    seen = seen | {id(function)}
    cells = []
    for cell in function.__closure__ or ():
        try:
            cells.append(_value_key(cell.cell_contents, depth - 1, seen))
        except ValueError:  # a cell not filled yet
            cells.append(None)
    defaults = tuple(_value_key(d, depth - 1, seen) for d in function.__defaults__ or ())
    kwdefaults = tuple(sorted((k, _value_key(d, depth - 1, seen)) for k, d in (function.__kwdefaults__ or {}).items()))
    names = function.__code__.co_names
    found = function.__globals__
    global_keys = tuple((name, _value_key(found[name], depth - 1, seen)) for name in names if name in found)
    return ("function", id(function.__code__), tuple(cells), defaults, kwdefaults, global_keys)


def trace_key(token):
    """A key of everything a trace of the registered callable can depend on other than its arguments (so two
    callables with one key trace to the same graph, whatever their token): the
    code, the Python numbers and strings it reads (closure cells, defaults, the globals its code and the
    functions it calls name, modules' attributes and training flags) and its tensors' shapes, dtypes and
    devices; None where it reads something whose effect cannot be keyed (a list, an arbitrary object),
    which is then traced again at every call."""
    func = entry(token).callable()
    try:
        return _value_key(func, _FINGERPRINT_DEPTH, frozenset())
    except _Unfingerprintable:
        return None


class TraceMemo:
    """Results of tracing keyed by trace_key (and the caller's arguments); at most `size` of them, the
    oldest dropped first (closures made afresh for every call share their code, so one key)."""

    def __init__(self, size=256):
        self.size, self.results = size, {}

    def get(self, key):
        return self.results.get(key)

    def put(self, key, value):
        if len(self.results) >= self.size:
            del self.results[next(iter(self.results))]
        self.results[key] = value


_entries: dict = {}  # token -> UserFunction
_tokens: dict = {}   # (id(owner), id(function)) -> token
_counter = itertools.count(1)


def _forget(key):
    token = _tokens.pop(key, None)
    if token is not None:
        _entries.pop(token, None)


def register(owner, function) -> int:
    """The token of (owner, function). Under torch.compile it runs at trace time and the graph holds
    the token as a constant: dynamo passes the objects to a function it runs while tracing only by
    their ids (guarding on them), and they are alive while it traces."""
    if torch.compiler.is_compiling():
        return _register_by_id(0 if owner is None else id(owner), 0 if function is None else id(function))
    return _register(owner, function)


@torch._dynamo.assume_constant_result
def _register_by_id(owner_id: int, function_id: int) -> int:
    def alive(object_id):
        return None if object_id == 0 else ctypes.cast(object_id, ctypes.py_object).value
    return _register(alive(owner_id), alive(function_id))


def _register(owner, function) -> int:
    key = (id(owner), id(function))
    token = _tokens.get(key)
    if token is not None and _entries[token].alive():
        return token
    token = next(_counter)
    entry = UserFunction(owner, function)
    _entries[token], _tokens[key] = entry, token
    for value in (owner, function):  # drop the entry with the first of its objects
        if value is not None:
            try:
                weakref.finalize(value, _forget, key)
            except TypeError:
                pass
    return token


def entry(token):
    found = _entries.get(token)
    if found is None:
        raise RuntimeError(f"odeint: no function is registered under token {token}; it was garbage collected "
                           "before its integration or gradient ran")
    return found
