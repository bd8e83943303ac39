"""The worker: the only process where a submission's code runs.

    python -I -c "<boot>" TASK.pt          (started by grading/sandbox.py, never by hand)

TASK.pt holds settings only (step, rules, threads, where to write, the ack
pipe's number): no input. The worker installs the instrumentation for the
step's rules, imports the step from the submission folder with it watching,
and only then reads the items -- one at a time, from its stdin, a pipe the
grader feeds (``read_item``): the grader sends the next item once the worker
acknowledged the last one (``ack``), and the hidden groups' items come last.
So nothing the submission runs at import can see an input, and no call can
see an input that comes after it. Each item's result -- tensors and a few
plain values, nothing else -- goes to ``out/<index>.pt`` as it goes. The
worker compares nothing and scores nothing: the grader does both, in its own
process, on the tensors it reads back (weights_only, schema-checked).

Everything recorded here (which ops ran, how many Triton launches, what the
autograd Function saved) is reported by a process the submission controls; a
hostile submission can forge it. grading/README.md says what the grader
cross-checks and what it cannot.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import faulthandler
import io
import os
import sys
import time
import traceback
import types
from collections import Counter
from pathlib import Path

import torch

from attnlib.diagnose import launched_tiles

MAX_MSG = 4000
MAX_SAVED = 16


def _short(text: str, n: int = MAX_MSG) -> str:
    text = str(text)
    return text if len(text) <= n else text[: n // 2] + "\n[...]\n" + text[-n // 2:]


def _error(phase: str, exc: BaseException, root: str) -> dict:
    tb = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in tb if f.filename.startswith(root)] or list(tb[-3:])
    lines = [f"  {f.filename.replace(root, '<submission>')}, line {f.lineno}, in {f.name}\n    {f.line or ''}"
             for f in mine[-6:]]
    return {"phase": phase, "type": type(exc).__name__, "message": _short(str(exc)),
            "traceback": _short("\n".join(lines), 3000)}


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu").clone().contiguous()


# ---------------------------------------------------------------------------
# Instrumentation for the rules
# ---------------------------------------------------------------------------

def _raw_library(*args):
    """The dispatcher's own registration handle (what ``torch.library.Library`` wraps)."""
    return torch._C._dispatch_library(*args)


