"""Nostr key file: created 0600 under HOME/identity, reloaded, refused when open or corrupt."""

from __future__ import annotations

import os
import stat

import pytest

from hydra_node.discovery.nostr.keys import NostrKeyError, load_or_create_nostr_keys, nostr_key_path


def test_created_with_private_modes_and_reloaded(tmp_path):
    keys = load_or_create_nostr_keys(tmp_path)
    path = nostr_key_path(tmp_path)
    assert path == tmp_path / "identity" / "nostr.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_text().startswith("nsec1")
    again = load_or_create_nostr_keys(tmp_path)
    assert again.public_key().to_hex() == keys.public_key().to_hex()
    assert [p.name for p in path.parent.iterdir()] == ["nostr.key"]  # no temp files left


def test_open_permissions_are_refused(tmp_path):
    load_or_create_nostr_keys(tmp_path)
    path = nostr_key_path(tmp_path)
    os.chmod(path, 0o644)
    with pytest.raises(NostrKeyError, match="chmod 600"):
        load_or_create_nostr_keys(tmp_path)


@pytest.mark.parametrize("content", ["", "nsec1notakey\n", "zz" * 32, "\x00\x01"])
def test_corrupt_file_is_refused_not_replaced(tmp_path, content):
    path = nostr_key_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    os.chmod(path, 0o600)
    with pytest.raises(NostrKeyError, match="corrupt"):
        load_or_create_nostr_keys(tmp_path)
    assert path.read_text() == content


def test_hex_secret_is_accepted(tmp_path):
    path = nostr_key_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text("11" * 32 + "\n")
    os.chmod(path, 0o600)
    assert len(load_or_create_nostr_keys(tmp_path).public_key().to_hex()) == 64
