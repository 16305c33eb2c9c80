"""Recorded uploads (``--record-uploads``): what the audit reads back is bit for bit what left each
client and what it started from, stored in fewer bytes than the wire carries; a damaged file is an
error naming it, never a different upload; a round recorded before compression still reads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from secfed import atomic_file
from secfed.federation import codec, recording
from secfed.federation.messages import MODEL, Broadcast, Summand, Upload


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes as integers: equal bits, not merely equal values (0.0 vs -0.0)."""
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b))


def _round() -> tuple[Broadcast, dict[int, Broadcast], list[Upload]]:
    """A round as a run records it: the broadcast, one client's own (Eq. 15) broadcast, and two uploads
    with an update-sized float summand, a ring-encoded (distributed DP) summand and a DFS payload."""
    g = torch.Generator().manual_seed(0)
    weights = torch.randn(20_000, generator=g)
    weights[:3] = torch.tensor([-0.0, 0.0, 1e-40])  # signed zero and a subnormal must survive too
    broadcast = Broadcast(4, weights, "layout-a", {"dfs/1": torch.randn(3, 8, generator=g)})
    personal = {2: Broadcast(4, weights + 1e-3 * torch.randn(20_000, generator=g), "layout-a")}
    update = [1e-3 * torch.randn(20_000, generator=g) for _ in range(2)]
    uploads = [Upload(k, 4, {MODEL: Summand(update[k - 1], 10.0 + k, "float", 2.0, ((0, 50),)),
                             "ring": Summand(torch.randint(0, 2**32, (5_000,), generator=g), 1.0, "ring")},
                      {"dfs": torch.randn(3, 8, generator=g)}, bytes(range(32)))
               for k in (1, 2)]
    return broadcast, personal, uploads


def _assert_same_round(got: recording.RecordedRound, broadcast: Broadcast, personal: dict[int, Broadcast],
                       uploads: list[Upload]) -> None:
    for want, have in [(broadcast, got.broadcast), *((b, got.personal[k]) for k, b in personal.items())]:
        assert (have.round, have.layout_id) == (want.round, want.layout_id) and _same(have.weights, want.weights)
        assert have.payloads.keys() == want.payloads.keys()
        assert all(_same(have.payloads[n], v) for n, v in want.payloads.items())
    assert set(got.personal) == set(personal) and set(got.uploads) == {u.client_id for u in uploads}
    for want_u in uploads:
        have_u = got.uploads[want_u.client_id]
        assert (have_u.round, have_u.model_hash) == (want_u.round, want_u.model_hash)
        for name, s in want_u.summed.items():
            h = have_u.summed[name]
            assert _same(h.vector, s.vector)
            assert (h.weight, h.encoding, h.bound, h.statistics) == (s.weight, s.encoding, s.bound, s.statistics)
        assert all(_same(have_u.shared[n], v) for n, v in want_u.shared.items())


def test_a_recorded_round_reads_back_bit_for_bit_in_fewer_bytes_than_the_wire(tmp_path: Path) -> None:
    broadcast, personal, uploads = _round()
    recording.write_round(tmp_path, 5, uploads, broadcast, personal)
    assert recording.recorded_rounds(tmp_path) == [5]
    _assert_same_round(recording.read_round(tmp_path, 5), broadcast, personal, uploads)
    folder = recording.round_folder(tmp_path, 5)
    wire = (codec.broadcast_size(broadcast) + sum(codec.broadcast_size(b) for b in personal.values())
            + sum(codec.upload_size(u) for u in uploads))
    on_disk = sum(p.stat().st_size for p in folder.iterdir())
    assert on_disk < 0.9 * wire  # the wire bytes as they are (before: exactly `wire`)
    # the ring vector's unused high bytes cost next to nothing: the upload is well under its wire size
    ring_only = Upload(1, 4, {"ring": uploads[0].summed["ring"]})
    assert len(codec.compress(codec.encode_upload(ring_only))) < 0.6 * codec.upload_size(ring_only)


def test_a_flipped_byte_in_a_stored_message_is_refused_or_changes_nothing() -> None:
    """Every single-byte change of a compressed message: a CodecError, or (a flip in the last deflate
    byte's padding bits) exactly the message that was stored — never a different upload."""
    broadcast, _, uploads = _round()
    message = codec.encode_upload(Upload(1, 4, {MODEL: Summand(uploads[0].summed[MODEL].vector[:300])}))
    stored = codec.compress(message)
    assert codec.decompress(stored) == message
    refused = 0
    for i in range(len(stored)):
        damaged = bytearray(stored)
        damaged[i] ^= 0x10
        try:
            assert codec.decompress(bytes(damaged)) == message, f"byte {i}"
        except codec.CodecError:
            refused += 1
    assert refused >= len(stored) - 1
    for bad in (stored[:-5], stored + b"\0", b"SFEZ\x09" + stored[5:], b""):
        with pytest.raises(codec.CodecError):
            codec.decompress(bad)


