#!/usr/bin/env bash
# Installs everything the demo, the tests and the benchmarks need, idempotently:
#   - redis-server, PostgreSQL and libfaketime from Debian's packages (needs root for apt-get);
#   - the Toxiproxy server, built with `go install` at a pinned version into .tools/bin;
#   - a virtualenv in .venv with this project and its dev extras.
# Nothing is installed by hand anywhere else; CI and a fresh clone run exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TOXIPROXY_VERSION=v2.12.0

log() { printf '[setup] %s\n' "$*" >&2; }

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
# PostgreSQL: the server binaries (initdb, pg_ctl, postgres) under /usr/lib/postgresql/*/bin.
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)
ls /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 >/dev/null 2>&1 \
    || ls /usr/lib/*/faketime/libfaketimeMT.so.1 >/dev/null 2>&1 || need_apt+=(libfaketime)
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
    log "pip install -e .[dev,bench]"
    .venv/bin/python -m pip install -q --upgrade pip >/dev/null
    .venv/bin/python -m pip install -q -e ".[dev,bench]"
    rm -f .venv/.installed-*
    touch "$stamp"
fi
log "ready: $ROOT/.venv"
