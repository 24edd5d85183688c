"""The background maintenance of a manager's nodes (docs/design.md §4.3-§4.5): judge
restarted nodes, adopt unstamped markers, open amnesia episodes, and repair nodes whose
rejoin delay has passed. It runs in a thread or task of the manager's own, never on an
acquire's path; each step is bounded by ``repair_timeout``."""

from __future__ import annotations

from redlock._core.amnesia.episodes import adopt_markers, judge, open_episodes
from redlock._core.amnesia.guard import AmnesiaGuard
from redlock._core.amnesia.repair import repair_node
from redlock._core.requests import Flow, PauseUntilWoken, Wakeable


def maintenance(guard: AmnesiaGuard, stop: Wakeable, news: Wakeable) -> Flow[None]:
    """Judge restarted nodes, adopt unstamped markers, open episodes and repair nodes whose rejoin
    delay has passed; returns when no node needs it any more, or ``stop`` is set (the manager
    closed). Between rounds it waits for the next repair due, or ``news`` (set when a node newly
    needs it, and on close). Rate-limited; each step is bounded by ``repair_timeout``."""
    health, settings = guard.health, guard.settings
    bounded: dict[int, float] = {}  # when each benched node's rejoin time was last bounded
    while health.pending() and not stop.is_set():
        news.clear()
        health.news = False
        if health.adopt:
            yield from adopt_markers(guard, dict(health.adopt))
        if health.suspect:
            yield from judge(guard, dict(health.suspect))
        now = guard.clock()
        # Episodes to open, and rejoin times to bound again: one set to max_ttl while some
        # peers could not be read comes down once they answer (docs/design.md §4.3.1).
        every = settings.repair_interval
        again = [i for i, due in list(health.unmarked.items())
                 if due is None or (i in health.unbounded and due - now > every
                                    and now - bounded.get(i, now - 1e9) >= every)]
        if again:
            for i in again:
                bounded[i] = now
            yield from open_episodes(guard, again)
        now = guard.clock()
        for node, due in list(health.unmarked.items()):
            tried = health.last_try.get(node)
            if due is not None and due <= now and (
                    tried is None or now - tried >= settings.repair_interval):
                health.last_try[node] = now
                yield from repair_node(guard, node, force=False)
        if not health.pending():
            return
        now = guard.clock()
        waits = [settings.repair_interval]
        for node, due in list(health.unmarked.items()):
            if due is not None:
                tried = health.last_try.get(node)
                ready = max(due, tried + settings.repair_interval if tried else due)
                waits.append(ready - now)
        yield PauseUntilWoken(max(0.01, min(waits)), news)