class Guards:
    """Counters for the step's rules, installed before the submission is imported."""

    def __init__(self, rules):
        self.rules = set(rules)
        self.counts: Counter = Counter()
        self.phase: str | None = None
        self.max_numel = 0
        self.max_desc = ""
        self.nxn_limit = None
        self.sdpa_blocked = False                 # no_sdpa enforced at the dispatcher (counted there)
        self.score_numel = 0                      # compiled: batch * Nq * Nk of the attention call being watched
        self.eager_desc = ""                      # compiled: the first attention-sized op run eagerly

    # -- installation -------------------------------------------------------
    def install(self):
        _dispatch_mode_follows_dynamo()
        self._wrap_reference()
        if "no_sdpa" in self.rules:
            self._block_sdpa()
        if self.rules & {"triton_fwd", "triton_bwd"}:
            self._wrap_triton()
        if "extension" in self.rules:
            self._wrap_cpp_extension_loaders()
        if "compiled" in self.rules:
            import torch._dynamo  # noqa: F401  (so the counters exist)

    def _counting(self, fn, key):
        guards = self

        def wrapper(*args, **kwargs):
            if guards.phase is not None:
                guards.counts[key] += 1
            return fn(*args, **kwargs)
        wrapper.__wrapped__ = fn
        wrapper.__name__ = getattr(fn, "__name__", key)
        return wrapper

    def _wrap_reference(self):
        import attnlib
        import attnlib.checks
        import attnlib.diagnose
        import attnlib.reference
        for mod in (attnlib, attnlib.reference, attnlib.checks, attnlib.diagnose):
            for name in ("reference_attention", "reference_backward"):
                if hasattr(mod, name):
                    setattr(mod, name, self._counting(getattr(mod, name), "reference"))

    # Every aten operator that is SDPA or one of its fused kernels (not _fused_sdp_choice, which only picks).
    SDPA_KERNEL_WORDS = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention")

    def _block_sdpa(self):
        """``no_sdpa`` at the dispatcher: each SDPA operator and fused attention kernel gets a kernel
        that counts the call and raises, registered with ``torch.library`` for every key it runs on.

        Python-level hooks (a ``TorchFunctionMode``, a ``TorchDispatchMode``) are switched off by
        ``torch._C.DisableTorchFunction()`` and ``torch._C._DisableTorchDispatch()``; a kernel
        registered at the dispatcher is what the operator *is* in this process, whatever the caller
        disables.

        A registration lasts as long as its handle. A ``torch.library.Library`` is a Python object any
        code can find (``gc.get_objects()``) and destroy, which brings the original kernels back
        (``hostile/sdpa_library_destroyed``: 7-8/10 that way). So the handle is the dispatcher's own
        (``torch._C._dispatch_library``), which the garbage collector does not track, and it is leaked
        on purpose: no Python object refers to it, nothing can destroy it, and it lives until the worker
        exits. A registration the submission adds on top of it only hides it until that one is destroyed.
        """
        import ctypes
        import warnings
        guards = self

        def blocker(op):
            def blocked(*args, **kwargs):
                guards.counts[f"sdpa_{guards.phase or 'import'}"] += 1
                raise RuntimeError(f"the grader blocks aten::{op} in this step (rule no_sdpa): "
                                   "F.scaled_dot_product_attention and its fused kernels are what this step "
                                   "replaces, so compute attention yourself")
            return blocked

        names = [n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names()
                 if n.startswith("aten::") and any(w in n for w in self.SDPA_KERNEL_WORDS)]

        def register_all(impl):
            with warnings.catch_warnings():                 # "Overriding a previously registered kernel"
                warnings.simplefilter("ignore")
                for name in names:
                    for key in ("CompositeImplicitAutograd", "CompositeExplicitAutograd", "CPU", "CUDA"):
                        if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", key):
                            impl(name, key, blocker(name.split(".")[0]))

        try:
            lib = _raw_library("IMPL", "aten", "", __file__, 0)
            register_all(lambda name, key, fn: lib.impl(name, key, fn, False))
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(lib))     # never released: see above
            del lib
        except (AttributeError, TypeError):
            # A PyTorch whose private registration API differs: the public one, which a submission can
            # find and destroy (grading/README.md); blocked still, and counted in the worker's guard record
            # (sdpa_blocker_public) for whoever reads it.
            self._sdpa_lib = torch.library.Library("aten", "IMPL")
            register_all(lambda name, key, fn: self._sdpa_lib.impl(name, fn, key))
            self.counts["sdpa_blocker_public"] += 1
        self.sdpa_blocked = True

    def _wrap_triton(self):
        guards = self
        classes = []
        try:
            from triton.runtime.jit import JITFunction
            classes.append(JITFunction)
        except Exception:
            pass
        try:
            from triton.runtime.interpreter import InterpretedFunction
            classes.append(InterpretedFunction)
        except Exception:
            pass
        for cls in classes:
            orig = cls.run

            def run(self_, *args, __orig=orig, **kwargs):
                guards.counts[f"triton_{guards.phase or 'outside'}"] += 1
                return __orig(self_, *args, **kwargs)
            cls.run = run

    def _wrap_cpp_extension_loaders(self):
        import torch.utils.cpp_extension as ce
        guards = self
        for name in ("load", "load_inline"):
            orig = getattr(ce, name)

            def loader(*args, __orig=orig, **kwargs):
                mod = __orig(*args, **kwargs)
                guards.wrap_extension(mod)
                return mod
            setattr(ce, name, loader)

    def wrap_extension(self, mod):
        if not isinstance(mod, types.ModuleType) or getattr(mod, "__grading_wrapped__", False):
            return
        for name in dir(mod):
            obj = getattr(mod, name)
            if callable(obj) and isinstance(obj, types.BuiltinFunctionType):
                setattr(mod, name, self._counting(obj, "extension"))
        with contextlib.suppress(Exception):
            mod.__grading_wrapped__ = True

    def after_import(self, step_mod):
        """Wrap compiled extension modules the step imported at module level."""
        if "extension" not in self.rules:
            return
        for name, obj in list(vars(step_mod).items()):
            if isinstance(obj, types.ModuleType) and str(getattr(obj, "__file__", "")).endswith((".so", ".pyd")):
                self.wrap_extension(obj)
            elif isinstance(obj, types.BuiltinFunctionType):
                owner = sys.modules.get(getattr(obj, "__module__", "") or "")
                if owner is not None and str(getattr(owner, "__file__", "")).endswith((".so", ".pyd")):
                    setattr(step_mod, name, self._counting(obj, "extension"))

    # -- per call ------------------------------------------------------------
    @contextlib.contextmanager
    def watch(self, phase: str, nxn_probe: bool = False):
        """Count what happens while the submission runs ``phase`` ("fwd" or "bwd")."""
        modes = []
        if self.rules & {"no_sdpa", "extension"} or (nxn_probe and "no_nxn" in self.rules):
            # aten level: an SDPA kernel called through torch.ops, a custom op, the largest tensor made
            modes.append(_OpDispatchMode(self, nxn=nxn_probe and "no_nxn" in self.rules))
        graphs = self._dynamo_graphs() if "compiled" in self.rules else 0
        # ``compiled`` also looks at what ran in the forward of an attention call: the profiler (not a
        # dispatch mode, which Dynamo would trace through) records every aten op with its input shapes
        # and its enclosing ranges, so an op as large as the score matrix that ran outside the code
        # Inductor generated ("## Call CompiledFxGraph ##") and outside Dynamo's own tracing ("(dynamo_timed)")
        # is the attention run eagerly -- a decoy compiled inside attention (hostile/compile_decoy_inside).
        prof = None
        if "compiled" in self.rules and phase == "fwd" and self.score_numel:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)
        self.phase = phase
        try:
            with contextlib.ExitStack() as stack:
                if prof is not None:
                    stack.enter_context(prof)
                for m in modes:
                    stack.enter_context(m)
                yield
        finally:
            self.phase = None
            if "compiled" in self.rules:
                # ``compiled`` counts the graphs Dynamo compiles *during* a graded call: a decoy compiled at
                # import (hostile/compile_decoy) leaves the calls' count at 0.
                self.counts["dynamo_graphs_call"] += max(0, self._dynamo_graphs() - graphs)
                if prof is not None:
                    self._count_eager(prof)

    # Ops that make no new values (views, allocation, conjugation flags): never the attention's work.
    _NOT_COMPUTE = {"aten::" + n for n in (
        "view", "_unsafe_view", "reshape", "_reshape_alias", "expand", "as_strided", "transpose", "t", "permute",
        "unsqueeze", "squeeze", "contiguous", "detach", "alias", "resolve_conj", "resolve_neg", "empty",
        "empty_strided", "empty_like", "lift_fresh", "select", "slice", "split", "chunk", "unbind")}

    # Matrix products: Inductor calls them as extern kernels (aten::bmm inside its graph), so they are never
    # counted, should the graph's range be named otherwise in another PyTorch; the softmax, the scale and the
    # mask around them are what Inductor always fuses into its own kernels.
    _MATMUL = {"aten::" + n for n in ("mm", "bmm", "matmul", "baddbmm", "addmm", "addbmm", "_unsafe_view")}

    # Operator namespaces whose ops are PyTorch's own: any other "ns::op" above an attention-sized aten op
    # is an operator the submission registered, opaque to Inductor.
    _OWN_NAMESPACES = ("aten", "prims", "autograd", "inductor", "profiler", "c10d", "_c10d_functional",
                       "torch", "higher_order", "quantized", "rngprims")

    @classmethod
    def _opaque_op(cls, name: str) -> bool:
        ns, sep, op = name.partition("::")
        return bool(sep) and ns.isidentifier() and op[:1].isidentifier() and ns not in cls._OWN_NAMESPACES

    def _count_eager(self, prof):
        try:
            events = prof.events()
        except Exception:  # noqa: BLE001 - no events: nothing to count (the graph count still decides)
            return
        for e in events:
            if not e.name.startswith("aten::") or e.name in self._NOT_COMPUTE or e.name in self._MATMUL:
                continue
            shapes = [s for s in (e.input_shapes or []) if isinstance(s, (list, tuple)) and s]
            if not shapes or max(math.prod(s) for s in shapes) < self.score_numel:
                continue
            p, inside, opaque = e.cpu_parent, False, None
            while p is not None:
                if "CompiledFxGraph" in p.name or "(dynamo_timed)" in p.name:
                    inside = True
                    break
                if opaque is None and self._opaque_op(p.name):
                    opaque = p.name
                p = p.cpu_parent
            if inside and opaque:
                # Inside the compiled graph, but under an operator Inductor cannot look into: a custom op
                # whose body is eager PyTorch, called from the graph as an extern kernel
                # (hostile/compile_opaque_op). Nothing was generated for that attention.
                inside = False
            if not inside:
                self.counts["eager_attention_ops"] += 1
                if not self.eager_desc:
                    where = f" inside {opaque}, an operator Inductor cannot look into" if opaque else ""
                    self.eager_desc = f"{e.name} on {list(max(shapes, key=math.prod))}{where}"[:160]

    @staticmethod
    def _dynamo_graphs() -> int:
        from torch._dynamo.utils import counters
        return int(counters["stats"].get("unique_graphs", 0))

    def snapshot(self) -> dict:
        d = {k: int(v) for k, v in self.counts.items()}
        if "compiled" in self.rules:
            from torch._dynamo.utils import counters
            d["dynamo_graphs"] = int(counters["stats"].get("unique_graphs", 0))
        if self.eager_desc:
            d["eager_desc"] = self.eager_desc
        if self.max_desc:
            d["max_numel"] = int(self.max_numel)
            d["max_desc"] = self.max_desc
        return d


