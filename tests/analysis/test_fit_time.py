"""The fit's wall time part by part, and every step far above the median named: runs written with rnnmon's writer
and read back by its reader (real fits on every backend: tests/capture/test_recompile.py)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import read_run

from rnnmon.analysis.summary import summarize
from rnnmon.format import schema
from rnnmon.format.writer import SummaryWriter

T0 = 1_795_000_000.0
STEP_S, GAP_S = 0.002, 0.0005
FULL, PARTIAL, LONGER = [[32, 16, 8], [32, 1]], [[5, 16, 8], [5, 1]], [[32, 24, 8], [32, 1]]
WARMUP, EVAL, EPOCH_END, PROFILE = (schema.PHASE_KINDS.index(kind) for kind in ("warmup", "eval", "epoch_end",
                                                                                "profile"))


class Fit:
    """One fit's records, laid end to end as the monitor lays them: warm-up, steps with their gaps, phases."""

    def __init__(self, start: float, warmup_s: float = 1.0) -> None:
        self.steps: list[tuple] = []
        self.phases: list[tuple] = [(WARMUP, start, start + warmup_s)]
        self.shapes: list[dict] = [{"step": 1, "time": start + warmup_s - 0.1, "shapes": FULL}]
        self.compiles: list[dict] = []  # the steps that compiled, as rnnmon.capture.compiles reports them
        self.steps.append((1, 0, start + warmup_s - 0.1, start + warmup_s, 0.1, np.nan, 1))
        self.now = start + warmup_s

    def step(self, duration_s: float = STEP_S, wait_s: float = 0.0001, shapes: list | None = None,
             hole_s: float = 0.0, gap_s: float = GAP_S, compiled: float | bool | None = False) -> None:
        """`compiled`: False, or a compile event's measured seconds (None: the framework did not time it)."""
        begin = self.now + gap_s + hole_s  # a hole: time before the step that no record holds
        number = self.steps[-1][0] + 1
        self.steps.append((number, 0, begin, begin + duration_s, 1e3 * wait_s, 1e3 * gap_s, 1))
        if shapes is not None:
            self.shapes.append({"step": number, "time": begin, "shapes": shapes})
        if compiled is not False:
            self.compiles.append({"step": number, "batches": 1, "time": begin, "duration_s": duration_s, "count": 1,
                                  "seconds": compiled, "source": "jax", "shapes": shapes})
        self.now = begin + duration_s

    def phase(self, kind: int, seconds: float) -> None:
        self.phases.append((kind, self.now, self.now + seconds))
        self.now += seconds


def _write(run_dir, fits: list[Fit]) -> dict:
    writer = SummaryWriter(str(run_dir / "rnnmon"))
    writer.json(schema.RUN_TAG, {"version": schema.FORMAT_VERSION, "status": "finished", "start": T0,
                                 "backend": "jax", "input_wait": "measured", "fetch_floor_ms": 0.05})
    for fit in fits:
        writer.table(schema.STEPS_TAG, fit.steps)
        writer.table(schema.PHASES_TAG, fit.phases)
        writer.json(schema.SHAPES_TAG, fit.shapes)
        if fit.compiles:
            writer.json(schema.COMPILES_TAG, fit.compiles)
    writer.close()
    return summarize(read_run(str(run_dir)))


def _epoch(fit: Fit, steps: int = 40, last: dict | None = None) -> None:
    for _ in range(steps - 1):
        fit.step()
    fit.step(**(last or {}))
    fit.phase(EPOCH_END, 0.02)


def test_the_parts_add_up_to_each_fit_and_the_time_between_fits_is_no_part(tmp_path):
    first, second = Fit(T0), Fit(T0 + 100.0, warmup_s=0.2)  # 100 s apart: the pause belongs to no fit
    for fit in (first, second):
        _epoch(fit)
        fit.phase(EVAL, 0.3)
        _epoch(fit)
    summary = _write(tmp_path, [first, second])
    times = summary["time_s"]
    spans = (first.now - T0) + (second.now - T0 - 100.0)
    assert times["fit"] == pytest.approx(spans, abs=1e-3)
    assert abs(times["unaccounted"]) < 1e-3, times
    assert times["warmup"] == pytest.approx(1.2) and times["validation"] == pytest.approx(0.6)
    assert times["host_gaps"] == pytest.approx(4 * 40 * GAP_S, rel=0.01)  # not the first step (in the warm-up)
    assert summary["slow_steps"] == [] and times["recompiles"] == 0


def test_a_profilers_start_and_save_are_profiling_not_host_gaps(tmp_path):
    """Two profile phases of 0.1 s between 40 steps of 10 ms: as host gaps they made the run host-bound."""
    fit = Fit(T0)
    for index in range(40):
        if index in (5, 9):  # each the whole gap before a step (the monitor closes it at the step's begin)
            fit.phase(PROFILE, 0.1)
        fit.step(duration_s=0.01, gap_s=0.0 if index in (5, 9) else GAP_S)
    summary = _write(tmp_path, [fit])
    times = summary["time_s"]
    assert times["profiling"] == pytest.approx(0.2) and summary["profile_s"] == pytest.approx(0.2)
    assert abs(times["unaccounted"]) < 1e-3, times
    assert summary["shares"]["host"] < 0.25 and summary["verdict"] == "compute-bound", summary["shares"]
    assert "profiling 0.20 s" in _report_text(tmp_path)


