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
from . import limits
from .checks import amount
from .layers import Layer, linear, optimizer_state

RECOMPUTE = (None, "selective", "full")


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
    recompute: str | None = None     # activation recomputation: None, "selective", "full"
    sequence_parallel: bool = False  # tp ranks split the work they would repeat
    # Float8 training (Micikevicius et al., 2022, "FP8 formats for deep learning"): the
    # products with weights run at the device's FP8 rate (``Cluster.fp8_matrix``), their
    # inputs scaled and cast first; attention's and the logits' products stay 16-bit
    # (``sim.costs``)
    fp8: bool = False

    def __post_init__(self):
        owner = f"Network {self.name!r}"
        if not self.layers or not all(isinstance(x, Layer) for x in self.layers):
            raise ValueError(f"{owner}: layers must be a non-empty tuple of Layer, got "
                             f"{self.layers!r}")
        limits.layers(owner, "layers", len(self.layers))
        amount(owner, "in_elems", self.in_elems)
        amount(owner, "act_bytes", self.act_bytes, unit="bytes", positive=True)
        amount(owner, "grad_wire_bytes", self.grad_wire_bytes, unit="bytes")
        amount(owner, "update_bytes", self.update_bytes, unit="bytes")
        for part in ("params", "grads", "optimizer"):
            amount(owner, f"state[{part!r}]", self.state.get(part), unit="bytes")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"{owner}: recompute must be one of {RECOMPUTE}, got "
                             f"{self.recompute!r}")
        n = len(self.layers)
        for skip in self.skips:
            if (not isinstance(skip, tuple) or len(skip) != 2
                    or not all(isinstance(x, int) for x in skip)
                    or not -1 <= skip[0] < skip[1] - 1 or skip[1] >= n):
                raise ValueError(f"{owner}: a skip is (producer, consumer), layer indices "
                                 f"with producer < consumer - 1 < {n} (-1: the input), got "
                                 f"{skip!r}")

    def trained(self, *, recompute: str | None = None,
                sequence_parallel: bool = False) -> "Network":
        """The same network trained with activation recomputation ("full": keep each
        layer's input and run its forward again before its backward; "selective": drop
        and recompute attention's s^2 tensors, Korthikanti et al., 2022, section 5) and/or
        sequence parallelism (the tp ranks split the norms, dropouts and residual adds they
        would repeat, and what those keep; section 4.2.2)."""
        from dataclasses import replace
        return replace(self, recompute=recompute, sequence_parallel=bool(sequence_parallel))

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

    def kept_elems(self, i: int, sliced: int = 1, tp: int = 1, *, rebuilt: bool = False) -> float:
        """Elements per sample layer i keeps for its backward pass on a tp rank whose slice
        of it is 1/``sliced`` (``sim.memory``'s module doc): its sliced part, the part
        every rank keeps whole (split too under sequence parallelism), less attention's
        under selective recomputation, only its input under full recomputation. rebuilt:
        what it holds while its backward runs (all of it)."""
        layer = self.layers[i]
        replicated = layer.saved_replicated_elems / (tp if self.sequence_parallel else 1)
        whole = layer.saved_elems / sliced + replicated
        if rebuilt or self.recompute is None:
            return whole
        if self.recompute == "selective":
            return whole - layer.attention_elems / sliced
        return self.out_elems(i - 1) / (tp if self.sequence_parallel and sliced > 1 else 1)

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
        limits.layers("Network.mlp", "sizes", len(sizes) - 1)      # before building them
        layers = tuple(linear(f"linear{k}", a, b)          # each with its ReLU
                       for k, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])))
        state, update = optimizer_state(optimizer, 4)
        return cls(name or f"MLP {'-'.join(map(str, sizes))}", layers, sizes[0], 4, state,
                   grad_wire_bytes=4, update_bytes=update)

    @classmethod
    def transformer(cls, name: str, layers: int, hidden: int, heads: int, seq: int,
                    vocab: int = 0, *, flash: bool = False) -> "Network":
        """A GPT-style decoder in mixed precision with Adam; a sample = one sequence.

        ``layers`` GPT blocks (``sim.blocks.block``: 12 h^2 + 13 h parameters, forward
        FLOPs 24 s h^2 + 4 s^2 h, s h (34 + 5 a s / h) bytes kept, Korthikanti et al.,
        2022, eq. 1); with a vocabulary, an embedding before them and the logits after
        (its matrix tied to the embedding's, GPT-2 and Megatron-LM's). flash: flash
        attention (the s^2 tensors neither stored nor written to memory).
        """
        return cls.decoder(name, layers, hidden, heads, seq, vocab, flash=flash)

    @classmethod
    def llama(cls, name: str, layers: int, hidden: int, heads: int, seq: int, vocab: int = 0,
              *, kv_heads: int | None = None, ffn: int | None = None, tied: bool = False,
              flash: bool = True, experts: int = 1, top_k: int = 1) -> "Network":
        """A Llama-style decoder (Touvron et al., 2023): grouped-query attention with
        ``kv_heads`` key-value heads, a gated (SwiGLU) MLP of ``ffn`` units, RMSNorm, rotary
        embeddings, no biases, no dropout, flash attention; untied input and output
        matrices. E.g. Llama 2 7B: 32 layers, 4096, 32 heads, ffn 11008, vocab 32000.
        experts, top_k: mixture-of-experts MLPs (``sim.blocks.block``)."""
        return cls.decoder(name, layers, hidden, heads, seq, vocab, kv_heads=kv_heads,
                           ffn=ffn, gated=True, norm="rmsnorm", bias=False, dropout=False,
                           rotary=True, flash=flash, tied=tied, experts=experts, top_k=top_k)

    @classmethod
    def decoder(cls, name: str, layers: int, hidden: int, heads: int, seq: int,
                vocab: int = 0, *, tied: bool = True, act_bytes: int = 2,
                **block_options) -> "Network":
        """Any decoder of ``sim.blocks.block``s (its options), with an embedding and logits
        when ``vocab`` > 0; 16-bit activations and Adam in mixed precision (16 bytes per
        parameter, Rajbhandari et al., 2020), or ``act_bytes=4``: float32 throughout."""
        from .blocks import block, embedding, head
        norm = block_options.get("norm", "layernorm")
        ab = act_bytes
        limits.layers(f"Network {name!r}", "layers", counted(layers, "layers"))   # before building
        body = [block(f"block{k}", seq, hidden, heads, act_bytes=ab, **block_options)
                for k in range(layers)]
        if vocab:
            body = [embedding(seq, hidden, vocab, act_bytes=ab), *body,
                    head(seq, hidden, vocab, tied=tied, norm=norm, act_bytes=ab)]
        state, update = optimizer_state("adam", ab)
        return cls(name, tuple(body), seq * hidden, ab, state, grad_wire_bytes=ab,
                   update_bytes=update)

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

