"""pytest plugin: the test-only node agent (localenv/nodeagent/) on the real control plane.

Load it with `pytest_plugins = ["localenv.fixtures_k8s", "localenv.fixtures_agent"]`.

- node_agent (session): a NodeAgent subprocess registered as Node `eopipe-node-0`; pods bound
  to it run as local processes. Function-scoped tests may stop it (a "node" outage); the
  `running_node_agent` fixture brings it back before a test.

When a test using the agent fails, the tail of the agent's log is attached to the report, and
the end of the run says where the agent's workdir (pod logs, volumes) is kept.
"""

from __future__ import annotations

import pytest

from localenv.nodeagent import NodeAgent

_AGENT_KEY = pytest.StashKey[NodeAgent]()


@pytest.fixture(scope="session")
def node_agent(control_plane, tmp_path_factory, request) -> NodeAgent:
    agent = NodeAgent(control_plane.kubeconfig, tmp_path_factory.mktemp("nodeagent"))
    request.config.stash[_AGENT_KEY] = agent
    agent.start()
    yield agent
    agent.stop()


@pytest.fixture
def running_node_agent(node_agent) -> NodeAgent:
    if not node_agent.running:  # a fault test stopped the node; bring it back
        node_agent.start()
    return node_agent


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    agent = item.config.stash.get(_AGENT_KEY, None)
    fixtures = getattr(item, "fixturenames", ())
    if agent is None or not rep.failed or not ({"node_agent", "running_node_agent"} & set(fixtures)):
        return
    rep.sections.append((f"node agent log (tail of {agent.log_path})", agent.tail(40)))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    agent = config.stash.get(_AGENT_KEY, None)
    if agent is not None and (exitstatus != 0 or terminalreporter.stats.get("failed")):
        terminalreporter.write_line(f"node agent workdir (log, pod logs, volumes) kept in {agent.workdir}")
