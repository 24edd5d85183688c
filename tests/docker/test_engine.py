"""The private Docker engine: its own socket and data, no bridge, and a clean slate
after a run that was killed."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest
from docker_support import ROOT

from tests.support.dockerd import (
    ISOLATION_FLAGS,
    EngineAPI,
    EngineError,
    PrivateDockerd,
    _alive,
    _cmdline,
)
from tests.support.images import ensure_images

pytestmark = pytest.mark.docker


def test_engine_has_no_bridge_and_no_network_but_host_and_none(docker_engine: EngineAPI
                                                                ) -> None:
    names = {net["Name"] for net in docker_engine.json("GET", "/networks")}
    private = PrivateDockerd()
    if docker_engine.socket_path != str(private.socket_path):
        pytest.skip("DOCKER_HOST is not our private engine")
    # --bridge none: no docker0 and no address of a private range on this machine.
    assert names == {"host", "none"}
    pid = private.running_pid()
    assert pid is not None
    command = _cmdline(pid)
    for flag in ISOLATION_FLAGS:
        assert flag in command
    assert str(private.data_root) in command


def _run_container(api: EngineAPI, image: str, command: list[str]) -> str:
    created = api.json("POST", "/containers/create", body={
        "Image": image, "Cmd": command, "HostConfig": {"NetworkMode": "host"},
        "Labels": {"org.redlock-fenced.testing": "1"}})
    container_id = str(created["Id"])
    api.request("POST", f"/containers/{container_id}/start")
    return container_id


def test_killed_engine_is_cleaned_up_by_the_next_start(docker_engine: EngineAPI) -> None:
    """dockerd killed with SIGKILL mid-run (the container's shim, the container and a
    volume left behind): the next start removes them all, and stop leaves no process,
    mount or run directory."""
    # Not under pytest's shared temp dir: should this test ever leave a mount behind,
    # it must not break the temp-dir clean-up of every other pytest run as root.
    root = Path(tempfile.mkdtemp(prefix="engine-test-", dir=ROOT / ".tools"))
    engine = PrivateDockerd(root)
    engine.start()
    try:
        api = engine.api()
        ensure_images(api, only=["toxiproxy"])
        from redlock.testing.redis_nodes import free_port

        container = _run_container(api, "redlock-fenced/toxiproxy:local",
                                   ["-host=127.0.0.1", f"-port={free_port()}"])
        server_pid = int(api.json("GET", f"/containers/{container}/json")["State"]["Pid"])
        assert _alive(server_pid)
        api.json("POST", "/volumes/create", body={"Name": "left-behind"})
        dockerd_pid = engine.running_pid()
        assert dockerd_pid is not None
        os.kill(dockerd_pid, signal.SIGKILL)
        assert engine._process is not None
        engine._process.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(dockerd_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(dockerd_pid)
        assert engine.pidfile.exists()  # what a killed run leaves
        assert engine.leftover_processes(), "the container's shim outlives a killed dockerd"

        again = PrivateDockerd(root)
        again.start()
        assert again.api().leftovers() == {"containers": [], "networks": [], "volumes": []}
        assert not _alive(server_pid)
        assert not list(Path("/sys/fs/cgroup").glob(f"*/docker/{container}"))
        # The image survives: the data root is the cache.
        assert again.api().image("redlock-fenced/toxiproxy:local") is not None
        again.stop()
        assert not again.leftover_processes()
        assert not again.run_dir.exists()
        mounts = Path("/proc/self/mounts").read_text()
        assert str(root) not in mounts
        with pytest.raises((OSError, EngineError)):
            again.api(timeout=2).request("GET", "/_ping")
    finally:
        engine.stop()
        shutil.rmtree(root)

