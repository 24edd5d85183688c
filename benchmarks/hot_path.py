"""Issue 21's hot-path figures: ours against the peers it must not be slower than.

    PYTHONPATH=. .venv/bin/python benchmarks/hot_path.py [--ns 1 3 5 7 9] [--rounds 5]
        [--cycles 1000] [--pin none|apart|shared]
    PYTHONPATH=. .venv/bin/python benchmarks/hot_path.py --profile [--ns 1 3]

Uncontended acquire+release, loopback, the first N of 9 redis-server processes. For each
N, in the same rounds (interleaved, the order rotated every round):

* ours asyncio against aioredlock (target: no slower at N=1, 3, 5, 7, 9);
* ours sync against the raw sync scatter/gather floor (target: at most 1.1x at N=3, 5);
* at N=1, ours sync against redis-py's ``Lock`` and python-redis-lock, ours asyncio
  against redis-py's asyncio ``Lock`` (issue 41's targets: sync at most 1.15x redis-py's
  ``Lock`` and no slower than python-redis-lock, asyncio at most 1.15x redis-py's).

Each ratio is the median over rounds of the ratio of the two p50s of that round (the
two measured back to back), with its [min-max] over rounds.

``--profile``: cProfile of both of our clients per N, with the time of each cycle
counted per layer (our code by package, redis-py, hiredis, asyncio, the socket and
select calls, the rest), in µs per acquire+release. cProfile slows Python code more
than C calls, so the layers' shares matter, not their sum.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import sys

from _environment import configure_logging, loadavg_text, machine_lines, pin
from _peers import (
    AsyncPeer,
    Peer,
    Peers,
    aioredlock,
    ours_async,
    ours_sync,
    python_redis_lock,
    raw_floor,
    raw_floor_async,
    redis_py_lock,
    redis_py_lock_async,
)
from _sections import rotated

LOOP = "asyncio"  # --loop

# (ours, theirs): ratio ours/theirs of p50s; below 1 is ours faster
PAIRS = (("ours_async", "aioredlock"), ("ours", "floor"), ("ours_async", "floor_async"),
         ("ours", "redispy"), ("ours", "prl"), ("ours_async", "redispy_async"))


def new_loop() -> asyncio.AbstractEventLoop:
    """The async peers' event loop: asyncio's own, or uvloop's with ``--loop uvloop`` (what
    ``uvicorn[standard]`` installs)."""
    if LOOP == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def peer_set(urls: list[str]) -> tuple[Peers, list[Peer]]:
    peers = Peers(new_loop)
    chosen: list[Peer] = []
    chosen.append(raw_floor(peers, urls))  # first: it initialises the first N nodes
    chosen.append(ours_sync(peers, urls, "ours", "ours sync"))
    chosen.append(ours_async(peers, urls))
    peers.add("aioredlock", lambda: aioredlock(peers, urls))
    chosen.append(raw_floor_async(peers, urls))
    if len(urls) == 1:
        import redis

        single = redis.Redis.from_url(urls[0])
        peers.closers.append(single.close)
        chosen.append(redis_py_lock(single))
        chosen.append(redis_py_lock_async(peers, urls[0]))
        peers.add("python-redis-lock", lambda: python_redis_lock(single))
    chosen += [p for p in peers.all if p not in chosen]
    return peers, chosen


def measure(urls: list[str], rounds: int, cycles: int, warmup: int,
            only: list[str] | None = None) -> dict[str, list[float]]:
    peers, chosen = peer_set(urls)
    if only:
        chosen = [p for p in chosen if p.key in only]
    out: dict[str, list[float]] = {p.key: [] for p in chosen}
    try:
        for round_no in range(rounds):
            for peer in rotated(chosen, round_no):
                result = peer.uncontended(f"bench:hot:{len(urls)}:{peer.key}:{round_no}",
                                          cycles=cycles, warmup=warmup)
                out[peer.key].append(result["p50_us"])
    finally:
        peers.close()
    return out


def report(n: int, out: dict[str, list[float]]) -> None:
    print(f"\nN={n}: p50 per acquire+release, median over rounds [min-max]")
    for key, values in out.items():
        print(f"  {key:12s} {statistics.median(values):6.0f} us"
              f" [{min(values):.0f}-{max(values):.0f}]")
    for ours, theirs in PAIRS:
        if ours in out and theirs in out:
            ratios = [a / b for a, b in zip(out[ours], out[theirs], strict=True)]
            print(f"  {ours} / {theirs}: {statistics.median(ratios):.2f}"
                  f" [{min(ratios):.2f}-{max(ratios):.2f}]")


# -- the profile, per layer ----------------------------------------------------------

LAYERS = (
    ("redlock/_io/", "ours: _io (transports)"),
    ("redlock/_core/", "ours: _core"),
    ("redlock/_scripts/", "ours: _scripts (replies)"),
    ("redlock/_client/", "ours: _client"),
    ("redlock/", "ours: shells, rest"),
    ("redis/", "redis-py (pack, parse, pool)"),
    ("asyncio/", "asyncio (event loop)"),
    ("selectors.py", "asyncio (event loop)"),
)
BUILTIN_LAYERS = (
    ("hiredis", "hiredis (C)"),
    ("socket", "socket / select (C)"),
    ("select", "socket / select (C)"),
    ("_asyncio", "asyncio (event loop)"),
    ("epoll", "socket / select (C)"),
)


def layer_of(key: tuple[str, int, str]) -> str:
    filename, _, name = key
    if filename == "~":  # a built-in: "<method 'recv_into' of '_socket.socket' objects>"
        for token, layer in BUILTIN_LAYERS:
            if token in name:
                return layer
        return "builtins (other C)"
    for token, layer in LAYERS:
        if token in filename:
            return layer
    return "other Python (stdlib...)"


def per_layer(profiler: cProfile.Profile, cycles: int) -> dict[str, float]:
    stats = pstats.Stats(profiler)
    layers: dict[str, float] = {}
    for key, (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        layer = layer_of(key)
        layers[layer] = layers.get(layer, 0.0) + tottime
    return {layer: seconds / cycles * 1e6 for layer, seconds in
            sorted(layers.items(), key=lambda item: -item[1])}


def profile_peer(peer: Peer, cycles: int) -> cProfile.Profile:
    handle = peer.make("bench:hot:profile")
    profiler = cProfile.Profile()
    if isinstance(peer, AsyncPeer):
        async def run(count: int, profiled: bool) -> None:
            for _ in range(50):
                await peer.release(handle, await peer.acquire(handle))
            if profiled:
                profiler.enable()
            for _ in range(count):
                await peer.release(handle, await peer.acquire(handle))
            if profiled:
                profiler.disable()
        peer.loop.run_until_complete(run(cycles, True))
    else:
        for _ in range(50):
            peer.release(handle, peer.acquire(handle))
        profiler.enable()
        for _ in range(cycles):
            peer.release(handle, peer.acquire(handle))
        profiler.disable()
    return profiler


def profile(urls: list[str], cycles: int, top: int) -> None:
    peers, chosen = peer_set(urls)
    try:
        for peer in [p for p in chosen if p.key in ("ours", "ours_async")]:
            profiler = profile_peer(peer, cycles)
            print(f"\n== {peer.label} N={len(urls)}: cProfile, {cycles} cycles;"
                  " tottime per acquire+release, by layer ==")
            layers = per_layer(profiler, cycles)
            for layer, micros in layers.items():
                print(f"  {layer:32s} {micros:7.1f} us")
            print(f"  {'(sum, under cProfile)':32s} {sum(layers.values()):7.1f} us")
            if top:
                stats = pstats.Stats(profiler, stream=sys.stdout)
                stats.sort_stats("tottime").print_stats(top)
    finally:
        peers.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--ns", type=int, nargs="*", default=[1, 3, 5, 7, 9])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--only", nargs="*", help="peer keys to measure (default: all)")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile of our two clients per N, per layer")
    parser.add_argument("--pin", choices=["none", "apart", "shared"], default="none",
                        help="where this process and the nodes run (see _environment.pin)")
    parser.add_argument("--top", type=int, default=0,
                        help="with --profile: also the top functions by tottime")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio",
                        help="the async peers' event loop")
    args = parser.parse_args()
    global LOOP
    LOOP = args.loop
    configure_logging()
    from redlock.testing import RedisNodes

    print("issue 21 hot path" + (" (profile)" if args.profile else ""))
    for line in machine_lines():
        print("  " + line)
    print(f"  N={args.ns} rounds={args.rounds} cycles={args.cycles} loop={args.loop}; "
          f"loadavg {loadavg_text()}")
    with RedisNodes(max(args.ns)) as nodes:
        print("  " + pin(args.pin, [node.pid for node in nodes if node.pid is not None]))
        for n in args.ns:
            if args.profile:
                profile(nodes.urls[:n], args.cycles, args.top)
            else:
                report(n, measure(nodes.urls[:n], args.rounds, args.cycles, args.warmup,
                                  args.only))
    print(f"\nloadavg at end: {loadavg_text()}")
    return 0


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    sys.exit(main())