class _OpDispatchMode(torch.utils._python_dispatch.TorchDispatchMode):
    """Sees every aten op (forward and backward): the largest tensor made, SDPA kernels, custom ops.

    Higher-order operators pass through too: on a GPU, a ``triton_op`` (steps 05-10) launches its
    kernels through ``triton_kernel_wrapper_mutation``, which refuses a mode that does not take
    them ("There was no rule registered for HigherOrderOperator", H200, 2026-11-30). A Triton
    launch is neither an extension nor a tensor made, so it is only counted.
    """

    supports_higher_order_operators = True

    def __init__(self, guards, nxn):
        super().__init__()
        self.guards = guards
        self.nxn = nxn

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        g = self.guards
        if isinstance(func, torch._ops.HigherOrderOperator):
            g.counts[f"hop_{g.phase}"] += 1
            return out
        name = str(func)
        if "scaled_dot_product" in name and not g.sdpa_blocked:       # blocked: counted at the dispatcher
            g.counts[f"sdpa_{g.phase}"] += 1
        ns = name.split(".", 1)[0]
        if ns not in ("aten", "prims", "prim", "_c10d_functional", "c10d", "profiler"):
            g.counts["extension"] += 1
        if self.nxn:
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor) and t.numel() > g.max_numel:
                    g.max_numel = t.numel()
                    g.max_desc = (f"{name} made a tensor of shape {tuple(t.shape)} in the "
                                  + {"fwd": "forward", "bwd": "backward"}.get(g.phase, str(g.phase)))
        return out


# PyTorch wraps a mode's __torch_dispatch__ in torch._disable_dynamo (torch/utils/_python_dispatch.py), so that
# Dynamo never traces the mode's own frames; that wrapper imports torch._dynamo on its first call: 1.3-1.8 s of
# the worker's CPU (2.5-3 s under a profiler) in every grade of steps 04-10, whether or not anything is
# compiled (measured 2026-12-03, 2-core CPU machine). Dynamo can only trace a frame once torch._dynamo is
# imported, so until then the mode's own function runs as it is, and torch's wrapper takes over the moment
# that import completes (``_DynamoImportWatch``), before any compiled code can run: the same wrapper as
# before wherever Dynamo is loaded. Nothing a rule counts changes.
_DISPATCH_WRAPPED = _OpDispatchMode.__dict__["__torch_dispatch__"]        # torch's wrapper (or the function)
_DISPATCH_RAW = getattr(_DISPATCH_WRAPPED, "__wrapped__", _DISPATCH_WRAPPED)


def _dynamo_loaded() -> bool:
    return hasattr(sys.modules.get("torch._dynamo"), "disable")


