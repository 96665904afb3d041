"""A network as the cost model sees it: its layers, their skip connections, and its numbers.

A :class:`Network` is a sequence of ``Layer`` s (``sim.layers``) run in order, plus the
skip connections by which a later layer also reads an earlier one's output (a U-Net's
encoder features, a residual cell's two inputs). A pipeline cut between two layers
carries every output that is produced before it and read after it (``cut_elems``): the
activation the layer before hands on and every skip tensor that jumps over the cut,
forward; their gradients, as large, backward. A stage relays a skip tensor it does not
use to the next stage (torchgpipe's portals send it straight to its consumer; over a
chain of stages the bytes that cross each cut are the same).

Builders: ``Network.mlp(sizes)``, ``Network.transformer(...)`` (GPT), ``Network.unet(...)``
and ``Network.amoebanet(...)`` (``sim.convnets``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import counted
from .checks import amount
from .layers import Layer, linear, optimizer_state


@dataclass(frozen=True)
class Network:
    """A model as a sequence of layers, and how many bytes its numbers take.

    act_bytes: one activation element (4 float32, 2 fp16). state: bytes per parameter
    on a device without ZeRO, split as {"params", "grads", "optimizer"}: plain SGD in
    float32 is 4 + 4 + 0; Adam in mixed precision 2 + 2 + 12 (fp16 weights and
    gradients; fp32 master weights, momentum and variance: Rajbhandari et al., ZeRO,
    2020, section 3.1, "16 bytes per parameter"). grad_wire_bytes: a gradient as data
    parallel sends it. update_bytes: bytes the optimizer step reads and writes per
    parameter.
    """

    name: str
    layers: tuple
    in_elems: float
    act_bytes: int = 4
    state: dict = field(default_factory=lambda: {"params": 4, "grads": 4, "optimizer": 0})
    grad_wire_bytes: int = 4
    update_bytes: float = 12.0
    skips: tuple = ()                # (producer, consumer): layer j also reads layer i's output

    def __post_init__(self):
        owner = f"Network {self.name!r}"
        if not self.layers or not all(isinstance(x, Layer) for x in self.layers):
            raise ValueError(f"{owner}: layers must be a non-empty tuple of Layer, got "
                             f"{self.layers!r}")
        amount(owner, "in_elems", self.in_elems)
        amount(owner, "act_bytes", self.act_bytes, unit="bytes", positive=True)
        amount(owner, "grad_wire_bytes", self.grad_wire_bytes, unit="bytes")
        amount(owner, "update_bytes", self.update_bytes, unit="bytes")
        for part in ("params", "grads", "optimizer"):
            amount(owner, f"state[{part!r}]", self.state.get(part), unit="bytes")
        n = len(self.layers)
        for skip in self.skips:
            if (not isinstance(skip, tuple) or len(skip) != 2
                    or not all(isinstance(x, int) for x in skip)
                    or not -1 <= skip[0] < skip[1] - 1 or skip[1] >= n):
                raise ValueError(f"{owner}: a skip is (producer, consumer), layer indices "
                                 f"with producer < consumer - 1 < {n} (-1: the input), got "
                                 f"{skip!r}")

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    def __len__(self) -> int:
        return len(self.layers)

    def out_elems(self, i: int) -> float:
        """Elements of layer i's output per sample (i = -1: the network's input)."""
        return self.in_elems if i < 0 else self.layers[i].out_elems

    def crossing(self, at: int) -> list[int]:
        """The layers whose outputs cross a cut before layer ``at``: the one before it and
        every skip's producer before the cut whose consumer is at or after it."""
        if not 0 < at < len(self.layers):
            raise ValueError(f"a cut is between two layers: 0 < at < {len(self.layers)}, "
                             f"got {at}")
        return sorted({at - 1} | {i for i, j in self.skips if i < at <= j})

    def cut_elems(self, at: int) -> float:
        """Activation elements per sample crossing a cut before layer ``at`` (forward; the
        backward sends their gradients, as many)."""
        return sum(self.out_elems(i) for i in self.crossing(at))

    def cut_bytes(self, at: int, batch: float = 1) -> float:
        """Bytes crossing a cut before layer ``at`` for ``batch`` samples, each way."""
        return self.cut_elems(at) * batch * self.act_bytes

    @classmethod
    def mlp(cls, sizes, *, optimizer: str = "sgd", name: str | None = None) -> "Network":
        """The course's MLP: Linear layers (each with its ReLU) in float32.

        A Linear a -> b: a b + b parameters, 2 a b FLOPs forward per sample; it keeps
        its input (and the ReLU its output) for the backward pass. optimizer: "sgd"
        (4 + 4 bytes per parameter) or "adam" (+ 8 for the two moments, float32).
        """
        sizes = tuple(counted(s, "a layer width") for s in sizes)
        if len(sizes) < 2:
            raise ValueError(f"an MLP needs an input and an output width, got sizes={sizes}")
        layers = tuple(linear(f"linear{k}", a, b)          # each with its ReLU
                       for k, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])))
        state, update = optimizer_state(optimizer, 4)
        return cls(name or f"MLP {'-'.join(map(str, sizes))}", layers, sizes[0], 4, state,
                   grad_wire_bytes=4, update_bytes=update)

    @classmethod
    def transformer(cls, name: str, layers: int, hidden: int, heads: int, seq: int,
                    vocab: int = 0) -> "Network":
        """A GPT-style decoder in mixed precision with Adam; a sample = one sequence.

        Per block: 12 h^2 parameters; forward FLOPs 24 s h^2 (the four projections and
        the MLP) + 4 s^2 h (scores and their use) (Narayanan et al., 2021, eq. 3, /3
        for the forward alone); kept for backward s h (34 + 5 a s / h) bytes
        (Korthikanti et al., 2022, eq. 1). Element-wise: softmax and dropout over a s^2
        scores and GeLU over 4 s h split by tp; two layer norms, two dropouts and two
        residual adds over s h repeated on every tp rank (what sequence parallelism
        later removed). Under tensor parallelism a block all-reduces its s h output twice
        forward and its input's gradient twice backward (Shoeybi et al., 2019, fig. 4).
        The embedding (vocab h) is a layer of its own when vocab > 0.
        """
        s, h, a = seq, hidden, heads
        block = Layer("block", 12 * h * h + 13 * h, 24.0 * s * h * h + 4.0 * s * s * h,
                      out_elems=s * h, saved_elems=s * h * (34 + 5 * a * s / h) / 2,
                      elementwise_bytes=2.0 * (3 * 2 * a * s * s + 2 * 4 * s * h),
                      replicated_bytes=2.0 * (2 * 2 + 2 * 2 + 2 * 3) * s * h,
                      tp_all_reduces=2)
        body = tuple(Layer(f"block{k}", block.params, block.flops, block.out_elems,
                           block.saved_elems, block.elementwise_bytes, block.replicated_bytes,
                           block.tp_all_reduces)
                     for k in range(counted(layers, "layers")))
        if vocab:       # its matrix also gives the logits: 2 s h V FLOPs, sliced by vocab
            head = Layer("embedding", vocab * h, 2.0 * s * h * vocab, out_elems=s * h,
                         saved_elems=s * h, tp_all_reduces=1)
            body = (head, *body)
        return cls(name, body, s * h, 2, {"params": 2, "grads": 2, "optimizer": 12},
                   grad_wire_bytes=2, update_bytes=32.0)


    @classmethod
    def unet(cls, image: int = 128, in_channels: int = 3, classes: int = 3, base: int = 16,
             depth: int = 4, *, name: str | None = None, act_bytes: int = 4,
             optimizer: str = "adam") -> "Network":
        """A U-Net (Ronneberger et al., 2015) on ``image`` x ``image`` inputs: see
        ``sim.convnets.unet`` (its skip connections recorded)."""
        from .convnets import unet
        return unet(cls, image, in_channels, classes, base, depth, name=name,
                    act_bytes=act_bytes, optimizer=optimizer)

    @classmethod
    def amoebanet(cls, image: int = 224, cells: int = 18, filters: int = 208,
                  classes: int = 1000, *, name: str | None = None, act_bytes: int = 4,
                  optimizer: str = "adam") -> "Network":
        """An AmoebaNet-like network of cells that each read the two cells before it: see
        ``sim.convnets.amoebanet``."""
        from .convnets import amoebanet
        return amoebanet(cls, image, cells, filters, classes, name=name, act_bytes=act_bytes,
                         optimizer=optimizer)

