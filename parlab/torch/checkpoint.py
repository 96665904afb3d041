"""Checkpoints of a sharded run: save on n ranks, resume on any number, survive a crash.

Every ``every`` steps each rank writes its own shard of the model's and the optimizer's
state with PyTorch's distributed checkpoint (DCP, ``torch.distributed.checkpoint``):
FSDP2's parameters and Adam's moments are DTensors, and DCP records which slice of each
tensor every file holds, so a checkpoint written on 4 ranks loads on 2 or on 1 (DCP
"load-time resharding").

A save is committed atomically. Every rank writes into ``.step-000NNN.partial-<id>``; after
a barrier rank 0 writes ``manifest.json`` (step, world size, strategy, parameter shapes,
file sizes) and renames the folder to ``step-000NNN``. A crash while saving leaves only a
``.partial`` folder, which ``latest`` ignores, and the previous checkpoint stays whole.
A rename within one file system is atomic (POSIX ``rename(2)``).

``check`` compares a checkpoint with a model before anything is loaded, and says in words
what differs: a key, a shape, a missing manifest, a truncated file.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from . import comm, data_parallel, models, runtime, training
from .groups import as_group

STRATEGIES = ("fsdp2", "replicated")
MANIFEST = "manifest.json"
_NAME = re.compile(r"^step-(\d{6})$")


@dataclass(frozen=True)
class Config:
    """The run: the MLP's widths, the global batch, Adam's learning rate, the seed."""

    sizes: tuple = (64, 32, 32, 10)
    batch_size: int = 32
    lr: float = 1e-3
    seed: int = 0


def step_name(step: int) -> str:
    return f"step-{step:06d}"


# ------------------------------------------------------------------ finding and checking
def latest(folder) -> Path | None:
    """The newest complete checkpoint in ``folder`` (a ``step-NNNNNN`` folder with a
    manifest), or None. ``.partial`` folders, left by a save that did not finish, are
    ignored."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    done = [p for p in folder.iterdir()
            if _NAME.match(p.name) and (p / MANIFEST).is_file()]
    return max(done, key=lambda p: int(_NAME.match(p.name).group(1)), default=None)


def _damaged(path: Path, why: str) -> ValueError:
    return ValueError(f"checkpoint {path.name} ({path}) is damaged or incomplete: {why}. "
                      "Nothing was loaded; resume from another one (latest(folder) "
                      "finds the newest complete one) or delete this folder.")


def read_manifest(path) -> dict:
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"no checkpoint folder at {path}")
    f = path / MANIFEST
    if not f.is_file():
        raise _damaged(path, f"it has no {MANIFEST}, so its save never finished")
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise _damaged(path, f"{MANIFEST} cannot be read ({e})") from None


def _verify_files(path: Path, manifest: dict):
    """Every file the manifest lists exists with its recorded size, and DCP's metadata
    reads and points inside them. Returns that metadata."""
    from torch.distributed.checkpoint import FileSystemReader
    for name, size in manifest.get("files", {}).items():
        f = path / name
        if not f.is_file():
            raise _damaged(path, f"file {name} is missing")
        if f.stat().st_size != size:
            raise _damaged(path, f"file {name} has {f.stat().st_size} bytes, the manifest "
                                 f"recorded {size} (truncated or overwritten)")
    try:
        meta = FileSystemReader(str(path)).read_metadata()
    except Exception as e:                   # DCP's reader raises pickle/OS errors as they come
        raise _damaged(path, f"its DCP metadata file .metadata cannot be read "
                             f"({type(e).__name__}: {e})") from None
    # each stored item is (file, offset, length): a file that ends early is truncated
    for index, info in (meta.storage_data or {}).items():
        f = path / info.relative_path
        if not f.is_file() or f.stat().st_size < info.offset + info.length:
            raise _damaged(path, f"file {info.relative_path} ends before {index.fqn} "
                                 f"(needs {info.offset + info.length} bytes)")
    return meta


def _shape(t) -> tuple:
    return tuple(int(s) for s in t)


