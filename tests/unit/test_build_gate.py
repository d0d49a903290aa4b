"""The accuracy gate's statistics, its verdicts and the build's plan, on stand-in engines that answer chosen classes
(no model is built). The exact interval is checked against values computed by hand.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.stats import binom

from build_models import ARTIFACTS, plan
from build_models.accuracy_gate import AccuracyGate, AccuracyRefused, judge
from build_models.plan import Job, Outcome
from fastinfer.common import hardware
from fastinfer.measure import accuracy
from fastinfer.measure import evaluate as ev
from fastinfer.measure.accuracy import SETTLE_SEARCHED, EvalSet, clopper_pearson, paired

# --- the exact interval ---------------------------------------------------------------------------------


def test_clopper_pearson_on_values_known_by_hand() -> None:
    # 5 of 10: the textbook interval 0.1871 to 0.8129.
    assert clopper_pearson(5, 10) == pytest.approx((0.187086, 0.812914), abs=1e-6)
    # All or none of n: the bound is closed-form, (α/2)^(1/n).
    assert clopper_pearson(20, 20) == pytest.approx((0.025 ** (1 / 20), 1.0))
    assert clopper_pearson(0, 10) == pytest.approx((0.0, 1 - 0.025 ** (1 / 10)))
    assert clopper_pearson(1, 1) == pytest.approx((0.025, 1.0))
    with pytest.raises(ValueError):
        clopper_pearson(3, 2)


def answers_with(n: int, lost: int = 0, gained: int = 0, changed_wrong: int = 0) -> tuple[np.ndarray, ...]:
    """Targets, the reference's answers and a backend's on ``n`` photos of 3 classes: the reference wrong on the
    last ``gained`` + ``changed_wrong`` photos; the backend losing the first ``lost`` photos, right on the last
    ``gained``, and answering another wrong class on the ``changed_wrong`` before them."""
    targets = np.arange(n) % 3
    reference = targets.copy()
    wrong_tail = gained + changed_wrong
    reference[n - wrong_tail :] = (targets[n - wrong_tail :] + 1) % 3
    backend = reference.copy()
    backend[:lost] = (targets[:lost] + 1) % 3
    backend[n - gained :] = targets[n - gained :]
    backend[n - wrong_tail : n - gained] = (targets[n - wrong_tail : n - gained] + 2) % 3
    return targets, reference, backend


def test_the_pairs_and_the_interval_of_one_photo_lost_of_60() -> None:
    """The issue's case: 60 photos, one lost. By hand: the share q of photos whose rightness differs is 1 of 60,
    its 97.5% upper bound solves P(X <= 1) = 0.0125; the share of those lost is 1 of 1, in [0.0125, 1]; the drop
    q(2p - 1) then lies in [-0.975 q_high, q_high]."""
    targets, reference, backend = answers_with(60, lost=1)
    pairs = paired(reference, backend, targets)
    assert (pairs.both_right, pairs.both_wrong, pairs.only_reference_right, pairs.only_backend_right) == (59, 0, 1, 0)
    assert (pairs.changed, pairs.agreement, pairs.drop_pp) == (1, 59 / 60, 1.666667)
    q_high = pairs.drop_high_pp / 100
    assert (1 - q_high) ** 60 + 60 * q_high * (1 - q_high) ** 59 == pytest.approx(0.0125)
    assert q_high == pytest.approx(0.101703, abs=1e-6) and pairs.drop_low_pp == pytest.approx(-97.5 * q_high)
    verdict = judge(pairs, 1.0)
    assert not verdict.refused and not verdict.settled
    assert verdict.note.startswith("undecided: a difference of 1 photo is never refused")
    assert "about 3090 photos would settle it" in verdict.note


def test_no_photo_differing_is_no_proof_on_few_photos() -> None:
    """0 of 60 photos differ: the share that may differ is up to 1 - 0.0125^(1/60) = 7.04%, so the drop's interval
    is +-7.04 points, and a limit of 1 point needs 437 photos that all agree."""
    targets, reference, _ = answers_with(60)
    pairs = paired(reference, reference, targets)
    bound = (1 - 0.0125 ** (1 / 60)) * 100
    assert (pairs.drop_low_pp, pairs.drop_high_pp) == pytest.approx((-bound, bound), abs=1e-6)
    assert not judge(pairs, 1.0).settled and pairs.photos_to_settle(1.0) == 437
    assert (1 - 0.0125 ** (1 / 437)) * 100 <= 1.0 < (1 - 0.0125 ** (1 / 436)) * 100


def test_answers_that_change_between_wrong_classes_count_as_changed_not_as_lost() -> None:
    targets, reference, backend = answers_with(30, lost=2, gained=1, changed_wrong=3)
    pairs = paired(reference, backend, targets)
    assert (pairs.only_reference_right, pairs.only_backend_right, pairs.both_wrong) == (2, 1, 3)
    assert pairs.changed == 6 and pairs.net_photos == 1 and pairs.drop_pp == pytest.approx(100 / 30, abs=1e-5)


def test_one_photo_is_never_refused_even_at_a_limit_of_zero() -> None:
    for lost, gained in ((1, 0), (6, 5), (30, 29)):
        targets, reference, backend = answers_with(80, lost=lost, gained=gained)
        verdict = judge(paired(reference, backend, targets), 0.0)
        assert not verdict.refused and "a difference of 1 photo is never refused" in verdict.note
    targets, reference, backend = answers_with(80, lost=3, gained=5)
    assert judge(paired(reference, backend, targets), 0.0).note.startswith("undecided: 3 photo(s) lost, 5 gained;")


def test_a_drop_shown_over_the_limit_is_refused_and_one_shown_within_is_passed() -> None:
    targets, reference, backend = answers_with(200, lost=20)  # 10 points lost, 20 of 20 discordant pairs
    pairs = paired(reference, backend, targets)
    q_low = clopper_pearson(20, 200, 0.975)[0]
    assert binom.sf(19, 200, q_low) == pytest.approx(0.0125)  # P(X >= 20) at the lower bound
    assert pairs.drop_low_pp == pytest.approx(q_low * (2 * 0.0125 ** (1 / 20) - 1) * 100, abs=1e-5)
    assert judge(pairs, 1.0).refused and judge(pairs, 1.0).settled and pairs.drop_low_pp > 3.5
    assert not judge(pairs, 16.0).refused and judge(pairs, 16.0).settled  # the whole interval within 16


@pytest.mark.parametrize(("lost", "limit"), [(1, 1.0), (2, 1.0), (3, 2.0), (5, 3.0)])
def test_the_photos_said_to_settle_it_do_at_the_same_rates(lost: int, limit: float) -> None:
    targets, reference, backend = answers_with(50, lost=lost)
    pairs = paired(reference, backend, targets)
    assert not judge(pairs, limit).settled
    needed = pairs.photos_to_settle(limit)
    targets, reference, backend = answers_with(needed, lost=round(lost * needed / 50))
    assert judge(paired(reference, backend, targets), limit).settled


def test_when_every_photo_changes_sides_the_gate_still_gives_a_verdict() -> None:
    """Lost and gained counts scaled apart once asked for more successes than photos, and the gate raised."""
    targets = np.zeros(6, dtype=int)
    reference, backend = np.array([0, 0, 0, 1, 1, 1]), np.array([1, 1, 1, 0, 0, 0])
    pairs = paired(reference, backend, targets)
    assert (pairs.only_reference_right, pairs.only_backend_right) == (3, 3)
    assert isinstance(pairs.photos_to_settle(3.0), int)
    assert judge(pairs, 3.0).note.startswith("undecided")


# --- three families of one's own, through the gate ------------------------------------------------------


class Answering:
    """A stand-in engine answering chosen classes, in the order the gate sends the photos."""

    def __init__(self, answers: np.ndarray | list[int], classes: int, precision: str | None = None) -> None:
        self.answers, self.classes, self.precision, self.seen = answers, classes, precision, 0

    def run(self, images: np.ndarray) -> np.ndarray:
        logits = np.zeros((len(images), self.classes), dtype=np.float32)
        logits[np.arange(len(images)), self.answers[self.seen : self.seen + len(images)]] = 1.0
        self.seen += len(images)
        return logits

    def describe(self) -> dict[str, Any]:
        return {} if self.precision is None else {"precision": self.precision}


def family_gate(
    targets: np.ndarray,
    reference: np.ndarray,
    engines: dict[str, Any],
    tmp: Path,
    said: list[str] | None = None,
    limit: float = 1.0,
) -> AccuracyGate:
    """A gate over photos of 3 classes held as tiny pixels (the stand-ins never look at them), saying into
    ``said``."""
    n = len(targets)
    images = EvalSet(tmp, np.zeros((n, 1, 1, 3), np.uint8), targets, [], [], [], ["red", "green", "blue"])
    said = [] if said is None else said
    ref = accuracy.accuracy(np.eye(3)[reference], targets)
    return AccuracyGate(images, ref, reference, limit, tmp / "accuracy.json", said.append,
                        open=lambda backend, dirs: engines[backend])  # fmt: skip


def test_a_family_whose_int8_loses_a_known_share_is_refused_with_its_interval(tmp_path) -> None:
    targets, reference, backend = answers_with(150, lost=24, gained=3)  # 14 points lost net, 27 discordant
    gate = family_gate(targets, reference, {"onnx-int8": Answering(backend, 3)}, tmp_path)
    with pytest.raises(AccuracyRefused) as err:
        gate.check("hues-onnx-int8", "onnx-int8", None, tmp_path)
    message = str(err.value)
    assert "14.00 percentage points below" in message and "over --max-accuracy-drop 1 with 95% confidence" in message
    assert "(95% interval +4.19 to +25.19 pp)" in message and "27 answer(s) changed" in message and "\n" not in message
    row = gate.rows[-1]
    assert row.status == "refused" and row.paired.drop_low_pp > 1.0
    gate.finish()
    written = json.loads((tmp_path / "accuracy.json").read_text())["rows"][-1]
    assert written["paired"]["only_reference_right"] == 24 and written["paired"]["only_backend_right"] == 3
    assert written["paired"]["drop_low_pp"] == row.paired.drop_low_pp and written["paired"][
        "agreement"
    ] == pytest.approx(123 / 150)
    assert "exact (Clopper-Pearson)" in written["paired"]["method"]


def test_a_family_too_small_to_decide_is_stored_with_a_warning_saying_what_would_settle_it(tmp_path) -> None:
    targets, reference, backend = answers_with(6, lost=3)  # half the photos lost, but only 6 of them
    said: list[str] = []
    gate = family_gate(targets, reference, {"onnx-int8": Answering(backend, 3)}, tmp_path, said)
    measured = gate.check("tiny-onnx-int8", "onnx-int8", None, tmp_path)
    assert measured["top1"] == 0.5 and measured["paired"]["drop_low_pp"] < 1.0 < measured["paired"]["drop_high_pp"]
    assert measured["gate"].startswith("undecided: the 95% interval")
    row = gate.rows[-1]
    assert row.status == "measured" and row.drop_pp == 50.0
    assert (row.paired.only_reference_right, row.paired.changed) == (3, 3)
    warning = said[-1]
    assert warning.startswith("tiny-onnx-int8: WARNING: stored, undecided") and "photos would settle it" in warning
    assert "| drop's 95% interval (pp) | same answer (changed) |" in gate.report().table()


# --- what the build does with a verdict -----------------------------------------------------------------

RIGHT = np.repeat([0, 1, 2], 4)  # 12 photos of 3 classes, the reference right on every one


def test_one_within_the_limit_is_stored_with_its_figures(tmp_path) -> None:
    right = np.repeat([0, 1, 2], 25)  # 75 photos: one miss is 1.33 points
    one_miss = [1, *right[1:]]
    engines = {"onnx-int8": Answering(one_miss, 3), "onnx-int8-dynamic": Answering(right, 3)}
    gate = family_gate(right, right, engines, tmp_path, limit=1.5)
    measured = gate.check("tiles-onnx-int8", "onnx-int8", None, tmp_path)
    paired, verdict = measured.pop("paired"), measured.pop("gate")
    assert measured == {
        "eval_dir": str(tmp_path.resolve()),
        "images": 75,
        "skipped": 0,
        "top1": 74 / 75,
        "top5": 1.0,
        "reference_top1": 1.0,
        "reference_top5": 1.0,
        "precision": "int8",
        "max_accuracy_drop_pp": 1.5,
    }
    assert (paired["both_right"], paired["only_reference_right"], paired["changed"]) == (74, 1, 1)
    assert paired["agreement"] == 74 / 75 and paired["method"].startswith("exact (Clopper-Pearson)")
    assert verdict.startswith("undecided: a difference of 1 photo is never refused; 95% interval -8.00 to +8.21 pp")
    assert gate.check("tiles-onnx-int8-dynamic", "onnx-int8-dynamic", None, tmp_path)["top1"] == 1.0
    assert gate.rows[-1].note.startswith("undecided: no photo differs; 95% interval -5.68 to +5.68 pp")
    # The same miss with a limit below it: one photo is never refused.
    gate = family_gate(right, right, {"onnx-int8": Answering(one_miss, 3)}, tmp_path, limit=1.0)
    assert gate.check("tiles-onnx-int8", "onnx-int8", None, tmp_path)["top1"] == 74 / 75
    assert gate.rows[-1].note.startswith("undecided: a difference of 1 photo is never refused")


def test_a_drop_of_exactly_the_limit_passes(tmp_path) -> None:
    """100 photos, one miss: exactly 1 point (not 1.0000000000000009) is not more than --max-accuracy-drop 1."""
    right = np.repeat([1, 2], 50)
    gate = family_gate(right, right, {"onnx-int8": Answering([0, *right[1:]], 3)}, tmp_path)
    assert gate.check("x-onnx-int8", "onnx-int8", None, tmp_path)


def test_openvino_is_gated_only_where_it_runs_in_bf16(tmp_path) -> None:
    worse = (RIGHT + 1) % 3  # every photo missed: 12 of 12 lost is over 1 point with 95% confidence
    f32 = family_gate(RIGHT, RIGHT, {"openvino": Answering(worse, 3, precision="f32")}, tmp_path)
    measured = f32.check("x-openvino", "openvino", None, tmp_path)  # FP32: its verification holds it, not this
    assert measured["precision"] == "fp32" and f32.rows[-1].status == "measured"
    bf16 = family_gate(RIGHT, RIGHT, {"openvino": Answering(worse, 3, precision="bf16")}, tmp_path)
    with pytest.raises(AccuracyRefused, match="at bf16"):
        bf16.check("x-openvino", "openvino", None, tmp_path)


def test_a_model_kept_as_up_to_date_is_measured_and_reported_never_refused(tmp_path) -> None:
    engines = {"onnx-int8": Answering((RIGHT + 1) % 3, 3), "onnx": Answering(RIGHT, 3)}
    gate = family_gate(RIGHT, RIGHT, engines, tmp_path)
    gate.report_stored("x-onnx-int8", "onnx-int8", None, tmp_path)
    gate.report_stored("x-onnx", "onnx", None, tmp_path)
    assert gate.rows[-2].status == "over the limit" and "--force" in gate.rows[-2].note
    assert gate.rows[-1].status == "measured" and "metadata unchanged" in gate.rows[-1].note


@pytest.mark.skipif(hardware.is_macos(), reason="CoreML predicts on macOS")
def test_a_backend_that_cannot_run_here_is_recorded_as_not_measured(tmp_path) -> None:
    gate = family_gate(RIGHT, RIGHT, {}, tmp_path)
    assert gate.check("x-coreml-b4", "coreml", 4, tmp_path) is None
    assert gate.rows[-1].status == "not measured" and "macOS" in gate.rows[-1].note


def test_every_refused_model_is_in_the_table_with_the_gates_figure(tmp_path) -> None:
    wrong = (RIGHT + 1) % 3
    engines = {"onnx-int8": Answering(wrong, 3), "onnx-int8-dynamic": Answering(RIGHT, 3)}
    engines["openvino-int8"] = Answering(wrong, 3)
    gate = family_gate(RIGHT, RIGHT, engines, tmp_path)
    for artifact in engines:
        with contextlib.suppress(AccuracyRefused):  # the build says it and goes on
            gate.check(f"x-{artifact}", artifact, None, tmp_path)
    assert [row.backend for row in gate.rows if row.status == "refused"] == ["x-onnx-int8", "x-openvino-int8"]
    assert [row.drop_pp for row in gate.rows] == [100.0, 0.0, 100.0]  # the table's figure is the gate's


# --- the plan ---------------------------------------------------------------------------------------------


def named(artifact: str, batch: int | None) -> str:
    return f"hues-{artifact}" + ("" if batch is None else f"-b{batch}")


def test_the_plan_follows_the_tables_order_and_knows_what_converts_what() -> None:
    batches = {a.name: a.batches for a in ARTIFACTS.values()}
    sources = {a.name: a.built_from for a in ARTIFACTS.values()}
    jobs = plan.jobs(["coreml", "openvino-int8", "onnx-int8"], batches, sources, named)
    assert [j.name for j in jobs] == [
        "hues-onnx-int8",
        "hues-openvino-int8",
        *(f"hues-coreml-b{b}" for b in (1, 2, 4, 8)),
    ]
    assert jobs[1].built_from == "onnx-int8" and jobs[0].built_from is None


def test_a_diverging_export_is_refused_its_conversion_skipped_and_the_rest_stored() -> None:
    """The plan's carry-on: what the build does after a refusal, and the table and last word it ends with."""
    done = [
        Outcome("hues-pytorch", "pytorch", plan.STORED, "hues-pytorch:a in 0.4s"),
        Outcome("hues-onnx-int8", "onnx-int8", plan.REFUSED, "the export diverges from PyTorch: max |logit diff| 9"),
    ]
    converts = Job("hues-openvino-int8", "openvino-int8", None, built_from="onnx-int8")
    why = plan.blocked(converts, done)
    assert why == "converts hues-onnx-int8's export, refused in this build"
    assert plan.blocked(Job("hues-openvino", "openvino"), done) is None
    done += [Outcome(converts.name, converts.artifact, plan.SKIPPED, why)]
    done += [Outcome("hues-openvino", "openvino", plan.STORED, "hues-openvino:b in 3.0s")]
    lines = plan.table(done)
    assert lines[:2] == ["| model | outcome | why |", "|---|---|---|"]
    assert "| hues-onnx-int8 | refused | the export diverges from PyTorch: max \\|logit diff\\| 9 |" in lines
    assert f"| hues-openvino-int8 | skipped | {why} |" in lines
    assert lines[-1] == "build: 2 stored, 1 refused, 1 skipped"
    last = plan.refusal(done)
    assert str(last).startswith("1 model(s) refused") and str(last).endswith(": hues-onnx-int8")
    assert plan.refusal(done[:1]) is None and last.outcomes == done


