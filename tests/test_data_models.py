"""The course's data and models: deterministic data, models that really learn."""
import numpy as np
import pytest
import torch

from parlab import data
from parlab.trace import CORE_WAIT
from parlab.torch import memory, models, single


def test_digits_split_is_fixed_disjoint_and_normalised():
    xtr, ytr = data.digits("train")
    xte, yte = data.digits("test")
    assert xtr.shape == (1437, 64) and xte.shape == (360, 64)
    assert xtr.dtype == np.float32 and 0 <= xtr.min() and xtr.max() <= 1
    assert set(np.unique(ytr)) == set(range(10))
    rows = {r.tobytes() for r in xtr}
    assert sum(r.tobytes() in rows for r in xte) < 5  # a handful of identical images at most
    np.testing.assert_array_equal(data.digits("train")[0], xtr)
    assert data.digits("test", flat=False)[0].shape == (360, 1, 8, 8)
    with pytest.raises(ValueError, match="split"):
        data.digits("validation")


def test_generators_are_deterministic_and_labelled():
    a, b = data.waves(64, seed=3), data.waves(64, seed=3)
    np.testing.assert_array_equal(a[0], b[0])
    assert a[0].shape == (64, 32, 1) and set(np.unique(a[1])) <= {0, 1, 2, 3}
    img, mask = data.shapes(16, size=32, seed=1)
    assert img.shape == (16, 1, 32, 32) and mask.shape == (16, 32, 32)
    assert {0, 1, 2} == set(np.unique(mask))
    assert (img[:, 0][mask > 0].mean() - img[:, 0][mask == 0].mean()) > 0.5  # shapes are visible


def test_batches_cover_the_data_in_a_seeded_order():
    x, y = np.arange(10)[:, None], np.arange(10)
    got = [yb for _, yb in data.batches(x, y, 3, seed=1)]
    assert len(got) == 3 and len(set(np.concatenate(got))) == 9
    assert [list(b) for b in got] == [list(yb) for _, yb in data.batches(x, y, 3, seed=1)]
    with pytest.raises(ValueError):
        next(data.batches(x, y, 0))
    endless = data.endless_batches(x, y, 4)
    firsts = [next(endless)[1][0] for _ in range(5)]   # 2 batches per epoch, in fixed order
    assert firsts == [0, 4, 0, 4, 0]


@pytest.mark.parametrize("name", ["mlp", "cnn", "deep_lstm", "unet"])
def test_every_torch_model_learns_its_data(name):
    torch.manual_seed(0)
    if name == "mlp":
        model, (x, y), epochs, lr = models.mlp(), data.digits("train"), 2, 1e-3
    elif name == "cnn":
        model, (x, y), epochs, lr = models.cnn(), data.digits("train", flat=False), 2, 1e-3
    elif name == "deep_lstm":
        model, (x, y), epochs, lr = models.deep_lstm(layers=3, hidden=32), data.waves(512), 8, 3e-3
    else:
        model, (x, y), epochs, lr = models.unet(8), data.shapes(96), 3, 1e-2
    before = single.accuracy(model, x, y)
    hist = single.train(model, x, y, epochs=epochs, batch_size=32, lr=lr, progress=False)
    after = single.accuracy(model, x, y)
    assert np.mean(hist["loss"][-5:]) < 0.6 * np.mean(hist["loss"][:5]), name
    assert after > before + 0.2, (name, before, after)


def test_memory_estimate_and_measurement_agree_where_they_must():
    torch.manual_seed(0)
    model = models.mlp((64, 128, 10))
    x, y = torch.zeros(32, 64), torch.zeros(32, dtype=torch.long)
    est = memory.estimate(model, x, optimizer_slots=2)
    got = memory.measure(model, torch.optim.Adam(model.parameters()), torch.nn.CrossEntropyLoss(), x, y)
    n_params = (64 * 128 + 128 + 128 * 10 + 10) * 4
    assert est["parameters"] == got["parameters"] == n_params
    assert est["gradients"] == got["gradients"] == n_params
    assert est["optimizer state"] == got["optimizer state"] == 2 * n_params
    assert est["activations"] == 4 * 32 * (128 + 128 + 10)
    # autograd keeps the input, the ReLU output (shared with the next Linear) and a few
    # loss intermediates; never the weights
    assert 4 * 32 * (64 + 128) <= got["activations"] < n_params
    sgd = memory.measure(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.CrossEntropyLoss(), x, y)
    assert sgd["optimizer state"] == 0


def test_step_timeline_and_throughput():
    x, y = data.digits("train")
    tl = single.step_timeline(models.mlp(), x, y, batch_size=32, steps=3)
    phases = [s.name for s in tl if s.kind != CORE_WAIT]     # a wait for a core may come between
    assert phases == ["data", "forward", "backward", "update"] * 3 and tl.ranks == [0]
    tp = single.throughput(models.mlp, x, y, [8, 64], steps=3)
    assert [r["batch_size"] for r in tp] == [8, 64] and all(r["samples_per_s"] > 0 for r in tp)
    with pytest.raises(ValueError, match="larger than the data"):
        single.throughput(models.mlp, x[:10], y[:10], [64])
