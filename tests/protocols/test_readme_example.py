"""The README's embedding example, executed as written, in a fresh interpreter without torch."""

from __future__ import annotations

import subprocess
import sys

# The README shows exactly this block (the lead keeps the two in one source).
EXAMPLE = '''\
import numpy as np
from secfed import protocols as sp

n, d = 5, 1000                               # 5 sites, updates of 1000 floats in [-1, 1]
q = sp.Quantizer.for_cohort(n, clip=1.0)     # finest fixed-point scale that cannot overflow
config = sp.SessionConfig(sp.new_session_id(), round=0, params=sp.choose_params(n),
                          dimension=d, ring_bits=q.bits)
server = sp.SecAggServer(config)
clients = [sp.SecAggClient(config, i) for i in range(n)]
rng = np.random.default_rng(0)
updates = [rng.normal(0, 0.1, d) for _ in range(n)]

def post(message):                           # your transport: bytes on the wire, typed at the ends
    return sp.decode(sp.encode(message))

for c in clients:
    server.receive(post(c.advertise_keys()))
for i, roster in server.close_phase().items():
    server.receive(post(clients[i].share_keys(post(roster))))
for i, delivery in server.close_phase().items():
    if i == 3:
        continue                             # site 3 vanishes before uploading
    clients[i].receive_shares(post(delivery))
    server.receive(post(clients[i].mask(q.to_ring(updates[i], rng))))
for i, request in server.close_phase().items():
    server.receive(post(clients[i].unmask(post(request))))
server.close_phase()
total = q.from_ring(server.result.total)     # the server learns only this sum
assert server.result.survivors == (0, 1, 2, 4)
assert np.allclose(total, sum(updates[i] for i in (0, 1, 2, 4)), atol=1e-6)
'''


def test_readme_example_runs_with_secfed_protocols_alone():
    check = "\nimport sys\nprint(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
    out = subprocess.run([sys.executable, "-c", EXAMPLE + check], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
