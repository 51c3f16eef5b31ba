"""The real OpenAI-ecosystem clients against ONE live node on the bundled model (issue 13, item 7).

Every test in this package shares the package-scoped :func:`node`, the session's ``shared_node``
(a real ``hydra-node serve``, bundled SmolLM2-135M, see tests/conftest.py); requests are greedy
(``temperature: 0``) with small ``max_tokens``. The bundled model's answers are poor, so the
tests assert on structure: a call of the named tool whose arguments validate, JSON that
validates, OpenAI's shapes.

No client may phone home: ``clientkit`` sets what each client documents to stay off the network
before any client is imported, and ``netguard`` refuses and records every connection that leaves
the loopback, in this process (checked after every test) and in client subprocesses.
"""

from __future__ import annotations

import pytest

from clientkit import netguard, restore_env


def pytest_configure(config: pytest.Config) -> None:
    # pydantic's note on litellm's own TypedDicts when litellm is imported: nothing tested here
    config.addinivalue_line("filterwarnings", "ignore:.*using the `ReadOnly` qualifier:UserWarning")


@pytest.fixture(scope="package")
def node(shared_node):
    """One real node for every client test: the session's shared node (tests/conftest.py)."""
    return shared_node


@pytest.fixture(scope="package")
def base_url(node) -> str:
    return node.base_url


@pytest.fixture(scope="package", autouse=True)
def network_guard():
    """This process is guarded while the client tests run, and only then; afterwards the
    no-network variables are put back as they were."""
    netguard.install()
    yield
    netguard.uninstall()
    restore_env()


@pytest.fixture(autouse=True)
def no_phoning_home(network_guard):
    """A test during which a client tried to leave the loopback fails."""
    before = len(netguard.attempts)
    yield
    assert netguard.attempts[before:] == [], f"a client tried to reach the network: {netguard.attempts[before:]}"
