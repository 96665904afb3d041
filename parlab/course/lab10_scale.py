"""Lab 10 at scale, PREDICTED by the cost model: when ring attention's K/V passes hide
behind the attention beside them on H100 nodes (``sim.hybrid`` with context parallelism)."""
from __future__ import annotations


def _llama3_8b(seq: int):
    """Llama 3 8B's shape (Dubey et al., 2024: 32 blocks of width 4096, 32 heads, 8 of them
    for keys and values, MLP 14,336, vocabulary 128,256) on sequences of ``seq`` tokens."""
    from .. import sim
    return sim.Network.llama(f"Llama 3 8B, {seq:,} tokens", 32, 4096, 32, seq, 128256,
                             kv_heads=8, ffn=14336)


def ring_at_scale(seqs=(1024, 4096, 16384, 65536), nodes: int = 4) -> list[dict]:
    """PREDICTED (``sim.hybrid``: every rank's step run by the event engine): Llama 3 8B
    on one sequence, tp 8 inside each of ``nodes`` H100 nodes and cp = ``nodes`` across
    them. Per sequence length: one K/V pass of a block, the forward attention it runs
    beside (1/cp of the block's), and what rank 0 waits for K/V in the whole step."""
    from .. import sim
    from ..sim.blocks import is_block
    from ..sim.summary_terms import ring_step
    cluster, rows = sim.h100_nodes(nodes), []
    for seq in seqs:
        net = _llama3_8b(seq)
        tl = sim.hybrid(net, cluster, 1, dp=1, tp=8, cp=nodes)
        block = next(x for x in net.layers if is_block(x))
        _, passing, forward, _ = ring_step(net, block, 1 / nodes, 8, nodes, cluster, 8)
        waited = tl.seconds_by_name(0).get("wait for K/V", 0.0)
        rows.append({"seq": seq, "pass_s": passing, "beside_s": forward / nodes,
                     "waited_s": waited, "step_s": tl.step_s})
    return rows


def ring_block(seq: int, nodes: int = 4):
    """PREDICTED: rank 0's lanes (its compute, its K/V passes) over one block's forward in
    ``ring_at_scale``'s run at ``seq`` tokens: from the block's first pass to the next's."""
    from .. import sim
    tl = sim.hybrid(_llama3_8b(seq), sim.h100_nodes(nodes), 1, dp=1, tp=8, cp=nodes)
    lane = min(s.rank for s in tl.spans if s.name == "K/V pass")   # rank 0's second lane
    passes = sorted(s.start for s in tl.spans if s.rank == lane and s.name == "K/V pass")
    part = tl.window(passes[0], passes[nodes - 1]).filter(ranks=(0, lane))
    return sim.PredictedTimeline(part.spans, {0: "rank 0", lane: "rank 0, K/V passes"},
                                 [0, lane], notes=tl.notes)


def plot_ring_at_scale(seqs=(4096, 16384), nodes: int = 4):
    """PREDICTED: ``ring_block`` at each sequence length, one panel each."""
    from .. import plot
    plt = plot.pyplot()
    fig, axes = plt.subplots(len(seqs), 1, figsize=(11, 1.7 * len(seqs) + 0.6))
    for ax, seq in zip(axes, seqs):
        plot.timeline(ring_block(seq, nodes), ax=ax, unit="us", legend=ax is axes[0],
                      color_by="axis", names=False,
                      title=f"{seq:,} tokens: one block's forward (PREDICTED)")
    fig.tight_layout()
    return plot.finish(fig)


def print_ring_at_scale(nodes: int = 4) -> None:
    print(f"PREDICTED: Llama 3 8B, one sequence, tp 8 in each of {nodes} H100 nodes, cp {nodes} "
          "across them (parlab.sim.hybrid)")
    print(f"{'tokens':>8}{'a K/V pass':>12}{'attention beside it':>21}"
          f"{'waiting for K/V, a step':>25}{'step':>9}")
    for r in ring_at_scale(nodes=nodes):
        print(f"{r['seq']:>8,}{r['pass_s'] * 1e6:>9.1f} µs{r['beside_s'] * 1e6:>18.1f} µs"
              f"{r['waited_s'] * 1e3:>10.2f} ms ({r['waited_s'] / r['step_s']:4.1%})"
              f"{r['step_s'] * 1e3:>9.0f} ms")
