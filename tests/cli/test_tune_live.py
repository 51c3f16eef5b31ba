"""`benchmark tune` on the bundled model: real runner children, a tiny grid, then --apply and `config show`."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib


def run_cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hydra_node.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def test_tune_measures_recommends_and_applies_into_the_default_file(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text('# my settings\n[scheduler]\nmode = "active"  # keep me\n')
    r = run_cli(
        "benchmark",
        "tune",
        "--home",
        str(tmp_path),
        "--ubatch-sizes",
        "128",
        "--flash-attention",
        "auto",
        "--parallel",
        "2",
        "--rounds",
        "1",
        "--max-tokens",
        "2",
        "--prompt",
        "Hi",
        "--budget",
        "200",
        "--json",
        "--apply",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)
    cands = report["candidates"]
    assert [c["status"] for c in cands] == ["measured", "measured"], cands
    assert cands[0]["profile"] == report["baseline"] and "ubatch=512" in report["baseline"]
    assert "ubatch=128" in cands[1]["profile"] and "parallel=2" in cands[1]["profile"]
    for c in cands:
        f = c["figures"]
        assert f["gen_tok_s"] > 0 and f["pp_tok_s"] > 0 and f["ttft_ms"] > 0 and f["peak_rss_bytes"] > 10 << 20
    rec = report["recommended"]
    assert rec["profile"] in {c["profile"] for c in cands}
    assert "ETA" in r.stderr and "applied:" in r.stderr  # the progress bar, then the file written

    # the keys the sweep varied were written into the default file; comments and other keys kept
    text = cfg.read_text()
    assert text.startswith("# my settings\n") and 'mode = "active"  # keep me' in text
    data = tomllib.loads(text)
    written = {
        "defaults.model_fit.ubatch": data["defaults"]["model_fit"]["ubatch"],
        "defaults.throughput.parallel": data["defaults"]["throughput"]["parallel"],
    }
    assert written == {k: rec["keys"][k] for k in written}
    assert "ctx_size" not in data["defaults"]["model_fit"]  # not varied: left to the config as it was
    assert (tmp_path / "config.toml.bak").read_text() == '# my settings\n[scheduler]\nmode = "active"  # keep me\n'

    # serve's configuration now takes them from the file
    show = run_cli("config", "show", "--json", "--home", str(tmp_path), timeout=60)
    assert show.returncode == 0, show.stderr
    values = json.loads(show.stdout)["values"]
    for key, value in written.items():
        assert values[key] == {"value": value, "source": str(cfg)}


def test_tune_refuses_bad_axes_with_a_clear_error(tmp_path):
    r = run_cli("benchmark", "tune", "--home", str(tmp_path), "--mmap-values", "sometimes", timeout=60)
    assert r.returncode == 2 and "--mmap-values: bad value 'sometimes'" in r.stderr
    r = run_cli("benchmark", "tune", "--home", str(tmp_path), "--draft-max-tokens", "4", timeout=60)
    assert r.returncode == 2 and "--draft-max-tokens: needs a draft model" in r.stderr
