"""Lab 01 (labs/01_single_device.ipynb): its exercises (memory of a step and of training)."""
from __future__ import annotations

from .exercise import Exercise, check, register  # noqa: F401 (labNN.check)


def _mlp_activation_bytes(sizes, batch_size):
    # every Linear output, and the ReLU output after each hidden Linear, in float32
    return 4 * batch_size * (sum(sizes[1:]) + sum(sizes[1:-1]))


register(Exercise(
    name="mlp_activation_bytes",
    reference=_mlp_activation_bytes,
    cases=[((64, 256, 256, 128, 10), 64), ((64, 10), 1), ((8, 32, 8), 100), ((64, 512, 10), 7)],
    hint="count one output per layer: each Linear gives batch x out_features numbers, and "
         "each ReLU (after every Linear but the last) as many again; a float32 is 4 bytes.",
))


OPTIMIZER_SLOTS = {"sgd": 0, "momentum": 1, "adam": 2}   # tensors kept per parameter


def _training_state_bytes(sizes, optimizer):
    params = sum(i * o + o for i, o in zip(sizes[:-1], sizes[1:]))   # weights + biases
    return 4 * params * (2 + OPTIMIZER_SLOTS[optimizer])              # + gradients + slots


register(Exercise(
    name="training_state_bytes",
    reference=_training_state_bytes,
    cases=[((64, 256, 256, 128, 10), "adam"), ((64, 256, 256, 128, 10), "sgd"),
           ((64, 10), "momentum"), ((8, 32, 8), "adam"), ((3, 5, 7, 2), "sgd")],
    hint="a Linear(i, o) has a weight of i x o numbers and a bias of o. Training keeps the "
         "parameters, one gradient per parameter, and whatever the optimizer keeps per "
         "parameter: plain SGD nothing, SGD with momentum one running average, Adam two. "
         "A float32 is 4 bytes.",
))
