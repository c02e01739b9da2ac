"""Generated workloads for the fleet benchmark (no download).

Each generator returns :class:`SimRequest` arrivals, sorted by time, from a
seeded :class:`random.Random`: the same seed, rate and duration give the same
requests. Prompt text is real text (the engines hash it into 16-token
blocks, the routers into their own blocks), built from a pool of random
64-character chunks so that a 4,000-token prompt costs a join, not 16,000
random draws. Texts are 4 characters a token, as the engine simulator counts
them; a unique header chunk starts every question so that two questions of
one group share exactly their system prompt.

Workloads (:data:`WORKLOADS`):

``chat``
    Poisson arrivals; input tokens normal(4,096, 2,048) clipped to
    [128, 12,000]; output tokens exponential with mean 1,024, clipped to
    [16, 4,096]. No shared prefixes beyond chance.
``shared_prefix``
    32 groups x 32 prompts: a 2,048-token system prompt per group, a
    256-token question, 256 output tokens; each arrival picks a group and a
    question uniformly (llm-d-benchmark's ``shared_prefix_synthetic`` shape).
``shared_prefix_long``
    150 groups x 5 prompts, system 6,000 tokens, question 1,200, output
    1,000 (llm-d's optimized-baseline guide shape).
``multiturn``
    Conversations start as a Poisson process; each has 5 turns 5 s apart
    (mean, exponential think time); a turn's prompt is a 1,024-token system
    prompt shared by 8 conversation families plus the whole history (earlier
    questions and answers), a 192-token question, 192 output tokens.
``bursty``
    ``shared_prefix`` content with on/off arrivals: 4 s at 1.8x the mean
    rate, 4 s at 0.2x.
``two_models``
    ``shared_prefix`` content split evenly over two models, each served by
    half the pods (two worker sets of one pool).
``hetero``
    ``shared_prefix`` content on one worker set whose pods have two GPU
    profiles (half ``h100``, half ``a10g``; see the fleet spec).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

CHARS_PER_TOKEN = 4
CHUNK_TOKENS = 16
CHUNK_CHARS = CHUNK_TOKENS * CHARS_PER_TOKEN
_ALPHABET = "abcdefghijklmnopqrstuvwxyz     "
_POOL_SIZE = 4096


@dataclass(eq=False, slots=True)
class SimRequest:
    """One request of a workload, as a client would send it."""

    id: str
    time: float
    text: str
    #: tokens the engine will count (4 characters each)
    prompt_tokens: int
    output_len: int
    model: str = "m"
    #: prefix group (for reporting; routers never read it)
    group: int = -1
    #: leading tokens the workload means to be shared with earlier requests
    #: (the group's system prompt; for a conversation's turn, the family's
    #: system prompt and then the previous turn's prompt): what an engine
    #: could already hold cached. Routers never read it; the floors do
    #: (:mod:`.floor`).
    prefix_tokens: int = 0
    tags: frozenset[str] = frozenset()
    #: filled by the fleet on first use
    engine_hashes: tuple[bytes, ...] | None = None
    router_hashes: tuple[int, ...] | None = None
    extra: dict = field(default_factory=dict)


class TextFactory:
    """Prompt texts from a fixed pool of random chunks (seeded)."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(f"chunks/{seed}")
        self.pool = ["".join(rng.choices(_ALPHABET, k=CHUNK_CHARS)) for _ in range(_POOL_SIZE)]
        self._n = 0

    def unique_header(self) -> str:
        """A chunk no other prompt of this factory starts a question with."""
        self._n += 1
        n, letters = self._n, []
        while n:
            n, r = divmod(n, 26)
            letters.append(chr(97 + r))
        tag = "".join(letters)
        return ("q" + tag + " " * CHUNK_CHARS)[:CHUNK_CHARS]

    def text(self, rng: random.Random, tokens: int, *, unique: bool = True) -> str:
        """About ``tokens`` tokens of text (a multiple of 16, at least 16)."""
        chunks = max(1, round(tokens / CHUNK_TOKENS))
        parts = [self.unique_header()] if unique else []
        parts.extend(rng.choices(self.pool, k=chunks - len(parts)))
        return "".join(parts)


