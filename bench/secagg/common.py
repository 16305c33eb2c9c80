"""What the sections share: formatting, the clients' updates, the raw-keystream floor, sessions and
per-step clocks fed by the protocol driver's ``on_step`` hook."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from secfed.protocols import GraphParams, Phase, Quantizer, Session, StepTime
from secfed.protocols.prg import CHUNK_WORDS, counter_block

CLIP = 1.0


def load() -> str:
    """The load averages, for the header and the end of each section (the machine is shared)."""
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


def fmt_s(v: float | None) -> str:
    return "-" if v is None else (f"{v:.3f}" if v < 10 else f"{v:.1f}")


def update_of(seed: int, client: int, d: int) -> np.ndarray:
    """Client ``client``'s float32 update: deterministic, generated when needed (n·d floats do not fit)."""
    return np.random.default_rng([seed, client]).normal(0.0, 0.05, d).astype(np.float32)


def new_session(params: GraphParams, d: int, authenticated: bool) -> tuple[Session, Quantizer]:
    """A fresh session for ``params`` with vectors of length d, and the quantizer sized for its cohort."""
    q = Quantizer.for_cohort(params.n_clients, CLIP)
    session = Session.new(params, dimension=d, ring_bits=q.bits, input_bound=q.max_abs,
                          authenticated=authenticated, session_id=os.urandom(16))
    return session, q


def dropped_clients(n: int, fraction: float, rng: np.random.Generator) -> set[int]:
    """round(fraction·n) clients, drawn without replacement."""
    return set(rng.choice(n, size=round(fraction * n), replace=False).tolist())


def after_sharing_keys(dropped: set[int]) -> Callable[[int, Phase], bool]:
    """The driver's ``alive``: the ``dropped`` clients vanish once they have shared their keys."""
    return lambda i, phase: i not in dropped or phase < Phase.MASKED_INPUT


@dataclass
class Clock:
    """Wall and CPU seconds spent in one kind of work."""

    wall: float = 0.0
    cpu: float = 0.0

    def add(self, step: StepTime) -> None:
        self.wall += step.wall
        self.cpu += step.cpu

    def run(self, fn, *args):
        """``fn(*args)``, its seconds added here (for work the protocol driver does not do)."""
        w, c = time.perf_counter(), time.process_time()
        out = fn(*args)
        self.wall += time.perf_counter() - w
        self.cpu += time.process_time() - c
        return out


# ---- raw keystream: the floor masking is compared with ---------------------------------------------


def raw_keystream_seconds(streams: int, d: int, threads: int = 1) -> float:
    """AES-128-CTR keystream for ``streams`` × d words in the chunks the masking pass uses, nothing
    else; with ``threads`` > 1 each thread produces its share of the words (counter offsets)."""
    parts = [(lo, min(d, lo + -(-d // threads))) for lo in range(0, d, -(-d // threads))]

    def produce(lo: int, hi: int) -> None:
        zeros, buf = memoryview(bytes(4 * CHUNK_WORDS)), bytearray(4 * CHUNK_WORDS)
        ciphers = [Cipher(algorithms.AES(os.urandom(16)), modes.CTR(counter_block(bytes(16), lo - lo % 4))).encryptor()
                   for _ in range(streams)]
        for start in range(lo, hi, CHUNK_WORDS):
            n = min(CHUNK_WORDS, hi - start)
            for c in ciphers:
                c.update_into(zeros[: 4 * n], buf)

    start = time.perf_counter()
    if len(parts) == 1:
        produce(*parts[0])
    else:
        workers = [threading.Thread(target=produce, args=p) for p in parts]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    return time.perf_counter() - start


def best_of(repeats: int, fn: Callable[[], float]) -> float:
    return min(fn() for _ in range(repeats))


def seconds(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
