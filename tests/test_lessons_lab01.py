"""Lab 01's lessons: each check says "shown" on numbers that show its claim and "not
shown", with the cause, on planted numbers that contradict it. No training, no timing."""
from parlab.course import lab01, lessons


def test_lab01_registers_its_lessons_in_the_notebooks_order():
    assert [x.name for x in lessons.of_lab("01")] == [
        "01.mlp_learns_digits", "01.throughput_grows_then_levels", "01.models_learn_their_data"]


# ------------------------------------------------------------------ the MLP
def test_mlp_learns_digits_shown_above_90_percent():
    v = lessons.evaluate("01.mlp_learns_digits",
                         {"accuracy": 0.95, "chance": 0.11, "loss": (2.3, 0.05)})
    assert v.shown and "95.0%" in v.figures and "11.0%" in v.figures


def test_mlp_learns_digits_not_shown_below_90_percent():
    v = lessons.evaluate("01.mlp_learns_digits",
                         {"accuracy": 0.62, "chance": 0.11, "loss": (2.3, 1.9)})
    assert not v.shown and "62.0%" in v.figures
    assert "2.300 to 1.900" in v.why


def test_mlp_numbers_reads_the_last_epoch_and_the_commonest_digit():
    import numpy as np
    history = {"test_accuracy": [0.5, 0.93], "loss": [2.3, 1.0, 0.1]}
    m = lab01.mlp_numbers(history, np.array([1, 1, 1, 2]))
    assert m == {"accuracy": 0.93, "chance": 0.75, "loss": (2.3, 0.1)}


# ------------------------------------------------------------------ throughput
def _sweep(*step_ms, core_wait=0.01, load=1.0, device="cpu"):
    return {"batch": [4, 16, 64, 256, 1024], "step_s": [t / 1e3 for t in step_ms],
            "core_wait": core_wait, "load": load, "device": device}


def test_throughput_shown_flat_then_saturated():
    v = lessons.evaluate("01.throughput_grows_then_levels", _sweep(0.6, 0.65, 1.0, 2.7, 13.0))
    assert v.shown
    assert "step time x1.08, throughput x3.69" in v.figures
    assert "throughput x0.83" in v.figures


def test_throughput_not_shown_when_the_smallest_batches_are_not_fixed_cost():
    v = lessons.evaluate("01.throughput_grows_then_levels",
                         _sweep(0.6, 2.0, 6.0, 20.0, 80.0, core_wait=0.4, load=5.0))
    assert not v.shown
    assert "more than doubled from batch 4 to 16" in v.why
    assert "40% of the sweep waiting for a core" in v.why and "load average 5.0" in v.why


def test_throughput_not_shown_when_the_device_never_saturates():
    v = lessons.evaluate("01.throughput_grows_then_levels",
                         _sweep(0.10, 0.10, 0.11, 0.12, 0.15, device="cuda:0"))
    assert not v.shown
    assert "cuda:0 was not saturated at batch 1024" in v.why
    assert "doubled" not in v.why


def test_throughput_not_shown_under_contention_blames_the_waits_not_the_device():
    v = lessons.evaluate("01.throughput_grows_then_levels",
                         _sweep(0.10, 0.10, 0.11, 0.12, 0.15, core_wait=0.35, load=4.0))
    assert not v.shown and "the sweep waited for a core" in v.why
    assert "not saturated" not in v.why and "35% of the sweep waiting for a core" in v.why


def test_throughput_numbers_keeps_the_sweep():
    rows = [{"batch_size": b, "step_s": s, "samples_per_s": b / s} for b, s in ((4, 1.0), (16, 2.0))]
    m = lab01.throughput_numbers(rows, 0.25, "cpu")
    assert m["batch"] == [4, 16] and m["step_s"] == [1.0, 2.0] and m["core_wait"] == 0.25


# ------------------------------------------------------------------ the other models
def _models(unet_iou=0.9, unet_loss=(1.1, 0.01)):
    return {
        "CNN, digits": {"epochs": 4, "after": 0.93, "baseline": 0.08, "loss": (2.3, 0.4),
                        "measure": "accuracy"},
        "deep LSTM, waves": {"epochs": 6, "after": 0.91, "baseline": 0.21, "loss": (1.4, 0.2),
                             "measure": "accuracy"},
        "U-Net, shapes (pixels)": {"epochs": 60, "after": unet_iou, "baseline": 0.0,
                                   "loss": unet_loss, "measure": "mean IoU of disc and square"},
    }


def test_models_learn_their_data_shown():
    v = lessons.evaluate("01.models_learn_their_data", _models())
    assert v.shown and "U-Net mean IoU of disc and square 0.90 (every pixel painted " \
                       "background, the commonest training label: 0.00)" in v.figures
    assert "CNN accuracy 0.93 (always answering the commonest training label: 0.08)" in v.figures


def test_models_learn_their_data_not_shown_for_a_unet_painting_background():
    # the review's run: every pixel background, 85.8 % pixel accuracy, IoU 0
    v = lessons.evaluate("01.models_learn_their_data", _models(0.0, (1.12, 0.21)))
    assert not v.shown
    assert v.why.startswith("U-Net only 0.00 after 60 epochs") and "1.120 -> 0.210" in v.why
    assert "CNN" not in v.why


def test_score_is_the_foreground_iou_for_masks():
    import numpy as np
    y = np.zeros((1, 4, 4), dtype=np.int64)
    y[0, 0, :2] = 1                       # a disc of 2 pixels
    y[0, 3, :] = 2                        # a square of 4 pixels
    assert lab01.score(np.zeros_like(y), y) == 0.0          # all background: 0, not 10/16
    pred = y.copy()
    pred[0, 3, 3] = 0                     # one square pixel missed: IoU 3/4
    assert lab01.score(pred, y) == (1.0 + 0.75) / 2
    assert lab01.score(np.array([1, 2, 2]), np.array([1, 2, 0])) == 2 / 3   # accuracy