def _poisson_times(rng: random.Random, rate: float, duration: float) -> list[float]:
    out, t = [], rng.expovariate(rate)
    while t < duration:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def _tokens(text: str) -> int:
    return max(1, -(-len(text) // CHARS_PER_TOKEN))


def chat(rng: random.Random, rate: float, duration: float, factory: TextFactory) -> list[SimRequest]:
    out = []
    for i, t in enumerate(_poisson_times(rng, rate, duration)):
        n_in = int(min(12_000, max(128, rng.gauss(4096, 2048))))
        n_out = int(min(4096, max(16, rng.expovariate(1 / 1024))))
        text = factory.text(rng, n_in)
        out.append(SimRequest(f"c{i}", t, text, _tokens(text), n_out))
    return out


def _grouped(rng: random.Random, times: list[float], factory: TextFactory, *, groups: int, per_group: int,
             system: int, question: int, output: int, prefix: str = "s",
             models: tuple[str, ...] = ("m",)) -> list[SimRequest]:
    grng = random.Random(f"groups/{groups}/{system}/{question}/{rng.random()}")
    systems = [factory.text(grng, system, unique=False) for _ in range(groups)]
    questions = [[factory.text(grng, question) for _ in range(per_group)] for _ in range(groups)]
    out = []
    for i, t in enumerate(times):
        g = rng.randrange(groups)
        q = rng.randrange(per_group)
        text = systems[g] + questions[g][q]
        model = models[g % len(models)]
        out.append(SimRequest(f"{prefix}{i}", t, text, _tokens(text), output, model=model, group=g,
                              prefix_tokens=_tokens(systems[g])))
    return out


def shared_prefix(rng: random.Random, rate: float, duration: float, factory: TextFactory) -> list[SimRequest]:
    return _grouped(rng, _poisson_times(rng, rate, duration), factory,
                    groups=32, per_group=32, system=2048, question=256, output=256)


def shared_prefix_long(rng: random.Random, rate: float, duration: float,
                       factory: TextFactory) -> list[SimRequest]:
    return _grouped(rng, _poisson_times(rng, rate, duration), factory,
                    groups=150, per_group=5, system=6000, question=1200, output=1000, prefix="l")


def two_models(rng: random.Random, rate: float, duration: float, factory: TextFactory) -> list[SimRequest]:
    return _grouped(rng, _poisson_times(rng, rate, duration), factory,
                    groups=32, per_group=32, system=2048, question=256, output=256, prefix="t",
                    models=("m", "n"))


def bursty(rng: random.Random, rate: float, duration: float, factory: TextFactory) -> list[SimRequest]:
    times, t0 = [], 0.0
    on = True
    while t0 < duration:
        r = rate * (1.8 if on else 0.2)
        times.extend(t0 + x for x in _poisson_times(rng, r, min(4.0, duration - t0)))
        t0 += 4.0
        on = not on
    return _grouped(rng, times, factory, groups=32, per_group=32, system=2048, question=256, output=256,
                    prefix="b")


def multiturn(rng: random.Random, rate: float, duration: float, factory: TextFactory) -> list[SimRequest]:
    """``rate`` is requests/s: conversations start at rate / turns."""
    turns, families = 5, 8
    frng = random.Random(f"families/{rng.random()}")
    systems = [factory.text(frng, 1024, unique=False) for _ in range(families)]
    out = []
    for c, start in enumerate(_poisson_times(rng, rate / turns, duration)):
        history = systems[rng.randrange(families)]
        shared = _tokens(history)
        t = start
        for k in range(turns):
            history += factory.text(rng, 192)
            text = history
            out.append(SimRequest(f"u{c}.{k}", t, text, _tokens(text), 192, group=c, prefix_tokens=shared))
            # the engine computed this prompt; the answer it generated is not the text the client resends
            shared = _tokens(text)
            history += factory.text(rng, 192)  # the answer, as the client resends it
            t += rng.expovariate(1 / 5.0)
    out.sort(key=lambda r: r.time)
    return [r for r in out if r.time < duration * 1.5]


def hetero(rng: random.Random, rate: float, duration: float, factory: TextFactory) -> list[SimRequest]:
    return _grouped(rng, _poisson_times(rng, rate, duration), factory,
                    groups=32, per_group=32, system=2048, question=256, output=256, prefix="h")


def trial(rng: random.Random, rate: float, duration: float, factory: TextFactory, *,
          groups: int = 16) -> list[SimRequest]:
    """The issue's first real-time trial: 16 groups (or ``groups``) of
    2,000-token system prompts, ~200-token questions, 32 output tokens (4
    pods, 1,200 KV blocks)."""
    return _grouped(rng, _poisson_times(rng, rate, duration), factory,
                    groups=groups, per_group=64, system=2000, question=200, output=32, prefix="x")


WORKLOADS = {
    "chat": chat,
    "shared_prefix": shared_prefix,
    "shared_prefix_long": shared_prefix_long,
    "multiturn": multiturn,
    "bursty": bursty,
    "two_models": two_models,
    "hetero": hetero,
    "trial": trial,
}


def generate(name: str, seed: int, rate: float, duration: float, **shape: int) -> list[SimRequest]:
    """The workload's requests for a seed, rate and duration (the same list
    every time); ``shape``: keyword arguments of the workload's function
    (``groups=`` for ``trial``), part of the seed when given."""
    try:
        gen = WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}") from None
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"rate must be positive, got {rate}")
    tag = "".join(f"/{k}={v}" for k, v in sorted(shape.items()))
    rng = random.Random(f"{name}/{seed}/{rate:.6f}/{duration:.3f}{tag}")
    return gen(rng, rate, duration, TextFactory(seed), **shape)
