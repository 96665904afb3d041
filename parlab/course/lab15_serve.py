"""Lab 15's last parts: the U-Net in TensorFlow as the course's source material trained
it (Keras ``fit`` under ``MirroredStrategy``, a custom loop under
``MultiWorkerMirroredStrategy`` with ``TF_CONFIG``), and the trained model served from a
process of its own."""
from __future__ import annotations

import os

import numpy as np

from ..launcher import LaunchResult, launch
from ..split import UNetConfig

CFG = UNetConfig()


# ------------------------------------------------------------------ TensorFlow, as the source did
def run_tf_mirrored_fit(tf_devices, cfg: UNetConfig = CFG) -> dict:
    """The TensorFlow U-Net trained by Keras ``fit`` on one device and under
    ``MirroredStrategy`` over ``tf_devices`` (logical CPUs, or GPUs), from the same
    weights: both runs, and the
    weights they started from (for the multi-worker run). ``cfg.steps`` steps: the first
    ``cfg.steps`` batches of the training images, in order, one epoch."""
    from ..tf import data_parallel as tf_dp
    from ..tf import unet as tf_unet
    weights = tf_unet.initial_weights(cfg)
    images = cfg.steps * cfg.global_batch
    one = tf_unet.fit(cfg, weights, None, n=images)
    mirrored = tf_unet.fit(cfg, weights, tf_dp.mirrored(tf_devices.names), n=images)
    return {"one": one, "mirrored": mirrored, "initial_weights": weights}


def run_tf_multi_worker(weights, cfg: UNetConfig = CFG, workers: int = 2,
                        timeout: float = 180.0) -> LaunchResult:
    """``MultiWorkerMirroredStrategy``: ``workers`` TensorFlow processes, each given its
    TF_CONFIG (ports on 127.0.0.1 chosen here), the custom loop from ``weights``."""
    from ..tf.cluster import free_ports
    from ..tf.unet import multi_worker
    return launch(multi_worker, workers, args=(free_ports(workers), cfg, weights),
                  process_group=False, timeout=timeout, env={"TF_CPP_MIN_LOG_LEVEL": "2"})


def weight_difference(a, b) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


# ------------------------------------------------------------------ serving
def serve_in_fresh_process(model, images, *, cfg: UNetConfig = CFG, folder: str = "models",
                           timeout: float = 120.0) -> dict:
    """Save the trained U-Net to ``folder``, then segment ``images`` in a new Python
    process that loads it (``python -m parlab.torch.serve``), as a server would.

    Returns {"masks", "path", "said" (the process's own line), "pid"}.
    """
    from ..torch import serve
    os.makedirs(folder, exist_ok=True)
    path = serve.save(model, os.path.join(folder, "unet_shapes.pt"), base=cfg.base,
                      size=cfg.size)
    return {"path": path, **subprocess_serve(path, images, timeout=timeout)}


def subprocess_serve(path: str, images, *, timeout: float = 120.0) -> dict:
    """Segment ``images`` with the model saved at ``path``, in a process of its own:
    {"masks", "said", "pid"}; a RuntimeError with the process's error if it fails."""
    import subprocess
    import sys
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "images.npy"), os.path.join(tmp, "masks.npy")
        np.save(src, np.asarray(images, dtype=np.float32))
        done = subprocess.run([sys.executable, "-m", "parlab.torch.serve", path, src, dst],
                              capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONPATH": _package_root()})
        if done.returncode:
            raise RuntimeError(f"the serving process failed (exit {done.returncode}):\n"
                               f"{done.stderr[-2000:]}")
        masks = np.load(dst)
    said = done.stdout.strip().splitlines()[-1]
    return {"masks": masks, "said": said, "pid": int(said.split()[1].rstrip(":"))}


def _package_root() -> str:
    """The folder holding this ``parlab``, ahead of any PYTHONPATH already set: the new
    process imports the same package as the notebook."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.pathsep.join([root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def show_segmentations(images, masks, truth, *, title: str):
    """Each image beside the mask the model gave it and the true mask."""
    from matplotlib.colors import ListedColormap

    from .. import plot
    plt = plot.pyplot()
    colors = ListedColormap(["#f2f2f2", plot.OKABE_ITO["blue"], plot.OKABE_ITO["orange"]])
    n = len(images)
    fig, axes = plt.subplots(n, 3, figsize=(8.5, 2.9 * n), squeeze=False)
    for i in range(n):
        for ax, pic, what in ((axes[i][0], images[i][0], "image"),
                              (axes[i][1], masks[i], "mask from the served model"),
                              (axes[i][2], truth[i], "true mask")):
            if what == "image":
                ax.imshow(pic, cmap="gray")
            else:
                ax.imshow(pic, cmap=colors, vmin=0, vmax=2, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(what, fontsize=12)
    # the key to the colours under the title, where the eye starts, not below the last row
    fig.suptitle(f"{title}\ngrey: background   blue: disc   orange: square", fontsize=13)
    fig.tight_layout()
    return plot.finish(fig)
