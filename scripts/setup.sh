#!/usr/bin/env bash
# Installs everything the demo, the tests and the benchmarks need, idempotently:
#   - redis-server, PostgreSQL and libfaketime from Debian's packages (needs root for apt-get);
#   - the Toxiproxy server, built with `go install` at a pinned version into .tools/bin;
#   - a virtualenv in .venv with this project and its dev, bench and docker extras.
# With --docker (scripts/test passes it unless the Docker tests are deselected), also:
#   - Debian's docker.io (dockerd, containerd, runc) and docker-compose (v1: the v2
#     plugin is not packaged by Debian 12 nor on PyPI);
#   - a private dockerd (tests/support/dockerd.py: its own data root in .tools/docker,
#     socket, no bridge, no iptables), started to build the local images
#     (tests/support/images.py: FROM scratch, from this machine's redis-server,
#     toxiproxy-server and Python; cached by content hash) and stopped again by its pid.
# Nothing is installed by hand anywhere else; CI and a fresh clone run exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TOXIPROXY_VERSION=v2.12.0

log() { printf '[setup] %s\n' "$*" >&2; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

want_docker=0
for arg in "$@"; do
    case "$arg" in
        --docker) want_docker=1 ;;
        *) log "unknown option $arg (known: --docker)"; exit 2 ;;
    esac
done

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
# PostgreSQL: the server binaries (initdb, pg_ctl, postgres) under /usr/lib/postgresql/*/bin.
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)
ls /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 >/dev/null 2>&1 \
    || ls /usr/lib/*/faketime/libfaketimeMT.so.1 >/dev/null 2>&1 || need_apt+=(libfaketime)
if [ "$want_docker" = 1 ]; then
    # The machine may have a docker CLI of its own: what we need is Debian's engine.
    [ -x /usr/sbin/dockerd ] || need_apt+=(docker.io)
    command -v docker-compose >/dev/null 2>&1 || need_apt+=(docker-compose)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        log "missing ${need_apt[*]}: run this script as root (apt-get) or install them"; exit 1
    fi
    log "apt-get install ${need_apt[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
    # Debian starts the packaged services; our tests start their own servers on free ports.
    (service redis-server stop || true) >/dev/null 2>&1
    (service postgresql stop || true) >/dev/null 2>&1
    # Likewise the system's Docker engine, if the package started it: we run our own.
    if [[ " ${need_apt[*]} " == *" docker.io "* ]]; then
        (service docker stop || true) >/dev/null 2>&1
    fi
fi

mkdir -p .tools/bin
# Go is preinstalled under /usr/local/go on our machines, not always on PATH.
[ -x /usr/local/go/bin/go ] && ! command -v go >/dev/null 2>&1 && export PATH="$PATH:/usr/local/go/bin"
if [ ! -x .tools/bin/toxiproxy-server ]; then
    if command -v go >/dev/null 2>&1; then
        log "go install toxiproxy server ${TOXIPROXY_VERSION}"
        tmp=$(mktemp -d)
        GOBIN="$tmp" GOFLAGS=-buildvcs=false go install "github.com/Shopify/toxiproxy/v2/cmd/server@${TOXIPROXY_VERSION}"
        mv "$tmp/server" .tools/bin/toxiproxy-server
        rmdir "$tmp"
    else
        log "go not found: the Toxiproxy fault tests will be skipped"
    fi
fi

if [ ! -x .venv/bin/python ]; then
    log "creating .venv"
    python3 -m venv .venv
fi
stamp=.venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -e "$stamp" ]; then
    log "pip install -e .[dev,bench,docker]"
    .venv/bin/python -m pip install -q --upgrade pip >/dev/null
    .venv/bin/python -m pip install -q -e ".[dev,bench,docker]"
    rm -f .venv/.installed-*
    touch "$stamp"
fi

if [ "$want_docker" = 1 ]; then
    export PATH="$ROOT/.tools/bin:$PATH"
    started=$EPOCHREALTIME
    if host=$(.venv/bin/python -m tests.support.dockerd up); then
        log "private dockerd up in $(since "$started") s at $host"
        set +e
        DOCKER_HOST=$host .venv/bin/python -m tests.support.images --app "$ROOT" \
            | sed 's/^/[setup] image /' >&2
        built=${PIPESTATUS[0]}
        set -e
        .venv/bin/python -m tests.support.dockerd down
        [ "$built" = 0 ] || { log "building the local images failed"; exit 1; }
        log "private dockerd stopped; engine and images took $(since "$started") s"
    else
        log "the Docker engine cannot start here: the docker tests will skip (fail under CI)"
    fi
fi
log "ready: $ROOT/.venv"
