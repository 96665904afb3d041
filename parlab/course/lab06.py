"""Lab 06 (labs/06_parameter_server.ipynb): what its notebook runs, its explorer, its exercises."""
from __future__ import annotations

from ..launcher import launch
from . import lessons, replays
from .exercise import Exercise, check, register, run_on_ranks, whose  # noqa: F401 (labNN.check, labNN.whose)
from .explorer import (HERE, choice, cluster_choices, cluster_for, explorer,
                       refuse_unless_here, slider)


def run_tf_cluster(timeout: float = 180.0, env: dict | None = None, **options) -> dict:
    """A TensorFlow parameter-server cluster, trained in a fresh process; its report.

    ``options`` go to ``parlab.tf.parameter_server.cluster_training`` (num_workers,
    chunks, steps_per_chunk, workers_in_process, kill_worker, ...); ``env``: extra
    environment variables for the cluster's processes. The process and every
    server it started are gone when this returns, whether training succeeded or not.
    Where TensorFlow itself crashes (a fatal signal inside its own code), the cluster runs
    once more in a fresh process, and a line says so.
    """
    import functools
    import re

    from ..errors import WorkerError
    from ..rank_stacks import crashed_in_library
    from ..tf import parameter_server
    for attempt in (1, 2):
        try:
            result = launch(functools.partial(parameter_server.cluster_training, **options), 1,
                            process_group=False, timeout=timeout,
                            env={"TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})})
            return result.results[0]
        except WorkerError as err:
            # TensorFlow's coordinator, rarely, crashes in its own native code while a
            # worker dies (a segmentation fault copying a step's result): a bug of
            # TensorFlow's, not of this lab, so a fresh process gets one more try.
            if attempt == 2 or crashed_in_library(err.remote_traceback) != "tensorflow":
                raise
            signal = re.search(r"killed by \w+", err.summary)
            print(f"TensorFlow's coordinator crashed in TensorFlow's own code "
                  f"({signal.group(0) if signal else 'a fatal signal'}): the cluster runs "
                  "once more, in a fresh process.")


def _rule_problem(fn) -> str | None:
    """What is wrong with an update rule on small known tensors (None: nothing)."""
    import torch
    torch.manual_seed(1)
    for staleness in (0, 3):
        shard, grad = torch.randn(12), torch.randn(12)
        before = shard.clone()
        out = fn(shard, grad.clone(), 0.1, staleness)
        want = before - 0.1 * grad
        if torch.equal(shard, before):
            if isinstance(out, torch.Tensor) and torch.allclose(out, want, atol=1e-6):
                return ("it returns the new parameters but leaves `shard` unchanged: the server "
                        "sends `shard` itself to the workers, so change it in place "
                        "(`shard -= ...` or `shard.sub_(...)`).")
            return "`shard` is unchanged after the call: apply the gradient to it, in place."
        if not torch.allclose(shard, want, atol=1e-6):
            step = shard - before
            where = f"with lr 0.1 and staleness {staleness}"
            if torch.allclose(step, 0.1 * grad, atol=1e-6):
                return (f"{where}, the parameters moved along the gradient, uphill: the loss "
                        "would grow. Gradient descent goes the other way.")
            scale = float((step @ -grad) / (grad @ grad))
            if torch.allclose(step, -scale * grad, atol=1e-6):
                return (f"{where}, the parameters moved the right way, but by {scale:.3g} times "
                        "the gradient: how far should one step go? (Plain SGD does not use "
                        "the staleness.)")
            return (f"{where}, the parameters did not move against their gradient: each "
                    "number of `shard` should move against its own number of `grad`.")
    return None


def _train_with_rule(rank: int, world_size: int, rule, steps: int = 40) -> dict:
    from ..torch.parameter_server import train_parameter_server
    return train_parameter_server(rank, world_size, mode="async", num_servers=1, model="mlp",
                                  global_batch=64, steps=steps, lr=0.2, update=rule)


def check_update_rule(fn, steps: int = 40):
    """Check the learner's asynchronous update rule, then train with it on real ranks.

    Returns the rule the rest of the lab uses: the learner's when it is right, otherwise
    ``sgd_update`` (and it says why).
    """
    import functools

    import numpy as np

    from ..torch.parameter_server import accuracy, sgd_update
    try:
        problem = _rule_problem(fn)
    except NotImplementedError:
        print("[async_update] not attempted yet: the lab goes on with the reference rule.")
        return sgd_update
    except Exception as exc:  # noqa: BLE001 - reported to the learner in words
        problem = f"it raised {type(exc).__name__}: {exc}"
    if problem:
        print(f"[async_update] not yet right: {problem}\nThe lab goes on with the reference rule.")
        return sgd_update
    results = run_on_ranks("async_update", functools.partial(_train_with_rule, steps=steps), fn, 3)
    if results is None:
        return sgd_update
    applied = results[0]["applied"]
    first = np.mean([a["loss"] for a in applied[:10]])
    last = np.mean([a["loss"] for a in applied[-10:]])
    print(f"[async_update] correct. An asynchronous server with your rule applied "
          f"{len(applied)} pushes from 2 workers: loss {first:.2f} -> {last:.2f}, test accuracy "
          f"{accuracy(results):.0%}.")
    return fn


def _push_staleness(events):
    # an asynchronous server: every push is applied at once (one more version); a pull
    # reads the current version; a push's staleness is the updates since its worker read
    version, read, out = 0, {}, []
    for action, worker in events:
        if action == "pull":
            read[worker] = version
        else:
            out.append(version - read[worker])
            version += 1
    return out


register(Exercise(
    name="push_staleness",
    reference=_push_staleness,
    cases=[([("pull", 1), ("pull", 2), ("push", 1), ("pull", 1), ("push", 2), ("pull", 2)],),
           ([("pull", 1), ("push", 1), ("pull", 1), ("push", 1)],),
           ([("pull", 1), ("pull", 2), ("pull", 3), ("push", 3), ("pull", 3), ("push", 3),
             ("push", 1), ("push", 2)],),
           ([("pull", 2), ("pull", 1), ("push", 1), ("pull", 1), ("push", 1), ("pull", 1),
             ("push", 1), ("pull", 1), ("push", 2), ("pull", 2)],),
           # a late pull: worker 1 reads worker 2's update before pushing, so it is not
           # stale; a rule that counts others' pushes and ignores pulls says 1
           ([("pull", 2), ("push", 2), ("pull", 1), ("push", 1), ("pull", 2), ("push", 2)],)],
    hint="keep a version number that the server increases with every gradient it applies, "
         "and remember which version each worker last read. A worker's own earlier pushes "
         "do not make its next gradient stale if it pulled after them.",
    close=lambda got, want: list(got) == list(want),
))


def parameter_server_explorer(here, measured=None, net=None, *, per_worker: int = 32):
    """Lab 06: a parameter server and n workers, one of them slower (PREDICTED).

    here: this machine as the lab calibrated it; measured: the per-layer costs of the
    lab's model measured here (``sim.Measured``); net: that model (``sim.Network``, e.g.
    ``torch.calibrate.network_of(models.cnn(), (1, 8, 8))``). Every worker takes
    ``per_worker`` samples a step (lab 06: 2 workers, global batch 64), whatever their
    number. Throughput counts the gradients the server applies per second. "measure it here" runs
    ``parameter_server.train_parameter_server`` with the lab's CNN (at most 3 workers).
    """
    from .. import sim

    def predicted(workers, slow, mode, cluster, steps):
        c = cluster_for(cluster, workers + 1, here)
        costs = measured if cluster == HERE else None
        return sim.parameter_server(net, c, per_worker * workers, workers=workers, mode=mode,
                                    slow={workers: slow} if slow > 1 else None, steps=steps,
                                    costs=costs)

    def rate(tl):
        pushes = [s for s in tl.spans if s.rank == 0 and s.kind == "comm"
                  and s.name == "receive gradients"]
        return len(pushes) / (max(s.end for s in pushes) - tl.start)

    def predict(workers, slow, mode, cluster):
        tl = predicted(workers, slow, mode, cluster, 40)
        other = predicted(workers, slow, "async" if mode == "sync" else "sync", cluster, 40)
        sync, async_ = (tl, other) if mode == "sync" else (other, tl)
        return tl, (f"PREDICTED: {rate(tl):,.0f} gradients per second {mode}hronously; "
                    f"asynchronous / synchronous throughput {rate(async_) / rate(sync):.2f}x"), \
            f"{mode}, {workers} workers, the last {slow}x slower, {cluster_for(cluster, workers + 1, here).name}"

    def measure(workers, slow, mode, cluster):
        from ..launcher import launch
        from ..torch import parameter_server as ps
        refuse_unless_here(cluster, workers + 1)
        run = launch(ps.train_parameter_server, workers + 1, kwargs=dict(
            mode=mode, model="cnn", global_batch=per_worker * workers, steps=30, lr=0.2,
            slow={workers: slow} if slow > 1 else None))
        tl = run.timeline
        mid = tl.start + tl.duration / 2
        pred = predicted(workers, slow, mode, cluster, 20)
        width = min(0.05, pred.duration / 2)
        pmid = pred.start + pred.duration / 2
        return tl.window(mid, mid + width), pred.window(pmid, pmid + width)

    controls = {"workers": slider("workers", range(2, 9), 2),
                "slow": slider("last worker slower by", [1, 1.5, 2, 3, 4, 6], 3),
                "mode": choice("server", ["sync", "async"]),
                "cluster": choice("cluster", cluster_choices(here))}
    return explorer(predict, controls, measure=measure)


# ------------------------------------------------------------------ lessons
STRAGGLER = {2: 3.0}    # worker rank 2 computes 3x slower (emulated: it idles for the rest,
#                         a time measured once: parameter_server.EmulatedSlowdown)


def straggler_runs(devices=None, update=None, steps: int = 100, model: str = "cnn") -> dict:
    """The synchronous and the asynchronous server (rank 0) with two workers, rank 2 of
    them emulated 3x slower: {"sync": LaunchResult, "async": LaunchResult}."""
    from ..hardware import devices as find_devices
    from ..torch import parameter_server as ps
    devices = devices or find_devices(3)
    rule = {} if update is None else {"update": update}    # None: the server's own rule
    return {mode: launch(ps.train_parameter_server, 3, devices=devices, kwargs=dict(
        mode=mode, model=model, global_batch=64, steps=steps, lr=0.2, slow=STRAGGLER, **rule))
        for mode in ("sync", "async")}


def arrivals(tl) -> list[tuple[float, int]]:
    """(when, worker) of each gradient that reached server 0 on ``tl`` (measured or
    replayed), in the order it took them in: seconds from the server's first span."""
    start = min(s.start for s in tl.spans if s.rank == 0)
    return sorted((s.end - start, s.peer) for s in tl.spans
                  if s.rank == 0 and s.kind == "comm" and s.name == "receive gradients")


def while_all_push(tl) -> dict:
    """The gradients that reached server 0 while every worker was still pushing: until
    the first worker's last one. After it, the others push alone: a run stops after a
    number of gradients, and a replay keeps each worker's count from the run.
    {"until": seconds, "pushes": {worker: count}}."""
    got = arrivals(tl)
    until = min(max(t for t, w in got if w == peer) for peer in {w for _, w in got})
    pushes: dict[int, int] = {}
    for t, w in got:
        if t <= until:
            pushes[w] = pushes.get(w, 0) + 1
    return {"until": until, "pushes": pushes}


def samples_per_s(tl, global_batch: int = 64, workers: int = 2) -> float:
    """Training samples per second on ``tl`` while every worker pushes (``while_all_push``):
    each gradient carries global_batch / workers samples."""
    part = while_all_push(tl)
    return sum(part["pushes"].values()) * global_batch / workers / part["until"]


def history_on(tl, run) -> list[dict]:
    """Server 0's record of each applied gradient (``parameter_server.history``), timed
    by ``tl``: on a replay, when the gradient reached the server there. A worker's k-th
    gradient is its k-th there too; the workers' turns may differ from the run's."""
    from ..torch import parameter_server as ps
    times: dict[int, list[float]] = {}
    for t, w in arrivals(tl):
        times.setdefault(w, []).append(t)
    seen: dict[int, int] = {}
    out = []
    for h in ps.history(run.results):
        k = seen[h["worker"]] = seen.get(h["worker"], -1) + 1
        out.append(dict(h, time=times[h["worker"]][k]))
    return sorted(out, key=lambda h: h["time"])


def named(tl, labels: dict):
    """``tl`` with its lanes named ``labels`` ({rank: role}), still drawn as what it is
    (``replays.lanes_named``)."""
    return replays.lanes_named(tl, labels)


def straggler_numbers(runs: dict, replayed: dict | None = None) -> dict:
    """What lesson 06.async_beats_sync reads from ``straggler_runs``, replayed on
    dedicated devices (``replayed``: {mode: replay}, made here if not given): samples per
    second of each mode, and how many times fewer gradients the slow worker pushed than
    the fast one when nobody waited for it (asynchronous, while both pushed: its
    slowdown)."""
    replayed = replayed or {m: replays.replayed(r) for m, r in runs.items()}
    pushes = while_all_push(replayed["async"])["pushes"]
    return {"speed": {m: samples_per_s(tl) for m, tl in replayed.items()},
            "slowdown": pushes.get(1, 0) / max(pushes.get(2, 0), 1),
            "source": replays.source(next(iter(replayed.values())))}


def _straggler_experiment() -> dict:
    return straggler_numbers(straggler_runs())


@lessons.lesson("06.async_beats_sync",
                "with one worker computing 3x slower, the asynchronous server trains on more samples "
                "per second than the synchronous one (at least 1.25x; without communication "
                "costs, (s + 1) / 2 = 2x for a worker s = 3 times slower)",
                _straggler_experiment)
def async_beats_sync(m: dict):
    ratio = m["speed"]["async"] / m["speed"]["sync"]
    s = m["slowdown"]
    figures = (f"async {ratio:.2f}x sync; the slow worker pushed {s:.1f}x fewer gradients "
               f"than the fast one (no-communication model for that slowdown: {(s + 1) / 2:.2f}x)")
    why = (f"the slow worker was only {s:.1f}x slower" if s < 2.5 else
           "messages took the time the no-communication model leaves out")
    return ratio >= 1.25, figures, why
