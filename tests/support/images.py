"""Docker images built locally, from binaries already on this machine: no registry.

    from tests.support.dockerd import EngineAPI
    from tests.support.images import ensure_images

    ensure_images(EngineAPI.from_host())     # redlock-fenced/redis:local, .../toxiproxy:local

No container registry is reachable here, so nothing is pulled. Each image is a root
filesystem of its own (``FROM scratch``): the binary, the shared libraries ``ldd``
lists for it (with the dynamic loader), and the few directories it needs, imported
with the Engine API's ``docker import``. No ``docker build`` and no base image.

- ``redlock-fenced/redis:local``: Debian's ``redis-server`` (and ``redis-cli``); its
  default command is ``redis-server --protected-mode no``, as the official image does
  through its config, so connections through a port mapping are not refused.
- ``redlock-fenced/toxiproxy:local``: the ``toxiproxy-server`` that ``go install``
  builds (``scripts/setup.sh``); entry point the server, as in the upstream image.
- ``redlock-fenced/sale-app:local`` (only from a checkout, for ``compose/``): the
  Python interpreter of this virtualenv with its standard library, the library's
  dependencies, ``redlock``, ``fencing``, ``examples`` and ``compose/app``.

Images are cached by content: each is tagged with the hash of everything that goes
into it (paths, modes, file contents, config) and ``:local`` points at the current
one. An unchanged input costs one hash; a changed one builds anew and drops the old
tag.

``python -m tests.support.images [--app CHECKOUT]`` builds what is missing.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from redlock.testing.redis_nodes import find_redis_server
from redlock.testing.toxiproxy import find_toxiproxy_server
from tests.support.dockerd import EngineAPI

LOCAL_TAG = "local"
REDIS_REPOSITORY = "redlock-fenced/redis"
TOXIPROXY_REPOSITORY = "redlock-fenced/toxiproxy"
APP_REPOSITORY = "redlock-fenced/sale-app"
REDIS_IMAGE = f"{REDIS_REPOSITORY}:{LOCAL_TAG}"
TOXIPROXY_IMAGE = f"{TOXIPROXY_REPOSITORY}:{LOCAL_TAG}"
APP_IMAGE = f"{APP_REPOSITORY}:{LOCAL_TAG}"
SEARCH_PATH = "/usr/local/bin:/usr/bin:/bin"

_LDD_LINE = re.compile(r"^\s*(?:(\S+)\s+=>\s+)?(\S+)\s+\(0x[0-9a-f]+\)\s*$")


class ImageBuildError(RuntimeError):
    """An image could not be assembled from this machine's files."""


def shared_libraries(binary: str | os.PathLike[str]) -> list[Path]:
    """The shared libraries ``ldd`` lists for ``binary`` (the loader included), as the
    paths the loader will look for; empty for a static binary."""
    result = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        if "not a dynamic executable" in result.stdout + result.stderr:
            return []
        raise ImageBuildError(f"ldd {binary}: {result.stderr.strip() or result.stdout.strip()}")
    libraries = []
    for line in result.stdout.splitlines():
        if "=> not found" in line:
            raise ImageBuildError(f"ldd {binary}: {line.strip()}")
        match = _LDD_LINE.match(line)
        if match and match.group(2).startswith("/"):
            libraries.append(Path(match.group(2)))
    return libraries


