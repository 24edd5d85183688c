"""The network sections of benchmarks/network.py: latency sweep, blackholed minority,
N-scaling. Each collects raw results over the N-node peers of ``_peers.add_redlocks``
(ours sync and asyncio, pottery, aioredlock, redlock-py, redlock-ng sync and asyncio,
the two floors); benchmarks/_netreport.py turns them into tables.

* RTT: a Toxiproxy ``latency`` toxic on both directions of every proxy, half the RTT
  each way (upstream RTT//2 ms, downstream the rest), so a request and its reply
  together take the RTT. Every peer runs with its library's defaults (ours: no
  ``node_timeout``, no ``outage_timeout`` passed); a cycle is *one* call of the
  library's acquire (its own retries included) and a release, and a failure is counted,
  not raised.
* Blackhole: Toxiproxy's ``timeout`` toxic with timeout 0 on both directions of 1, then
  2, of the 5 proxies (``Proxy.blackhole``): connections are accepted, nothing is ever
  answered or closed. The healthy row is measured in the same section, just before.
* N-scaling: loopback, no proxy, the first N of 9 nodes.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import _netreport
import redis
from _environment import LoadMonitor
from _peers import Peer, Peers, add_redlocks
from _sections import Loads, rotated, section

Results = dict[str, dict[str, list[dict[str, Any]]]]  # condition -> peer key -> rounds


def set_rtt(proxies: Any, rtt_ms: int) -> None:
    """Every toxic removed, then ``rtt_ms`` of round trip on every proxy (0: none)."""
    proxies.heal()
    if rtt_ms <= 0:
        return
    for proxy in proxies:
        proxy.add_toxic("latency", stream="upstream", name="rtt_up", latency=rtt_ms // 2)
        proxy.add_toxic("latency", stream="downstream", name="rtt_down",
                        latency=rtt_ms - rtt_ms // 2)


def probe_link(url: str, pings: int) -> dict[str, float]:
    """What one round trip and one new redis-py connection (connect + its handshake:
    HELLO, CLIENT SETINFO...) cost through the proxy, in ms: the link as the libraries see
    it, whatever the toxic's settings say."""
    pool = redis.ConnectionPool.from_url(url, socket_timeout=10, socket_connect_timeout=10)
    connects, rtts = [], []
    try:
        for _ in range(3):
            conn = pool.make_connection()
            t0 = time.perf_counter()
            conn.connect()
            connects.append((time.perf_counter() - t0) * 1000)
            for _ in range(pings):
                t0 = time.perf_counter()
                conn.send_command("PING")
                conn.read_response()
                rtts.append((time.perf_counter() - t0) * 1000)
            conn.disconnect()
    finally:
        pool.disconnect()
    return {"ping_ms": statistics.median(rtts), "connect_ms": statistics.median(connects)}


def _limits(args: argparse.Namespace, rtt_ms: int) -> dict[str, Any]:
    return {"cycles": args.cycles, "warmup": args.warmup if rtt_ms <= 2 else 2,
            "budget_s": args.budget, "max_failures": args.max_failures, "hang_s": args.hang}


def _measure_all(peers: list[Peer], rounds: int, condition: str, limits: dict[str, Any],
                 out: Results) -> None:
    for round_no in range(rounds):
        for peer in rotated(peers, round_no):
            resource = f"bench:net:{condition}:{peer.key}:{round_no}"
            out.setdefault(condition, {}).setdefault(peer.key, []).append(
                peer.attempts(resource, limits))
        print(f"   {condition}: round {round_no + 1}/{rounds} done", flush=True)


def _peer_set(urls: list[str], args: argparse.Namespace) -> tuple[Peers, list[Peer]]:
    peers = Peers()
    add_redlocks(peers, urls, args)
    chosen = [p for p in peers.all if not args.peers or p.key in args.peers]
    return peers, chosen


