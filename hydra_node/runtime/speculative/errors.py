"""Typed errors of speculative decoding, each saying who is to blame."""

from __future__ import annotations


class SpeculationError(Exception):
    """Base class for errors raised by the speculative package."""


class DraftProtocolError(SpeculationError):
    """The draft side sent a proposal we cannot use (the draft's fault, maybe a remote peer).

    The decoder answers it by finishing the request with the target alone.
    """


class SessionStateError(SpeculationError):
    """A session method was called out of order (our own bug)."""


class ContextFull(SpeculationError):
    """The next evaluation would not fit in the context window (``n_ctx``)."""
