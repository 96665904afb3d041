"""The rank code that measures this machine for the cost model (course/calibrate.py
launches it): message times, how late a woken rank resumes, and a step's phases."""
from __future__ import annotations

import contextlib


def network_of(model, sample_shape, *, name: str | None = None):
    """The cost model's view (``sim.Network``) of a PyTorch ``nn.Sequential``: one layer
    per Linear or Conv2d, with its parameters, forward FLOPs per sample (2 per
    multiply-add: 2 c_in k^2 c_out per output pixel of a convolution, 2 a b for a
    Linear a -> b) and the elements of its output, found by running one sample through.
    The element-wise layers between them (ReLU, pooling) only add their bytes.
    """
    import torch
    from torch import nn

    from .. import sim
    layers, counts = [], {}
    x = torch.zeros(1, *sample_shape)
    with torch.no_grad():
        for module in model:
            y = module(x)
            kind = type(module).__name__
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                params = sum(p.numel() for p in module.parameters())
                if isinstance(module, nn.Linear):
                    flops = 2.0 * module.in_features * module.out_features
                else:
                    k = module.kernel_size[0] * module.kernel_size[1]
                    flops = 2.0 * module.in_channels // module.groups * k * y[0].numel()
                counts[kind] = counts.get(kind, 0) + 1
                layers.append(sim.Layer(f"{kind.lower()}{counts[kind] - 1}", params, flops,
                                        out_elems=y[0].numel(),
                                        saved_elems=x[0].numel() + y[0].numel()))
            elif layers:        # element-wise work after a layer: read and write it
                last = layers[-1]
                layers[-1] = sim.Layer(last.name, last.params, last.flops, y[0].numel(),
                                       last.saved_elems + y[0].numel(),
                                       last.elementwise_bytes + 4.0 * (x[0].numel() + y[0].numel()))
            x = y
    return sim.Network(name or type(model).__name__, tuple(layers),
                       float(torch.zeros(sample_shape).numel()))


def calibration_ranks(rank: int, world_size: int, sizes, batches, steps: int,
                       messages) -> dict:
    """Rank function: lab 00's link sweep on two ranks, then lab 01's traced step.

    The sweep (``bandwidth.sweep``: half a ping-pong, and two-rank all-reduces) comes
    first, then how late a receiver that blocked resumes, after 20 ms ("wake") and after
    ``SHORT_BLOCK_S`` ("wake_short"), and how often an isend waits for its sender's
    compute ("held", ``held_sends``). Then rank 0 trains the MLP for ``steps`` steps at
    each batch size, the sizes taking turns ("forward", "backward", "update" spans), and
    a network of one tiny layer after each turn ("call forward", ...: what a pass costs
    with next to no layer), twice: back to back, as lab 01 runs, and with a small
    message to and from rank 1 before every phase, rank 1 training too, as the ranks of
    a distributed step run (``calibration_steps``). Then both ranks run DDP's bucket
    all-reduce (``bucket_handoffs``), and last lab 03's operators around a collective
    (``tp_operators``).
    """
    from . import bandwidth, comm
    links = bandwidth.sweep(rank, world_size, sizes=messages, ops=("send_recv", "all_reduce"))
    wake = wake_times(rank, repeats=40)
    wake_short = wake_times(rank, repeats=40, sleep_s=SHORT_BLOCK_S)
    held = held_sends(rank)
    comm.barrier(name="calibration")
    calibration_steps(rank, sizes, batches, steps, between_messages=False)
    comm.barrier(name="calibration")
    calibration_steps(rank, sizes, batches, steps, between_messages=True)
    comm.barrier(name="calibration")
    bucket_handoffs(rank, world_size, sizes, steps)
    comm.barrier(name="calibration")
    tp_operators(sizes, steps)
    comm.barrier(name="calibration")
    return {"links": links, "wake": wake, "wake_short": wake_short, "held": held}


SHORT_BLOCK_S = 0.002    # a short block: a pipeline's or lab 02's receives block 1-2 ms
LONG_BLOCK_S = 0.02      # a long one: the wake-up collectives pay (wake_latency_s)


