"""Kernels as PyTorch operators, and the host-side checks every kernel launcher shares.

Why an operator: ``torch.compile`` traces Python. A Triton kernel launched from an
``autograd.Function`` gets traced too, and Inductor then recompiles the kernel from its
source with its own argument types (a Python float becomes fp64, not Triton's fp32) and
its own launch options; a CUDA extension call is opaque bytes it cannot trace at all.
An operator registered with ``torch.library`` is a name with a schema, a fake
implementation (shapes and dtypes only, for tracing) and an autograd formula: the
compiler treats it as one node it knows how to handle, and the eager call is unchanged.

- ``kernel_op``: a Triton-backed operator. On a GPU, ``torch.library.triton_op``
  (Inductor sees the kernels through ``wrap_triton`` and launches them itself); under
  Triton's CPU interpreter, ``wrap_triton`` cannot trace the interpreted function, so the
  same body becomes an opaque ``torch.library.custom_op`` with the given fake; and where
  Inductor's launch would lose a launch option (``opaque=True``), opaque on a GPU too.
- ``extension_op``: a ``torch.library.custom_op`` around a compiled extension.
- ``configured``: a kernel with its launch options (``num_warps``, ``num_stages``,
  ``maxnreg``) as a one-config ``triton.autotune``, so that the options survive
  ``torch.compile`` (Dynamo passes ``maxnreg`` through configs only).
- ``raise_if_stubbed``: a stub's ``raise NotImplementedError`` inside a ``@triton.jit``
  function cannot compile on a GPU (Triton has no ``raise``); this finds it on the host,
  before any launch, and raises it as the student's ``Step NN: ...`` message.
- ``direct_launches``: a launcher's ``wrap_triton(k)[grid](...)`` calls go straight to Triton when
  its tensors are real ones. Outside a ``triton_op``'s own eager call (an opaque operator, a launcher
  called directly, any autograd thread) ``wrap_triton`` is on by default and each launch goes through
  PyTorch's higher-order-operator path: about 0.25 ms of host time per launch on an H200 host, where
  step 06's whole backward runs in 0.03 ms at small shapes (results/h200/host/).
- ``eager_fast``: an operator's Python function called directly in eager mode (no dispatcher), the
  operator itself whenever a compiler traces the call: what the Functions call.
- ``op_namespace``: one operator namespace per implementation folder, so steps/,
  solutions/ and a submission can be loaded in one process.
"""

from __future__ import annotations

import functools
import inspect
import os
import re

import torch

_STUB_RAISE = re.compile(r"raise\s+NotImplementedError\(\s*(['\"])(Step \d\d:.*?)\1\s*\)")


