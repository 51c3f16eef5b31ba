"""The one API error type: OpenAI's error body ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from hydra_node.http.server import Response
from hydra_node.inference import GenerationError

__all__ = ["ApiError", "bad"]


class ApiError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}``."""

    TYPES = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "invalid_request_error",
        405: "invalid_request_error",
        409: "invalid_request_error",
        413: "invalid_request_error",
        422: "invalid_request_error",
        429: "rate_limit_error",
        499: "request_cancelled",
    }

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        param: str | None = None,
        retry_after: float | None = None,
        extra: Mapping[str, Any] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.retry_after = status, message, code, param, retry_after
        #: Further members of ``error`` (``fields`` of an identity mismatch, a failed ``operation``).
        self.extra = dict(extra or {})

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.TYPES.get(self.status, "server_error"),
                "param": self.param,
                "code": self.code,
                **self.extra,
            }
        }

    def response(self) -> Response:
        headers = []
        if self.retry_after is not None:
            headers.append(("retry-after", str(max(1, math.ceil(self.retry_after)))))
        return Response.json(self.status, self.body(), headers)

    @classmethod
    def from_generation(cls, exc: GenerationError) -> "ApiError":
        return cls(exc.status, exc.message, exc.code, retry_after=exc.retry_after)


def bad(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    """A 400 ``invalid_request_error`` naming ``param``."""
    return ApiError(400, message, code, param)