@dataclass
class RootFS:
    """The files of one image: path in the image -> file on this machine."""

    files: dict[str, tuple[Path, int]] = field(default_factory=dict)
    dirs: dict[str, int] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    changes: list[str] = field(default_factory=list)

    def add_file(self, host: str | os.PathLike[str], image_path: str | None = None,
                 mode: int | None = None) -> None:
        source = Path(host).resolve()
        if not source.is_file():
            raise ImageBuildError(f"{host} is not a file")
        target = image_path or str(Path(host).absolute())
        self.files[target] = (source, mode if mode is not None
                              else stat.S_IMODE(source.stat().st_mode))

    def add_libraries(self, binary: str | os.PathLike[str]) -> None:
        for library in shared_libraries(binary):
            # The path ldd printed (what the loader looks for), the content of the file.
            self.add_file(library, str(library), 0o755)

    def add_executable(self, host: str | os.PathLike[str], image_path: str) -> None:
        self.add_file(host, image_path, 0o755)
        self.add_libraries(host)

    def add_tree(self, host_dir: Path, image_dir: str,
                 keep: Callable[[Path], bool] = lambda path: True) -> None:
        for path in sorted(host_dir.rglob("*")):
            relative = path.relative_to(host_dir)
            if path.is_file() and not path.is_symlink() and keep(relative):
                self.add_file(path, f"{image_dir}/{relative.as_posix()}")

    def add_dir(self, image_path: str, mode: int = 0o755) -> None:
        self.dirs[image_path] = mode

    def digest(self) -> str:
        """Hash of everything that goes into the image (not of the tar: no mtimes)."""
        summary = hashlib.sha256()
        for target, (source, mode) in sorted(self.files.items()):
            content = hashlib.sha256(source.read_bytes()).hexdigest()
            summary.update(f"f {target} {mode:o} {content}\n".encode())
        for target, mode in sorted(self.dirs.items()):
            summary.update(f"d {target} {mode:o}\n".encode())
        for target, link in sorted(self.links.items()):
            summary.update(f"l {target} {link}\n".encode())
        summary.update(json.dumps(self.changes).encode())
        return summary.hexdigest()

    def write_tar(self, out: tarfile.TarFile) -> None:
        made: set[str] = set()

        def parents(path: str) -> None:
            parts = Path(path).parent.parts[1:]
            for depth in range(1, len(parts) + 1):
                name = "/".join(parts[:depth])
                if name not in made:
                    made.add(name)
                    info = tarfile.TarInfo(name)
                    info.type = tarfile.DIRTYPE
                    info.mode = self.dirs.get("/" + name, 0o755)
                    out.addfile(info)

        for target in sorted(self.dirs):
            parents(target + "/x")
        for target, (source, mode) in sorted(self.files.items()):
            parents(target)
            info = out.gettarinfo(str(source), arcname=target.lstrip("/"))
            info.mode, info.uid, info.gid, info.uname, info.gname = mode, 0, 0, "root", "root"
            with open(source, "rb") as content:
                out.addfile(info, content)
        for target, link in sorted(self.links.items()):
            parents(target)
            info = tarfile.TarInfo(target.lstrip("/"))
            info.type, info.linkname = tarfile.SYMTYPE, link
            out.addfile(info)


# -- the images --------------------------------------------------------------------------


def redis_rootfs(redis_server: str | None = None) -> RootFS:
    """Debian's redis-server (a multi-call binary: the real file, named redis-server)."""
    rootfs = RootFS()
    rootfs.add_executable(Path(find_redis_server(redis_server)).resolve(),
                          "/usr/local/bin/redis-server")
    cli = Path(find_redis_server(redis_server)).parent / "redis-cli"
    if cli.exists():  # for healthchecks and `docker exec ... redis-cli` by hand
        rootfs.add_executable(cli.resolve(), "/usr/local/bin/redis-cli")
    rootfs.add_dir("/data")
    rootfs.add_dir("/tmp", 0o1777)
    rootfs.changes = [f"ENV PATH={SEARCH_PATH}", "WORKDIR /data", "EXPOSE 6379/tcp",
                      'CMD ["redis-server", "--protected-mode", "no"]']
    return rootfs


def toxiproxy_rootfs(toxiproxy_server: str | None = None) -> RootFS:
    rootfs = RootFS()
    rootfs.add_executable(find_toxiproxy_server(toxiproxy_server),
                          "/usr/local/bin/toxiproxy-server")
    rootfs.add_dir("/tmp", 0o1777)
    rootfs.changes = [f"ENV PATH={SEARCH_PATH}", "EXPOSE 8474/tcp",
                      'ENTRYPOINT ["/usr/local/bin/toxiproxy-server"]', 'CMD ["-host=0.0.0.0"]']
    return rootfs


_STDLIB_SKIP = {"site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip",
                "lib2to3"}
_EXTENSION_SKIP = re.compile(r"^(_tkinter|_test|xx|_xx|_ctypes_test|_curses|readline)")


def _runtime_distributions(root_name: str) -> list[importlib.metadata.Distribution]:
    """The distributions ``root_name`` needs at run time (no extras), for this Python."""
    from packaging.requirements import Requirement  # pytest's dependency; only needed here

    wanted, seen, order = [root_name], set(), []
    while wanted:
        name = wanted.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        seen.add(key)
        dist = importlib.metadata.distribution(name)
        if key != re.sub(r"[-_.]+", "-", root_name).lower():
            order.append(dist)
        for text in dist.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                wanted.append(requirement.name)
    return order