def rtt_sweep(proxies: Any, args: argparse.Namespace, monitor: LoadMonitor,
              loads: Loads) -> dict[str, Any]:
    """Uncontended acquire+release through Toxiproxy at every RTT, N=len(proxies).

    Every RTT gets new clients (new managers, pools and connections) made after the
    latency is set, as an application started on that network would have: a client's
    first connections then pay their handshake at that RTT. ``--reuse-clients`` keeps
    one set of clients, connected at the first RTT, for the whole sweep instead."""
    out: Results = {}
    links: dict[str, dict[str, float]] = {}
    labels: dict[str, str] = {}
    skipped: dict[str, str] = {}
    title = (f"Latency sweep: N={len(proxies)} through Toxiproxy, RTT {args.rtts} ms, "
             "default settings, uncontended, "
             + ("one set of clients for the sweep" if args.reuse_clients
                else "new clients at every RTT"))
    shared = _peer_set(proxies.urls, args) if args.reuse_clients else None
    try:
        with section(title, monitor, loads):
            for rtt in args.rtts:
                set_rtt(proxies, rtt)
                links[str(rtt)] = probe_link(proxies.urls[0], pings=5 if rtt < 40 else 2)
                peers, chosen = shared or _peer_set(proxies.urls, args)
                try:
                    _measure_all(chosen, args.rounds, str(rtt), _limits(args, rtt), out)
                finally:
                    if shared is None:
                        peers.close()
                labels.update({p.key: p.label for p in chosen})
                skipped.update({f"{k} (RTT {rtt})": v for k, v in peers.skipped.items()})
            proxies.heal()
            print(_netreport.rtt_table(list(labels.items()), out, links, args.rtts))
    finally:
        proxies.heal()
        if shared is not None:
            shared[0].close()
    return {"results": out, "links": links, "skipped": skipped, "labels": labels,
            "reuse_clients": args.reuse_clients}


def blackhole(proxies: Any, args: argparse.Namespace, monitor: LoadMonitor,
              loads: Loads) -> dict[str, Any]:
    """Healthy, then 1 and 2 of the proxies blackholed (RTT ``--blackhole-rtt``)."""
    out: Results = {}
    peers, chosen = _peer_set(proxies.urls, args)
    rtt = args.blackhole_rtt
    conditions: list[tuple[str, Callable[[], None]]] = [
        ("healthy", lambda: None),
        ("1 of 5", proxies[0].blackhole),
        ("2 of 5", proxies[1].blackhole),  # on top of the first
    ]
    title = (f"Minority blackholed: N={len(proxies)} through Toxiproxy, RTT {rtt} ms, "
             "default settings, uncontended")
    try:
        with section(title, monitor, loads):
            set_rtt(proxies, rtt)
            for name, fault in conditions:
                fault()
                # The floors read every reply: with a node that never answers they only
                # measure their own socket timeout. They are in the healthy row only.
                measured = [p for p in chosen if name == "healthy" or not p.reference]
                _measure_all(measured, args.rounds, name, _limits(args, rtt), out)
            print(_netreport.blackhole_table(chosen, out, [c for c, _ in conditions]))
    finally:
        proxies.heal()
        peers.close()
    return {"results": out, "skipped": peers.skipped, "rtt_ms": rtt,
            "labels": {p.key: p.label for p in chosen}}


def n_scaling(urls: list[str], args: argparse.Namespace, monitor: LoadMonitor,
              loads: Loads) -> dict[str, Any]:
    """Loopback, no proxy: uncontended acquire+release on the first N nodes."""
    out: Results = {}
    labels: dict[str, str] = {}
    skipped: dict[str, str] = {}
    title = (f"N-scaling: loopback (no proxy), N={args.ns}, {args.nscale_cycles} cycles x "
             f"{args.nscale_rounds} rounds, uncontended")
    with section(title, monitor, loads):
        for n in args.ns:
            peers, chosen = _peer_set(urls[:n], args)
            try:
                for round_no in range(args.nscale_rounds):
                    for peer in rotated(chosen, round_no):
                        try:
                            result: dict[str, Any] = dict(peer.uncontended(
                                f"bench:nscale:{n}:{peer.key}:{round_no}",
                                cycles=args.nscale_cycles, warmup=args.warmup))
                        except Exception as exc:
                            result = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                        out.setdefault(str(n), {}).setdefault(peer.key, []).append(result)
                labels.update({p.key: p.label for p in chosen})
                skipped.update(peers.skipped)
            finally:
                peers.close()
            print(f"   N={n} done", flush=True)
        print(_netreport.nscale_table(labels, out, args.ns))
    return {"results": out, "labels": labels, "skipped": skipped}
