"""Typed errors of the codec, split by who is to blame.

`DecodeError` is the sender's fault: bytes from a peer or a child that are not a valid
value or frame. Its `code` is a stable, short reason string (listed in protocol/README.md,
section 2) used in logs, counters and test vectors. `EncodeError` is our own bug: we
tried to send a value outside the data model or a frame above its bound.
"""

from __future__ import annotations

__all__ = ["CodecError", "CodedError", "DecodeError", "EncodeError", "FrameError"]


class CodedError(Exception):
    """An error with a stable, short `code` naming the defect (the base of every protocol error we raise)."""

    code = "error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class CodecError(CodedError):
    """Base of the codec's errors; `code` names the defect."""

    code = "codec"


class DecodeError(CodecError):
    """Untrusted bytes are not a valid value or frame (the sender's fault)."""

    code = "malformed"


class FrameError(DecodeError):
    """A length-prefixed frame broke the framing or its bound (codes: too_large, bad_message)."""

    code = "bad_frame"


class EncodeError(CodecError):
    """We tried to encode something the data model or a bound forbids (our bug)."""

    code = "local"