def app_rootfs(checkout: Path) -> RootFS:
    """The compose stack's app: this virtualenv's interpreter (at its own path, so it
    finds its standard library as on this machine), the library's runtime
    dependencies, the project's packages and ``compose/app``."""
    rootfs = RootFS()
    base = Path(sys.base_prefix)
    interpreter = Path(sys.executable).resolve()
    rootfs.add_executable(interpreter, str(interpreter))
    rootfs.links["/usr/local/bin/python3"] = str(interpreter)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    stdlib = base / "lib" / version
    plain_pyc = f".{sys.implementation.cache_tag}.pyc"

    def keep_stdlib(relative: Path) -> bool:
        if relative.parts[0] in _STDLIB_SKIP or relative.parts[0].startswith("config-"):
            return False
        if relative.parts[0] == "lib-dynload":
            return False
        return relative.suffix == ".py" or relative.name.endswith(plain_pyc)

    rootfs.add_tree(stdlib, str(stdlib), keep_stdlib)
    for extension in sorted((stdlib / "lib-dynload").glob("*.so")):
        if _EXTENSION_SKIP.match(extension.name):
            continue
        try:
            libraries = shared_libraries(extension)
        except ImageBuildError:
            continue  # a module whose library is not installed here cannot load anyway
        rootfs.add_file(extension, str(extension))
        for library in libraries:
            rootfs.add_file(library, str(library), 0o755)
    for dist in _runtime_distributions("redlock-fenced"):
        for entry in dist.files or []:
            source = Path(str(dist.locate_file(entry)))
            if entry.parts[0] == ".." or "__pycache__" in entry.parts or not source.is_file():
                continue
            rootfs.add_file(source, f"/app/lib/{entry.as_posix()}")

    def keep_source(relative: Path) -> bool:
        return "__pycache__" not in relative.parts and relative.suffix in (".py", ".typed")

    def keep_library(relative: Path) -> bool:
        # The test tooling is not the app's: changing it must not rebuild the image.
        return keep_source(relative) and relative.parts[0] != "testing"

    for package in ("redlock", "fencing", "examples"):
        rootfs.add_tree(checkout / package, f"/app/src/{package}",
                        keep_library if package == "redlock" else keep_source)
    rootfs.add_tree(checkout / "compose" / "app", "/app", keep_source)
    rootfs.add_dir("/tmp", 0o1777)
    rootfs.changes = [f"ENV PATH={SEARCH_PATH}", "ENV PYTHONPATH=/app/lib:/app/src",
                      "ENV PYTHONUNBUFFERED=1", "ENV PYTHONDONTWRITEBYTECODE=1", "WORKDIR /app",
                      f'ENTRYPOINT ["{interpreter}", "/app/sale_service.py"]']
    return rootfs


# -- building ------------------------------------------------------------------------------


@dataclass
class Built:
    image: str
    content_tag: str
    built: bool
    seconds: float


def ensure_image(api: EngineAPI, repository: str, rootfs: RootFS) -> Built:
    """``repository:local`` with exactly ``rootfs``: imported unless the image of the
    same content hash exists; older content tags of the repository are removed."""
    started = time.monotonic()
    content_tag = rootfs.digest()[:16]
    reference = f"{repository}:{content_tag}"
    built = api.image(reference) is None
    if built:
        with tempfile.TemporaryFile() as tar_file:
            with tarfile.open(fileobj=tar_file, mode="w", format=tarfile.PAX_FORMAT) as tar:
                rootfs.write_tar(tar)
            size = tar_file.tell()
            tar_file.seek(0)
            api.import_image(tar_file, size, repository, content_tag, rootfs.changes)
    api.tag(reference, repository, LOCAL_TAG)
    for image in api.images(repository):
        for tag in image.get("RepoTags") or []:
            if tag not in (reference, f"{repository}:{LOCAL_TAG}"):
                api.remove_image(tag)
    return Built(f"{repository}:{LOCAL_TAG}", reference, built, time.monotonic() - started)


def ensure_images(api: EngineAPI, *, app_checkout: Path | None = None,
                  only: Iterable[str] = ("redis", "toxiproxy")) -> list[Built]:
    """The Redis and Toxiproxy images (and the compose app's, given a checkout)."""
    wanted = list(only)
    builders: dict[str, tuple[str, Callable[[], RootFS]]] = {
        "redis": (REDIS_REPOSITORY, redis_rootfs),
        "toxiproxy": (TOXIPROXY_REPOSITORY, toxiproxy_rootfs),
    }
    if app_checkout is not None:
        builders["app"] = (APP_REPOSITORY, lambda: app_rootfs(app_checkout))
        wanted.append("app")
    return [ensure_image(api, builders[name][0], builders[name][1]()) for name in wanted]


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Build the local Docker images (no pulls).")
    parser.add_argument("--app", metavar="CHECKOUT", type=Path,
                        help="also the compose app image, from this checkout")
    args = parser.parse_args(argv)
    api = EngineAPI.from_host()
    started = time.monotonic()
    for result in ensure_images(api, app_checkout=args.app):
        state = "built" if result.built else "cached"
        print(f"{result.image} ({result.content_tag}): {state} in {result.seconds:.1f} s")
    print(f"images ready in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