def calibration_steps(rank: int, sizes, batches, steps: int, between_messages: bool) -> None:
    """Rank 0 trains the MLP (lr 0), each phase traced; between messages, rank 1 too.

    The batch sizes take turns, one step each (32, 64, 128, then the tiny network's
    step, 32, ...), rather than ``steps`` of one size and then the next: this machine's
    cores change speed over seconds, and the fit draws a line through the sizes.
    Measured here, twenty runs each: a line through batches 32 and 128 run one size
    after the other predicted batch 64 at 0.83-1.45 of its measured time; with the sizes
    taking turns, 1.00-1.11.

    between_messages: before each phase rank 0 sends rank 1 a small message and blocks
    until it answers. A rank that has just blocked computes slower than one running
    back to back: measured here, 1.3-1.7x for this MLP at batch 64 (its caches went
    cold while it slept, and on a virtual machine its processor was halted); every rank
    of a distributed step blocks between its phases, so its compute is timed this way.
    And both ranks compute, each phase after the exchange, as the ranks of a distributed
    step do; both are timed. The one that answers (receives, sends, then computes while
    its message may still be leaving) computed slower than the one that waited for the
    answer: measured here, rank 1's forward at 1.2-1.5x rank 0's unpinned (six launches),
    1.0-1.2x pinned (four), while rank 0 computed as fast as with rank 1 idle. A
    distributed step's ranks take both roles, so its compute is timed on both.
    """
    import torch
    from torch import nn

    from . import comm, training
    from ..trace import span
    if rank != 0 and not between_messages:
        return                              # nothing to answer
    buf = torch.zeros(2)

    def message() -> None:
        if not between_messages:
            return
        if rank == 0:
            comm.send(buf, 1, name="calibration")
            comm.recv(buf, 1, name="calibration")
        else:
            comm.recv(buf, 0, name="calibration")
            comm.send(buf, 0, name="calibration")

    model = training.build_model("mlp", sizes=sizes, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    tiny = nn.Sequential(nn.Linear(1, 2))        # a pass with next to no layer: its call
    tiny_opt = torch.optim.SGD(tiny.parameters(), lr=0.0)
    loss_fn = nn.CrossEntropyLoss()
    data = {b: (torch.randn(b, sizes[0]), torch.randint(0, sizes[-1], (b,))) for b in batches}
    data["call"] = (torch.randn(1, 1), torch.zeros(1, dtype=torch.long))
    runs = [(b, model, opt, "") for b in batches] + [("call", tiny, tiny_opt, "call ")]
    for _ in range(steps):
        for b, net, optimizer, prefix in runs:
            x, y = data[b]
            message()
            with span(prefix + "forward"):
                optimizer.zero_grad()
                loss = loss_fn(net(x), y)
            message()
            with span(prefix + "backward"):
                loss.backward()
            message()
            with span(prefix + "update"):
                optimizer.step()


def wake_times(rank: int, repeats: int, sleep_s: float = LONG_BLOCK_S) -> list[float]:
    """Rank 0: when it sent a small message; rank 1: when its blocked receive returned.

    Rank 1 posts its receive at once and sleeps in it while rank 0 sleeps ``sleep_s``
    first: their difference, less the message's own time, is how late a rank that
    blocked resumes (one host: one monotonic clock, ``time.perf_counter``).
    """
    import time

    import torch

    from . import comm
    buf, out = torch.zeros(2), []
    for _ in range(repeats):
        comm.barrier(name="calibration")
        if rank == 0:
            time.sleep(sleep_s)
            out.append(time.perf_counter())
            comm.send(buf, 1)
        elif rank == 1:
            comm.recv(buf, 0)
            out.append(time.perf_counter())
    return out


HELD_COMPUTE_S = 0.003      # the sender computes this long after posting its message
HELD_MESSAGE_BYTES = 65536  # a lab 04 micro-batch's activation (64 x 256 floats)


def held_sends(rank: int, repeats: int = 60) -> list[float]:
    """Rank 0: how long each of its receives took, posted before rank 1's isend of
    ``HELD_MESSAGE_BYTES``, rank 1 computing ``HELD_COMPUTE_S`` right after posting it.

    gloo writes the message on the sender's communication thread; a pinned rank's
    thread must take its core from the computing main thread, and here it often did not
    until that compute ended (``sim.shared_cores.held_s``): a receive that took over half
    the compute waited for it (``course.calibrate.held_share``). Each rank's threads are
    pinned to a core of its own while this runs, as labs 03, 04 and 07 pin their ranks.
    """
    import time

    import torch

    from . import comm
    buf, work, out = torch.zeros(HELD_MESSAGE_BYTES // 4), torch.randn(128, 128), []
    with _threads_pinned(rank):
        for _ in range(repeats):
            comm.barrier(name="calibration")
            if rank == 1:
                pending = comm.isend(buf, 0)
                start = time.perf_counter()
                while time.perf_counter() - start < HELD_COMPUTE_S:
                    work @ work
                comm.wait_all([pending])
            elif rank == 0:
                start = time.perf_counter()
                comm.recv(buf, 1)
                out.append(time.perf_counter() - start)
    return out


@contextlib.contextmanager
def _threads_pinned(rank: int):
    """Every thread of this process on one core (the rank's among those it may use),
    each thread's own setting back afterwards."""
    import os
    cores = sorted(os.sched_getaffinity(0))
    before = {}
    for tid in map(int, os.listdir("/proc/self/task")):
        try:
            before[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, {cores[rank % len(cores)]})
        except OSError:             # the thread ended meanwhile
            before.pop(tid, None)
    try:
        yield
    finally:
        for tid, allowed in before.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, allowed)


def bucket_handoffs(rank: int, world_size: int, sizes, steps: int, batch: int = 64) -> None:
    """Both ranks train the MLP ``sizes`` under DDP with lab 05's traced hook (one bucket):
    what a bucket's all-reduce costs its rank beyond the all-reduce itself.

    Each step records "handoff backward" (until the last gradient is ready) and "handoff
    wait" (from then until ``backward()`` returns), as lab 05 splits them; the hook's
    all-reduce is a span on the rank's lane. Before it starts, DDP copies the gradients
    into the bucket and calls the hook; after it ends, the hook divides and copies the
    result back, DDP hands it to the gradients and the thread waiting in ``backward()``
    wakes: measured here, 0.05-0.07 ms from the last gradient to the hook's post and
    0.3-0.5 ms after (lab 05's MLP, five launches, medians), which a prediction of the
    all-reduce alone left out (``course.calibrate``: ``sim.Cluster.handoff_s``).

    Each step also runs the same MLP unwrapped ("plain forward", "plain backward") and
    times DDP's forward ("ddp forward"): what DDP's wrapper adds to a step's passes beyond
    the model's own work (``course.calibrate.ddp_wrapper``: ``sim.Cluster.ddp_wrapper_s``).
    Measured here, in one process: 0.16-0.20 ms on a forward of 0.26 ms, 0.25-0.33 ms on a
    backward of 0.38 ms (with its all-reduce, of one rank; here, the backward is timed to
    its last gradient), the plain and the wrapped step taking turns.
    """
    import time

    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from ..recorders import recorder
    from ..trace import COMPUTE, WAIT, span
    from . import training
    from .data_parallel import traced_hook
    plain = training.build_model("mlp", sizes=sizes, seed=0)
    net = DistributedDataParallel(training.build_model("mlp", sizes=sizes, seed=0))
    net.register_comm_hook({"lane": world_size + rank, "compress": False}, traced_hook)
    last = [0.0]                          # when the last gradient was ready

    def ready(_param) -> None:
        last[0] = time.perf_counter()
    for p in net.parameters():
        p.register_post_accumulate_grad_hook(ready)
    x, y = torch.randn(batch, sizes[0]), torch.randint(0, sizes[-1], (batch,))
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(steps):
        with span("plain forward"):
            loss = loss_fn(plain(x), y)
        with span("plain backward"):
            loss.backward()
        plain.zero_grad(set_to_none=True)
        with span("ddp forward"):
            loss = loss_fn(net(x), y)
        b0 = time.perf_counter()
        loss.backward()
        b1 = time.perf_counter()
        recorder().add("handoff backward", COMPUTE, b0, last[0])
        recorder().add("handoff wait", WAIT, last[0], b1)
        net.zero_grad(set_to_none=True)


def tp_operators(sizes, steps: int, batch: int = 64) -> None:
    """Both ranks run a column-then-row pair of lab 03 (``tensor_parallel``: operator f,
    a column-parallel Linear of ``sizes[1] -> sizes[2]``, ReLU, a row-parallel Linear to
    ``sizes[3]``, operator g) after a plain first Linear, forward and backward: one
    all-reduce in each pass ("sliced forward", "sliced backward"). Taking turns with it,
    the same layers' slices computed without the operators ("unsliced forward", "unsliced
    backward"): the same products, no collective.

    What the sliced step takes beyond its all-reduces and beyond the unsliced one is what
    each collective inside a pass costs its rank (``course.calibrate.tp_operator``): the
    autograd function that calls it (and its backward node), and resuming after it, when
    the rank's next layer finds its caches cold (the slow-down ``calibration_steps``
    times once per pass, here once per collective; both steps add the bias after the
    product, so it cancels). Measured here: 0.15-0.17 ms per collective in three
    launches of its own, 0.16-0.40 ms in the first calibrations of 45 benchmark rounds
    (2026-11-27), where the model had priced none: in lab 03's steps each stretch of
    compute after a collective had taken 0.2-0.4 ms longer than predicted.
    """
    import torch
    import torch.nn.functional as F
    from torch import nn

    from ..trace import span
    from . import tensor_parallel as tp
    torch.manual_seed(0)
    widths = (*sizes, sizes[-1], sizes[-1])[:4]      # a network of two layers: its last twice
    first = nn.Linear(widths[0], widths[1])
    column = tp.ColumnParallelLinear(nn.Linear(widths[1], widths[2]))
    row = tp.RowParallelLinear(nn.Linear(widths[2], widths[3]))
    params = [*first.parameters(), *column.parameters(), *row.parameters()]
    x = torch.randn(batch, widths[0])

    def sliced():
        return row(F.relu(column(F.relu(first(x))))).sum()

    def unsliced():
        y = F.linear(F.relu(F.linear(F.relu(first(x)), column.weight, column.bias)), row.weight)
        return (y + row.bias).sum()
    for _ in range(steps):
        for name, pair in (("unsliced", unsliced), ("sliced", sliced)):
            with span(f"{name} forward"):
                loss = pair()
            with span(f"{name} backward"):
                loss.backward()
            for p in params:
                p.grad = None


CALIBRATION_MESSAGES = (4096, 65536, 1 << 18, 1 << 20, 4 << 20)
