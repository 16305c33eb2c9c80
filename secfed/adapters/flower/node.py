"""What a SuperNode's machine keeps for itself: its sealing key, its identity, the cohort it trusts.

    STATE_DIR/              node config ``secfed-state-dir`` (default: $XDG_STATE_HOME/secfed/flower)
        node.key            32 random bytes from the OS, created on first use (0600, folder 0700).
                            AES-256-GCM key that seals the protocol state a ClientApp leaves in Flower's
                            ``context.state`` between messages. It is read only by processes on this
                            machine and is never put into a message or into ``context.state``.
        identity.pem        the node's Ed25519 identity (PKCS#8 PEM, 0600) for authenticated secure
                            aggregation; its public half goes into the deployment's cohort file
                            (``secfed flower keys`` prints it)
        sites/              ``secfed train --flower``: one private folder per site (see sites.py)

    cohort file             node config ``secfed-cohort``: the identity keys the node trusts (TOML,
                            below). The server uses the same file to accept nodes.

Both keys are created with write-to-a-temporary-file-then-link, so two processes racing on a
fresh folder end up with the same key and a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import socket
import stat
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secfed.protocols.crypto import open_sealed, seal, transcript
from secfed.protocols.edwards import weak_identity_key

STATE_DIR_KEY = "secfed-state-dir"
COHORT_KEY = "secfed-cohort"
NODE_KEY_FILE = "node.key"
IDENTITY_FILE = "identity.pem"
SEALING_KEY_BYTES = 32


class NodeSetupError(ValueError):
    """A node's state folder, key or cohort file is missing or unusable; names the path."""


# A path: absolute, under ~ or ~user, relative with ./ or ../, or relative with two slashes or more (a/b/c) —
# what a node's error text names on its own machine. The server gets the text without them (public_text);
# the node's log keeps them. A path ends at a space, a quote, a bracket, a colon or a backslash.
_END = r"\s:'\"`,;()\[\]{}<>\\"
_PATH = re.compile(rf"(?:~[\w.-]*|\.{{1,2}})?/[^{_END}]+|[\w.-]+(?:/[\w.-]+){{2,}}/?")
PATH_SAID = "<a path on the node>"


def public_text(text: str, roots: Sequence[str] = ()) -> str:
    """``text`` as a node says it to the server: its ``roots`` (absolute folders, e.g. :func:`private_roots`,
    spaces and all, each up to a path's end) and then every path replaced by :data:`PATH_SAID` — not a
    URL's //host (a ``file://`` URL's path is), a ratio such as 1/2, or and/or. Found by review: a node's
    refusal carried its folders, its user name among them, to the server's log; then relative roots
    replaced the words of the text that happened to spell them."""
    for root in sorted({r.rstrip("/") for r in roots if r.startswith("/") and len(r.rstrip("/")) > 1},
                       key=len, reverse=True):
        text = re.sub(re.escape(root) + rf"(?:/[^{_END}]*)?(?=[{_END}]|$)", PATH_SAID, text)

    def said(match: re.Match[str]) -> str:
        before = text[match.start() - 1] if match.start() else " "
        url = before == ":" and match.group().startswith("//") and not text[:match.start()].endswith("file:")
        if before.isalnum() or before in "_/.~-" or url:
            return match.group()  # a word's slash (and/or, 1/2), or a URL's authority
        return PATH_SAID

    return re.sub(f"(?:{re.escape(PATH_SAID)})+", PATH_SAID, _PATH.sub(said, text))


def private_roots(node_config: Mapping[str, object]) -> list[str]:
    """The absolute folders a node's error text may name, as given and resolved: its state folder, data
    and public roots (node config), home, working and temporary folders."""
    named = [node_config.get(k) for k in (STATE_DIR_KEY, "secfed-data-root", "secfed-public-root")]
    found = [str(v) for v in named if isinstance(v, str) and v]
    # where state_dir() puts it, made or not; any of them may be unknowable (no home, a deleted cwd)
    for where in (Path.home, os.getcwd, tempfile.gettempdir, default_state_dir):
        with contextlib.suppress(OSError, RuntimeError, KeyError):
            found.append(str(where()))
    out = []
    for r in found:
        with contextlib.suppress(OSError, RuntimeError, ValueError):
            out += [str(Path(r).expanduser().absolute()), str(Path(r).expanduser().resolve())]
    return sorted({r for r in out if r != "/"})


def yes(value: object) -> bool:
    """A node-config switch (``true``/``1``/``yes``, as text or a TOML boolean) set on."""
    return str(value).lower() in ("true", "1", "yes")


