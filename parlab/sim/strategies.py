"""Every strategy's predicted timeline by name: ``timeline("pipeline", net, cluster, 64, ...)``."""
from __future__ import annotations

from .costs import Network
from .engine import PredictedTimeline
from .model import Cluster
from .servers import parameter_server
from .timelines import (data_parallel, hybrid, manual_split, pipeline, single_device,
                        tensor_parallel)

STRATEGIES = {"single_device": single_device, "manual_split": manual_split,
              "tensor_parallel": tensor_parallel, "pipeline": pipeline,
              "data_parallel": data_parallel, "parameter_server": parameter_server,
              "hybrid": hybrid}


def timeline(strategy: str, net: Network, cluster: Cluster, batch: int, **options
             ) -> PredictedTimeline:
    """``timeline("pipeline", net, cluster, 64, stages=4, schedule="1f1b")``: by name."""
    try:
        fn = STRATEGIES[strategy]
    except KeyError:
        raise ValueError(f"strategy must be one of {sorted(STRATEGIES)}, got {strategy!r}") from None
    return fn(net, cluster, batch, **options)