def test_out_without_eval_dir_is_one_line(capsys, tmp_path) -> None:
    from build_models.__main__ import main

    assert main(["--weights", "random", "--name", "hues", "--out", str(tmp_path)]) == 1
    assert capsys.readouterr().err.strip() == "build_models: --out: only with --eval-dir DIR, the photos to measure on"


def test_past_the_search_the_photos_that_would_settle_it_are_said_as_more_than() -> None:
    """Past the search (20,000 photos) the number is said as a bound, not as the fewest."""
    targets, reference, backend = answers_with(60, lost=1)
    pairs = paired(reference, backend, targets)
    assert pairs.photos_to_settle(1.45) == SETTLE_SEARCHED + 1
    assert "more than 20000 photos would settle it" in judge(pairs, 1.45).note


def test_the_build_names_the_fastest_backend_within_the_limit_and_writes_it(tmp_path) -> None:
    """With --eval-dir the build's output says what `fastinfer evaluate` would, from a brief timing."""

    class Steady(Answering):  # the same answers on every pass: the accuracy pass, then the timing
        def __init__(self, answers: np.ndarray, delay_s: float) -> None:
            super().__init__(answers, 3)
            self.delay_s = delay_s

        def run(self, images: np.ndarray) -> np.ndarray:
            time.sleep(self.delay_s)
            rows = (self.seen + np.arange(len(images))) % len(self.answers)
            self.seen += len(images)
            return np.eye(self.classes, dtype=np.float32)[self.answers[rows]]

    targets, reference, lossy = answers_with(60, lost=30)
    engines = {"onnx": Steady(reference, 0.02), "onnx-int8": Steady(lossy, 0.0), "openvino": Steady(reference, 0.0)}
    said: list[str] = []
    gate = family_gate(targets, reference, engines, tmp_path, said)
    gate.timing = ev.Timing(seconds=0.05, warmup_s=0.0, say=lambda line: None)
    for artifact in engines:
        with contextlib.suppress(AccuracyRefused):  # onnx-int8 loses half: refused, however fast
            gate.check(f"hues-{artifact}", artifact, None, tmp_path)
    gate.finish()
    assert set(gate.speeds) == {"hues-onnx", "hues-onnx-int8", "hues-openvino"}
    assert gate.speeds["hues-openvino"] > gate.speeds["hues-onnx"]  # no 20 ms a call
    (line,) = [s for s in said if s.startswith("accuracy: fastest within the limit (1 pp): ")]
    assert line.startswith("accuracy: fastest within the limit (1 pp): hues-openvino, ")
    written = json.loads((tmp_path / "accuracy.json").read_text())
    assert written["fastest_within_limit"] == "hues-openvino" and set(written["images_per_s_in_process"]) == set(
        gate.speeds
    )