def number(raw: object, key: str, *, below: float = math.inf, unit: str = "") -> float:
    """A node-config number ≥ 0 (and < ``below``): :class:`NodeSetupError` naming ``key`` otherwise."""
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise NodeSetupError(f"node config {key}={raw!r} is not a number{unit}") from None
    if not 0 <= value < below:
        bound = f"in [0, {below:g})" if below < math.inf else "≥ 0"
        raise NodeSetupError(f"node config {key}={raw!r} must be {bound}{unit}")
    return value


def whole(raw: object, key: str, *, least: int = 0) -> int:
    """A node-config whole number ≥ ``least``: :class:`NodeSetupError` naming ``key`` otherwise (found
    by review: ``secfed-min-clients = 1.5`` was cut to 1 and ``'abc'`` raised a bare ValueError)."""
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        value = math.nan
    if isinstance(raw, bool) or not math.isfinite(value) or value != int(value) or value < least:
        raise NodeSetupError(f"node config {key}={raw!r} must be a whole number ≥ {least}")
    return int(value)


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "secfed" / "flower"


def state_dir(node_config: Mapping[str, object]) -> Path:
    """The node's state folder from its node config (``secfed-state-dir``), resolved: created 0700 with
    every folder made for it, this user's (tightened to 0700 if looser), and out of other users' reach
    — every folder above it this user's or root's, none writable by others (group or everyone) unless
    sticky, as OpenSSH's StrictModes has it. Found by review: under umask 000 the parents were 0777 and
    another user swapped the folder for one of theirs (the node sent it the broadcast and used its empty
    privacy record); then a link planted under /tmp, flipped after the check, and an ancestor of
    another user passed."""
    raw = node_config.get(STATE_DIR_KEY)
    path = Path(str(raw)).expanduser() if raw else default_state_dir()
    try:
        missing = [p for p in (path, *path.parents) if not p.exists() and not p.is_symlink()]
        for folder in reversed(missing):
            folder.mkdir(mode=0o700, exist_ok=True)
        real = path.resolve(strict=True)  # used from here on: a link flipped later leads nowhere
        info = real.stat()
        if info.st_uid != os.geteuid():
            raise NodeSetupError(f"{STATE_DIR_KEY}={path}: {real} is owned by another user (uid {info.st_uid}); "
                                 "a node keeps its keys and records only in a folder of its own")
        if info.st_mode & 0o077:
            real.chmod(0o700)
        for above in real.parents:
            st = above.stat()
            if st.st_uid not in (0, os.geteuid()):
                raise NodeSetupError(f"{STATE_DIR_KEY}={path}: {above} belongs to another user (uid {st.st_uid}), "
                                     "who could move the state folder away")
            shared = st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and not _private_group(st.st_gid))
            if shared and not st.st_mode & stat.S_ISVTX:
                raise NodeSetupError(f"{STATE_DIR_KEY}={path}: {above} is writable by other users, who could put "
                                     f"a folder of theirs in the state folder's place (chmod go-w {above})")
    except (OSError, RuntimeError) as exc:
        raise NodeSetupError(f"{STATE_DIR_KEY}={path}: cannot create the node's state folder ({exc})") from None
    return real


@functools.lru_cache(maxsize=64)
def _private_group(gid: int) -> bool:
    """Whether ``gid`` is this user's own group with nobody else in it (a user-private group, as
    Fedora and Ubuntu give every user with umask 002: a folder writable by it is writable by this user
    alone — found by review: `secfed flower local` under umask 002 was refused)."""
    import grp
    import pwd

    try:
        group, me = grp.getgrgid(gid), pwd.getpwuid(os.geteuid())
    except KeyError:
        return False
    # named after the user, as user-private groups are: a directory service lists no account by its
    # primary group, so a shared primary group ("domain users") would look private (review)
    return gid == me.pw_gid and group.gr_name == me.pw_name and not [m for m in group.gr_mem if m != me.pw_name] \
        and not any(p.pw_gid == gid and p.pw_uid != me.pw_uid for p in pwd.getpwall())


def bind_private(sock: socket.socket, address: str) -> None:
    """Bind the Unix socket ``sock`` to ``address`` created 0600 (this user only), whatever the folder."""
    mask = os.umask(0o177)
    try:
        sock.bind(address)
    finally:
        os.umask(mask)


