"""What one manager knows about its nodes' data (docs/design.md §4): which nodes restarted and wait
to be judged, which lost their data and when they may rejoin, which markers carry no known server
run, which nodes a newer release initialised (§4.1). Health is only bookkeeping: the guard
(:mod:`redlock._core.amnesia.guard`) and the background work
(:mod:`redlock._core.amnesia.episodes`, ``repair``, ``maintenance``) act on it."""

from __future__ import annotations

from redlock._core.environment import Mutex
from redlock._scripts.replies import stamped_run


class NodeHealth:
    """What one manager knows about its nodes' data (thread-safe)."""

    def __init__(self, mutex: Mutex) -> None:
        self.marker_seen = False  # this manager has seen an initialised cluster
        self.inspected = False  # node configurations were read once (see unsafe_config)
        # Restarted: the marker value to judge, and the run id of the server judged.
        self.suspect: dict[int, tuple[bytes, str]] = {}
        self.unidentifiable: set[int] = set()  # may not run INFO: restarts go unseen
        # Marked in another format than this client's (a newer release's, §4.1): not used
        # at all (never counted, judged nor repaired); why, for the outcomes.
        self.incompatible: dict[int, str] = {}
        self.unmarked: dict[int, float | None] = {}  # lost data: when it may rejoin
        # Lost data, and bounded by max_ttl (its peers could not all be read): bounded
        # again later, which may bring its rejoin time down (docs/design.md §4.3.1).
        self.unbounded: set[int] = set()
        self.last_try: dict[int, float] = {}  # last repair attempt (rate limit)
        # Markers without a known run (written by a release before run ids, or by a user
        # who may not run INFO): to be stamped with the server's run id, as found.
        self.adopt: dict[int, tuple[bytes, str]] = {}
        self.news = False  # a node needs the maintenance since its last round
        self._initialising = 0  # new-cluster initialisations of this manager in flight
        self._mutex = mutex

    def initialising(self, change: int) -> None:
        with self._mutex:
            self._initialising += change

    def initialising_now(self) -> bool:
        return self._initialising > 0

    def after_fork(self, mutex: Mutex) -> None:
        self._mutex = mutex  # a parent thread may have held the old one at the fork

    def identified(self, node: int, run_id: str, marker: bytes | None) -> bool:
        """Record what a new connection found (a marker of this client's format, or
        none: see :meth:`of_other_format`); True if the node became a suspect."""
        with self._mutex:
            self.incompatible.pop(node, None)
            if marker is None:
                # No marker: the acquire script refuses there by itself, and the acquire
                # tells a new cluster from a node that lost its data.
                self.suspect.pop(node, None)
                return False
            self.marker_seen = True
            stamped = stamped_run(marker)
            if stamped == run_id or run_id == "unknown":
                # The same server run, or we cannot tell (our user may not run INFO:
                # restart detection is off for this node, and the manager warned).
                self.suspect.pop(node, None)
                self.unmarked.pop(node, None)
                return False
            if stamped in (None, "unknown"):
                # Whoever wrote the marker could not tell restarts apart either: what it
                # promised holds, from now on with restart detection (it is adopted).
                self.suspect.pop(node, None)
                self.news |= node not in self.adopt
                self.adopt[node] = (marker, run_id)
                return False
            known = node in self.suspect
            self.suspect[node] = (marker, run_id)
            self.news |= not known
            return not known

    def of_other_format(self, node: int, why: str) -> bool:
        """The node's marker names another format than this client's (a newer release
        initialised it, ``why`` says which): it is not used from now on (until a new
        connection finds a marker of this format, or none). True the first time."""
        with self._mutex:
            self.marker_seen = True  # (a cluster somebody initialised)
            self.suspect.pop(node, None)
            self.unmarked.pop(node, None)
            self.adopt.pop(node, None)
            new = node not in self.incompatible
            self.incompatible[node] = why
            return new

    def benched(self) -> set[int]:
        with self._mutex:
            return set(self.suspect) | set(self.unmarked)

    def rejoins_in(self, node: int, now: float) -> float | None:
        with self._mutex:
            due = self.unmarked.get(node)
        return None if due is None else max(0.0, due - now)

    def healthy(self, node: int) -> None:
        with self._mutex:
            self.suspect.pop(node, None)
            self.unmarked.pop(node, None)

    def marked(self, node: int) -> None:
        """The node has its marker again (whether its server may be trusted is the
        suspects' business)."""
        with self._mutex:
            self.unmarked.pop(node, None)

    def lost_data(self, node: int) -> bool:
        """Note a node without its marker; True the first time."""
        with self._mutex:
            self.suspect.pop(node, None)
            if node in self.unmarked:
                return False
            self.unmarked[node] = None
            self.news = True
            return True

    def episode_unknown(self, node: int) -> None:
        """Its episode must be looked at again (it began anew, or could not be read)."""
        with self._mutex:
            if node in self.unmarked:
                self.unmarked[node] = None

    def rejoins_at(self, node: int, at: float) -> None:
        with self._mutex:
            if node in self.unmarked:
                self.unmarked[node] = at

    def pending(self) -> bool:
        return bool(self.suspect or self.unmarked or self.adopt)

    def quiet(self) -> bool:
        """Whether no node needs the maintenance; then ``news`` is cleared (under the
        lock: a node that newly needs it at the same moment keeps it set). The end of
        every call looks at ``news`` only, so it must not stay set for nothing."""
        with self._mutex:
            if self.pending():
                return False
            self.news = False
            return True

    def adopted(self, node: int, found: tuple[bytes, str]) -> None:
        """The marker found on ``node`` was adopted (or changed): no longer to adopt."""
        with self._mutex:
            if self.adopt.get(node) == found:
                del self.adopt[node]