def test_a_stored_message_cannot_inflate_beyond_what_its_header_declares() -> None:
    """A decompression bomb: the header declares 300 floats, the deflate stream goes on with 256 MiB
    of zeros (a 250 kB file). It is refused after at most one byte beyond the declared length, never
    inflated whole (before, decompress inflated everything first)."""
    import zlib

    _, _, uploads = _round()
    message = codec.encode_upload(Upload(1, 4, {MODEL: Summand(uploads[0].summed[MODEL].vector[:300])}))
    stored = codec.compress(message)
    bomb = stored[:5] + zlib.compress(message + bytes(256 << 20), 9)
    assert len(bomb) < 300_000
    with pytest.raises(codec.CodecError, match="inflates beyond the"):
        codec.decompress(bomb)
    assert codec.upload_identity(bomb)[0] == 1  # the header alone still reads
    # ... nor declare more than the reader knows a message can hold (found by review: a 1 MB file
    # declared 1 GiB of zeros, and the audit inflated four such files at once)
    declared = codec.compress(codec.encode_upload(Upload(1, 4, {MODEL: Summand(torch.zeros(1 << 20))})))
    with pytest.raises(codec.CodecError, match="declares 4,194,.* bytes, more than the 1,000,000"):
        codec.decompress(declared, limit=1_000_000)
    assert len(codec.decompress(declared, limit=5_000_000)) > 1 << 22


def test_a_damaged_recorded_file_is_an_error_that_names_it(tmp_path: Path) -> None:
    broadcast, personal, uploads = _round()
    recording.write_round(tmp_path, 1, uploads, broadcast, personal)
    path = recording.round_folder(tmp_path, 1) / "client-0002.upload"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(recording.RecordingError, match="client-0002.upload"):
        recording.read_round(tmp_path, 1)
    (recording.round_folder(tmp_path, 1) / "broadcast.bin").unlink()
    with pytest.raises(recording.NoBroadcast, match="broadcast.bin"):
        recording.read_round(tmp_path, 1)


def test_a_round_recorded_before_compression_reads_the_same(tmp_path: Path) -> None:
    """Run directories written by an earlier secfed hold the plain wire bytes."""
    broadcast, personal, uploads = _round()
    folder = recording.round_folder(tmp_path, 2)
    folder.mkdir(parents=True)
    atomic_file.write_bytes(folder / "broadcast.bin", codec.encode_broadcast(broadcast))
    for k, b in personal.items():
        atomic_file.write_bytes(folder / f"client-{k:04d}.broadcast", codec.encode_broadcast(b))
    for u in uploads:
        atomic_file.write_bytes(folder / f"client-{u.client_id:04d}.upload", codec.encode_upload(u))
    _assert_same_round(recording.read_round(tmp_path, 2), broadcast, personal, uploads)


def test_the_model_hashes_come_from_the_headers_alone(tmp_path: Path) -> None:
    """The audit's protocol check reads each upload's model hash without inflating its tensors: a file
    whose tensors are cut off still gives its hash, and a damaged header is an error naming the file."""
    broadcast, personal, uploads = _round()
    uploads.append(Upload(7, 4, {MODEL: Summand(torch.zeros(20_000))}))  # a client that sent no hash
    recording.write_round(tmp_path, 1, uploads, broadcast, personal)
    assert recording.model_hashes(tmp_path, 1) == {1: bytes(range(32)), 2: bytes(range(32)), 7: None}
    path = recording.round_folder(tmp_path, 1) / "client-0001.upload"
    path.write_bytes(path.read_bytes()[:1000])  # the header survives, the tensors do not
    assert recording.model_hashes(tmp_path, 1)[1] == bytes(range(32))
    with pytest.raises(recording.RecordingError, match="client-0001.upload"):
        recording.read_round(tmp_path, 1)
    path.write_bytes(b"SFEZ\x01" + b"\x00" * 40)
    with pytest.raises(recording.RecordingError, match="client-0001.upload"):
        recording.model_hashes(tmp_path, 1)
    plain = codec.encode_upload(uploads[0])  # a file from before compression: its header as it is
    assert codec.upload_identity(plain) == (1, bytes(range(32)))
