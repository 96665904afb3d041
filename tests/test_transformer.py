"""The transformer: split by heads, MLP slices and vocabulary (Megatron tensor parallel),
and along the sequence too (sequence parallel), it trains exactly like the whole model on
one device."""
import numpy as np
import pytest
import torch
from batched import launch_each
from conftest import rank_processes

from parlab.torch import tensor_parallel as tp
from parlab.torch import transformer, transformer_cp, transformer_sp, transformer_tp

TOL = 1e-5        # float32: partial sums added in another order
CFG = transformer.GPTConfig(vocab=256, seq_len=32, d_model=64, heads=4, layers=2)
BATCH, STEPS = 4, 3


@pytest.fixture(scope="module")
def runs():
    calls = {"tp": (transformer_tp.train_tp, (CFG, BATCH, STEPS)),
             "sp": (transformer_sp.train_sp, (CFG, BATCH, STEPS)),
             "cp": (transformer_cp.train_cp, (CFG, BATCH, STEPS)),
             "zigzag": (transformer_cp.train_cp, (CFG, BATCH, STEPS, 0.1, 0, "sgd", "zigzag")),
             "library": (transformer_tp.library_step, (CFG, BATCH))}
    out = {(n, key): run for n in (2, 4) for key, run in launch_each(calls, n).items()}
    assert not rank_processes(), "ranks left running"
    return out


@pytest.fixture(scope="module")
def reference():
    return transformer.train_reference(CFG, BATCH, STEPS)