def test_time_no_record_holds_is_unaccounted(tmp_path):
    fit = Fit(T0)
    for index in range(40):
        fit.step(hole_s=0.25 if index == 20 else 0.0)  # a quarter second between a step's gap and the one before
    summary = _write(tmp_path, [fit])
    assert summary["time_s"]["unaccounted"] == pytest.approx(0.25, abs=1e-3)
    assert "0.25 s in none of them" in _report_text(tmp_path)


def test_a_step_on_new_shapes_that_compiled_again_is_a_recompile_with_its_shapes_and_fix(tmp_path):
    fit = Fit(T0)
    _epoch(fit, last={"duration_s": 0.9, "shapes": PARTIAL, "compiled": None})  # compiles the partial batch
    _epoch(fit)  # the next epoch's partial batch reuses that program
    for _ in range(3):
        fit.step(duration_s=0.2, wait_s=0.19)  # waited for the pipeline: an input stall
    fit.step(duration_s=0.3)  # slow without a cause rnnmon saw
    summary = _write(tmp_path, [fit])
    counts, times = summary["slow_step_count"], summary["time_s"]
    assert counts == {"recompile": 1, "input": 3, "unknown": 1}, summary["slow_steps"]
    assert times["recompiles"] == pytest.approx(0.9 - STEP_S, abs=1e-3)
    assert times["slow_steps"] == pytest.approx(0.3 - STEP_S, abs=1e-3)
    assert abs(times["unaccounted"]) < 1e-3
    top = summary["slow_steps"][0]
    assert (top["step"], top["cause"], top["shapes"], top["previous_shapes"]) == (41, "recompile", PARTIAL, FULL)

    [finding] = [f for f in summary["findings"] if f["code"] == "RECOMPILE"]
    assert "step 41 on (5, 16, 8), (5, 1) after (32, 16, 8), (32, 1), 0.90 s" in finding["message"]
    without = times["training"] - times["recompiles"]
    assert finding["speedup"] == round(times["training"] / without, 2)
    assert f"this fit would take {without:.1f} s instead of {times['training']:.1f} s after its warm-up" in (
        finding["message"])
    assert "drop_remainder=True" in finding["advice"] and "bucket" not in finding["advice"]
    assert summary["verdict"] == "compile-bound"
    assert summary["summary"].startswith("The training step was compiled again for new input shapes: 0.90 s")


def test_a_new_sequence_length_gets_both_fixes(tmp_path):
    fit = Fit(T0)
    _epoch(fit, last={"duration_s": 1.5, "shapes": LONGER, "compiled": None})
    summary = _write(tmp_path, [fit])
    [finding] = [f for f in summary["findings"] if f["code"] == "RECOMPILE"]
    assert "padded_batch" in finding["advice"] and "pad_to_bucket_boundary=True" in finding["advice"]
    assert "dataset.batch(n, drop_remainder=True)" not in finding["advice"]


def test_a_slow_step_on_new_shapes_without_a_compile_event_is_no_recompile(tmp_path):
    """TensorFlow without XLA traced once for every length: a longer sequence is a longer step, not a compile."""
    fit = Fit(T0)
    _epoch(fit, last={"duration_s": 0.9, "shapes": LONGER})
    summary = _write(tmp_path, [fit])
    assert summary["slow_step_count"]["recompile"] == 0 and summary["time_s"]["recompiles"] == 0
    assert summary["slow_steps"][0]["cause"] == "unknown"
    assert "RECOMPILE" not in {f["code"] for f in summary["findings"]}


def test_where_most_steps_compile_a_normal_step_is_one_on_shapes_already_seen(tmp_path):
    """The median of all steps would be a compile; the steps that compiled nothing are the baseline."""
    fit = Fit(T0)
    for index in range(30):
        new = index % 3 != 2  # two steps in three meet a new length and compile for 0.5 s
        fit.step(duration_s=0.5 + STEP_S if new else STEP_S, compiled=None if new else False,
                 shapes=[[32, 10 + index, 8], [32, 1]] if new else None)
    summary = _write(tmp_path, [fit])
    times = summary["time_s"]
    assert summary["slow_step_count"]["recompile"] == 20
    assert times["recompiles"] == pytest.approx(20 * 0.5, abs=1e-3) and times["slow_steps"] == 0
    assert summary["verdict"] == "compile-bound"


def test_a_compile_timed_by_the_framework_counts_its_own_seconds(tmp_path):
    fit = Fit(T0)
    _epoch(fit, last={"duration_s": 0.9, "shapes": LONGER, "compiled": 0.6})  # JAX: 0.6 s compiling, 0.3 s more
    summary = _write(tmp_path, [fit])
    assert summary["time_s"]["recompiles"] == pytest.approx(0.6)
    assert summary["time_s"]["slow_steps"] == 0


def test_new_shapes_that_compiled_nothing_or_little_are_no_finding(tmp_path):
    fit = Fit(T0)
    _epoch(fit, 400, last={"shapes": PARTIAL})  # TensorFlow without XLA: one trace serves every batch size
    fit.step(duration_s=0.03, shapes=LONGER, compiled=None)  # compiled again, but 1% of the fit
    summary = _write(tmp_path, [fit])
    assert summary["slow_step_count"]["recompile"] == 1
    assert "RECOMPILE" not in {f["code"] for f in summary["findings"]}


def _report_text(tmp_path) -> str:
    from rnnmon.report import build_report, render_text

    return render_text(build_report(str(tmp_path)))