def check(path, model: nn.Module) -> dict:
    """Refuse, in words, a checkpoint that does not fit ``model``; returns its manifest.

    Compares the model entries of DCP's metadata (``FileSystemReader.read_metadata()``:
    key -> global size) with ``model.state_dict()`` (a DTensor's ``shape`` is the global
    one, so a sharded model compares as a whole one). Reads only the manifest and
    metadata, so every rank reaches the same verdict before any tensor is loaded.
    """
    path = Path(path)
    manifest = read_manifest(path)
    if manifest.get("strategy", STRATEGIES[0]) not in STRATEGIES:
        raise ValueError(f"checkpoint {path.name} was saved by strategy "
                         f"{manifest['strategy']!r}, whose state this loader does not read: "
                         f"load it with that strategy's loader (zero3: checkpoint_zero3.load)")
    meta = _verify_files(path, manifest)
    saved = {k[len("model."):]: _shape(m.size) for k, m in meta.state_dict_metadata.items()
             if k.startswith("model.") and hasattr(m, "size")}
    mine = {k: _shape(v.shape) for k, v in model.state_dict().items()}
    sizes = manifest.get("sizes")
    hint = (f"build the model with the sizes it was saved with {tuple(sizes)}" if sizes
            else f"build the model its {MANIFEST} describes")
    for k in saved:
        if k not in mine:
            raise ValueError(f"checkpoint {path.name} has {k} of shape {saved[k]}, which "
                             f"this model lacks: {hint}")
    for k in mine:
        if k not in saved:
            raise ValueError(f"this model has {k} of shape {mine[k]}, which checkpoint "
                             f"{path.name} lacks: {hint}")
        if saved[k] != mine[k]:
            raise ValueError(f"checkpoint {path.name} has {k} of shape {saved[k]}; this "
                             f"model's is {mine[k]}: {hint}")
    return manifest


