"""Lab 06 in TensorFlow: ParameterServerStrategy on a real cluster.

* ``ParameterServerStrategy`` with a ``ClusterCoordinator``: a coordinator (this process)
  places the variables on parameter-server tasks and schedules training steps on worker
  tasks, each of which runs them asynchronously, as soon as it is free. Every task is a
  ``tf.distribute.Server`` addressed as 127.0.0.1, but gRPC binds its port on every
  interface: TensorFlow's ``GrpcServer::Init`` (grpc_server_lib.cc) listens on
  ``"0.0.0.0:" + port`` whatever host the cluster names, and offers no setting for it.

``cluster_training`` runs the whole cluster inside one process started by
``parlab.launch`` (see ``parlab.course.lab06.run_tf_cluster``), so the notebook's kernel
never holds gRPC servers, and stops every process it started before returning, also
when training fails. The servers live no
longer than that process: worker processes die with it (parent-death signal), and stay
in its process group, which the launcher stops after the launch whatever happened.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time

import numpy as np

from ..system import listening_addresses
from .cluster import HOST, free_ports


# ------------------------------------------------------------------ the cluster
def cluster_spec(num_workers: int, num_ps: int = 1) -> dict:
    """Addresses for the tasks, all on 127.0.0.1, on ports that were free a moment ago."""
    if num_workers < 1 or num_ps < 1:
        raise ValueError(f"a parameter-server cluster needs at least one worker and one "
                         f"server, got {num_workers} worker(s) and {num_ps} server(s)")
    ports = free_ports(num_workers + num_ps)
    return {"worker": [f"{HOST}:{p}" for p in ports[:num_workers]],
            "ps": [f"{HOST}:{p}" for p in ports[num_workers:]]}


def _server_config(tf, threads: int):
    config = tf.compat.v1.ConfigProto()
    # On 2 cores an in-process cluster deadlocks with TensorFlow's default inter-op
    # pool (one thread per core): several servers' blocking RPC handlers then occupy
    # every thread. Three or more per server keeps it moving.
    config.inter_op_parallelism_threads = threads
    return config


def _serve_forever(spec: dict, job: str, index: int, threads: int, parent_pid: int) -> None:
    """Body of a server process: start a tf.distribute.Server and wait to be stopped."""
    from ..processes import die_with_parent
    die_with_parent(parent_pid)  # a coordinator that crashes takes its servers along
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    from ..hardware import quiet_tensorflow
    quiet_tensorflow()
    import tensorflow as tf
    server = tf.distribute.Server(tf.train.ClusterSpec(spec), job_name=job, task_index=index,
                                  protocol="grpc", config=_server_config(tf, threads), start=True)
    server.join()


def _wait_listening(spec: dict, procs, timeout: float = 60.0) -> None:
    """Return once every task's port accepts connections; fail fast if a server died."""
    import socket
    pending = [a for addrs in spec.values() for a in addrs]
    end = time.monotonic() + timeout
    while pending:
        for proc in procs:
            if not proc.is_alive():
                raise RuntimeError(f"a TensorFlow server process exited during start-up "
                                   f"(exit code {proc.exitcode})")
        host, port = pending[0].rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=0.2).close()
            pending.pop(0)
        except OSError:
            if time.monotonic() > end:
                raise TimeoutError(f"no TensorFlow server answered on {pending[0]} within "
                                   f"{timeout:.0f} s") from None
            time.sleep(0.1)


