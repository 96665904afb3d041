"""A small generated language for the transformer to learn: English words, a grammar,
and who can do what to whom.

Nothing is downloaded: sentences come from a seeded generator. A sentence is a subject,
a verb and what the verb takes, each noun phrase with an optional adjective and an
optional place:

    the old farmer reads a short letter near the river .

Words are drawn with Zipf-like frequencies, so that counting words alone (the unigram
model) already predicts something. What it cannot predict is the structure: a verb takes
objects of some kinds only (one eats food, reads something written), an adjective fits
some kinds of noun only, "an" comes before a vowel and "a" before the rest, a sentence
ends with a full stop. A model that learns these beats the unigram model on held-out text.
"""
from __future__ import annotations

import functools
import math

import numpy as np

NOUNS = {
    "animal": "dog cat horse bird fox cow goat mouse owl sheep rabbit duck wolf bear frog",
    "person": "farmer teacher child doctor baker sailor king queen girl boy painter driver",
    "food": "bread apple soup cake fish cheese rice pear egg plum honey carrot",
    "written": "letter book map story note poem list sign song message",
    "thing": "ball box cup hat key chair lamp rope bell coat bag stone",
}
PLACES = "river market garden forest school village bridge hill field kitchen road lake"
ADJECTIVES = {
    "animal": "small old quick brown hungry wild tired",
    "person": "old young tired kind happy brave quiet",
    "food": "fresh sweet warm cold small ripe",
    "written": "short long old strange new secret",
    "thing": "red blue small big old heavy new",
}
# verb: the kinds of noun it takes as its object
VERBS = {
    "sees": ("animal", "person", "food", "written", "thing"),
    "likes": ("animal", "person", "food", "written", "thing"),
    "eats": ("food",), "cooks": ("food",), "buys": ("food", "thing", "written"),
    "reads": ("written",), "writes": ("written",),
    "carries": ("thing", "food", "animal"), "finds": ("thing", "animal", "written"),
    "feeds": ("animal", "person"), "helps": ("person", "animal"),
    "follows": ("animal", "person"), "drops": ("thing", "food"),
}
SUBJECTS = ("animal", "person")
PREPOSITIONS = "near in by behind".split()
END = "."


def vocabulary() -> list[str]:
    """Every word the language has, in a fixed order (the token ids)."""
    words = ["the", "a", "an", END, *PREPOSITIONS, *VERBS, *PLACES.split()]
    for kind in NOUNS:
        words += NOUNS[kind].split() + ADJECTIVES[kind].split()
    return list(dict.fromkeys(words))


@functools.lru_cache(maxsize=None)
def _zipf_cdf(n: int) -> np.ndarray:
    cdf = (1.0 / np.arange(1, n + 1)).cumsum()
    return cdf / cdf[-1]


def _zipf(words: list[str], rng) -> str:
    """The k-th word with probability proportional to 1/k: ``rng.choice(p=...)``'s own
    draw (one uniform number, looked up in the cumulative weights), without its checks."""
    return words[int(_zipf_cdf(len(words)).searchsorted(rng.random(), side="right"))]


def _noun_phrase(kind: str, rng) -> list[str]:
    words = []
    if rng.random() < 0.4:
        words.append(_zipf(ADJECTIVES[kind].split(), rng))
    words.append(_zipf(NOUNS[kind].split(), rng))
    article = "the" if rng.random() < 0.5 else ("an" if words[0][0] in "aeiou" else "a")
    return [article] + words


def sentence(rng) -> list[str]:
    subject = SUBJECTS[rng.integers(len(SUBJECTS))]
    verb = _zipf(list(VERBS), rng)
    kinds = VERBS[verb]
    words = _noun_phrase(subject, rng) + [verb] + _noun_phrase(kinds[rng.integers(len(kinds))], rng)
    if rng.random() < 0.3:
        words += [rng.choice(PREPOSITIONS), "the", _zipf(PLACES.split(), rng)]
    return words + [END]


def tokens(count: int, seed: int = 0) -> np.ndarray:
    """``count`` token ids of running text, sentence after sentence (int64)."""
    return _tokens(count, seed).copy()


@functools.lru_cache(maxsize=8)         # generating 200,000 words takes seconds
def _tokens(count: int, seed: int) -> np.ndarray:
    ids = {w: i for i, w in enumerate(vocabulary())}
    rng = np.random.default_rng(seed)
    out: list[int] = []
    while len(out) < count:
        out += [ids[w] for w in sentence(rng)]
    return np.array(out[:count], dtype=np.int64)


def text(ids) -> str:
    words = vocabulary()
    return " ".join(words[i] for i in ids)


def unigram_nats(train: np.ndarray, held_out: np.ndarray) -> float:
    """Cross-entropy (nats a token) on ``held_out`` of the model that only counts words
    in ``train`` (add-one smoothing): the baseline a language model must beat."""
    counts = np.bincount(train, minlength=len(vocabulary())) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-logp[held_out].mean())


def uniform_nats() -> float:
    """Cross-entropy of guessing every word as likely: what an untrained model scores."""
    return math.log(len(vocabulary()))