@pytest.mark.parametrize("strategy", ["tp", "sp"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_split_transformer_trains_like_one_device(strategy, world_size, runs, reference):
    for r, res in enumerate(runs[world_size, strategy].results):
        np.testing.assert_allclose(res["losses"], reference["losses"], atol=TOL)
        part = CFG.vocab // world_size
        np.testing.assert_allclose(res["first_logits"],
                                   reference["first_logits"][..., r * part:(r + 1) * part],
                                   atol=TOL)
        assert set(res["first_grads"]) == set(reference["first_grads"])
        for name, dense in reference["first_grads"].items():
            np.testing.assert_allclose(res["first_grads"][name],
                                       transformer_tp.dense_part(name, dense, r, world_size),
                                       atol=TOL, err_msg=f"rank {r}: gradient of {name}")
        for name, dense in reference["weights"].items():
            np.testing.assert_allclose(res["weights"][name],
                                       transformer_tp.dense_part(name, dense, r, world_size),
                                       atol=TOL, err_msg=f"rank {r}: {name} after {STEPS} steps")


@pytest.mark.parametrize("world_size", [2, 4])
def test_the_library_plan_computes_what_the_hand_split_does(world_size, runs):
    for r, (lib, hand) in enumerate(zip(runs[world_size, "library"].results,
                                        runs[world_size, "tp"].results)):
        assert lib["loss"] == pytest.approx(hand["losses"][0], abs=TOL)
        np.testing.assert_allclose(lib["first_logits"], hand["first_logits"], atol=TOL)
        assert set(lib["first_grads"]) == set(hand["first_grads"])
        for name, grad in hand["first_grads"].items():
            np.testing.assert_allclose(lib["first_grads"][name], grad, atol=TOL,
                                       err_msg=f"rank {r}: gradient of {name}")


@pytest.mark.parametrize("layout", ["cp", "zigzag"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_context_parallel_transformer_trains_like_one_device(layout, world_size, runs,
                                                            reference):
    held = []
    for r, res in enumerate(runs[world_size, layout].results):
        held += list(res["positions"])
        np.testing.assert_allclose(res["losses"], reference["losses"], atol=TOL)
        np.testing.assert_allclose(res["first_logits"],
                                   reference["first_logits"][:, res["positions"]], atol=TOL)
        for name, dense in reference["first_grads"].items():
            np.testing.assert_allclose(res["first_grads"][name], dense, atol=TOL,
                                       err_msg=f"rank {r}: gradient of {name}")
        for name, dense in reference["weights"].items():
            np.testing.assert_allclose(res["weights"][name], dense, atol=TOL,
                                       err_msg=f"rank {r}: {name} after {STEPS} steps")


    assert sorted(held) == list(range(CFG.seq_len))       # every position, once


def test_the_zigzag_split_gives_every_rank_the_same_attention():
    assert transformer_cp.chunks_of(1, 4, "zigzag") == (1, 6)
    assert transformer_cp.attention_blocks(4) == pytest.approx([1 / 32, 3 / 32, 5 / 32, 7 / 32])
    assert transformer_cp.attention_blocks(4, "zigzag") == pytest.approx([1 / 8] * 4)
    with pytest.raises(ValueError, match="the sequence \\(zigzag split\\) has 30 units"):
        transformer_cp.positions_of(0, 4, 30, "zigzag")


@pytest.mark.parametrize("strategy", ["tp", "sp", "cp", "zigzag"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_each_rank_moves_the_bytes_of_the_formula(strategy, world_size, runs):
    timeline = runs[world_size, strategy].timeline
    if strategy == "tp":
        want = transformer_tp.expected_comm_bytes(CFG, BATCH)["total"] * STEPS
    else:
        module = transformer_sp if strategy == "sp" else transformer_cp   # either split
        want = module.expected_comm_bytes(CFG, BATCH, world_size)["total"] * STEPS
    for r in range(world_size):
        assert timeline.comm_bytes(r) == want, f"rank {r}"


@pytest.mark.parametrize("world_size", [2, 4])
def test_sequence_parallel_saves_the_norms_activations_by_position(world_size, runs):
    split = transformer_sp.split_activation_bytes(CFG, BATCH)
    for r in range(world_size):
        tp_saved = runs[world_size, "tp"].results[r]["saved_for_backward"]
        sp_saved = runs[world_size, "sp"].results[r]["saved_for_backward"]
        assert tp_saved - sp_saved == split - split // world_size, f"rank {r}"


def test_the_split_holds_no_more_than_its_share(runs):
    dense = sum(p.numel() for p in transformer.build(CFG).parameters())
    held = sum(w.size for w in runs[4, "tp"].results[0]["weights"].values())
    whole = 2 * CFG.d_model * CFG.layers * 2 + CFG.seq_len * CFG.d_model + 2 * CFG.d_model \
        + CFG.layers * 2 * CFG.d_model          # norms, positions, and the row layers' biases
    assert held == (dense - whole) // 4 + whole


def test_heads_that_do_not_split_say_what_to_change():
    dense = transformer.build(transformer.GPTConfig(vocab=240, heads=4, d_model=48))
    with pytest.raises(ValueError, match="the attention's heads has 4 units, which do not "
                                         "split evenly over 3 devices"):
        transformer_tp.ParallelGPT(dense, tp.layout(3))


def test_a_sequence_that_does_not_split_says_what_to_change():
    dense = transformer.build(transformer.GPTConfig(vocab=240, seq_len=30, heads=4, d_model=48))
    with pytest.raises(ValueError, match="the sequence has 30 units, which do not split "
                                         "evenly over 4 devices"):
        transformer_sp.SequenceParallelGPT(dense, tp.layout(4))


def test_a_model_width_that_does_not_split_into_heads_says_so():
    with pytest.raises(ValueError, match="d_model 100 must divide by heads 3"):
        transformer.GPTConfig(d_model=100, heads=3)


def test_the_reference_learns_the_walk():
    ref = transformer.train_reference(CFG, batch_size=8, steps=60, lr=3e-3,
                                      optimizer_name="adam")
    assert ref["losses"][-1] < 0.8 * ref["losses"][0], ref["losses"][::8]


def test_the_model_learns_the_generated_language_past_counting_words():
    from parlab import corpus
    cfg = transformer.GPTConfig(vocab=128, seq_len=32, d_model=64, heads=4, layers=2)
    torch.manual_seed(0)
    model = transformer.build(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    batches = transformer.text_batches(cfg, 16)
    for _ in range(60):
        x, y = next(batches)
        opt.zero_grad()
        transformer.lm_loss(model(x), y).backward()
        opt.step()
    unigram = corpus.unigram_nats(corpus.tokens(200_000, 0), corpus.tokens(50_000, 1))
    held_out = transformer.held_out_nats(model, cfg)
    assert held_out < unigram - 0.5, (held_out, unigram)


def test_the_language_reads_as_sentences_and_says_what_vocabulary_it_needs():
    from parlab import corpus
    words = corpus.text(corpus.tokens(400, seed=3)).split(" . ")
    assert all(w.split()[0] in ("the", "a", "an") for w in words[:-1])
    assert " an old " in corpus.text(corpus.tokens(5000)) and " a old " not in \
        corpus.text(corpus.tokens(5000))
    with pytest.raises(ValueError, match="the language has 120 words: set GPTConfig"):
        next(transformer.text_batches(transformer.GPTConfig(vocab=64), 2))


def test_context_parallel_on_one_rank_is_the_whole_model(reference):
    import parlab
    out = parlab.launch(transformer_cp.train_cp, 1, args=(CFG, BATCH, STEPS), timeout=120)
    np.testing.assert_allclose(out.results[0]["losses"], reference["losses"], atol=TOL)
    assert out.timeline.comm_bytes(0) == \
        transformer_cp.expected_comm_bytes(CFG, BATCH, 1)["total"] * STEPS
