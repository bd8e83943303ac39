"""bench/experiments/issue17_targets.py without a GPU: how rounds of (ours, cuDNN) times become a cell's verdict.
(The timing itself is ``bench.core.measure``'s, the grid's; the GPU run is the experiment's.)"""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("issue17_targets", ROOT / "bench" / "experiments" / "issue17_targets.py")
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)


def test_a_cell_met_in_every_round_at_the_median_or_not():
    every = mod.summarize([(1.0, 0.96), (1.0, 1.01), (2.0, 1.9)], 0.95)     # ratios cuDNN / ours: 0.96, 1.01, 0.95
    assert every["met"] == 3 and every["median"] == pytest.approx(0.96)
    assert mod.verdict(every, 0.95) == "met in every round"
    median = mod.summarize([(1.0, 0.97), (1.0, 0.90), (1.0, 0.96)], 0.95)
    assert (median["met"], median["min"], median["max"]) == (2, 0.9, 0.97)
    assert mod.verdict(median, 0.95) == "met at the median (2/3 rounds)"
    some = mod.summarize([(1.0, 0.96), (1.0, 0.90), (1.0, 0.91)], 0.95)
    assert mod.verdict(some, 0.95) == "not met (1/3 rounds)"
    assert mod.verdict(mod.summarize([(1.0, 0.8)], 0.9), 0.9) == "not met"


def test_a_round_without_a_time_is_left_out_and_counted():
    s = mod.summarize([(None, 1.0), (1.0, 0.95), (1.0, None)], 0.95)
    assert (s["rounds"], s["missing"], s["met"]) == (1, 2, 1)
    none = mod.summarize([(None, 1.0)], 0.9)
    assert none["rounds"] == 0 and mod.verdict(none, 0.9) == "not measured"


def test_the_cells_are_flashattentions_grid_from_4096():
    cells = mod.cells()
    assert len(cells) == 12 and {c[2] for c in cells} == {4096, 8192, 16384}
    assert all(b * n == 16384 and h * d == 2048 for d, _, n, b, h in cells)
    assert [t[2] for t in mod.TARGETS] == [0.95, 0.90] and mod.CUDA_TARGET[2] == 0.90      # issue 17's numbers