class _StderrToFile:
    """Send this process's stderr (fd 2, Python's sys.stderr and TensorFlow's logger) to a
    file, and so that of every process it starts meanwhile; restore all on exit.

    A killed worker makes TensorFlow's coordinator log dozens of gRPC errors (C++ and
    Python), one per lost step; the report summarises them in a line instead.
    """

    def __init__(self, folder: str = "traces"):
        # beside the lab's other traces (labs/traces from a notebook), one file rewritten
        # each run: a temporary file kept for the learner to read would pile up in /tmp
        os.makedirs(folder, exist_ok=True)
        self.path = os.path.join(folder, "ps-cluster-errors.log")
        self.file = open(self.path, "w+", encoding="utf-8")

    def __enter__(self):
        import logging
        sys.stderr.flush()
        self.saved_fd, self.saved_stderr = os.dup(2), sys.stderr
        os.dup2(self.file.fileno(), 2)
        sys.stderr = self.file
        self.handlers = [(h, h.setStream(self.file)) for h in logging.getLogger("tensorflow").handlers
                         if isinstance(h, logging.StreamHandler)]
        return self

    def __exit__(self, *exc):
        self.file.flush()
        for handler, stream in self.handlers:
            handler.setStream(stream)
        sys.stderr = self.saved_stderr
        os.dup2(self.saved_fd, 2)
        os.close(self.saved_fd)
        return False

    def summary(self, killed_worker: int) -> dict:
        self.file.seek(0)
        lines = [line for line in self.file.read().splitlines() if line.strip()]
        self.file.close()
        kinds = sorted({k for k in ("UnavailableError", "Socket closed", "Connection reset by peer",
                                    "Connection refused", "CANCELLED")
                        if any(k in line for line in lines)})
        text = (f"TensorFlow logged {len(lines)} lines of errors while worker {killed_worker} "
                f"was gone ({', '.join(kinds) or 'no error named'}): the coordinator lost the "
                "steps running there and scheduled them again on the other worker. "
                f"Full log: {self.path}")
        return {"lines": len(lines), "log": self.path, "summary": text}


