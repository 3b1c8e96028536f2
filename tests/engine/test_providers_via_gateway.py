"""Every provider test again (tests/engine/test_providers.py: both vendors' SDKs, streamed and not, every
scripted fault), each call through a real model gateway process (veronica.agent.providers.gateway): what
the SDKs and our retry loop see through it is what they saw going direct."""
from __future__ import annotations

import pytest

from tests.engine import test_providers as direct
from tests.engine.test_model_gateway import through_gateway  # noqa: F401 - the fixture below uses it

# its tests and its fixtures; not the one about the direct clients' TLS contexts (the gateway has its own)
globals().update({name: value for name, value in vars(direct).items()
                  if not name.startswith("__") and name != "test_the_shard_clients_of_a_process_share_one_tls_context"})


@pytest.fixture(autouse=True)
def every_call_through_the_gateway(through_gateway):  # noqa: F811
    yield through_gateway
