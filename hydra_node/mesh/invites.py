"""Invites an issuer keeps track of, and the revocation lists of the other members (pure; time injected).

:class:`InviteBook` is the issuer's side: every token this node issues is recorded (id, expiry,
``uses``, how many joiners it admitted, revoked or not) in ``HOME/mesh/invites.json`` (mode 0600,
rewritten atomically, so records survive a restart), and the book builds this node's signed
revocation list from the revoked and used-up records. :class:`RevocationTable` holds the newest
list of every other issuer (a list only speaks for its signer's tokens) and rejects forged,
foreign, replayed or equivocating ones. :func:`check_invite` is the admission rule both feed
(protocol/README.md section 6.1):

* our own token: refused when revoked (``token_revoked``), when a ``uses``-limited token has no
  record here (``token_unknown``) or admitted as many joiners as it allows (``token_used_up``);
  otherwise admitted, and the use is counted (and written) before the handshake's accept is sent;
* another member's token: refused when its issuer's list names it (``token_revoked`` /
  ``token_used_up``), and a ``uses``-limited token is refused outright (``token_issuer_only``):
  only its issuer can count uses, so only its issuer redeems it (joiners dial the issuer anyway).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import nacl.signing

from hydra_node.mesh.wire.revocations import (
    MAX_REVOCATION_ENTRIES,
    MAX_REVOCATION_VERSION,
    Revocation,
    RevocationList,
    RevocationRejected,
    open_revocations,
    seal_revocations,
)
from hydra_node.mesh.wire.token import (
    InviteToken,
    TokenIssuerOnly,
    TokenRevoked,
    TokenUnknown,
    TokenUsedUp,
    issue_invite,
    parse_invite,
)
from hydra_node.mesh.wire.errors import TokenError

__all__ = [
    "InviteBook",
    "InviteBookError",
    "InviteRecord",
    "MAX_INVITE_RECORDS",
    "MAX_REVOCATION_ISSUERS",
    "RevocationTable",
    "check_invite",
]

#: Unexpired records an issuer keeps (expired ones are dropped); beyond it, issuing is refused.
MAX_INVITE_RECORDS = 1024
#: Other issuers' lists held at once (lists of issuers that left the mesh are evicted first).
MAX_REVOCATION_ISSUERS = 256
#: Shortest prefix of a token id ``invite revoke`` accepts (ids are 32 hex characters).
MIN_ID_PREFIX = 8


class InviteBookError(Exception):
    """An operator's request the book cannot carry out; ``code``: ``not_found`` (no such invite of
    ours), ``not_ours`` (another node issued it), ``bad_token``, ``too_many`` (a bound is reached),
    ``unreadable`` (the records file)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class InviteRecord:
    """One token this node issued, as ``invite list`` and ``GET /api/invites`` show it."""

    id: str
    mesh_id: str
    issued_at: int
    expires_at: int
    uses: int | None
    used: int = 0
    revoked: bool = False

    @property
    def used_up(self) -> bool:
        return self.uses is not None and self.used >= self.uses

    def state(self, now: float) -> str:
        if self.revoked:
            return "revoked"
        if now >= self.expires_at:
            return "expired"
        return "used_up" if self.used_up else "valid"


