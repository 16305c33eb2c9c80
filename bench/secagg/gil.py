"""``gil`` section: whether AES-CTR, BLAKE3, SHA-256, Ed25519 verification and numpy's add release the
GIL (a pure-Python thread keeps running during one long call), the premise of the thread pool."""

from __future__ import annotations

import hashlib
import threading
import time

import numpy as np
from blake3 import blake3
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes


def section_gil(args) -> None:
    print("\n== gil: does a pure-Python thread keep running during one long call?")
    big = bytes(128 << 20)
    out = bytearray(128 << 20)
    key = Ed25519PrivateKey.generate()
    public, message = key.public_key(), bytes(32 << 20)
    signature = key.sign(message)
    vector = np.ones(32 << 20, dtype=np.uint32)
    calls = {
        "AES-128-CTR update_into, 128 MiB": lambda: Cipher(algorithms.AES(bytes(16)), modes.CTR(bytes(16)))
        .encryptor().update_into(big, out),
        "SHA-256, 128 MiB": lambda: hashlib.sha256(big).digest(),
        "BLAKE3, 128 MiB": lambda: blake3(big).digest(),
        "Ed25519 verify, 32 MiB message": lambda: public.verify(signature, message),
        "numpy add, 32 Mi uint32": lambda: np.add(vector, vector, out=vector),
    }
    for name, call in calls.items():
        span = {}

        def run():
            t0 = time.perf_counter()
            call()
            span["call"] = (t0, time.perf_counter())

        thread = threading.Thread(target=run)
        thread.start()
        stamps = []
        while thread.is_alive():
            stamps.append(time.perf_counter())
        thread.join()
        t0, t1 = span["call"]
        inside = sum(1 for s in stamps if t0 <= s <= t1)
        gaps = np.diff(stamps) if len(stamps) > 1 else np.array([t1 - t0])
        held = float(gaps.max()) >= 0.9 * (t1 - t0)
        print(f"  {name:36s} call {1e3 * (t1 - t0):7.1f} ms; loop iterations meanwhile {inside:8d}; longest "
              f"stall {1e3 * float(gaps.max()):6.1f} ms -> {'HOLDS the GIL' if held else 'releases the GIL'}")
