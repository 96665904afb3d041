"""The device mesh: the grid's arithmetic, process groups on real ranks, bad shapes."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import workers
from batched import launch_each
from conftest import rank_processes

import parlab
from parlab.mesh import Grid

ROOT = Path(__file__).resolve().parents[1]


def test_a_one_axis_mesh_is_one_line_of_every_rank():
    g = Grid(dp=4)
    assert g.world_size == 4 and g.lines("dp") == [[0, 1, 2, 3]]
    assert g.neighbors(0, "dp") == (None, 1) and g.neighbors(3, "dp") == (2, None)
    assert g.label(2) == "dp 2"


def test_a_2d_mesh_varies_its_last_axis_fastest():
    g = Grid(dp=2, tp=2)
    assert [g.coords(r) for r in range(4)] == [
        {"dp": 0, "tp": 0}, {"dp": 0, "tp": 1}, {"dp": 1, "tp": 0}, {"dp": 1, "tp": 1}]
    assert g.lines("tp") == [[0, 1], [2, 3]]          # tensor-parallel pairs: neighbours
    assert g.lines("dp") == [[0, 2], [1, 3]]          # data-parallel lines: across pairs
    assert g.line(3, "dp") == [1, 3] and g.neighbors(3, "dp") == (1, None)
    assert g.label(2) == "dp 1 · tp 0"
    assert all(g.rank_at(**g.coords(r)) == r for r in g)


def test_a_3d_mesh_matches_picotrons_grid():
    # picotron: torch.arange(world).view(dp, pp, tp); a line varies one index
    g = Grid(dp=2, pp=3, tp=2)
    assert g.world_size == 12
    assert g.coords(7) == {"dp": 1, "pp": 0, "tp": 1}
    assert g.line(7, "pp") == [7, 9, 11]
    assert g.line(7, "dp") == [1, 7]
    assert g.line(7, "tp") == [6, 7]
    for axis in g.axes:                                # the lines of an axis partition the world
        assert sorted(r for line in g.lines(axis) for r in line) == list(range(12))
    assert g.neighbors(9, "pp") == (7, 11)


@pytest.mark.parametrize("axes,message", [
    (dict(), "at least one axis"), (dict(dp=0), "whole number >= 1"),
    (dict(dp=2.0), "whole number"), (dict(dp=True), "whole number")])
def test_bad_axis_sizes_are_refused(axes, message):
    with pytest.raises(ValueError, match=message):
        Grid(**axes)


def test_a_mesh_that_does_not_match_the_world_names_both():
    with pytest.raises(ValueError, match=r"dp 3 × tp 2 needs 3 × 2 = 6 ranks, but the world has 4"):
        Grid(dp=3, tp=2).check_world(4)


def test_a_bad_mesh_fails_on_the_ranks_before_any_group_is_built(no_leftover_ranks):
    with pytest.raises(parlab.WorkerError, match="needs 3 × 2 = 6 ranks, but the world has 4"):
        parlab.launch(workers.mesh_report, 4, args=({"dp": 3, "tp": 2},), timeout=60)


MESHES = [{"dp": 4}, {"dp": 2, "tp": 2}, {"dp": 2, "pp": 1, "tp": 2}]


@pytest.fixture(scope="module")
def reports():
    """Each mesh above built in turn on the same 4 ranks: one launch."""
    out = launch_each({i: (workers.mesh_report, (axes,)) for i, axes in enumerate(MESHES)}, 4)
    assert not rank_processes(), "ranks left running"
    return out


@pytest.mark.parametrize("i", range(len(MESHES)), ids=[str(m) for m in MESHES])
def test_mesh_groups_coordinates_and_neighbours_on_real_ranks(i, reports):
    axes = MESHES[i]
    grid = Grid(**axes)
    out = reports[i].results
    for rank, rep in enumerate(out):
        assert rep["coords"] == grid.coords(rank)
        assert rep["label"] == grid.label(rank)
        for a in grid.axes:
            line = grid.line(rank, a)
            assert rep["ranks"][a] == line
            assert rep["sizes"][a] == grid.shape[a]
            assert tuple(rep["neighbors"][a]) == grid.neighbors(rank, a)
            assert rep["sums"][a] == sum(line)          # the collective ran on that line only
        assert rep["device_mesh"] == tuple(grid.shape.values())


@pytest.mark.slow
def test_the_mesh_under_torchrun(tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed next to this Python")
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'tests'}:{ROOT}", OMP_NUM_THREADS="1")
    code = ("import parlab.torch.torchrun as tr, workers\n"
            "res, tl = tr.run_here(workers.mesh_report, ({'dp': 2, 'tp': 2},))\n"
            "if res: print('SUMS', [r['sums'] for r in res])\n")
    script = tmp_path / "mesh_run.py"
    script.write_text(code)
    out = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "4", str(script)],
                         capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("SUMS"))
    assert line == ("SUMS [{'dp': 2.0, 'tp': 1.0}, {'dp': 4.0, 'tp': 1.0}, "
                    "{'dp': 2.0, 'tp': 5.0}, {'dp': 4.0, 'tp': 5.0}]")
