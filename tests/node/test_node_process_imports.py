"""The node process never loads llama.cpp: only its runner children do.

On a CUDA build, loading llama-cpp-python initialises every GPU backend in the loading process:
measured on an H200, the node process of a mesh peer hosting nothing then held about 550 MiB
of RSS (a GPU context too) for nothing (issue 12's RSS goal). Checked in a fresh interpreter,
since the test process itself has loaded llama.cpp long ago.
"""

import subprocess
import sys

CHECK = """
import sys
import hydra_node.cli.main, hydra_node.node
from hydra_node.runtime.rpc.ggml import check_rpc_support
check_rpc_support()
import hydra_node.runtime.speculative.service  # the node side of speculation
loaded = sorted(m for m in sys.modules if m == "llama_cpp" or m.startswith("llama_cpp."))
print(",".join(loaded) or "none")
"""


def test_importing_and_starting_checks_do_not_load_llama_cpp():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "none", out.stdout