def _create_once(path: Path, make: bytes) -> bytes:
    """``path``'s bytes; when it does not exist, ``make`` is written there first (0600, atomically)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not path.exists():
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(make)
                fh.flush()
                os.fsync(fh.fileno())
            os.link(tmp, path)  # fails if another process created it meanwhile: theirs wins
        except FileExistsError:
            pass
        finally:
            Path(tmp).unlink(missing_ok=True)
    try:
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise NodeSetupError(f"{path}: not a file of this user's alone (0600): a key another user could "
                                 "write or read is no key of this node")  # found by review: a planted identity
        return path.read_bytes()
    except OSError as exc:
        raise NodeSetupError(f"{path}: cannot read ({exc})") from None


def sealing_key(folder: Path) -> bytes:
    key = _create_once(folder / NODE_KEY_FILE, os.urandom(SEALING_KEY_BYTES))
    if len(key) != SEALING_KEY_BYTES:
        raise NodeSetupError(f"{folder / NODE_KEY_FILE}: {len(key)} bytes, expected {SEALING_KEY_BYTES}")
    return key


def identity_key(folder: Path) -> Ed25519PrivateKey:
    """The node's Ed25519 identity, created on first use."""
    fresh = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    pem = _create_once(folder / IDENTITY_FILE, fresh)
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise NodeSetupError(f"{folder / IDENTITY_FILE}: not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise NodeSetupError(f"{folder / IDENTITY_FILE}: not an Ed25519 key")
    return key


def public_identity(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes_raw()


# ---- sealing what the node leaves in context.state ---------------------------------------------------


def _binding(purpose: str, run_id: int, node_id: int) -> bytes:
    return transcript(f"flower-node-state/{purpose}", run_id, node_id)


def seal_state(key: bytes, plaintext: bytes, *, purpose: str, run_id: int, node_id: int) -> bytes:
    """AES-256-GCM under the node key, bound to (purpose, run, node): a sealed state from another
    run or node does not open here."""
    return seal(key, plaintext, _binding(purpose, run_id, node_id))


def open_state(key: bytes, sealed: bytes, *, purpose: str, run_id: int, node_id: int) -> bytes:
    """Inverse of :func:`seal_state`; DecryptionFailed for anything else."""
    return open_sealed(key, sealed, _binding(purpose, run_id, node_id))


# ---- the cohort the deployment trusts ---------------------------------------------------------------


def toml_key(name: str) -> str:
    """``name`` as a quoted TOML key: JSON's escapes are TOML's, but a character beyond the BMP must stay
    itself, not a surrogate pair TOML refuses (found by review: "lab🔬"); NodeSetupError for a name that
    is no Unicode text (a lone surrogate from undecodable bytes)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise NodeSetupError(f"site name {name!r} is not valid Unicode text") from None
    return json.dumps(name, ensure_ascii=False)


@dataclass(frozen=True)
class Cohort:
    """The sites a deployment trusts: name → Ed25519 public identity key (32 bytes).

    On disk (TOML), one line per site, the key in hex as ``secfed flower keys`` prints it::

        [sites]
        campus = "9f1c…"
    """

    sites: Mapping[str, bytes]

    def __post_init__(self) -> None:
        keys = list(self.sites.values())
        if len(set(keys)) != len(keys):
            raise NodeSetupError("cohort lists one identity key under two names")
        for name, key in self.sites.items():
            toml_key(name)  # a name TOML cannot hold is refused here, not when the file is read back
            if len(key) != 32:
                raise NodeSetupError(f"cohort site {name!r}: identity key must be 32 bytes, got {len(key)}")
            if weak := weak_identity_key(key):  # (found by review: two encodings of the neutral point enrolled)
                raise NodeSetupError(f"cohort site {name!r}: identity key is {weak}")

    def name_of(self, key: bytes) -> str | None:
        return next((name for name, k in self.sites.items() if k == key), None)

    def __contains__(self, key: object) -> bool:
        return key in self.sites.values()

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Cohort:
        path = Path(path).expanduser()
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError, ValueError) as exc:  # ValueError: a NUL in the path
            raise NodeSetupError(f"{path}: cannot read the cohort file ({exc})") from None
        return cls.loads(text, str(path))

    @classmethod
    def loads(cls, text: str, where: str = "cohort") -> Cohort:
        """A cohort from its TOML text (:meth:`dumps`); ``where`` names it in errors."""
        from secfed.config import tomllib

        try:
            raw = tomllib.loads(text)
        except (tomllib.TOMLDecodeError, RecursionError) as exc:  # nested too deeply: RecursionError (review)
            raise NodeSetupError(f"{where}: cannot read the cohort file ({exc or 'nested too deeply'})") from None
        table = raw.get("sites")
        if not isinstance(table, dict) or not table:
            raise NodeSetupError(f"{where}: needs a [sites] table with one `name = \"hex key\"` line per site")
        sites = {}
        for name, value in table.items():
            try:
                sites[name] = bytes.fromhex(value)
            except (TypeError, ValueError):
                raise NodeSetupError(f"{where}: sites.{name} must be a hex string") from None
        try:
            return cls(sites)
        except NodeSetupError as exc:
            raise NodeSetupError(f"{where}: {exc}") from None

    def dumps(self) -> str:
        lines = ["# secfed cohort: the sites this deployment trusts and their Ed25519 identity keys", "[sites]"]
        lines += [f'{toml_key(name)} = "{key.hex()}"' for name, key in self.sites.items()]
        return "\n".join(lines) + "\n"
