"""steps/ is generated from solutions/, and the generator keeps its promises."""

import json
import os
from pathlib import Path

import pytest
import torch

from attnlib import stubgen

REPO = Path(__file__).resolve().parent.parent


NO_SOLUTIONS = pytest.mark.skipif(not (REPO / "solutions").is_dir(), reason="a student release has no solutions/")


@NO_SOLUTIONS
def test_steps_are_generated_from_solutions():
    """steps/ was generated from today's solutions/. Your own edits in steps/ are allowed here (the
    manifest tells them apart); `make check-stubs` is the strict check for the course's authors."""
    problems = stubgen.drift(allow_edits=True)
    assert not problems, ("steps/ has drifted from solutions/: run `make stubs` (it refuses to overwrite "
                          "files you have edited):\n  " + "\n  ".join(problems))


def test_a_students_edit_is_not_drift(tmp_path):
    sol, steps = tmp_path / "solutions", tmp_path / "steps"
    sol.mkdir()
    (sol / "step01_naive.py").write_text("def f():\n    # >>> STUDENT: do it\n    return 1\n    # <<< STUDENT\n")
    stubgen.write(sol, steps)
    (steps / "step01_naive.py").write_text("def f():\n    return 1  # my work\n")
    assert stubgen.drift(sol, steps, allow_edits=True) == []
    assert stubgen.drift(sol, steps)                                  # the strict check still sees it
    # A solution changed without `make stubs` is drift, edits or not.
    (sol / "step01_naive.py").write_text("def f():\n    # >>> STUDENT: do it now\n    return 1\n    # <<< STUDENT\n")
    assert any("stale" in p for p in stubgen.drift(sol, steps, allow_edits=True))


def test_region_becomes_a_raise_with_the_hint():
    src = ("def f(x):\n"
           "    y = 1\n"
           "    # >>> STUDENT: return x plus one\n"
           "    return x + y\n"
           "    # <<< STUDENT\n"
           "secret = 42  # SOLUTION-ONLY\n")
    out = stubgen.make_stub(src, "step04_flash_torch.py")
    assert "return x + y" not in out and "secret" not in out
    assert "    raise NotImplementedError('Step 04: return x plus one')" in out
    ns = {}
    exec(out, ns)
    with pytest.raises(NotImplementedError, match="Step 04: return x plus one"):
        ns["f"](1)


def test_c_region_keeps_its_stub_lines():
    src = ("__global__ void k(float* o) {\n"
           "    // >>> STUDENT: write one\n"
           "    // STUB: o[0] = 0.f;\n"
           "    o[0] = 1.f;\n"
           "    // <<< STUDENT\n"
           "}\n")
    out = stubgen.make_stub(src, "csrc/step07_flash.cu")
    assert "o[0] = 1.f;" not in out
    assert "    // TODO(Step 07): write one\n    STUDENT_TODO;  // delete this line once the region is written\n    o[0] = 0.f;\n" in out


@pytest.mark.parametrize("bad", [
    "# >>> STUDENT: x\npass\n",                                   # never closed
    "# <<< STUDENT\n",                                            # closed, never opened
    "# >>> STUDENT:\npass\n# <<< STUDENT\n",                      # no hint
    "# >>> STUDENT: a\n# >>> STUDENT: b\n# <<< STUDENT\n",        # nested
])
def test_malformed_regions_are_refused(bad):
    with pytest.raises(stubgen.StubError):
        stubgen.make_stub(bad, "step01_naive.py")


def test_refuses_to_overwrite_edits(tmp_path):
    sol, steps = tmp_path / "solutions", tmp_path / "steps"
    sol.mkdir()
    (sol / "step01_naive.py").write_text("def f():\n    # >>> STUDENT: do it\n    return 1\n    # <<< STUDENT\n")
    assert stubgen.write(sol, steps) == ["step01_naive.py"]
    assert stubgen.drift(sol, steps) == []
    (steps / "step01_naive.py").write_text("def f():\n    return 2  # my work\n")
    assert stubgen.drift(sol, steps)
    with pytest.raises(stubgen.StubError, match="edited"):
        stubgen.write(sol, steps)
    assert "my work" in (steps / "step01_naive.py").read_text()
    stubgen.write(sol, steps, force=True)
    assert stubgen.drift(sol, steps) == []
    manifest = json.loads((steps / stubgen.MANIFEST).read_text())
    assert set(manifest) == {"step01_naive.py"}
    # A solution change regenerates an unedited stub without --force.
    (sol / "step01_naive.py").write_text("def f():\n    # >>> STUDENT: do it now\n    return 1\n    # <<< STUDENT\n")
    assert stubgen.write(sol, steps) == ["step01_naive.py"]


