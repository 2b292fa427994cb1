"""The docs' Python samples run as written (tests/docs_samples.py says which).

The runnable blocks of one page run in order in one namespace, as a reader would type them
into one shell, against the test database (nothing commits, so nothing reaches a broker)
with the Messages API stand-in as the model. A block that defines `test_*` functions has
them called, with the fixtures they name (`agentrun_messages_api`, `admin_user`...). Agents
a page defines are forgotten afterwards.
"""

from __future__ import annotations

import inspect
from collections import defaultdict

import pytest

from django_agentrun.agents import registered_agents, unregister_agent
from tests.docs_samples import python_samples

RUNNABLE: dict[str, list] = defaultdict(list)
for _sample in python_samples():
    if _sample.runs:
        RUNNABLE[_sample.page].append(_sample)

# What the run asks the model (the request's rules), not how its rows are stored: the same on
# any Postgres driver and binding (the store's statements run in the other modules).
pytestmark = [pytest.mark.timeout(60), pytest.mark.one_driver]


@pytest.fixture
def forget_new_agents():
    before = registered_agents()
    yield
    after = registered_agents()
    for name in set(after) - set(before):
        unregister_agent(name)
    replaced = sorted(n for n in before if after.get(n) is not before[n])
    assert not replaced, f"a sample redefines the test suite's agents {replaced}: rename them"


def test_docs_samples__there_are_runnable_samples():
    assert sum(len(found) for found in RUNNABLE.values()) >= 15, dict(RUNNABLE)


@pytest.mark.django_db
@pytest.mark.parametrize("page", sorted(RUNNABLE))
def test_docs_samples__run(page, request, agentrun_messages_api, forget_new_agents):
    namespace: dict = {"__name__": f"docs_sample_{page}"}
    for sample in RUNNABLE[page]:
        before = set(namespace)
        try:
            exec(compile(sample.code, str(sample), "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"the sample at {sample} fails: {exc!r}") from exc
        for name in sorted(set(namespace) - before):
            if name.startswith("test_") and callable(namespace[name]):
                test = namespace[name]
                fixtures = {
                    p: request.getfixturevalue(p) for p in inspect.signature(test).parameters
                }
                test(**fixtures)