def interpreting() -> bool:
    """True when Triton kernels run in its CPU interpreter (TRITON_INTERPRET=1 when triton was imported)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _interpreter_launches_eagerly() -> None:
    """Under the interpreter, let ``wrap_triton(kernel)[grid](...)`` launch eagerly on every torch we pin.

    torch 2.11 hands a ``triton.autotune`` around an interpreted kernel to its tracing wrapper, which
    looks for a compiled ``JITFunction`` inside and fails (``'function' object has no attribute
    'fn'``; pytorch#152868, fixed in pytorch#185597, which torch 2.13 has). Interpreted kernels cannot
    be traced into a graph anyway, so there we switch ``wrap_triton``'s dispatch off, as that fix does.
    """
    if not interpreting():
        return
    import torch._library.triton as library_triton
    if not hasattr(library_triton, "_is_interpreted_triton_kernel"):         # a torch without the fix
        library_triton.wrap_triton_enabled_default = False


_interpreter_launches_eagerly()


def op_namespace(module_name: str) -> str:
    """``solutions.step06_triton_bwd`` -> ``attn_solutions``; a loader package -> ``attn_attn_impl_<hash>``."""
    pkg = module_name.rpartition(".")[0] or module_name
    return "attn_" + re.sub(r"\W", "_", pkg).strip("_")


def _free_name(qualname: str) -> str:
    """The name itself, or name_r2, name_r3... when a module is imported again (a notebook's reload)."""
    from torch._library.custom_ops import OPDEFS
    ns, name = qualname.split("::")
    candidate, n = qualname, 1
    while candidate in OPDEFS or hasattr(getattr(torch.ops, ns), candidate.split("::")[1]):
        n += 1
        candidate = f"{ns}::{name}_r{n}"
    return candidate


def _register(opdef, backward, setup_context):
    if backward is not None:
        opdef.register_autograd(backward, setup_context=setup_context)
    return opdef._opoverload


def kernel_op(qualname: str, fn, *, fake, backward=None, setup_context=None, opaque=False):
    """Register ``fn`` (PyTorch ops + ``wrap_triton`` launches) as the operator ``qualname``.

    Returns the ``OpOverload`` (``torch.ops.<ns>.<name>.default``): call it like ``fn``.
    ``fake(*args)`` returns empty outputs with the real ones' shapes, dtypes and strides.
    ``opaque``: a ``custom_op`` on a GPU too, so that a compiled graph calls ``fn`` itself. Needed
    where a launch uses ``maxnreg``: Inductor relaunches a triton_op's kernels with num_warps and
    num_stages only (torch 2.11-2.13, ``config_to_dict``), and step 06's dK/dV kernel without its
    128-register cap took 3.20 ms instead of 2.47 at the leaderboard shape (H200,
    results/h200/gpu-check/cs336_harness*.json).
    """
    qualname = _free_name(qualname)
    if opaque or interpreting() or os.environ.get("ATTN_OPAQUE_OPS", "0") not in ("", "0"):
        # ATTN_OPAQUE_OPS=1: every operator opaque, to measure what Inductor's own launch changes.
        opdef = torch.library.custom_op(qualname, fn, mutates_args=())
        opdef.register_fake(fake)
    else:
        opdef = torch.library.triton_op(qualname, fn, mutates_args=())
    return _register(opdef, backward, setup_context)


def extension_op(qualname: str, fn, *, fake, backward=None, setup_context=None):
    """Register ``fn`` (a call into a compiled extension) as an opaque operator with a fake."""
    opdef = torch.library.custom_op(_free_name(qualname), fn, mutates_args=())
    opdef.register_fake(fake)
    return _register(opdef, backward, setup_context)


def _traced(args) -> bool:
    """Is any argument a tensor subclass (FakeTensor, FunctionalTensor: a compiler tracing the call)?"""
    return any(isinstance(a, torch.Tensor) and type(a) is not torch.Tensor for a in args)


def direct_launches(fn):
    """Decorate a launcher: with plain tensors, its ``wrap_triton`` launches call the kernels at once.

    ``torch.library.triton_op`` does the same for its own eager calls (``set_wrap_triton_enabled``,
    a thread-local switch); this extends it to opaque operators and direct calls. With any tensor
    subclass (FakeTensor, FunctionalTensor: a compiler tracing the launcher) nothing changes, so
    ``torch.compile`` still sees the kernels.
    """
    from torch._library.triton import set_wrap_triton_enabled

    @functools.wraps(fn)
    def launcher(*args, **kwargs):
        if _traced((*args, *kwargs.values())):
            return fn(*args, **kwargs)
        with set_wrap_triton_enabled(False):
            return fn(*args, **kwargs)
    return launcher


def eager_fast(op, fn):
    """``op`` where a compiler traces the call; ``fn`` (the function ``op`` was registered from) in eager mode.

    Inside an ``autograd.Function`` the operator's layers (dispatcher, autograd key, the custom op's
    checks) do nothing an eager call needs and cost 25-40 us of host time per call on an H200 host
    (results/h200/host/): a small model's training step is bound by that host time. Under
    ``torch.compile`` (Dynamo traces, or AOTAutograd passes FakeTensors) the operator is called, so
    the compiled graph holds it as one node; with grad mode on the operator is called too (its autograd
    formula, or its error when it has none, stays the operator's). ``.op`` is the operator.
    """
    def call(*args):
        if torch.compiler.is_compiling() or torch.is_grad_enabled() or _traced(args):
            return op(*args)
        return fn(*args)
    call.op = op
    call.__name__ = call.__qualname__ = f"eager_fast({getattr(fn, '__name__', 'fn')})"
    return call


_CONFIGURED: dict = {}
LAUNCH_OPTIONS = ("num_warps", "num_stages", "maxnreg")


def tiles(config: dict) -> dict:
    """A config without its launch options: the kernel's compile-time constants (BLOCK_M, ...)."""
    return {key: val for key, val in config.items() if key not in LAUNCH_OPTIONS}


def configured(kernel, config):
    """``kernel`` with the launch options in ``config`` (num_warps, num_stages, maxnreg) as a one-config autotuner.

    Launch it as ``wrap_triton(configured(kernel, opts))[grid](...)``, assigned to a name first
    (``k = configured(...)``; ``wrap_triton(k)``) so that PyTorch's source scan of a triton_op
    finds the kernel (its compile caches hash the kernel's source). A single config is launched
    without timing anything, and ``torch.compile`` carries its options over whole (Dynamo takes
    ``maxnreg`` from configs only, not as a launch keyword).
    """
    import triton

    options = {key: val for key, val in config.items() if key in LAUNCH_OPTIONS}
    if interpreting():
        options.pop("maxnreg", None)          # a register cap means nothing to the interpreter
    key = (kernel, tuple(sorted(options.items())))
    tuned = _CONFIGURED.get(key)
    if tuned is None:
        tuned = _CONFIGURED[key] = triton.autotune(configs=[triton.Config({}, **options)], key=[])(kernel)
    return tuned


def _jit_functions(kernel, whole_module=True):
    """The ``@triton.jit`` functions ``kernel`` can reach, in source order.

    ``whole_module``: every one in the kernel's module (its globals: a step that checks one kernel
    covers its siblings too), plus what they call elsewhere (step 08's kernel calls step 05's
    ``_fwd_inner``, which calls ``online_softmax_tile``). ``False``: only what the kernel calls,
    directly or not (a warm-up kernel is stubbed only when the helpers it calls are).
    """
    from triton.runtime.jit import JITFunction
    try:
        from triton.runtime.interpreter import InterpretedFunction
        kinds = (JITFunction, InterpretedFunction)
    except ImportError:                      # pragma: no cover - older triton
        kinds = (JITFunction,)
    fn = kernel
    while not hasattr(fn, "__code__") and hasattr(fn, "fn"):         # autotuner -> jit -> function (a compiled
        fn = fn.fn                                                    # JITFunction has __globals__, not __code__)
    found = {}
    todo = [fn] if hasattr(fn, "__code__") else []
    if whole_module:
        todo += [getattr(obj, "fn", None) for obj in getattr(fn, "__globals__", {}).values() if isinstance(obj, kinds)]
    while todo:                              # the closure over the names each function uses
        f = todo.pop()
        if f is None or not hasattr(f, "__code__") or id(f) in found:
            continue
        found[id(f)] = f
        for name in f.__code__.co_names:
            obj = f.__globals__.get(name)
            if isinstance(obj, kinds):
                todo.append(getattr(obj, "fn", None))
    return sorted(found.values(), key=lambda f: (f.__code__.co_filename, f.__code__.co_firstlineno))


_STUBBED: dict = {}


def raise_if_stubbed(kernel, whole_module=True) -> None:
    """Raise the first ``NotImplementedError('Step NN: ...')`` left in ``kernel``'s module's Triton code
    (``whole_module=False``: in the Triton code ``kernel`` calls, as a warm-up kernel does).

    On a GPU such a ``raise`` stops Triton's compiler ("unsupported AST node") with a traceback
    that buries the hint; in the interpreter it raises only once reached. Checked once per kernel.
    """
    key = (id(kernel), whole_module)
    if key not in _STUBBED:
        message = None
        for fn in _jit_functions(kernel, whole_module):
            try:
                src = inspect.getsource(fn)
            except (OSError, TypeError):
                continue
            m = _STUB_RAISE.search(src)
            if m:
                message = m.group(2)
                break
        _STUBBED[key] = message
    if _STUBBED[key]:
        raise NotImplementedError(_STUBBED[key])