def cluster_training(rank: int, world_size: int, num_workers: int = 2, chunks: int = 8,
                     steps_per_chunk: int = 25, batch: int = 32, lr: float = 0.05,
                     workers_in_process: bool = True, kill_worker: int | None = None,
                     kill_after_chunk: int = 2, threads: int = 4) -> dict:
    """Body for ``parlab.launch(cluster_training, 1, process_group=False)``.

    Starts one parameter server and ``num_workers`` workers on 127.0.0.1, trains the
    course's MLP with a custom step scheduled through a ``ClusterCoordinator``, and
    reports the loss after each chunk of steps.

    workers_in_process: True runs every server inside this process (an in-process
    cluster, fast to start); False gives each worker a process of its own, which is what
    lets ``kill_worker`` (a worker index) really die, by SIGKILL, right after chunk
    ``kill_after_chunk`` is scheduled. The parameter server always lives in this process.
    While a worker is killed, TensorFlow's error messages (every process's stderr) go to a
    file; the report's "errors" summarises them in one line.
    """
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    from ..hardware import quiet_tensorflow
    quiet_tensorflow()
    if kill_worker is not None and workers_in_process:
        raise ValueError("only a worker with a process of its own can be killed: "
                         "pass workers_in_process=False")
    if kill_worker is not None:
        if not 0 <= kill_worker < num_workers:
            raise ValueError(f"kill_worker={kill_worker}: there are workers 0..{num_workers - 1}")
        if num_workers < 2:
            raise ValueError("killing the only worker leaves nobody to train (the coordinator "
                             "would wait for it forever): use num_workers >= 2")
        if not 0 <= kill_after_chunk < chunks:
            raise ValueError(f"kill_after_chunk={kill_after_chunk}: there are chunks "
                             f"0..{chunks - 1}")
    spec = cluster_spec(num_workers)
    procs = []
    started = time.perf_counter()
    capture = _StderrToFile() if kill_worker is not None else None
    if capture:
        capture.__enter__()       # before the workers start: they inherit it
    try:
        if not workers_in_process:
            ctx = multiprocessing.get_context("spawn")
            procs = [ctx.Process(target=_serve_forever, daemon=True,
                                 args=(spec, "worker", i, threads, os.getpid()))
                     for i in range(num_workers)]
            for proc in procs:
                proc.start()
        import keras
        import tensorflow as tf

        from .. import data as datasets
        from . import models
        config = _server_config(tf, threads)
        cluster = tf.train.ClusterSpec(spec)
        # kept referenced: a tf.distribute.Server stops when it is garbage-collected
        servers = [tf.distribute.Server(cluster, job_name="ps", task_index=0, protocol="grpc",
                                        config=config, start=True)]
        if workers_in_process:
            servers += [tf.distribute.Server(cluster, job_name="worker", task_index=i,
                                             protocol="grpc", config=config, start=True)
                        for i in range(num_workers)]
        _wait_listening(spec, procs)
        addresses = listening_addresses([os.getpid()] + [p.pid for p in procs])
        startup_s = time.perf_counter() - started

        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc")
        strategy = tf.distribute.ParameterServerStrategy(resolver)
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        x, y = datasets.digits("train")
        xt, yt = datasets.digits("test")
        with strategy.scope():
            model = models.mlp()
            opt = keras.optimizers.SGD(lr)
            # The steps add their losses here, on the parameter server, and return nothing:
            # TensorFlow copies a step's result from its worker to this process, and that
            # copy, racing a worker's death, crashed the coordinator (SIGSEGV in identity,
            # coordinator/values.py); without results there is no copy.
            loss_sum = tf.Variable(0.0, trainable=False)
            losses_added = tf.Variable(0.0, trainable=False)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        def dataset_fn():
            # each worker builds its own copy: a differently shuffled endless stream
            return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(y)).repeat().batch(batch)

        iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

        @tf.function
        def step(it):
            def replica(xb, yb):
                with tf.GradientTape() as tape:
                    loss = loss_fn(yb, model(xb))
                opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                        model.trainable_variables))
                loss_sum.assign_add(loss)
                losses_added.assign_add(1.0)
            strategy.run(replica, args=next(it))

        progress, t0, ran = [], time.perf_counter(), 0
        for chunk in range(chunks):
            loss_sum.assign(0.0)
            losses_added.assign(0.0)
            futures = [coordinator.schedule(step, args=(iterator,)) for _ in range(steps_per_chunk)]
            killed = kill_worker is not None and chunk == kill_after_chunk
            if killed:
                time.sleep(0.05)                            # let the chunk get going
                os.kill(procs[kill_worker].pid, signal.SIGKILL)
            coordinator.join()                              # wait for every scheduled step
            for future in futures:
                future.fetch()                              # raises if a step was lost
            ran += len(futures)
            # A step lost with its worker runs again elsewhere; its first run may have
            # added its loss already (and updated the variables): at least once, not once.
            added = float(losses_added.numpy())
            progress.append({"chunk": chunk, "time": time.perf_counter() - t0,
                             "steps scheduled": (chunk + 1) * steps_per_chunk,
                             "steps run": ran,
                             "step runs counted on the server": int(added),
                             "mean loss": float(loss_sum.numpy()) / added,
                             "worker killed here": killed,
                             "workers alive": (num_workers if workers_in_process
                                               else sum(p.is_alive() for p in procs))})
        kernel = model.trainable_variables[0]
        report = {"cluster": spec, "listening": addresses, "startup_s": startup_s,
                  "progress": progress,
                  "test_accuracy": float((np.argmax(model(xt).numpy(), 1) == yt).mean()),
                  "variable device": getattr(kernel, "value", kernel).device,
                  "server pids": [p.pid for p in procs], "coordinator pid": os.getpid()}
        if capture:                  # after the last call that reaches out to the dead worker
            capture.__exit__(None, None, None)
            report["errors"], capture = capture.summary(kill_worker), None
        return report
    finally:
        for proc in procs:           # a server never returns by itself: stop it
            if proc.is_alive():
                proc.kill()
        for proc in procs:
            proc.join(10)
        if capture:                  # training failed: what TensorFlow said goes with it
            capture.__exit__(None, None, None)
            capture.file.seek(0)
            sys.stderr.write(capture.file.read()[-4000:])
