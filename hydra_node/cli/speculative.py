"""``serve --draft MODEL`` / ``--draft-server MODEL``: shortcuts for ``[defaults.speculative]``."""

from __future__ import annotations

import dataclasses


def add_speculative_serve_args(s) -> None:
    s.add_argument(
        "--draft",
        default=None,
        metavar="MODEL",
        help="speculative decoding with this local draft model (same vocabulary as the served "
        "model): [defaults.speculative] strategy = \"local\", draft_model = MODEL",
    )
    s.add_argument(
        "--draft-server",
        default=None,
        metavar="MODEL",
        help="serve this draft model to the mesh's speculative targets (tunnel service \"draft\"): "
        "[defaults.speculative] serve_draft = MODEL",
    )
    s.add_argument(
        "--speculative",
        default=None,
        choices=("off", "local", "mesh", "auto"),
        help="[defaults.speculative] strategy (mesh: draft on a peer that serves one)",
    )


def apply_speculative_args(args, file_cfg):
    """The file config with the flags above applied (flags win)."""
    spec = file_cfg.defaults.speculative
    changes = {}
    if getattr(args, "draft", None):
        changes.update(strategy="local", draft_model=args.draft)
    if getattr(args, "draft_server", None):
        changes["serve_draft"] = args.draft_server
    if getattr(args, "speculative", None):
        changes["strategy"] = args.speculative
    if not changes:
        return file_cfg
    spec = dataclasses.replace(spec, **changes)
    spec.validate("defaults.speculative")
    return dataclasses.replace(file_cfg, defaults=dataclasses.replace(file_cfg.defaults, speculative=spec))
