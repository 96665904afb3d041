"""What every published run's record names, whichever set holds it: its id, kind, source,
metric and value (shared by the tests of the validation set and of the sealed set)."""
import math
import re

from parlab.sim import published_runs as pr
from parlab.sim.published_setups import FLOPS

UNVERIFIED = "from memory, unverified"


def assert_names_its_source_metric_and_value(run):
    assert re.fullmatch(r"[a-z0-9][a-z0-9.-]*", run.id)
    assert run.kind in pr.KINDS
    assert run.title and run.metric and run.unit and run.note
    assert run.cite.authors and 2015 <= run.cite.year <= 2026 and run.cite.where
    assert re.match(r"arXiv:\d{4}\.\d{4,5}|https://", run.cite.ref), run.cite.ref
    assert isinstance(run.value, (int, float)) and math.isfinite(run.value) and run.value > 0
    assert run.flops in FLOPS or run.flops == ""