class _DynamoImportWatch:
    """On sys.meta_path: when torch._dynamo is imported, puts torch's wrapper back on the mode as soon
    as the module has run (whoever imports it: the submission, torch.compile, a profiler)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch._dynamo":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            _OpDispatchMode.__torch_dispatch__ = _DISPATCH_WRAPPED      # cannot watch it: wrapped at once
            return None
        run = loader.exec_module

        def exec_module(module):
            try:
                run(module)
            finally:
                _OpDispatchMode.__torch_dispatch__ = _DISPATCH_WRAPPED
        loader.exec_module = exec_module
        return spec


def _dispatch_mode_follows_dynamo():
    if _DISPATCH_RAW is _DISPATCH_WRAPPED or _dynamo_loaded():
        _OpDispatchMode.__torch_dispatch__ = _DISPATCH_WRAPPED
        return
    _OpDispatchMode.__torch_dispatch__ = _DISPATCH_RAW
    if not any(isinstance(f, _DynamoImportWatch) for f in sys.meta_path):
        sys.meta_path.insert(0, _DynamoImportWatch())


# ---------------------------------------------------------------------------
# The items
# ---------------------------------------------------------------------------

def _leaves(it, grads):
    dev = it["device"]
    return [it[n].to(dev).requires_grad_(grads) for n in ("q", "k", "v")]


def _forward_tiles(tiles) -> dict:
    """The forward's own query and key tile sizes (BLOCK_M, BLOCK_N), when its Triton launches all
    agreed on both: a diagnosis then names the student's tiles instead of simulating sizes."""
    bq, bk = tiles.get("BLOCK_M"), tiles.get("BLOCK_N")
    return {"q": bq, "k": bk} if bq and bk else {}