# ------------------------------------------------------------------ sizes
def expected_bytes(params: int, world_size: int, strategy: str = "fsdp2") -> float:
    """Bytes of shard files one rank writes: parameters plus Adam's two moments, float32,
    over the ranks, metadata left out.

    fsdp2: each rank holds 1/n of every tensor and writes that. replicated: every rank
    holds everything, and DCP's planner has each tensor written once, by one rank,
    spreading the tensors over the ranks (``_dedup_save_plans``): the same average, but
    one rank's share varies by up to a tensor.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    return 3 * 4 * params / world_size


def _my_files(folder: Path, index: int) -> int:
    # FileSystemWriter names rank i's files __i_<k>.distcp (i: position in the group)
    return sum(f.stat().st_size for f in folder.glob(f"__{index}_*.distcp"))


# ------------------------------------------------------------------ the model
def _fsdp2(model: nn.Module, g) -> nn.Module:
    """FSDP2 on a 1-D DeviceMesh of the group's ranks: each Linear, then the root
    (as ``parlab.torch.zero`` builds it)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    mesh = DeviceMesh.from_group(g.pg or dist.group.WORLD, runtime.library_device().type,
                                 mesh=torch.tensor(g.ranks), mesh_dim_names=("dp",))
    for m in model.modules():
        if list(m.parameters(recurse=False)):
            fully_shard(m, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _state(net, opt) -> dict:
    """The model's and the optimizer's state dicts, sharded as they are held (DTensors
    under FSDP2), keyed by parameter name: what DCP saves and loads in place."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    model_sd, optim_sd = get_state_dict(net, opt)
    return {"model": model_sd, "optim": optim_sd}


def load(path, net, opt, g) -> dict:
    """Check, then load the checkpoint at ``path`` into ``net`` and ``opt`` on any number
    of ranks (DCP reshards); returns its manifest."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict
    path = Path(path)
    manifest = check(path, net)
    state = _state(net, opt)
    try:
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(path)), process_group=g.pg)
    except Exception as e:
        raise _damaged(path, f"reading it failed ({type(e).__name__}: {e})") from None
    set_state_dict(net, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return manifest


# ------------------------------------------------------------------ saving
class Saver:
    """Saves and commits checkpoints for one rank; with ``asynchronous`` the files are
    written by a background thread while training goes on.

    DCP's ``async_save`` stages a CPU copy of the state, then runs ``save`` in a thread,
    whose collectives would interleave with the training's on the same gloo group: it
    gets a process group of its own (the DCP async tutorial's advice). It returns a
    ``concurrent.futures.Future``; the checkpoint is committed once it is done: at the
    next save or at the end, a point every rank reaches in the same order.
    """

    def __init__(self, folder, g, manifest: dict, asynchronous=False, fail_at=None,
                 state_fn=None):
        import torch.distributed as dist
        self.folder, self.g, self.manifest = Path(folder), g, manifest
        # what to save of (net, opt): DCP's state dicts, or a strategy's own (ZeRO-3 by hand)
        self.state_fn = state_fn or _state
        self.asynchronous, self.fail_at = asynchronous, fail_at
        self.saved, self.save_s, self.blocked_s = [], [], []
        self.rng: dict[int, list] = {}
        self.pending = None
        self.pg = None
        if asynchronous:
            self.pg = dist.new_group(list(g.ranks), backend="gloo",
                                     use_local_synchronization=True)
        if g.first:
            self.folder.mkdir(parents=True, exist_ok=True)

    def _agreed_id(self) -> str:
        # random, not seeded: a rerun after a crash must not reuse the crashed save's folder
        t = torch.tensor([secrets.randbits(31) if self.g.first else 0], dtype=torch.int64,
                         device=runtime.library_device())
        comm.broadcast(t, self.g.ranks[0], group=self.g, name="checkpoint id")
        return f"{int(t.item()):08x}"

    def save(self, step: int, net, opt) -> None:
        import torch.distributed.checkpoint as dcp
        started = time.perf_counter()
        self.finish()                                 # at most one save in flight
        partial = self.folder / f".{step_name(step)}.partial-{self._agreed_id()}"
        # the random state as it stands at this step (rank 0's: the ranks draw alike)
        self.rng[step] = torch.get_rng_state().tolist()
        writer = dcp.FileSystemWriter(str(partial))
        state = self.state_fn(net, opt)
        if self.asynchronous:
            fut = dcp.async_save(state, storage_writer=writer, process_group=self.pg)
            done = {}
            fut.add_done_callback(lambda _f: done.setdefault("t", time.perf_counter()))
            self.pending = (step, partial, started, fut, done)
        else:
            dcp.save(state, storage_writer=writer, process_group=self.g.pg)
            self._commit(step, partial)
            self.save_s.append(time.perf_counter() - started)
        self.blocked_s.append(time.perf_counter() - started)

    def finish(self) -> float:
        """Wait for the save in flight, if any, and commit it; returns seconds waited."""
        if self.pending is None:
            return 0.0
        t0 = time.perf_counter()
        step, partial, started, fut, done = self.pending
        self.pending = None
        fut.result()                                  # raises what the writer thread raised
        self._commit(step, partial)
        self.save_s.append(done.get("t", time.perf_counter()) - started)
        return time.perf_counter() - t0

    def _commit(self, step: int, partial: Path) -> None:
        self.saved.append((step, _my_files(partial, self.g.index)))
        if self.fail_at is not None and tuple(self.fail_at) == (self.g.rank, step):
            os._exit(1)                               # a crash between the shards and the commit
        comm.barrier(group=self.g, name="checkpoint written")
        if self.g.first:
            manifest = dict(self.manifest, step=step, world_size=self.g.size,
                            rng=self.rng.pop(step, None),
                            files={f.name: f.stat().st_size for f in sorted(partial.iterdir())
                                   if f.is_file()})
            _write_synced(partial / MANIFEST, json.dumps(manifest, indent=1))
            final = self.folder / step_name(step)
            old = None
            if final.exists():                        # the same step saved again: replace it
                old = final.with_name(f".{final.name}.old-{partial.name.rsplit('-', 1)[1]}")
                os.rename(final, old)
            os.rename(partial, final)
            _sync_folder(self.folder)
            for stale in self.folder.glob(f".{step_name(step)}.*"):
                shutil.rmtree(stale, ignore_errors=True)     # crashed saves of this step


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _sync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (fsync of the directory, POSIX)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ------------------------------------------------------------------ the rank function
def start_run(cfg: Config, steps: int, every: int, group):
    """Check the settings; (group, device, this rank's rows of a batch, the MLP seeded
    alike on every rank and world size, its parameters' shapes, their count)."""
    if every < 1 or steps < 0:
        raise ValueError(f"every must be at least 1 and steps at least 0, got {every}, {steps}")
    g, device = as_group(group), runtime.library_device()
    rows = g.rows(cfg.batch_size, "global batch")
    torch.manual_seed(cfg.seed)              # the same start on every rank and world size
    net = models.mlp(tuple(cfg.sizes)).to(device)
    shapes = {k: list(v.shape) for k, v in net.state_dict().items()}
    return g, device, rows, net, shapes, sum(p.numel() for p in net.parameters())


def run_steps(net, opt, saver, cfg: Config, steps: range, every: int, *, skip: int, rows,
              device, after_backward=None, after_step=None) -> tuple[list, list]:
    """The training loop every strategy shares: batch k of ``digit_batches`` is step k's
    (the first ``skip`` are passed over: the data's position), this rank's ``rows`` of
    it, Adam's step, a save every ``every`` steps. after_backward: what the strategy
    does with the gradients (replicated: average them). Returns ([(step, loss)],
    [seconds a step])."""
    batches = training.digit_batches("mlp", cfg.batch_size)
    for _ in range(skip):
        next(batches)
    losses, step_s = [], []
    for step in steps:
        t0 = time.perf_counter()
        x, y = training.on_device(*next(batches), device, rows)
        loss = nn.functional.cross_entropy(net(x), y)
        loss.backward()
        if after_backward is not None:
            after_backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append((step, loss.item()))
        runtime.synchronize()
        step_s.append(time.perf_counter() - t0)
        if after_step is not None:           # the step's own work, before its save
            after_step(step)
        if step % every == 0:
            saver.save(step, net, opt)
    return losses, step_s


def train(rank: int, world_size: int, cfg: Config, *, steps: int, every: int, folder,
          resume: bool = False, strategy: str = "fsdp2", group=None, fail_at=None,
          async_save: bool = False, after_step=None, restore: str = "all") -> dict:
    """Rank function: train the MLP with Adam up to step ``steps``, saving every ``every``.

    steps: the step to stop after, counted from the run's start: a resumed run trains
    only the steps after its checkpoint's. Batch k of ``digit_batches`` is step k's
    global batch whatever the world size; each rank takes its rows and the gradients
    are averaged (FSDP2's reduce-scatter, or an all-reduce for "replicated").
    resume: continue from ``latest(folder)`` (from step 0 if there is none).
    fail_at: (rank, step): that rank dies while saving that step (tests).
    async_save: write checkpoints in the background (``dcp.async_save``).
    restore: on resuming, "all" (the weights, Adam's state and the data's position) or
    "weights" (the weights alone: a fresh Adam, the data from its first batch), to show
    what the other two are for.
    after_step: called as ``after_step(step)`` once step ``step``'s optimizer step is
    taken, before that step's save (so what it draws from the random state is saved, as
    a dropout's draws would be); ``parlab.torch.elastic`` kills a rank there to rehearse
    a restart.

    Returns {"losses": [(step, loss)], "state": the whole weights (numpy), "saved":
    [(step, bytes of this rank's shard files)], "save_s", "blocked_s" (how long the
    training stopped for each save), "step_s", "start": the step it resumed from,
    "params", "end_wait_s": the wait for the last asynchronous save}.
    """
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         get_model_state_dict)
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if restore not in ("all", "weights"):
        raise ValueError(f"restore must be 'all' or 'weights', got {restore!r}")
    g, device, rows, net, shapes, params = start_run(cfg, steps, every, group)
    if strategy == "fsdp2":
        net = _fsdp2(net, g)
    opt = training.make_optimizer("adam", net.parameters(), cfg.lr)

    start = 0
    skip = 0                                 # batches already trained on
    if resume and latest(folder) is not None:
        saved = load(latest(folder), net, opt, g)
        start = saved["step"]
        if restore == "weights":
            opt = training.make_optimizer("adam", net.parameters(), cfg.lr)
        else:
            skip = start
            if saved.get("rng") is not None:         # the random state at the save
                torch.set_rng_state(torch.tensor(saved["rng"], dtype=torch.uint8))
    manifest = {"strategy": strategy, "parameters": shapes, "sizes": list(cfg.sizes),
                "seed": cfg.seed, "lr": cfg.lr, "batch_size": cfg.batch_size,
                "torch": torch.__version__}
    saver = Saver(folder, g, manifest, asynchronous=async_save, fail_at=fail_at)
    average = (lambda: data_parallel.average_gradients(net, g)) if strategy == "replicated" \
        else None
    losses, step_s = run_steps(net, opt, saver, cfg, range(start + 1, steps + 1), every,
                               skip=skip, rows=rows, device=device, after_backward=average,
                               after_step=after_step)
    end_wait = saver.finish()
    full = get_model_state_dict(net, options=StateDictOptions(full_state_dict=True))
    return {"losses": losses, "state": {k: training.to_numpy(v) for k, v in full.items()},
            "saved": saver.saved, "save_s": saver.save_s, "blocked_s": saver.blocked_s,
            "step_s": step_s, "start": start, "params": params, "end_wait_s": end_wait,
            "random_draw": torch.rand(1).item()}   # equal after a resume: the state came back
