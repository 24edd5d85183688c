"""Where a node is and how to log in (redlock/_io/endpoint.py, docs/design.md §2.4): the
same node given as a URL, a sync client or an asyncio client is the same endpoint; the
library reads a client's public settings only."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import redis.asyncio
import redis.sentinel

from redlock._io.endpoint import Endpoint, Tls, endpoints, from_client, from_url, labels

CLIENTS = (redis.Redis, redis.asyncio.Redis)


def test_urls() -> None:
    assert from_url("redis://h:1/2") == Endpoint(host="h", port=1, db=2)
    assert from_url("redis://h") == Endpoint(host="h")
    login = from_url("redis://alice:p%40ss@h:1?db=3&client_name=me")
    assert (login.username, login.password, login.db, login.client_name) == (
        "alice", "p@ss", 3, "me")
    assert login.credentials() == ("alice", "p@ss")
    assert from_url("redis://:pw@h").credentials() == ("pw",)
    tls = from_url("rediss://h:1?ssl_cert_reqs=none")
    assert tls.tls == Tls(cert_reqs="none")
    unix = from_url("unix:///tmp/r.sock?db=4")
    assert (unix.path, unix.db, unix.address) == ("/tmp/r.sock", 4, "unix:/tmp/r.sock/4")
    for bad in ("http://h:1", "redis://h:port", "redis://h/x", "unix://"):
        with pytest.raises(ValueError):
            from_url(bad)


@pytest.mark.parametrize("flavour", CLIENTS)
def test_a_client_is_the_endpoint_of_its_settings(flavour: type) -> None:
    tcp = flavour(host="h", port=1, db=2, username="u", password="p", client_name="me",
                  socket_keepalive=True)
    assert from_client(tcp) == from_url("redis://u:p@h:1/2?client_name=me")
    assert not from_client(flavour(host="h", socket_keepalive=False)).keepalive
    tls = flavour(host="h", ssl=True, ssl_ca_certs="/ca.pem")
    assert from_client(tls).tls == Tls(ca_certs="/ca.pem")
    unix = flavour(unix_socket_path="/tmp/r.sock")
    assert from_client(unix) == Endpoint(path="/tmp/r.sock")


def test_a_sentinel_client_names_its_service_and_sentinels() -> None:
    sentinel = redis.sentinel.Sentinel([("s1", 26379), ("s2", 26380)],
                                       sentinel_kwargs={"password": "sp"})
    master = from_client(sentinel.master_for("mymaster", password="mp"))
    assert master.sentinels is not None
    assert master.sentinels.hosts == (("s1", 26379), ("s2", 26380))
    assert (master.sentinels.service, master.sentinels.password, master.password) == (
        "mymaster", "sp", "mp")
    assert master.address == "sentinel:mymaster"
    with pytest.raises(ValueError, match="replica client"):
        from_client(sentinel.slave_for("mymaster"))


def test_the_node_list_is_checked_at_the_call_site() -> None:
    found = endpoints(["redis://h:1", redis.Redis(host="h", port=2),
                       redis.asyncio.Redis(host="h", port=3)])
    assert labels(found) == ["h:1", "h:2", "h:3"]
    with pytest.raises(TypeError, match="collection"):
        endpoints("redis://h:1")
    with pytest.raises(ValueError, match="at least one"):
        endpoints([])
    with pytest.raises(TypeError, match="URL string or a redis-py client, not int"):
        endpoints([42])
    with pytest.raises(ValueError, match="same Redis server"):
        endpoints(["redis://localhost:1/0", "redis://127.0.0.1:1/3"])
    with pytest.raises(ValueError, match=r"\*\*\*"):  # (no password in the message)
        endpoints(["redis://:secret@h:1", "redis://:secret@H:1"])


def test_endpoints_cross_to_another_process() -> None:
    found = [from_url("rediss://u:p@h:1/2"), from_client(redis.Redis(unix_socket_path="/s"))]
    assert pickle.loads(pickle.dumps(found)) == found


def test_the_library_and_its_renewer_import_no_redis_py() -> None:
    """A client's class is found among the modules already imported (an instance means its
    module is), so importing the library, and the renewer process's start (docs/design.md
    §5.2), do not import redis-py."""
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parents[1])!r});"
            " import redlock, redlock.aio, redlock._client.renewer_process;"
            " print(sorted(m for m in sys.modules if m == 'redis' or m.startswith('redis.')))")
    shown = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                           check=True)
    assert shown.stdout.strip() == "[]", shown.stdout
