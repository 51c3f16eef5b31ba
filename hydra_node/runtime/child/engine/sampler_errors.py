"""The error of a request whose sampling parameters cannot be honoured (its 400 error frame)."""

from __future__ import annotations

__all__ = ["SamplingError"]


class SamplingError(ValueError):
    """Sent as the request's error frame: ``code`` (``invalid_grammar``, ``invalid_request_error``), status 400."""

    def __init__(self, message: str, code: str = "invalid_request_error", status: int = 400):
        super().__init__(message)
        self.code, self.status = code, status

    def frame(self, rid: int) -> dict:
        return {"op": "error", "id": rid, "code": self.code, "status": self.status, "message": str(self)}
