"""One decoder for every untrusted byte: nothing outside hydra_node/codec decodes CBOR itself."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "hydra_node"
RAW_DECODE = re.compile(r"cbor2\.(loads?|CBORDecoder)\b|from cbor2 import")


def test_no_module_outside_the_codec_decodes_cbor() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name == "codec":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if RAW_DECODE.search(line):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{n}: {line.strip()}")
    assert not offenders, "decode through hydra_node.codec instead:\n" + "\n".join(offenders)
