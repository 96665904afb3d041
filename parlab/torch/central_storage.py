"""Lab 06, by hand: central storage on one machine.

The parameters live in ONE place (the host's memory, "central storage"); each replica
device receives a copy of them, computes gradients on its slice of the batch and sends
them back; the central place averages the gradients and updates its parameters. Unlike
the mirrored strategy, no device keeps parameters between steps, so a model that does
not fit next to its activations on every device still trains, at the price of moving
all parameters and gradients every step.

One process drives every replica in turn. With GPUs the copies are real host-to-device
and device-to-host transfers; without, the replicas are the CPU itself (simulated) and the
copies are memory copies. Spans are drawn on one lane per place: lane 0 is the central
storage, lane k + 1 is replica k.
"""
from __future__ import annotations

import time

import torch
from torch import nn

from ..split import share
from ..trace import COMM, COMPUTE, recording
from . import training
from .training import flat_gradients, flat_parameters, load_flat


def replica_devices(n: int) -> tuple[list[torch.device], bool]:
    """n GPUs when there are that many, else n simulated replicas on the CPU."""
    if n < 1:
        raise ValueError(f"central storage needs at least one replica, got {n}")
    if torch.cuda.device_count() >= n:
        return [torch.device("cuda", k) for k in range(n)], False
    return [torch.device("cpu")] * n, True


def _done(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)   # the span must end when the GPU is done
    return time.perf_counter()


def train_central_storage(replicas: int = 2, model: str = "mlp", global_batch: int = 128,
                          steps: int = 10, lr: float = 0.1, seed: int = 0) -> dict:
    """Train with parameters in host memory and ``replicas`` devices computing gradients.

    Replica k takes slice k of every global batch, so the averaged gradient is the whole
    batch's: the result equals one device on the global batch (``train_single``).
    """
    share(global_batch, replicas, f"{replicas} replicas")
    devices, simulated = replica_devices(replicas)
    central = flat_parameters(training.build_model(model, seed=seed))  # the only lasting copy
    copies = [training.build_model(model).to(d) for d in devices]      # each replica's working memory
    b = global_batch // replicas
    batches = training.digit_batches(model, global_batch)
    losses = []
    with recording() as rec:
        for _ in range(steps):
            xb, yb = next(batches)
            grad_sum = torch.zeros_like(central)
            step_loss = 0.0
            for k, (net, device) in enumerate(zip(copies, devices)):
                lane = k + 1
                t0 = time.perf_counter()
                load_flat(net, central.to(device))
                rec.add("parameters to replica", COMM, t0, _done(device), central.nbytes, lane=lane)
                x = torch.as_tensor(xb[k * b:(k + 1) * b]).to(device)
                y = torch.as_tensor(yb[k * b:(k + 1) * b]).to(device)
                t0 = time.perf_counter()
                net.zero_grad(set_to_none=True)
                loss = nn.functional.cross_entropy(net(x), y)
                loss.backward()
                rec.add("forward + backward", COMPUTE, t0, _done(device), lane=lane)
                t0 = time.perf_counter()
                grads = flat_gradients(net).to("cpu")
                rec.add("gradients to central", COMM, t0, _done(device), grads.nbytes, lane=lane)
                grad_sum += grads
                step_loss += loss.item() / replicas
            t0 = time.perf_counter()
            central -= lr * grad_sum / replicas
            rec.add("average + update", COMPUTE, t0, time.perf_counter(), lane=0)
            losses.append(step_loss)
    labels = {0: "central storage (host)"}
    labels.update({k + 1: f"replica {k} · {d}{' (simulated)' if simulated else ''}"
                   for k, d in enumerate(devices)})
    final = training.build_model(model)
    load_flat(final, central)
    return {"losses": losses, "timeline": rec.timeline(labels), "simulated": simulated,
            "state": training.state_numpy(final)}