@contextlib.contextmanager
def _memory_cap(headroom_mb):
    """no_nxn's memory probe: for the call, the address-space cap is lowered to what the worker holds now
    plus ``headroom_mb``, so the OS refuses an Nq x Nk matrix (the soft limit only: it is set back after)."""
    if not headroom_mb:
        yield
        return
    import gc
    import resource
    gc.collect()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    held = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    cap = held + int(headroom_mb) * 2 ** 20
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@contextlib.contextmanager
def _cuda_memory_cap(headroom_mb, rec):
    """no_nxn's memory probe on a GPU: for the call, the caching allocator may hold what it holds now plus
    ``headroom_mb`` (``set_per_process_memory_fraction``, set back after), so an Nq x Nk matrix is refused;
    the call's peak CUDA memory above the start goes into the record too (``gpu_peak_mb``)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    dev = torch.cuda.current_device()
    total = torch.cuda.get_device_properties(dev).total_memory
    start = torch.cuda.memory_allocated(dev)
    held = torch.cuda.memory_reserved(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    torch.cuda.set_per_process_memory_fraction(min(1.0, (held + int(headroom_mb) * 2 ** 20) / total), dev)
    try:
        yield
    finally:
        torch.cuda.synchronize()
        rec["meta"]["gpu_peak_mb"] = round((torch.cuda.max_memory_allocated(dev) - start) / 2 ** 20, 1)
        torch.cuda.set_per_process_memory_fraction(1.0, dev)
        torch.cuda.empty_cache()


def run_attn(mod, it, g, root):
    rec = {"tensors": {}, "meta": {}}
    if it["extra"].get("gpu") and it["extra"].get("headroom_mb"):
        with _cuda_memory_cap(it["extra"]["headroom_mb"], rec):
            return _run_attn(mod, it, g, root, rec)
    with _memory_cap(it["extra"].get("headroom_mb")):
        return _run_attn(mod, it, g, root, rec)


def _run_attn(mod, it, g, root, rec):
    q, k, v = _leaves(it, it["grads"])
    # The memory probe is measured by its cap alone: the op-by-op watch (the largest tensor) runs at 512.
    probe = it["nxn_probe"] and it["extra"].get("measure", True)
    g.score_numel = math.prod(q.shape[:-1]) * k.shape[-2]       # batch * Nq * Nk (rule compiled)
    try:
        with g.watch("fwd", probe), launched_tiles() as tiles:
            if it["extra"].get("sparse"):        # step 09's sparse groups: a real window and global tokens
                window, n_global = it["extra"]["sparse"]
                out = mod.attention_sparse(q, k, v, window, n_global, is_causal=it["is_causal"], scale=it["scale"])
            else:
                out = mod.attention(q, k, v, is_causal=it["is_causal"], scale=it["scale"])
    except BaseException as exc:  # noqa: BLE001 - a student's SystemExit is a failure too
        rec["error"] = _error("forward", exc, root)
        return rec
    finally:
        g.score_numel = 0
    rec["meta"]["tiles"] = _forward_tiles(tiles)
    rec["meta"]["o_type"] = type(out).__name__
    if not isinstance(out, torch.Tensor):
        return rec
    rec["tensors"]["o"] = _cpu(out)
    rec["meta"]["o_device"] = str(out.device)
    rec["meta"]["requires_grad"] = bool(out.requires_grad)
    if it["grads"] and out.requires_grad:
        try:
            with g.watch("bwd", probe):
                out.backward(it["dout"].to(out.device, out.dtype))
        except BaseException as exc:  # noqa: BLE001
            rec["error"] = _error("backward", exc, root)
            return rec
        for name, t in (("dq", q), ("dk", k), ("dv", v)):
            if t.grad is not None:
                rec["tensors"][name] = _cpu(t.grad)
    return rec


def run_lse(mod, it, g, root):
    rec = {"tensors": {}, "meta": {}}
    q, k, v = _leaves(it, False)
    fn = getattr(mod, it["extra"]["fn"], None)
    if fn is None:
        rec["error"] = {"phase": "forward", "type": "AttributeError", "traceback": "",
                        "message": f"the step has no function {it['extra']['fn']}(q, k, v, is_causal, scale)"}
        return rec
    try:
        with g.watch("fwd"), launched_tiles() as tiles:
            res = fn(q, k, v, is_causal=it["is_causal"], scale=it["scale"])
    except BaseException as exc:  # noqa: BLE001
        rec["error"] = _error("forward", exc, root)
        return rec
    rec["meta"]["tiles"] = _forward_tiles(tiles)
    rec["meta"]["o_type"] = type(res).__name__
    if isinstance(res, (tuple, list)) and len(res) == 2 and all(isinstance(t, torch.Tensor) for t in res):
        rec["tensors"]["o"], rec["tensors"]["lse"] = _cpu(res[0]), _cpu(res[1])
        rec["meta"]["o_device"] = str(res[0].device)
    rec["meta"]["len"] = len(res) if isinstance(res, (tuple, list)) else -1
    return rec


def run_saved(mod, it, g, root):
    rec = {"tensors": {}, "meta": {}}
    q, k, v = _leaves(it, True)
    try:
        with g.watch("fwd"):
            out = mod.attention(q, k, v, is_causal=it["is_causal"], scale=it["scale"])
    except BaseException as exc:  # noqa: BLE001
        rec["error"] = _error("forward", exc, root)
        return rec
    rec["meta"]["module_functions"] = sorted(
        name for name, obj in vars(mod).items()
        if isinstance(obj, type) and issubclass(obj, torch.autograd.Function) and obj is not torch.autograd.Function)
    if not isinstance(out, torch.Tensor) or out.grad_fn is None:
        rec["meta"]["functions"] = []
        return rec
    seen, todo, custom = set(), [out.grad_fn], []
    while todo and len(seen) < 200:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, torch.autograd.function.BackwardCFunction):
            custom.append(node)
        todo.extend(n for n, _ in node.next_functions)
    rec["meta"]["functions"] = [type(n).__name__ for n in custom]
    if custom:
        node = next((n for n in custom if type(n).__name__.startswith("FlashAttention")), custom[0])
        rec["meta"]["function"] = type(node).__name__
        saved = node.saved_tensors
        rec["meta"]["saved_count"] = len(saved)
        for i, t in enumerate(saved[:MAX_SAVED]):
            if isinstance(t, torch.Tensor):
                rec["tensors"][f"saved_{i}"] = _cpu(t)
    return rec


def run_bad_input(mod, it, g, root):
    rec = {"tensors": {}, "meta": {}}
    try:
        with torch.no_grad(), g.watch("fwd"):
            mod.attention(*_leaves(it, False))
    except BaseException as exc:  # noqa: BLE001
        rec["error"] = _error("forward", exc, root)
        return rec
    dev = it["device"]
    try:
        with torch.no_grad(), g.watch("fwd"):
            mod.attention(it["bad_q"].to(dev), it["bad_k"].to(dev), it["bad_v"].to(dev))
        rec["meta"]["raised"] = None
    except BaseException as exc:  # noqa: BLE001
        rec["meta"]["raised"] = type(exc).__name__
        rec["meta"]["message"] = _short(str(exc), 500)
    return rec


def run_backend(mod, it, g, root):
    rec = {"tensors": {}, "meta": {}}
    q, k, v = _leaves(it, False)
    try:
        # torch.autograd.profiler, which torch.profiler.profile drives: the latter's start asks
        # hasattr(torch, "_inductor"), which imports Inductor and Dynamo (1-1.5 s of CPU per step 03 grade)
        with torch.autograd.profiler.profile(use_cpu=True) as prof, g.watch("fwd"):
            out = mod.attention(q, k, v, is_causal=it["is_causal"], scale=it["scale"],
                                backend=it["extra"]["backend"])
    except BaseException as exc:  # noqa: BLE001
        rec["error"] = _error("forward", exc, root)
        return rec
    rec["meta"]["ops"] = sorted({e.key for e in prof.key_averages() if "scaled_dot_product" in e.key})[:20]
    rec["meta"]["o_type"] = type(out).__name__
    if isinstance(out, torch.Tensor):
        rec["tensors"]["o"] = _cpu(out)
        rec["meta"]["o_device"] = str(out.device)
    return rec


def run_chosen(mod, it, g, root):
    rec = {"tensors": {}, "meta": {}}
    q, k, v = _leaves(it, False)
    try:
        with g.watch("fwd"):
            name = mod.chosen_backend(q, k, v, is_causal=it["is_causal"], scale=it["scale"])
    except BaseException as exc:  # noqa: BLE001
        rec["error"] = _error("forward", exc, root)
        return rec
    rec["meta"]["chosen"] = name[:100] if isinstance(name, str) else f"<{type(name).__name__}>"
    return rec


def run_time(mod, it, g, root):
    """Forward + backward time on a GPU (median of 10 after 3 warm-ups), for the leaderboard."""
    from attnlib.inputs import make_dout, make_qkv
    rec = {"tensors": {}, "meta": {}}
    batch, nq, nk, d = it["extra"]["case"]
    q, k, v = make_qkv(Nq=nq, Nk=nk, D=d, batch_shape=tuple(batch), dtype=torch.float16, device="cuda",
                       requires_grad=True)
    dout = make_dout(q)
    times = []
    try:
        for i in range(13):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = mod.attention(q, k, v, is_causal=True)
            out.backward(dout)
            end.record()
            torch.cuda.synchronize()
            if i >= 3:
                times.append(start.elapsed_time(end))
            q.grad = k.grad = v.grad = None
    except BaseException as exc:  # noqa: BLE001
        rec["error"] = _error("forward", exc, root)
        return rec
    rec["meta"]["ms"] = sorted(times)[len(times) // 2]
    return rec


def run_warmup(mod, it, g, root):
    """Step 05's warm-ups: one launcher (a tiny kernel around one helper) on the grader's inputs."""
    from attnlib.warmups import materialize
    rec = {"tensors": {}, "meta": {}}
    ex = it["extra"]
    fn = getattr(mod, ex["fn"], None)
    if fn is None:
        rec["error"] = {"phase": "warmup", "type": "AttributeError", "traceback": "",
                        "message": f"the step has no function {ex['fn']}: the warm-ups come with the stub"}
        return rec
    try:
        with g.watch("warmup"):              # its launches count as triton_warmup, never as the forward's
            res = fn(*materialize(ex["args"], it["device"]), **materialize(ex["kwargs"], it["device"]))
    except BaseException as exc:  # noqa: BLE001
        rec["error"] = _error("warmup", exc, root)
        return rec
    outs = list(res) if isinstance(res, (tuple, list)) else [res]
    rec["meta"]["n_out"] = len(outs)
    rec["meta"]["o_type"] = type(res).__name__
    for i, t in enumerate(outs[:8]):
        if isinstance(t, torch.Tensor):
            rec["tensors"][f"out{i}"] = _cpu(t)
    return rec


def run_capstone(mod, it, g, root):
    """The capstone (steps 04, 06): what the dispatcher makes of the step, then a short training run.

    The dispatcher is capstone/dispatch.py (the worker's private copy), reading the step from the
    submission folder, so it gets the module imported under the rules. The run is pinned to the
    step (even where ``auto`` would not pick it: step 06 in Triton's interpreter) on the grader's
    weights and tokens; the grader trains the same model with SDPA's math backend and compares.
    """
    from capstone import dispatch
    from capstone.model import GPT, GPTConfig
    rec = {"tensors": {}, "meta": {}}
    ex, dev = it["extra"], it["device"]
    impl, code = ex["impl"], root.rstrip(os.sep)
    q, k, v = _leaves(it, False)
    try:
        with g.watch("fwd"):
            choice = dispatch.choose(q, k, v, True, "auto", code=code)
            trial = dispatch._probe(impl, q, k, v, True, code)     # its own trial call, wherever auto stopped
    except BaseException as exc:  # noqa: BLE001
        rec["error"] = _error("dispatch", exc, root)
        return rec
    rec["meta"]["chosen"] = choice.impl
    rec["meta"]["passed_over"] = [[str(n), _short(w, 500)] for n, w in choice.passed_over]
    rec["meta"]["trial"] = None if trial is None else _short(trial, 1000)
    losses = []
    try:
        model = GPT(GPTConfig(**ex["model"], attn=impl, code=code)).to(dev)
        model.load_state_dict(ex["state"])
        # Pinned: the decision auto would otherwise make (or refuse: step 06 on a CPU) is cached as impl.
        dispatch._CHOICES[dispatch._key(q, True, code) + (impl,)] = dispatch.Choice(impl, dispatch._function(impl, code))
        opt = torch.optim.AdamW(model.parameters(), lr=float(ex["lr"]), weight_decay=0.0)
        tokens = ex["tokens"].to(dev)
        for i in range(tokens.shape[0]):
            with g.watch("fwd"):
                _, loss = model(tokens[i, :, :-1], tokens[i, :, 1:])
            opt.zero_grad(set_to_none=True)
            with g.watch("bwd"):
                loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    except BaseException as exc:  # noqa: BLE001
        rec["error"] = _error("training", exc, root)
    rec["tensors"]["losses"] = torch.tensor(losses, dtype=torch.float64)
    return rec


# ---------------------------------------------------------------------------
# Step 10: the ring on a group of gloo processes, started inside this worker
# ---------------------------------------------------------------------------
# The ranks are this worker's children (attnlib.dist.RankGroup: a forkserver and W processes forked
# from it), so they live in the worker's PID, mount and network namespace, under its address-space
# cap (inherited) and its memory watchdog (the grader sums the whole process tree), and die with it.
# They reach each other over the namespace's own loopback (grading/sandbox.py brings it up), and
# import the same private copy of attnlib and grading as the worker. Each rank installs the step's
# rule instruments before it imports the step, and sends its counts back with its tensors.

RING_WORLD = 2
RING_TIMEOUT_S = 20.0         # one job on any rank; a rank waiting in a receive no rank sends waits this long
_RING: dict = {}              # the RankGroup, started on the first ring item and kept for the next ones
_RANK_STATE: dict = {}        # inside a rank: its Guards and the step module


def ring_rank_job(rank, world, task):
    """On every rank: this rank's rows of the whole-sequence q, k, v (the course's layout,
    ``attnlib.ringcheck.positions``) through ``ring_attention`` and ``ring_attention_with_lse``,
    forward and backward, with the step's rule instruments watching. What the step raises comes back
    as an error record, with the counts (the worker restarts the group after it)."""
    from attnlib.ringcheck import positions
    if "mod" not in _RANK_STATE:
        g = Guards(task["rules"])
        g.install()
        from attnlib.loader import load_step
        with g.watch("import"):
            _RANK_STATE["mod"] = load_step(10, task["root"])
        _RANK_STATE["guards"] = g
    mod, g = _RANK_STATE["mod"], _RANK_STATE["guards"]
    g.counts.clear()
    phase = "forward"
    try:
        idx = positions(task["q"].shape[-2], world, rank, task["is_causal"])
        qs, ks, vs = (task[n][..., idx, :].clone().requires_grad_(task["grads"]) for n in ("q", "k", "v"))
        out = {}
        with g.watch("fwd"):
            o = mod.ring_attention(qs, ks, vs, is_causal=task["is_causal"], scale=task["scale"])
            res = mod.ring_attention_with_lse(qs.detach(), ks.detach(), vs.detach(), is_causal=task["is_causal"],
                                              scale=task["scale"])
        if isinstance(o, torch.Tensor):
            out["o"] = o.detach()
        if isinstance(res, (tuple, list)) and len(res) == 2 and isinstance(res[1], torch.Tensor):
            out["lse"] = res[1]
        if task["grads"] and isinstance(o, torch.Tensor) and o.requires_grad:
            phase = "backward"
            with g.watch("bwd"):
                o.backward(task["dout"][..., idx, :])
            for name, t in (("dq", qs), ("dk", ks), ("dv", vs)):
                if t.grad is not None:
                    out[name] = t.grad
    except BaseException as exc:  # noqa: BLE001 - returned, with the counts: a rule blocked at the dispatcher
        # raises there, and the count of that call is what breaks the rule
        return {"error": _error(phase, exc, task["root"] + os.sep), "guard": {k: int(v) for k, v in g.counts.items()}}
    return {"tensors": {k: _cpu(t) for k, t in out.items()},
            "guard": {k: int(v) for k, v in g.counts.items()}}


def _ring_group(root):
    from attnlib.dist import DYNAMO, PRELOAD_TORCH_ONLY, RankGroup
    if "group" not in _RING:
        # Not attnlib in the forkserver's preload (attnlib/dist.py, PRELOAD_TORCH_ONLY): the ranks must
        # import this worker's private copy, not whatever attnlib the environment would find. Nor
        # torch._dynamo (which PRELOAD_TORCH_ONLY has, for a CPU machine): the ranks' guards no longer import
        # it (_dispatch_mode_follows_dynamo), and preloaded it cost the forkserver 2-3 s of CPU in every grade
        # of step 10 (stub and solution alike, 2026-12-03), as it already is left out on a GPU machine.
        _RING["group"] = RankGroup(world=RING_WORLD, impl=root, timeout_s=RING_TIMEOUT_S, threads=1,
                                   preload=[m for m in PRELOAD_TORCH_ONLY if m != DYNAMO])
    return _RING["group"]


def close_ring():
    if "group" in _RING:
        with contextlib.suppress(Exception):
            _RING.pop("group").close()


def run_ring(mod, it, g, root):
    """Step 10's ring on RING_WORLD gloo ranks; returns every rank's O, LSE (and dQ, dK, dV)."""
    from attnlib.dist import RankError, RankNotImplemented
    rec = {"tensors": {}, "meta": {"world": RING_WORLD}}
    group = _ring_group(root.rstrip(os.sep))
    task = {k: it[k] for k in ("q", "k", "v", "dout", "is_causal", "scale", "grads")}
    task.update(rules=sorted(g.rules), root=root.rstrip(os.sep))
    if "no_group" not in _RING and not group._procs:
        try:
            group.start()
        except BaseException as exc:  # noqa: BLE001 - gloo could not connect: the ranks never ran
            _RING["no_group"] = _short(
                f"needs a process group: {RING_WORLD} gloo ranks could not start and connect inside the "
                f"grader's worker, so the ring was not run (the grading machine's doing, not the "
                f"submission's: tell your instructor; `python -m grading doctor` shows whether the worker's "
                f"loopback is up). {str(exc).strip()[:1500]}")
    if "no_group" in _RING:
        rec["error"] = {"phase": "ring", "type": "NoProcessGroup", "traceback": "", "message": _RING["no_group"]}
        return rec
    if "hung" in _RING:
        # A deadlock waits RING_TIMEOUT_S on every input, and the group restarts after each: the step
        # would run out of time before it reported anything. One hang is enough to know.
        rec["error"] = {"phase": "ring", "type": "RankError", "traceback": "",
                        "message": "not run: the ring hung on an earlier input, so it was not started again. "
                                   "There:\n" + _RING["hung"]}
        return rec
    try:
        results = group.run(ring_rank_job, task)
    except RankError as exc:
        text = str(exc).replace(root, "<submission>/")
        if "did not answer" in text or "Timed out" in text:
            _RING["hung"] = _short(text, 2500)
        rec["error"] = {"phase": "ring", "traceback": "", "message": _short(text),
                        "type": "NotImplementedError" if isinstance(exc, RankNotImplemented) else "RankError"}
        return rec
    for res in results:
        g.counts.update(res["guard"])
    failed = {r: res["error"] for r, res in enumerate(results) if "error" in res}
    if failed:
        group.close()        # never reuse ranks after a failure: a hop posted before it may still be in flight
        lines = [f"ring_attention failed on {len(failed)} of {RING_WORLD} ranks"]
        lines += [f"  rank {r}: {e['type']} in the {e['phase']}: {e['message'].strip().splitlines()[-1] if e['message'].strip() else ''}"
                  for r, e in sorted(failed.items())]
        if any("Timed out" in e["message"] for e in failed.values()):
            lines.append(f"  (a rank waited {RING_TIMEOUT_S:.0f} s for a message no rank sent: check that every rank "
                         "posts the same hops in the same order, and waits for each)")
        r0, e0 = min(failed.items())
        lines.append(f"  traceback of rank {r0}:\n{e0['traceback']}")
        text = "\n".join(lines)
        if "Timed out" in text:
            _RING["hung"] = _short(text, 2500)
        stub = all(e["type"] == "NotImplementedError" for e in failed.values())
        rec["error"] = {"phase": "ring", "traceback": "", "message": _short(text),
                        "type": "NotImplementedError" if stub else next(iter(failed.values()))["type"]}
        return rec
    for r, res in enumerate(results):
        for name, t in res["tensors"].items():
            rec["tensors"][f"{name}{r}"] = t
    return rec


def run_ring_layout(mod, it, g, root):
    """The student's ``shard`` of a tagged sequence (row i holds i) for every rank, and ``unshard``
    of the course's own shards: where each rank's rows come from, and how they go back."""
    from attnlib.ringcheck import positions
    rec = {"tensors": {}, "meta": {}}
    world, n, causal = it["extra"]["world"], it["extra"]["n"], it["is_causal"]
    x = torch.arange(float(n))[None, None, :, None].expand(1, 2, n, 3).contiguous()
    try:
        with g.watch("fwd"):
            for r in range(world):
                rec["tensors"][f"shard{r}"] = _cpu(mod.shard(x, world, r, is_causal=causal))
            own = [x[..., positions(n, world, r, causal), :] for r in range(world)]
            rec["tensors"]["unshard"] = _cpu(mod.unshard(own, is_causal=causal))
    except BaseException as exc:  # noqa: BLE001
        rec["error"] = _error("forward", exc, root)
    return rec


RUNNERS = {"capstone": run_capstone, "attn": run_attn, "lse": run_lse, "saved": run_saved, "bad_input": run_bad_input,
           "backend": run_backend, "chosen_backend": run_chosen, "time": run_time, "warmup": run_warmup,
           "ring": run_ring, "ring_layout": run_ring_layout}


def _save(obj, path: Path):
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------
# The channel: items in on stdin, acknowledgements out on an inherited pipe
# ---------------------------------------------------------------------------
# An item is a frame: 8 bytes of big-endian length, then the item's dict as torch.save wrote it
# (plain tensors and values, loaded with weights_only). A frame of length 0 ends the run. After
# the import and after each item's record is saved, the worker writes one line to the ack pipe:
# "I" after the import, then the item's index. (grading/sandbox.py is the other side.)

FRAME_HEADER = 8


def open_channel(ack_fd: int) -> tuple[int, int]:
    """Take the items pipe off fd 0 (stdin reads /dev/null from here on, so a submission's
    input() does not eat an item) and keep both pipes from the submission's child processes."""
    items_fd = os.dup(0)                       # os.dup: not inherited by children
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.set_inheritable(ack_fd, False)
    return items_fd, ack_fd


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None                        # the grader closed the pipe: no more items
        buf += chunk
    return bytes(buf)


def read_item(fd: int) -> dict | None:
    """The next item from the grader, or None when it sent the end (or closed the pipe)."""
    os.set_blocking(fd, True)                  # whatever the submission did to the pipe's flags
    head = _read_exact(fd, FRAME_HEADER)
    if head is None:
        return None
    size = int.from_bytes(head, "big")
    if size == 0:
        return None
    data = _read_exact(fd, size)
    if data is None:
        return None
    return torch.load(io.BytesIO(data), weights_only=True)


def ack(fd: int, what: str):
    with contextlib.suppress(OSError):         # the grader went away: nothing left to tell it
        os.write(fd, f"{what}\n".encode())


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    task = torch.load(argv[0], weights_only=True)
    out = Path(task["out_dir"])
    items_fd, ack_fd = open_channel(int(task["ack_fd"]))
    faulthandler.enable()                       # a segfault prints where it happened (to our stderr file)
    torch.set_num_threads(max(1, int(task["threads"])))
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 tolerance assumes true fp32 products
    torch.backends.cudnn.allow_tf32 = False
    root = str(Path(task["root"]).resolve())
    g = Guards(task["rules"])
    g.install()
    t0 = time.perf_counter()
    try:
        from attnlib.loader import load_step
        with g.watch("import"):                 # SDPA or the reference at import counts too
            mod = load_step(int(task["step"]), root)
        g.after_import(mod)
    except BaseException as exc:  # noqa: BLE001 - a SyntaxError, an ImportError, a sys.exit at import
        # the counters too: SDPA blocked at the dispatcher fails an import that calls it, a broken rule
        _save({"error": _error("import", exc, root + os.sep), "guard": g.snapshot()}, out / "import.pt")
        return 0
    _save({"seconds": time.perf_counter() - t0, "guard": g.snapshot()}, out / "import.pt")
    ack(ack_fd, "I")
    i = 0
    while (it := read_item(items_fd)) is not None:
        t = time.perf_counter()
        g.counts.clear()
        g.max_numel, g.max_desc = 0, ""
        rec = RUNNERS[it["kind"]](mod, it, g, root + os.sep)
        rec["seconds"] = time.perf_counter() - t
        rec["guard"] = g.snapshot()
        _save(rec, out / f"{i}.pt")
        ack(ack_fd, str(i))
        i += 1
    close_ring()
    _save({"n": i}, out / "done.pt")
    return 0


def finish(code: int):
    """End the worker with ``code`` without the interpreter's teardown (grading/sandbox.py's BOOT calls it
    after ``main`` returned, every record written).

    Python's own shutdown after ``import torch`` -- tearing down thousands of modules, collecting what
    they held -- costs 0.5-0.7 s of CPU per worker, 1.5 s once torch._dynamo is in (step 02): measured
    2026-12-03 on the 2-core CPU machine, ``import torch`` then a normal exit against ``os._exit``. Every
    grade starts a worker per step. The atexit handlers still run first, a submission's among them
    (hostile/peek_ahead crashes in one), and the standard streams are flushed: what reaches the grader
    -- records, exit status, stderr -- is what a normal exit gives."""
    try:
        atexit._run_exitfuncs()
    finally:
        for f in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            with contextlib.suppress(Exception):
                f.flush()
        os._exit(code)


if __name__ == "__main__":
    finish(main())
