"""What each log event says to a person: its sentence, over the event's fields (docs/events.md
shows them). A template is a ``str.format`` string naming the event's fields
(``tests/test_logging.py`` checks them); lists read as ``a, b`` (``none`` when empty); sentences
start in lower case and name nodes by ``host:port``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SENTENCES: Mapping[str, str] = {
    # -- the normal life of a lock (DEBUG) -------------------------------------------------
    "redlock.acquired":
        "acquired {resource} ({kind}) with fencing token {token}: {granted} of {nodes} nodes"
        " granted it, valid for {validity_ms:.0f} ms",
    "redlock.term_unrecorded":
        "elected leader of {resource} for term {token}, but the term record reached only"
        " {recorded} nodes (need {needed}): {hint}",
    "redlock.handed_off":
        "releases handed {resource} to this waiter on {heard} nodes: acquired without an"
        " acquire round, fencing token {token} committed on {committed} nodes",
    "redlock.handoff_unused":
        "releases handed {resource} to this waiter, but the hand-off did not make an"
        " acquisition (token {token} committed on {committed} nodes, {validity_ms:.0f} ms"
        " of validity left): the next attempt asks the nodes",
    "redlock.quorum_failed":
        "attempt to acquire {resource} failed: {reason} (per node: {outcomes})",
    "redlock.released":
        "released {resource} (token {token}) on every node",
    "redlock.extended":
        "extended {resource} (token {token}) by {ttl_s} s on {acks} nodes",
    "redlock.renewed":
        "renewal of {resource} goes out {late_ms} ms after it was due, with {validity_ms} ms"
        " of validity left",

    # -- rare and expected (INFO) ----------------------------------------------------------
    "redlock.token_write_back":
        "fence counters of {resource} disagreed across nodes (only {returned_token} returned"
        " token {token}): {token} written back to {written_back} nodes, committed on"
        " {committed}; nothing to do (some node missed earlier acquires, e.g. while down)",
    "redlock.cluster_initialised":
        "new cluster: none of the {nodes} nodes had a node marker, markers written on"
        " {marked}; from now on a node that loses its data is detected",
    "redlock.node_restarted":
        "node {node} restarted or was replaced (it answers as server run {run_id}, its"
        " marker was stamped by run {stamped}): its votes do not count until the background"
        " maintenance has checked that it kept its data",
    "redlock.node_marker_adopted":
        "node {node} had a marker without a known server run: stamped with run {run_id},"
        " its restarts are detected from now on",
    "redlock.node_restamped":
        "node {node} restarted with durable persistence (appendonly yes, appendfsync always)"
        " and is no promoted replica: it counts in quorums again",
    "redlock.node_answers_again":
        "node {node} answers again, after failing for {outage_s} s from {since}: releases"
        " that missed it: {releases_missed} (their keys expired by their TTL); renewals that"
        " failed with it: {renewals_failed}",

    # -- an operator should look (WARNING) -------------------------------------------------
    "redlock.members_adopted":
        "the cluster's membership changed: now epoch {epoch}, members {members} (joining:"
        " {joining}), learnt from the nodes (one refused an older epoch, or members() read"
        " it); quorums are counted under it (docs/design.md §13; possible with this"
        " client's nodes: {possible})",
    "redlock.members_joint":
        "membership change: the joint configuration (epoch {epoch}) is on {acknowledged};"
        " from now on every acquire needs a majority of the old and of the new set",
    "redlock.members_seeded":
        "membership change (epoch {epoch}): fence counters (highest {highest}) and markers"
        " seeded on {nodes}",
    "redlock.members_waiting":
        "membership change (epoch {epoch}): waiting {seconds} s until every lock granted"
        " under the old configuration has expired",
    "redlock.cluster_initialised_by_hand":
        "initialise() wrote node markers on {initialised} of {nodes} nodes (force:"
        " {forced}); from now on a node that loses its data is detected",
    "redlock.members_change_started":
        "membership change to epoch {epoch} started: from {old} to {new}; it takes about"
        " {wait_s} s (acquires need a majority of both sets meanwhile)",
    "redlock.members_changed":
        "membership changed: epoch {epoch}, members {members}; retired {retired}; not"
        " reached: {unreached} (give every client the new list)",
    "redlock.node_incompatible":
        "node {node} is not used by this client: it was {why}; upgrade this client",
    "redlock.node_unidentifiable":
        "node {node} may not run INFO (ACL -@dangerous): its restarts and rollbacks cannot"
        " be detected; allow +info for the lock user",
    "redlock.release_feed_refused":
        "node {node} sends no release notifications ({error}): {hint}",
    "redlock.even_node_count":
        "a manager over {nodes} nodes needs {quorum} of them and tolerates"
        " {tolerated_failures} failing: {hint}",
    "redlock.node_unsafe_config":
        "node {node} is unsafe for locks: {problem}",
    "redlock.node_amnesiac":
        "node {node} lost its data (no node marker, or a restart without durable"
        " persistence): it may have forgotten locks and fence counters, so it is kept out"
        " of quorums until every lock it may have granted has expired, then repaired (the"
        " next event, redlock.node_out, says when); run Redis with appendonly yes and"
        " appendfsync always to avoid this",
    "redlock.node_out":
        "node {node} stays out of quorums for {rejoins_after_s} s (bounded by {bounded_by}),"
        " then its fence counters are re-seeded and it rejoins; nothing to do",
    "redlock.node_repaired":
        "node {node} repaired: {counters} fence counters re-seeded (highest {highest}) from"
        " {sources} healthy nodes, marker written back; it counts in quorums again",
    "redlock.release_incomplete":
        "release of {resource} did not reach node {node} ({error}): the key left there"
        " expires by its TTL within {expires_within_s} s; check that node and the network"
        " to it. Further releases that miss {node} are counted, not logged, until it"
        " answers again",
    "redlock.extend_retry":
        "renewal of {resource} reached no quorum, node {node} failed ({error}): retried"
        " while the lock is valid ({validity_left_s} s left), lost if none succeeds by then;"
        " check that node and the network to it. Further failed renewals with {node} are"
        " counted, not logged, until it answers again (per node: {outcomes})",
    "redlock.node_still_failing":
        "node {node} still fails, for {outage_s} s from {since}: releases that missed it:"
        " {releases_missed} (their keys expire by their TTL); renewals that failed with it:"
        " {renewals_failed}; check that node and the network to it",
    "redlock.lost":
        "lock {resource} (token {token}) is lost: {reason}; its holder must stop (check(),"
        " token, extend() and release() raise LockLost) and the fenced resource refuses"
        " token {token} once a newer holder wrote (per node: {outcomes})",
    "redlock.lost_on_exit":
        "the with block holding {resource} was left by an exception after the lock was"
        " lost ({reason}); the block's exception propagates",
    "redlock.abandoned":
        "auto-extended lock {resource} (token {token}) released by the renewal loop instead"
        " of renewed for ever ({reason}); release locks explicitly or hold them in a with"
        " block",
    "redlock.renewals_in_process":
        "auto-extended locks are renewed by a thread of this process, not by a renewer"
        " process, because {reason}: while this process is busy (CPU work between short"
        " system calls, an event loop that keeps yielding) the renewals may run late and"
        " healthy locks may be lost; give the nodes as URLs or plain clients, and run on"
        " Linux with the real clock, to renew from a process of their own",
    "redlock.renewer_died":
        "the renewer process of this manager exited unexpectedly (exit code {exit_code},"
        " {error}: killed by the OOM killer or by hand?) while it renewed {locks} locks: they are"
        " marked lost and their on_lost callbacks called; the next auto-extended lock"
        " starts a new renewer",
    "redlock.force_released":
        "lock {resource} force-released by an operator: key deleted on {deleted} of {nodes}"
        " nodes (not reached: {failed}); a holder still at work is protected only by its"
        " fencing token now",

    # -- a failure in the library's own background work (ERROR) ----------------------------
    "redlock.renewals_crashed":
        "the auto-extend loop crashed (a bug, please report it with this traceback): its"
        " {locks} locks are marked lost and their on_lost callbacks called",
    "redlock.maintenance_crashed":
        "the background maintenance of restarted and amnesiac nodes crashed (a bug, please"
        " report it with this traceback); it starts again with the next request that finds"
        " such a node",
    "redlock.on_lost_failed":
        "the on_lost callback for {resource} raised (traceback below); the lock is lost all"
        " the same",
}


def render(event: str, fields: Mapping[str, Any]) -> str:
    """The event's sentence with its fields filled in; the bare event name for an event
    without one. Never raises: a log line must not break the lock operation that logs it."""
    template = SENTENCES.get(event)
    if template is None:
        return event
    if list in map(type, fields.values()):  # rare (force_released): copy only then
        fields = {key: ", ".join(map(str, value)) or "none" if isinstance(value, list)
                  else value for key, value in fields.items()}
    try:
        return template.format_map(fields)
    except (KeyError, IndexError, ValueError, TypeError, AttributeError) as error:
        return f"{event} (sentence not rendered: {type(error).__name__}: {error})"
