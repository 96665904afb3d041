"""Checkpoints of the hand-written ZeRO-3 (``parlab.torch.zero``): save on n ranks, load on m.

A ``ShardedLinear`` keeps rank i's slice ``flat[i*s:(i+1)*s]`` of the layer's flat vector
[weight.reshape(-1), bias] (length n), padded with zeros to s = ceil(n/w) per rank. DCP
only reshards DTensors, so each layer's vector and its Adam moments are handed to it as
DTensors of global shape (n,), placement Shard(0) on a 1-D mesh of the group, whose local
piece is the shard without its padding. DTensor splits Shard(0) "inline with torch.chunk"
(``Shard.local_shard_size_and_offset``): ceil(n/w) per rank, the last ones shorter or
empty, the same split as the course's; ``split`` checks it for every size it is used on.
DCP records each piece's offset, so loading on another number of ranks reads the right
slices ("load-time resharding", torch.distributed.checkpoint docs).

Keys: ``model.<index>.flat`` (index: the layer's position in the Sequential, as in the
plain model's ``<index>.weight``), ``optim.<index>.exp_avg``, ``optim.<index>.exp_avg_sq``,
``optim.<index>.step`` (Adam's 0-d step tensor, the same on every rank: DCP writes it
once) and Adam's hyperparameters ``optim.lr``, ``optim.beta1``, ... as plain floats.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from . import checkpoint as ck, runtime, training, zero
from .groups import as_group

STRATEGY = "zero3"


def split(n: int, world: int, index: int) -> tuple[int, int]:
    """(valid elements, global offset) of rank ``index``'s shard of a flat vector of n;
    raises if DTensor's Shard(0) split differs from the course's ``zero.shard_size``."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
    s = zero.shard_size(n, world)
    mine = (max(0, min(s, n - index * s)), min(n, index * s))
    (size,), (offset,) = _compute_local_shape_and_global_offset((n,), (world,), [index],
                                                                [Shard(0)])
    if mine[0] and (size, offset) != mine:   # an empty shard's offset does not matter
        raise ValueError(f"DTensor's Shard(0) puts elements [{offset}, {offset + size}) of "
                         f"a vector of {n} on rank {index} of {world}; the ZeRO-3 shard "
                         f"holds [{mine[1]}, {mine[1] + mine[0]}): this torch splits "
                         f"differently, and a checkpoint would mix up the slices")
    return mine


def _mesh(g):
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    return DeviceMesh.from_group(g.pg or dist.group.WORLD, runtime.library_device().type,
                                 mesh=torch.tensor(g.ranks), mesh_dim_names=("dp",))


def layers(model: nn.Module) -> dict:
    """{index: (module, n)}: each Linear or ShardedLinear and its flat length."""
    out = {}
    for i, m in enumerate(model):
        if isinstance(m, (nn.Linear, zero.ShardedLinear)):
            o, k = (m.weight.shape if isinstance(m, nn.Linear)
                    else (m.out_features, m.in_features))
            out[str(i)] = (m, o * k + o)
    return out


def to_dtensors(model: nn.Module, opt: torch.optim.Optimizer, group=None) -> dict:
    """The state DCP saves, or loads in place: every flat vector and Adam moment as a
    DTensor (shape (n,), Shard(0)) whose local piece is a view of this rank's shard
    without its zero tail (no copy when saving)."""
    from torch.distributed.tensor import DTensor, Shard
    g = as_group(group)
    mesh, model_sd, optim_sd = _mesh(g), {}, {}

    def sharded(local, n):
        # shape and stride given: the pieces are uneven, and from_local would otherwise
        # assume w equal pieces (DTensor.from_local docs)
        return DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                  shape=torch.Size([n]), stride=(1,))

    for key, (m, n) in layers(model).items():
        valid, _ = split(n, g.size, g.index)
        p = m.shard
        st = opt.state.get(p, {})
        model_sd[f"{key}.flat"] = sharded(p.detach()[:valid], n)
        for name in ("exp_avg", "exp_avg_sq"):
            t = st[name][:valid] if name in st else torch.zeros(valid, device=p.device)
            optim_sd[f"{key}.{name}"] = sharded(t, n)
        optim_sd[f"{key}.step"] = (st["step"].detach().clone().float().cpu() if "step" in st
                                   else torch.tensor(0.0))
    group0 = opt.param_groups[0]
    optim_sd.update(lr=float(group0["lr"]), beta1=float(group0["betas"][0]),
                    beta2=float(group0["betas"][1]), eps=float(group0["eps"]),
                    weight_decay=float(group0["weight_decay"]))
    return {"model": model_sd, "optim": optim_sd}


