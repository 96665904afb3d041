"""parlab: train one neural network on many devices, and measure it.

``import parlab`` is cheap: it imports neither torch nor tensorflow. Each name below is
loaded the first time it is used, so a PyTorch lab never pays for TensorFlow and the
reverse.

Where things live, from the ground up (nothing imports a floor above its own):

* framework-free core: ``trace`` (``spans``, ``recorders``, ``timeline``), ``steps``
  (reading steps out of a timeline), ``metrics``, ``data``, ``processes``, ``plot/``,
  ``sim/`` (the cost model), and the framework-free half of each strategy, named as its
  ranks' half in ``torch/`` and ``tf/``: ``pipeline`` (schedules), ``split`` (where to
  cut a model), ``mesh`` (mesh arithmetic, ``HybridShape``), ``zero`` (ZeRO's bytes),
  ``nodes`` (ranks on nodes, the bytes over the slow link between them);
* ``torch/`` and ``tf/``: the runtime, traced communication and one module per strategy;
* the launcher: ``launcher`` (``parlab.launch``) with ``launch_settings``,
  ``launch_folder``, ``starting``, ``_worker``, ``rank_exits``, ``rank_stacks``;
* ``course/``: one module per lab (``labNN`` beside ``labs/NN_*.ipynb``) and what the labs
  share; ``bench/``: the benchmarks. ``experiments``, ``exercises`` and ``widgets`` keep
  the names earlier notebooks used.
"""
from __future__ import annotations

import importlib
import sys as _sys

__version__ = "0.1.0"

# public name -> (module, attribute or None for the module itself)
_LAZY = {
    "DeviceSet": ("parlab.hardware", "DeviceSet"),
    "LaunchResult": ("parlab.launcher", "LaunchResult"),
    "LaunchTimeout": ("parlab.errors", "LaunchTimeout"),
    "Span": ("parlab.trace", "Span"),
    "TeardownWarning": ("parlab.errors", "TeardownWarning"),
    "Timeline": ("parlab.trace", "Timeline"),
    "WorkerError": ("parlab.errors", "WorkerError"),
    "course": ("parlab.course", None),
    "data": ("parlab.data", None),
    "devices": ("parlab.hardware", "devices"),
    "exercises": ("parlab.exercises", None),
    "experiments": ("parlab.experiments", None),
    "grid": ("parlab.mesh", None),          # the names of earlier notebooks
    "hardware": ("parlab.hardware", None),
    "launch": ("parlab.launcher", "launch"),
    "mesh": ("parlab.mesh", None),
    "metrics": ("parlab.metrics", None),
    "missing": ("parlab.missing", None),
    "pipeline": ("parlab.pipeline", None),
    "plot": ("parlab.plot", None),
    "schedules": ("parlab.pipeline", None),
    "sim": ("parlab.sim", None),
    "recording": ("parlab.trace", "recording"),
    "span": ("parlab.trace", "span"),
    "split": ("parlab.split", None),
    "splitting": ("parlab.split", None),
    "steps": ("parlab.steps", None),
    "system_report": ("parlab.system", "system_report"),
    "torch": ("parlab.torch", None),
    "widgets": ("parlab.widgets", None),
    "zero": ("parlab.zero", None),
    "zero_memory": ("parlab.zero", None),
}

__all__ = sorted(_LAZY)

# In a notebook without TensorFlow, the labs' TensorFlow cells each print one line instead
# of stopping Run All (the labs import parlab first). Outside IPython: nothing to do.
if "IPython" in _sys.modules:
    from .missing import skip_tensorflow_cells as _skip_tensorflow_cells

    _skip_tensorflow_cells()


def __getattr__(name: str):
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'parlab' has no attribute {name!r}") from None
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
