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
from hydra_node.node import check_rpc_support
check_rpc_support()
from hydra_node.runtime.speculative import ControllerConfig  # the package's pure names stay at hand
loaded = sorted(m for m in sys.modules if m == "llama_cpp" or m.startswith("llama_cpp."))
print(",".join(loaded) or "none")
"""


def test_importing_and_starting_checks_do_not_load_llama_cpp():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "none", out.stdout


def test_the_speculative_package_still_hands_out_its_llama_parts_on_use():
    out = subprocess.run([sys.executable, "-c", "from hydra_node.runtime.speculative import LlamaEngine; "
                          "import sys; print('llama_cpp' in sys.modules, LlamaEngine.__module__)"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "hydra_node.runtime.speculative.child.engine"]