def from_dtensors(state: dict, model: nn.Module, opt: torch.optim.Optimizer,
                  group=None) -> None:
    """Copy a loaded ``to_dtensors`` state into the padded shards (zeros in the tail)
    and Adam's state, so that the next ``opt.step()`` continues the saved run."""
    g = as_group(group)
    for key, (m, n) in layers(model).items():
        p, (valid, _) = m.shard, split(n, g.size, g.index)

        def padded(dt):
            out = torch.zeros_like(p.detach())
            out[:valid] = dt.to_local()
            return out

        p.data.copy_(padded(state["model"][f"{key}.flat"]))
        o = state["optim"]
        # the keys torch.optim.Adam keeps per parameter (its _init_group)
        opt.state[p] = {"step": o[f"{key}.step"].detach().clone().float().cpu(),
                        "exp_avg": padded(o[f"{key}.exp_avg"]),
                        "exp_avg_sq": padded(o[f"{key}.exp_avg_sq"])}
    o = state["optim"]
    for pg in opt.param_groups:
        pg.update(lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"],
                  weight_decay=o["weight_decay"])


def check(path, model: nn.Module) -> dict:
    """Refuse, in words, a checkpoint that is not a ZeRO-3 one of ``model`` (plain or
    sharded); reads only the manifest and DCP's metadata. Returns the manifest."""
    path = Path(path)
    manifest = ck.read_manifest(path)
    if manifest.get("strategy") != STRATEGY:
        raise ValueError(f"checkpoint {path.name} was saved by strategy "
                         f"{manifest.get('strategy')!r}, not {STRATEGY!r}: its keys are "
                         f"the plain model's; load it with parlab.torch.checkpoint.load")
    meta = ck._verify_files(path, manifest)
    saved = {k: tuple(m.size) for k, m in meta.state_dict_metadata.items()
             if k.startswith("model.") and hasattr(m, "size")}
    mine = {f"model.{k}.flat": (n,) for k, (_, n) in layers(model).items()}
    if saved != mine:
        raise ValueError(f"checkpoint {path.name} holds flat vectors {saved}; this model's "
                         f"are {mine}: build the model with the sizes it was saved with "
                         f"{tuple(manifest.get('sizes', ()))}")
    return manifest


def load(path, model, opt, group=None) -> dict:
    """Check, then load a ZeRO-3 checkpoint on any number of ranks; returns its manifest."""
    import torch.distributed.checkpoint as dcp
    g, path = as_group(group), Path(path)
    manifest = check(path, model)
    state = to_dtensors(model, opt, g)           # the layout of this world size
    try:
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(path)), process_group=g.pg)
    except Exception as e:
        raise ck._damaged(path, f"reading it failed ({type(e).__name__}: {e})") from None
    from_dtensors(state, model, opt, g)
    return manifest


def train_zero3(rank: int, world_size: int, cfg: ck.Config, *, steps: int, every: int,
                folder, resume: bool = False, group=None) -> dict:
    """Rank function: ``checkpoint.train`` for the hand-written ZeRO-3 (same model, data
    and Adam; the layers reduce-scatter the averaged gradient themselves). Returns
    {"losses", "state": whole weights as numpy ("<index>.weight"/"<index>.bias"),
    "saved": [(step, bytes of this rank's files)], "save_s", "blocked_s", "step_s",
    "start", "params"}."""
    g, device, rows, plain, shapes, params = ck.start_run(cfg, steps, every, group)
    net = zero.shard_model(plain, g)
    del plain
    opt = training.make_optimizer("adam", net.parameters(), cfg.lr)
    start = 0
    if resume and ck.latest(folder) is not None:
        start = load(ck.latest(folder), net, opt, g)["step"]
    manifest = {"strategy": STRATEGY, "parameters": shapes, "sizes": list(cfg.sizes),
                "flat": {k: n for k, (_, n) in layers(net).items()}, "seed": cfg.seed,
                "lr": cfg.lr, "batch_size": cfg.batch_size, "torch": torch.__version__}
    saver = ck.Saver(folder, g, manifest, state_fn=lambda net, opt: to_dtensors(net, opt, g))
    losses, step_s = ck.run_steps(net, opt, saver, cfg, range(start + 1, steps + 1), every,
                                  skip=start, rows=rows, device=device)
    state = {}
    for key, (m, _) in layers(net).items():
        state.update(m.whole(key))
    return {"losses": losses, "state": state, "saved": saver.saved, "save_s": saver.save_s,
            "blocked_s": saver.blocked_s, "step_s": step_s, "start": start, "params": params}
