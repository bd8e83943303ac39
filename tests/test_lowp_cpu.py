"""fp16 is graded on a CPU for steps 01-06 (Triton's interpreter for 05-06); bf16 waits for a GPU."""

import torch

from attnlib.cases import dtypes_for
from grading import config as cfg
from grading.spec import STEP_SPECS, build_items


def test_tests_run_fp16_on_a_cpu():
    assert dtypes_for("cpu") == [torch.float32, torch.float16]
    assert torch.bfloat16 not in dtypes_for("cpu"), "bf16 on a CPU: the interpreter's bf16 tl.dot is wrong"


def test_grader_grades_fp16_on_a_cpu():
    conf = cfg.load()
    for n, sc in conf.steps.items():
        items, skipped = build_items(n, sc.groups, has_gpu=False)
        if STEP_SPECS[n].runs_on == "cuda":
            continue
        lowp = [g for g in sc.groups if g.kind == "lowp"]
        assert lowp and all(g.points > 0 for g in lowp), (
            f"step {n}: a `lowp` group with points, or dtype bugs score full marks on a laptop")
        assert not [g for g in skipped if g.kind == "lowp"], f"step {n}: lowp is skipped without a GPU"
        where = {(it.device, it.dtype) for it in items if it.kind == "attn" and any(c.group in {g.name for g in lowp}
                                                                                     for c in it.checks)}
        assert where == {("cpu", torch.float16)}, f"step {n}: lowp runs on {where}"
        assert all(c.what == "o+grads" for it in items for c in it.checks if c.group in {g.name for g in lowp})