class InviteBook:
    """The issuer's records at ``path`` (loaded lazily, rewritten on every change) and its revocation list."""

    def __init__(
        self, path: Path, signing_key: nacl.signing.SigningKey, *, max_records: int = MAX_INVITE_RECORDS
    ) -> None:
        self.path = path
        self.max_records = max_records
        self._key = signing_key
        self._records: dict[str, InviteRecord] | None = None
        self._list_version = 0
        self._list: tuple[str, bytes] | None = None  # (mesh id, signed list) until the next change

    @property
    def list_version(self) -> int:
        """The version of the last list we signed (0: none yet)."""
        self._load()
        return self._list_version

    # ---- records ------------------------------------------------------------------------------
    def records(self, now: float, mesh_id: str | None = None) -> list[InviteRecord]:
        """Unexpired records (of ``mesh_id`` when given), newest first."""
        recs = [r for r in self._load().values() if now < r.expires_at and mesh_id in (None, r.mesh_id)]
        return sorted(recs, key=lambda r: (-r.issued_at, r.id))

    def issue(self, mesh_id: str, addrs: list[str], ttl_s: float, now: float, uses: int | None = None) -> str:
        """A new token, recorded before it is handed out."""
        records = self._load()
        self._prune(now)
        if len(records) >= self.max_records:
            raise InviteBookError(
                f"this node already has {self.max_records} unexpired invites; revoke some or issue shorter-lived ones",
                "too_many",
            )
        text = issue_invite(self._key, mesh_id, addrs, ttl_s, now, uses=uses)
        self.record(parse_invite(text, now), now)
        return text

    def record(self, token: InviteToken, now: float) -> InviteRecord:
        """Record a token this node signed (``issue`` does; tests and vectors bring fixed nonces)."""
        if token.issuer_public_key != bytes(self._key.verify_key):
            raise InviteBookError(f"token {token.token_id[:12]} was not issued by this node", "not_ours")
        rec = self._load().setdefault(
            token.token_id, InviteRecord(token.token_id, token.mesh_id, int(now), token.expires_at, token.uses)
        )
        self._save()
        return rec

    def revoke(self, token_or_id: str, now: float) -> InviteRecord:
        """Revoke one of our tokens, given whole or by its id (or an unambiguous id prefix)."""
        key = token_or_id.strip()
        records = self._load()
        if len(key) > 32:  # a whole token: its id, and a record even if it predates the book
            try:
                tok = parse_invite(key, now)
            except TokenError as exc:
                raise InviteBookError(f"cannot revoke: {exc}", "bad_token") from None
            if bytes(self._key.verify_key) != tok.issuer_public_key:
                raise InviteBookError(
                    f"that token was issued by {tok.issuer_id[:16]}, not by this node; only its issuer can revoke it",
                    "not_ours",
                )
            rec = records.setdefault(
                tok.token_id, InviteRecord(tok.token_id, tok.mesh_id, int(now), tok.expires_at, tok.uses)
            )
        else:
            key = key.lower()
            found = [r for r in records.values() if r.id.startswith(key) and now < r.expires_at]
            if len(key) < MIN_ID_PREFIX or len(found) != 1:
                why = "matches several" if len(found) > 1 else "matches no unexpired invite of this node"
                raise InviteBookError(
                    f"invite id {token_or_id!r} {why} (give at least {MIN_ID_PREFIX} hex "
                    "characters of an id from `hydra-node invite list`, or the whole token)",
                    "not_found",
                )
            rec = found[0]
        if not rec.revoked:
            live = sum(1 for r in records.values() if r.revoked and now < r.expires_at and r.mesh_id == rec.mesh_id)
            if live >= MAX_REVOCATION_ENTRIES:
                raise InviteBookError(
                    f"this node already revoked {MAX_REVOCATION_ENTRIES} unexpired invites "
                    "(the bound of a revocation list); wait for some to expire",
                    "too_many",
                )
            rec.revoked = True
            self._changed()
        return rec

    def admit(self, token: InviteToken, now: float) -> bool:
        """Check one of our tokens for a joiner and count the use; True when the revocation list changed.
        TokenRevoked / TokenUnknown / TokenUsedUp when it must be refused."""
        rec = self._load().get(token.token_id)
        if rec is not None and rec.revoked:
            raise TokenRevoked(f"invite {token.token_id[:12]} was revoked by its issuer")
        if rec is None:
            if token.uses is not None:
                raise TokenUnknown(
                    f"invite {token.token_id[:12]} limits its uses but its issuer has no record "
                    "of it; ask a member for a new one"
                )
            return False  # an unlimited token that predates the book: nothing to count
        if rec.used_up:
            raise TokenUsedUp(
                f"invite {token.token_id[:12]} was already used ({rec.used} of {rec.uses} uses); "
                "ask a member for a new one"
            )
        rec.used += 1
        if rec.used_up:
            self._changed()
            return True
        self._save()
        return False

    # ---- the signed list ---------------------------------------------------------------------
    def revocation_list(self, mesh_id: str, now: float) -> bytes | None:
        """Our signed list for ``mesh_id`` (None while nothing of ours is revoked or used up)."""
        if self._list is not None and self._list[0] == mesh_id:
            return self._list[1]
        entries = [
            Revocation(bytes.fromhex(r.id), r.expires_at, "revoked" if r.revoked else "used")
            for r in self._load().values()
            if r.mesh_id == mesh_id and now < r.expires_at and (r.revoked or r.used_up)
        ]
        if not entries:
            return None
        # Revoked entries always fit (revoke() refuses beyond the bound); "used" ones are dropped first,
        # soonest-expiring first: other members refuse a uses-limited token anyway.
        entries.sort(key=lambda e: (e.reason == "used", -e.expires_at))
        self._list_version = min(MAX_REVOCATION_VERSION, max(self._list_version + 1, int(now)))
        self._save()
        raw = seal_revocations(self._key, mesh_id, self._list_version, entries[:MAX_REVOCATION_ENTRIES])
        self._list = (mesh_id, raw)
        return raw

    # ---- storage -----------------------------------------------------------------------------
    def _changed(self) -> None:
        self._list = None
        self._save()

    def _prune(self, now: float) -> None:
        records = self._load()
        for rid in [rid for rid, r in records.items() if now >= r.expires_at]:
            del records[rid]

    def _load(self) -> dict[str, InviteRecord]:
        if self._records is None:
            self._records = {}
            try:
                data = json.loads(self.path.read_text())
            except FileNotFoundError:
                return self._records
            except (OSError, ValueError) as exc:
                raise InviteBookError(
                    f"{self.path} is unreadable ({exc}); remove it to forget issued invites", "unreadable"
                ) from None
            try:
                self._list_version = int(data.get("list_version", 0))
                for item in data["invites"]:
                    rec = InviteRecord(**item)
                    self._records[rec.id] = rec
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise InviteBookError(
                    f"{self.path} is corrupt ({exc}); remove it to forget issued invites", "unreadable"
                ) from None
        return self._records

    def _save(self) -> None:
        doc = {
            "format": 1,
            "list_version": self._list_version,
            "invites": [asdict(r) for r in sorted(self._load().values(), key=lambda r: r.id)],
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
        os.replace(tmp, self.path)


class RevocationTable:
    """The newest revocation list of each other issuer in our mesh (sans-IO, bounded)."""

    def __init__(self, mesh_id: str, max_issuers: int = MAX_REVOCATION_ISSUERS) -> None:
        self.mesh_id = mesh_id
        self.max_issuers = max_issuers
        self._lists: dict[str, RevocationList] = {}

    def lists(self) -> list[RevocationList]:
        return list(self._lists.values())

    def offer(
        self, raw: bytes, *, is_member: Callable[[str], bool], own_id: str | None = None
    ) -> RevocationList | None:
        """Take a list if it is newer than the one held for its issuer: returns it (to be relayed), None
        for the very list we hold (a duplicate) or one of ``own_id`` (ours, relayed back: the
        :class:`InviteBook` keeps those); RevocationRejected otherwise (with its code)."""
        new = open_revocations(raw, expected_mesh_id=self.mesh_id)
        issuer = new.issuer_id
        if issuer == own_id:
            return None
        held = self._lists.get(issuer)
        if held is not None:
            if new.version < held.version:
                raise RevocationRejected(f"version {new.version} is older than the held {held.version}", code="stale")
            if new.version == held.version:
                if new.raw == held.raw:
                    return None
                raise RevocationRejected(f"another list with version {new.version}", code="equivocation")
        elif not is_member(issuer):
            raise RevocationRejected("the list's signer is not a member", code="not_member")
        elif len(self._lists) >= self.max_issuers:
            gone = [pid for pid in self._lists if not is_member(pid)]
            if not gone:
                raise RevocationRejected(f"already holding {self.max_issuers} lists", code="table_full")
            del self._lists[gone[0]]
        self._lists[issuer] = new
        return new

    def reason(self, issuer_id: str, token_id: bytes, now: float) -> str | None:
        held = self._lists.get(issuer_id)
        return held.reason_for(token_id, now) if held is not None else None


def check_invite(
    token: InviteToken, *, own_id: str, book: InviteBook, table: RevocationTable | None, now: float
) -> bool:
    """The admission rule (module docstring). True when our own revocation list changed (publish it)."""
    if token.issuer_id == own_id:
        return book.admit(token, now)
    reason = table.reason(token.issuer_id, token.nonce, now) if table is not None else None
    if reason == "revoked":
        raise TokenRevoked(f"invite {token.token_id[:12]} was revoked by its issuer {token.issuer_id[:16]}")
    if reason == "used":
        raise TokenUsedUp(f"invite {token.token_id[:12]} was used up at its issuer {token.issuer_id[:16]}")
    if token.uses is not None:
        raise TokenIssuerOnly(
            f"invite {token.token_id[:12]} limits its uses, so only its issuer "
            f"{token.issuer_id[:16]} can admit with it; dial one of its addresses"
        )
    return False
