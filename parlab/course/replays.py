"""The replay in the labs: this machine's idle link, measured once and kept.

A replay prices each message on a link (``sim.replay``). By default that is this
machine's own link when nothing else runs: lab 00's ping-pong between two ranks, each
pinned to a core of its own. Measured once, then kept in ``sim.replay.LINK_CACHE``, so
every later lab (and every run of the lessons) replays on the same link.
"""
from __future__ import annotations

from .. import sim
from ..launcher import launch
from ..sim.replay import idle_link as kept_link, save_idle_link

SIZES = (4096, 65536, 262144, 1 << 20, 4 << 20)


def idle_link(refresh: bool = False, timeout: float = 120.0) -> sim.Link:
    """This machine's idle link (alpha, beta), measured by a ping-pong sweep the first time.

    Each size's lower quartile stands for the idle machine: a repetition the scheduler
    delayed (another program, a busy loop) is slower, never faster. ``refresh``: measure
    again, and keep the new link only if it is the quicker (``sim.replay.save_idle_link``).
    """
    if not refresh and (link := kept_link()) is not None:
        return link
    from ..metrics import fit_link
    from ..torch.bandwidth import sweep     # here: importing the course imports no framework
    run = launch(sweep, 2, kwargs={"sizes": SIZES, "ops": ("send_recv",)}, timeout=timeout,
                 pin_cores=True)
    records = run.results[0]
    fit = fit_link([r["bytes"] for r in records], [r["lower_quartile_s"] for r in records])
    return save_idle_link(sim.Link(fit.latency_s, fit.bandwidth_Bps),
                          "ping-pong of two pinned ranks, lower quartile per size")


def replayed(run, link=None):
    """``run`` (a LaunchResult) replayed on dedicated devices, on this machine's idle link
    unless told otherwise; ranks grouped into nodes (``parlab.devices(n, nodes=k)``) talk
    across nodes on the devices' ``between`` link."""
    if link is None:
        devs = getattr(run, "devices", None)
        link = devs.replay_link(idle_link()) if devs is not None else idle_link()
    return sim.replay(run.timeline, link)


def source(tl, link: str = "this machine's idle link") -> str:
    """What a lesson read from a replay, for its verdict: "replayed on 2 dedicated devices,
    this machine's idle link"; nothing for a timeline that is not a replay."""
    if not getattr(tl, "replayed", False):
        return ""
    return f"replayed on {tl.notes.get('devices', len(tl.ranks))} dedicated devices, {link}"


def lanes_named(tl, labels: dict, ranks=None):
    """``tl`` with its lanes named ``labels`` ({rank: name}), drawn as what it is: a replay
    stays a replay (its notes kept, each lane ending "· replayed"), a measurement stays as
    recorded (so that it can still be replayed)."""
    from ..timeline import Timeline
    if getattr(tl, "replayed", False):
        return sim.ReplayedTimeline(tl.spans, {r: f"{n} · replayed" for r, n in labels.items()},
                                    ranks, notes=tl.notes)
    return Timeline(tl.recorded, labels, ranks)


def between_barriers(tl, name: str, parts: int) -> list[tuple[float, float]]:
    """The windows of a launch that ran ``parts`` parts one after another, each between
    two barriers called ``name`` (rank 0's barriers 2k and 2k + 1 hold part k): how a
    replay, whose times are its own, is cut where the run's recorded windows cannot be."""
    bars = sorted((s for s in tl.spans if s.rank == 0 and s.kind == "comm" and s.name == name),
                  key=lambda s: s.start)
    if len(bars) < 2 * parts:
        raise ValueError(f"{len(bars)} barriers {name!r} on rank 0: {parts} parts need "
                         f"{2 * parts}")
    return [(bars[2 * k].end, bars[2 * k + 1].start) for k in range(parts)]


def quickest_steps(tl, windows: dict, labels: dict, *, rank: int = 0, axis_of=None,
                   rename=lambda name: name):
    """One lane per part of a launch that ran parts one after another: ``rank``'s quickest
    step of each (``windows``: {part: (start, end)} on ``tl``; ``labels``: {part: lane
    name}), each from its own start; a transfer's axis is ``axis_of(its name)`` (e.g. its
    collective, for ``plot.timeline(color_by="axis")``). A replay stays a replay."""
    from ..steps import quickest_step
    from ..timeline import Timeline
    from ..trace import Span
    spans = []
    for lane, part in enumerate(labels):
        step = quickest_step(tl.window(*windows[part]).filter(ranks=[rank]), skip=1)
        spans += [Span(lane, s.kind, rename(s.name), s.start - step.start, s.end - step.start,
                       s.bytes, axis=axis_of(s.name) if axis_of and s.kind == "comm" else None)
                  for s in step.spans]
    built = (sim.ReplayedTimeline(spans, notes=tl.notes) if getattr(tl, "replayed", False)
             else Timeline(spans))
    return lanes_named(built, dict(enumerate(labels.values())))
