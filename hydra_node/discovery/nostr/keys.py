"""The node's Nostr key (secp256k1, nostr-sdk ``Keys``) at ``HOME/identity/nostr.key``.

Separate from the Ed25519 node identity: a listing key can be rotated (delete the file)
without changing the node id.  The file holds the secret as ``nsec1...`` on one line,
mode 0600; a file readable by others or unreadable as a key is refused, never replaced.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # nostr-sdk loads on first use (about 19 MB): a node without Nostr never pays
    from nostr_sdk import Keys

KEY_RELATIVE_PATH = Path("identity") / "nostr.key"
MAX_KEY_FILE = 1024  # bytes; an nsec is 63 characters


class NostrKeyError(Exception):
    """The Nostr key file is unusable; the message says how to fix it."""


def nostr_key_path(home: Path) -> Path:
    return home / KEY_RELATIVE_PATH


def load_or_create_nostr_keys(home: Path) -> Keys:
    """Load the key, creating it (0600, directory 0700) when missing."""
    path = nostr_key_path(home)
    try:
        return _load(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    from nostr_sdk import Keys

    keys = Keys.generate()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(keys.secret_key().to_bech32() + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # atomic and refuses to overwrite a key another process just made
        except FileExistsError:
            return _load(path)
    finally:
        tmp.unlink(missing_ok=True)
    return keys


def _load(path: Path) -> Keys:
    st = path.stat()  # FileNotFoundError goes to the caller
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise NostrKeyError(f"{path} is accessible by other users (mode {mode:o}); run: chmod 600 {path}")
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_KEY_FILE:
        raise NostrKeyError(f"{path} is not a small regular file; move it away to create a new key")
    try:
        text = path.read_text(encoding="ascii").strip()
        if not text:
            raise ValueError("empty")
        from nostr_sdk import Keys

        return Keys.parse(text)
    except Exception as exc:  # nostr-sdk raises its own NostrSdkError types
        raise NostrKeyError(f"{path} is corrupt ({type(exc).__name__}); move it away to create a new key") from None
