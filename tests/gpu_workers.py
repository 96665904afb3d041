"""Importable rank functions for tests/test_gpu.py and tests/test_staging.py.

The staging workers run the shared-GPU path of the traced layer (copy to host, gloo,
copy back) on whatever device the rank has: forced on CPU tensors here, on CUDA tensors in
a shared-GPU launch.
"""
import torch

from parlab.torch import comm, runtime


def staged_ops(rank, world_size, force=True):
    """Every traced operation once, with host staging forced when ``force``; results as numpy."""
    before = runtime.stage_through_host("all") if force else None
    device = runtime.rank_device()
    out = {"device": str(device), "staging": runtime.host_staging()}
    x = torch.full((4,), float(rank + 1), device=device)
    same = x
    comm.all_reduce(x)
    out["all_reduce"] = x.cpu().numpy()
    out["in_place"] = x is same
    y = torch.full((4,), float(rank + 1), device=device)
    out["avg"] = comm.all_reduce(y, "avg").cpu().numpy()
    b = torch.full((3,), float(rank), device=device)
    out["broadcast"] = comm.broadcast(b, 1).cpu().numpy()
    out["all_gather"] = [t.cpu().numpy() for t in comm.all_gather(torch.tensor([float(rank)], device=device))]
    rs = torch.arange(2.0 * world_size, device=device) * (rank + 1)
    out["reduce_scatter"] = comm.reduce_scatter(rs).cpu().numpy()
    even = torch.arange(world_size, dtype=torch.float32, device=device) + 10.0 * rank
    out["all_to_all"] = comm.all_to_all(even)[0].cpu().numpy()
    # uneven: member j gets j + 1 rows from every rank, the counts exchanged first
    rows = torch.arange(world_size * (world_size + 1) // 2, dtype=torch.float32, device=device)
    got, counts = comm.all_to_all(rows + 100.0 * rank, [j + 1 for j in range(world_size)])
    out["all_to_all_uneven"] = (got.cpu().numpy(), counts)
    # a ring of messages: blocking send on even ranks, isend on odd ones
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    got = torch.zeros(2, device=device)
    msg = torch.tensor([float(rank), 10.0 * rank], device=device)
    if rank % 2 == 0:
        comm.send(msg, right)
        comm.recv(got, left)
    else:
        comm.recv(got, left)
        comm.wait_all([comm.isend(msg, right)])
    out["ring"] = got.cpu().numpy()
    # recv_any: rank 0 hears from everyone else, in any order
    if rank == 0:
        heard = {}
        for _ in range(world_size - 1):
            buf = torch.zeros(1, device=device)
            sender = comm.recv_any(buf)
            heard[sender] = float(buf.item())
        out["recv_any"] = heard
    else:
        comm.send(torch.tensor([100.0 + rank], device=device), 0)
    z = torch.full((5,), float(rank), device=device)
    fut = comm.all_reduce_async(z, lane=world_size + rank)
    fut.wait()
    out["all_reduce_async"] = z.cpu().numpy()
    comm.barrier()
    if force:
        runtime.stage_through_host(before)
    return out


def staged_strategies(rank, world_size, names):
    """tests/workers.strategies_on_pairs with every traced message staged through host memory."""
    import workers
    runtime.stage_through_host("all")
    return workers.strategies_on_pairs(rank, world_size, names)


# ------------------------------------------------------------------ GPU only
def strategies_with_placement(rank, world_size, names):
    """Each strategy on pairs, with where it ran and how much CUDA memory it allocated."""
    import workers
    from parlab.torch.mesh import init_mesh
    mesh = init_mesh(pair=2, member=2)
    out = {"device": str(runtime.rank_device()), "library_device": str(runtime.library_device()),
           "backend": str(torch.distributed.get_backend()), "shares_gpu": runtime.shares_gpu(),
           "runs": {}, "cuda_peak": {}}
    for name in names:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        out["runs"][name] = workers.strategy_on_pairs(rank, world_size, name, mesh)["run"]
        torch.cuda.synchronize()
        out["cuda_peak"][name] = torch.cuda.max_memory_allocated() - before   # this strategy's own
    return out


def nccl_on_one_rank(rank, world_size):
    """One rank on its GPU: the backend, the device, and an all-reduce of a CUDA tensor."""
    device = runtime.rank_device()
    x = torch.ones(1000, device=device) * 3
    comm.all_reduce(x)
    return {"backend": str(torch.distributed.get_backend()), "device": str(device),
            "uses_gpus": runtime.uses_gpus(), "sum": float(x.sum().item()),
            "timer": type(__import__("parlab").trace.recorder().timer).__name__}


# ------------------------------------------------------------------ checks shared by the tests
PAIR_NAMES = ("split", "pipeline", "naive", "column_row", "dtensor", "by_hand", "ring", "ddp",
              "parameter_server", "wavefront")


def by_pair(out, names):
    """Per strategy, [[pair 0's results], [pair 1's results]] of a 4-rank launch."""
    pairs = ([0, 1], [2, 3])
    return {name: [[out.results[r]["runs"][name] for r in pair] for pair in pairs] for name in names}


def check_staged_ops(out, expect_staging, expect_device):
    """staged_ops' results are those of the operations, and the copies are traced as transfer."""
    import numpy as np
    n = len(out.results)
    total = sum(range(1, n + 1))
    for rank, r in enumerate(out.results):
        assert r["staging"] == expect_staging and r["device"].startswith(expect_device), r["device"]
        np.testing.assert_array_equal(r["all_reduce"], [total] * 4)
        assert r["in_place"], "all_reduce must still reduce the caller's tensor in place"
        np.testing.assert_allclose(r["avg"], [total / n] * 4)
        np.testing.assert_array_equal(r["broadcast"], [1.0] * 3)
        assert [float(a[0]) for a in r["all_gather"]] == [float(i) for i in range(n)]
        np.testing.assert_array_equal(r["reduce_scatter"], np.arange(2.0 * n)[2 * rank:2 * rank + 2] * total)
        np.testing.assert_array_equal(r["all_to_all"], [rank + 10.0 * s for s in range(n)])
        first = rank * (rank + 1) // 2                  # where member ``rank``'s rows start
        got, counts = r["all_to_all_uneven"]
        assert counts == [rank + 1] * n
        np.testing.assert_array_equal(got, [first + i + 100.0 * s for s in range(n)
                                            for i in range(rank + 1)])
        left = (rank - 1) % n
        np.testing.assert_array_equal(r["ring"], [left, 10.0 * left])
        np.testing.assert_array_equal(r["all_reduce_async"], [sum(range(n))] * 5)
    assert out.results[0]["recv_any"] == {s: 100.0 + s for s in range(1, n)}
    # the copies are transfer on the timeline, carry no bytes of their own, and come
    # before the matched span (so a rank's own copy is not taken for waiting on peers)
    spans = [s for s in out.timeline if s.kind != "core_wait"]    # a copy's wait for a core aside
    copies = [s for s in spans if " · " in s.name]
    assert copies and all(s.kind == "comm" and s.bytes == 0 for s in copies)
    for rank in range(n):
        to_host = [s for s in spans if s.rank == rank and s.name == "all_reduce · to host"]
        reduce = [s for s in spans if s.rank == rank and s.name == "all_reduce" and s.kind == "comm"]
        assert to_host and reduce and to_host[0].end <= reduce[0].end
    sent = sum(s.bytes for s in spans if s.rank == 0 and s.name == "all_reduce")
    assert sent == 2 * 4 * 4, "bytes count each all-reduce once (x and y), staging adds none"


def check_pairs_equal_references(pairs, tol):
    """Each strategy on each pair equals its single-device reference (as tests/test_groups.py)."""
    import numpy as np
    import workers
    from parlab.metrics import max_difference, merged
    from parlab.split import SplitConfig
    from parlab.torch import data_parallel as dp
    from parlab.torch import parameter_server as ps
    from parlab.torch import pipeline as pl
    from parlab.torch import single
    from parlab.torch import tensor_parallel as tp
    cfg = SplitConfig(**workers.PAIR_CFG)
    if "split" in pairs:
        ref = single.train_reference(SplitConfig(bounds=[4], **workers.PAIR_CFG))
        for pair in pairs["split"]:
            assert max_difference(merged(pair), ref["state"]) < tol, "split"
    if "pipeline" in pairs:
        ref = single.train_reference(cfg)
        for pair in pairs["pipeline"]:
            assert max_difference(merged(pair), ref["state"]) < tol, "pipeline"
    dense = tp.dense_reference(cfg.sizes, batch_size=48, steps=3, lr=0.1)
    for scheme in ("naive", "column_row"):
        kinds = tp.layer_kinds(cfg.sizes, 2, scheme)
        for pair in pairs.get(scheme, ()):
            for index, res in enumerate(pair):
                for n, v in res["shards"].items():
                    want = tp.dense_slice(n, dense["state"][n], kinds[n], index, 2)
                    np.testing.assert_allclose(v, want, atol=tol, err_msg=f"{scheme} {n}")
    if "dtensor" in pairs:
        first = tp.dense_reference(cfg.sizes, batch_size=48, steps=1, lr=0.1)
        kinds = tp.layer_kinds(cfg.sizes, 2, "column_row")
        for pair in pairs["dtensor"]:
            for index, res in enumerate(pair):
                for n, g in res["grads"].items():
                    want = tp.dense_slice(n, first["first_grads"][n], kinds[n], index, 2)
                    np.testing.assert_allclose(g, want, atol=tol, err_msg=f"dtensor {n}")
    one = dp.train_single(global_batch=64, steps=3, lr=0.1)
    for mode in ("by_hand", "ring", "ddp"):
        for pair in pairs.get(mode, ()):
            for res in pair:
                assert max_difference(res["state"], one["state"]) < tol, mode
    for pair in pairs.get("parameter_server", ()):
        assert max_difference(ps.state_dict(pair), one["state"]) < tol, "parameter_server"
    if "wavefront" in pairs:
        lstm = pl.lstm_single_device(2, hidden=16, length=6, batch=8, repeats=1)
        for pair in pairs["wavefront"]:
            np.testing.assert_allclose(pair[-1]["h"], lstm["stepped cells"]["h"], atol=tol)