@NO_SOLUTIONS
@pytest.mark.parametrize("level", stubgen.LEVELS)
def test_pristine_stubs_raise_not_implemented(tmp_path, level):
    """Every stub imports, and its student regions raise NotImplementedError (never another error).

    The stubs are generated afresh into a temporary folder: your edits in steps/ are not tested here."""
    from attnlib import make_qkv
    from attnlib.contract import STEPS
    from attnlib.loader import load_step
    pristine = tmp_path / "steps"
    stubgen.write(stubgen.SOLUTIONS, pristine, level=level)
    assert stubgen.drift(stubgen.SOLUTIONS, pristine) == []
    q, k, v = make_qkv(1, 1, 8, 8, 16)
    for n, (mod, _) in STEPS.items():
        step = load_step(n, pristine)            # import must succeed
        if n == 7:                               # a kernel cannot raise: its Python side refuses to launch it
            for f in (*step.FWD_FILES.values(), *step.BWD_FILES.values()):
                # the region is in the file, or in a step07_* header it includes: v4's descriptor (shared
                # by v4 to v6) lives in step07_wgmma.cuh, v5's producer (shared by v5 and v6) in step07_tma.cuh
                own = (pristine / "csrc" / f).read_text()
                where = f if "STUDENT_TODO;" in own else {"step07_fwd_v4.cu": "step07_wgmma.cuh",
                                                          "step07_fwd_v5.cu": "step07_tma.cuh"}[f]
                with pytest.raises(NotImplementedError, match=f"Step 07: csrc/{where}:"):
                    step.refuse_unwritten(f)
            if torch.cuda.is_available():
                with pytest.raises(NotImplementedError, match="Step 07: csrc/step07_fwd_v3.cu:"):
                    step.attention(*(t.cuda().half() for t in make_qkv(1, 1, 64, 64, 64)))
        if n >= 7:
            continue                             # needs a GPU to get as far as a student region
        with pytest.raises(NotImplementedError, match=f"Step {n:02d}"):
            step.attention(q, k, v)


def test_hard_track_keeps_signatures_and_drops_hints():
    src = ('def f(x):\n'
           '    """Return x plus one."""\n'
           '    y = 1\n'
           '    # >>> STUDENT: return x plus y, the hint\n'
           '    return x + y\n'
           '    # <<< STUDENT\n')
    out = stubgen.make_stub(src, "step04_flash_torch.py", level="hard")
    assert "def f(x):" in out and '"""Return x plus one."""' in out and "y = 1" in out
    assert "the hint" not in out and "return x + y" not in out
    assert "raise NotImplementedError('Step 04: f (hard track: its docstring is the spec)')" in out
    c = stubgen.make_stub("void k() {\n    // >>> STUDENT: the hint\n    // STUB: int a = 0;\n"
                          "    int a = 1;\n    // <<< STUDENT\n}\n", "csrc/step07_x.cu", level="hard")
    assert "the hint" not in c and "    // TODO(Step 07)\n    STUDENT_TODO;" in c and "    int a = 0;" in c


@NO_SOLUTIONS
def test_hard_track_leaves_no_region_hint_anywhere(tmp_path):
    import re
    stubgen.write(stubgen.SOLUTIONS, tmp_path, level="hard")
    for rel in stubgen.generate():
        sol = (stubgen.SOLUTIONS / rel).read_text()
        hints = re.findall(r"(?:#|//) >>> STUDENT:\s*(.*)", sol)
        stub = (tmp_path / rel).read_text()
        for h in hints:
            assert h.strip() not in stub, f"{rel}: the hard stub still says {h.strip()!r}"


@NO_SOLUTIONS
def test_stub_detection_sees_compiled_kernels(tmp_path):
    """On a GPU, @triton.jit gives compiled JITFunctions, not the interpreter's functions: the host-side
    search for a stub's raise must walk them too (it did not once, and on the H200 step 05's stubbed
    warm-ups reached Triton's compiler). Triton decorates without a GPU, so this runs here, outside
    the interpreter, in a fresh process."""
    import subprocess
    import sys
    pristine = tmp_path / "steps"
    stubgen.write(stubgen.SOLUTIONS, pristine)
    script = f"""
import triton.runtime.jit as jit
from attnlib.loader import load_step
from attnlib.ops import _jit_functions, raise_if_stubbed
sol = load_step(5, "solutions")
assert isinstance(sol._attn_fwd_kernel, jit.JITFunction), type(sol._attn_fwd_kernel)
called = {{f.__name__ for f in _jit_functions(sol._attn_fwd_kernel, whole_module=False)}}
assert {{"load_tile", "online_softmax_tile", "key_range"}} <= called, called
raise_if_stubbed(sol._warmup_load_tile_kernel, whole_module=False)      # written: no raise
stub = load_step(5, {str(pristine)!r})
for name in ("_warmup_load_tile_kernel", "_warmup_online_softmax_kernel", "_warmup_key_range_kernel"):
    try:
        raise_if_stubbed(getattr(stub, name), whole_module=False)
    except NotImplementedError as e:
        assert str(e).startswith("Step 05:"), e
    else:
        raise AssertionError(name + ": the stub's raise was not found")
print("ok")
"""
    env = {key: val for key, val in os.environ.items() if key != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
