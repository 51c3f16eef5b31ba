"""Fixtures of the artifact tests."""

from __future__ import annotations

from s3server import s3_server  # noqa: F401  (the real S3-compatible server: moto, a child process)
