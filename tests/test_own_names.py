"""Tests are good neighbours on the Redis they are given: what a session rings, publishes and counts
there carries the session's own tag (tests/own_names), and the session's end drops exactly that."""
from __future__ import annotations

import pytest
import redis
from django.conf import settings
from django_q.conf import Conf

from tests.conftest import make_space
from tests.own_names import SESSION_TAG, own_name, sweep
from veronica.engine import wakes
from veronica.plumbing import redisbell

hosted = pytest.mark.skipif(not settings.REDIS_URL, reason="hosted mode's Redis")


def test_the_session_queue_and_prefixes_are_its_own():
    # a test that isolated a queue of its own (tests/harness.isolate_queue) left it in place: inside the tag
    assert Conf.CLUSTER_NAME.startswith(SESSION_TAG) and Conf.PREFIX.startswith(SESSION_TAG)
    assert settings.Q_CLUSTER["name"] == SESSION_TAG
    assert own_name("q").startswith(f"{SESSION_TAG}-q-") and own_name("q") != own_name("q")


@hosted
def test_the_channel_layer_and_the_doorbell_use_the_session_prefix():
    assert settings.CHANNEL_PREFIX == SESSION_TAG
    assert settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"] == SESSION_TAG
    assert redisbell.prefix().startswith(f"{SESSION_TAG}:") and redisbell.client_name("test").startswith(SESSION_TAG)


@hosted
@pytest.mark.django_db(transaction=True)
def test_a_wake_rung_with_no_cluster_lands_in_the_session_queue_and_the_sweep_takes_it(tmp_path, monkeypatch):
    monkeypatch.setattr(Conf, "SYNC", False)
    monkeypatch.setattr(wakes, "_brokers", {})
    space = make_space(tmp_path, workers=("w1",))
    member = space.members.get(name="w1")
    client = redis.Redis.from_url(settings.REDIS_URL)
    neighbour = "veronica-someone-else:q"  # another deployment's key on the same server: never ours to drop
    client.set(neighbour, "1")
    try:
        assert wakes.enqueue_wake(member.pk, "message") is not False
        queue = f"django_q:{Conf.CLUSTER_NAME}:q"  # the session's, or a queue inside it (tests/harness.isolate_queue)
        assert SESSION_TAG in queue
        assert client.llen(queue) >= 1, sorted(k.decode() for k in client.keys("*"))
        assert sweep(settings.REDIS_URL) >= 1
        assert client.llen(queue) == 0 and not list(client.scan_iter(match=f"*{SESSION_TAG}*"))
        assert client.get(neighbour) == b"1"
    finally:
        client.delete(neighbour)
        client.close()
