"""The sync and asyncio public surfaces are the same, apart from sync vs async.

Redlock/AsyncRedlock, Lock/AsyncLock, MultiLock/AsyncMultiLock, the lock family's
handles, the operator's tools Admin/AsyncAdmin and the fenced stores
RedisFencedStore/AsyncRedisFencedStore must offer the same public names, and each
method the same parameters (names, kinds, defaults). Only I/O methods differ, by being
coroutine functions in the asyncio client. Also: the package's exports (what
applications use at ``redlock``, the operator's tools at ``redlock.admin``), handle
options that cannot be changed behind validation, the exception tree and the py.typed
marker.
"""

from __future__ import annotations

import importlib.resources
import inspect
import pickle
from typing import Any

import pytest
import redis
import redis.asyncio

import redlock
import redlock.admin
import redlock.errors
from fencing import AsyncRedisFencedStore, RedisFencedStore
from redlock import (
    AsyncElection,
    AsyncLeadership,
    AsyncLock,
    AsyncMultiLock,
    AsyncReadLock,
    AsyncReadWriteLock,
    AsyncRedlock,
    AsyncSemaphore,
    AsyncWriteLock,
    ClusterAmnesiaError,
    Election,
    Leadership,
    Lock,
    LockLost,
    LockNotAcquired,
    MultiLock,
    NodeResult,
    NotHeld,
    Outcome,
    QuorumUnavailable,
    ReadLock,
    ReadWriteLock,
    Redlock,
    RedlockError,
    Semaphore,
    WriteLock,
)
from redlock.admin import Admin, AsyncAdmin

# Methods that talk to Redis: plain in the sync client, coroutines in the asyncio one.
IO_METHODS = {
    (Redlock, AsyncRedlock): {"close", "adopt"},
    (Lock, AsyncLock): {"acquire", "release", "extend"},
    (MultiLock, AsyncMultiLock): {"acquire", "release", "extend"},
    (Semaphore, AsyncSemaphore): {"acquire", "release", "extend", "status"},
    (ReadLock, AsyncReadLock): {"acquire", "release", "extend"},
    (WriteLock, AsyncWriteLock): {"acquire", "release", "extend"},
    (Leadership, AsyncLeadership): {"acquire", "release", "extend", "resign"},
    (RedisFencedStore, AsyncRedisFencedStore): {"write", "fence", "read", "highest"},
    (ReadWriteLock, AsyncReadWriteLock): {"status"},
    (Election, AsyncElection): {"leader"},
    (Admin, AsyncAdmin): {"inspect", "is_locked", "force_release", "repair", "initialise",
                          "members", "change_members"},
}
# Methods that yield results from Redis: generators in the sync client, async generators
# in the asyncio one.
ITERATORS = {(Election, AsyncElection): {"observe"}}
# Context-manager protocol: the same role under sync and async names.
CONTEXT = {"__enter__": "__aenter__", "__exit__": "__aexit__"}
# Injected defaults that are by nature different between the two worlds. None today:
# both constructors are the one in redlock._client.manager.
ALLOWED_DEFAULT_DIFFERENCES: dict[tuple[str, str], tuple[Any, Any]] = {}

PAIRS = list(IO_METHODS)
PAIR_IDS = [sync.__name__ for sync, _ in PAIRS]
# The pairs that are context managers (not the fenced stores, rwlocks and elections).
CM_PAIRS = PAIRS[:7]


def public_names(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def instance_names(obj: object) -> set[str]:
    return {name for name in vars(obj) if not name.startswith("_")}


def params(func: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(func).parameters.values()]


@pytest.mark.parametrize(("sync_cls", "async_cls"), PAIRS, ids=PAIR_IDS)
def test_same_public_names(sync_cls: type, async_cls: type) -> None:
    assert public_names(sync_cls) == public_names(async_cls)
    assert public_names(sync_cls)  # not vacuous


def test_same_public_instance_attributes() -> None:
    # Constructing sends nothing, so an address nobody listens on is fine here.
    url = "redis://127.0.0.1:1"
    sync_dlm = Redlock([url])
    async_dlm = AsyncRedlock([url])
    try:
        assert instance_names(sync_dlm) == instance_names(async_dlm)
        sync_lock = sync_dlm.lock("r", ttl=5.0)
        async_lock = async_dlm.lock("r", ttl=5.0)
        # A handle's options are read-only properties, not attributes (below).
        assert instance_names(sync_lock) == instance_names(async_lock) == set()
        assert {"resource", "ttl", "timeout", "blocking", "auto_extend", "reentrant",
                "on_lost", "last_failure"} <= public_names(Lock)
        assert isinstance(sync_lock, Lock) and isinstance(async_lock, AsyncLock)
    finally:
        sync_dlm.close()
    sync_store = RedisFencedStore(redis.Redis(port=1), ttl=30)
    async_store = AsyncRedisFencedStore(redis.asyncio.Redis(port=1), ttl=30)
    assert instance_names(sync_store) == instance_names(async_store) == {
        "client", "namespace", "ttl"}


def _handles(dlm: Redlock | AsyncRedlock) -> list[object]:
    """One of every kind of handle (and maker of handles) ``dlm`` makes; nothing is sent."""
    rwlock, election = dlm.rwlock("rw", ttl=5.0), dlm.election("e", ttl=5.0, identity="me")
    return [dlm.lock("r", ttl=5.0, timeout=1.0, reentrant=True), dlm.lock_many(["a", "b"]),
            dlm.semaphore("s", permits=2), rwlock, rwlock.read(), rwlock.write(), election,
            election.campaign(), Admin(dlm) if isinstance(dlm, Redlock) else AsyncAdmin(dlm)]


@pytest.mark.parametrize("manager", [Redlock, AsyncRedlock])
def test_handle_options_are_read_only(manager: type[Redlock] | type[AsyncRedlock]) -> None:
    """Options are checked once, when the handle is made (``dlm.lock(...)``): none can be
    changed afterwards behind that check (issue 41). Nor can the manager's views."""
    dlm = manager(["redis://127.0.0.1:1"])
    try:
        for obj in [dlm, *_handles(dlm)]:
            assert instance_names(obj) == set(), obj
            for name in public_names(type(obj)):
                attr = inspect.getattr_static(type(obj), name)
                if isinstance(attr, property):
                    assert attr.fset is None, f"{type(obj).__name__}.{name}"
                    with pytest.raises(AttributeError):
                        setattr(obj, name, None)
    finally:
        if isinstance(dlm, Redlock):
            dlm.close()


def test_bad_options_are_refused_when_the_handle_is_made() -> None:
    with Redlock(["redis://127.0.0.1:1"]) as dlm:
        with pytest.raises(TypeError, match="on_lost must be a callable"):
            dlm.lock("r", on_lost="print")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="blocking=False"):
            dlm.lock("r", blocking=False, timeout=1.0)


@pytest.mark.parametrize(("sync_cls", "async_cls"), PAIRS, ids=PAIR_IDS)
def test_same_signatures_and_only_io_methods_are_coroutines(sync_cls: type,
                                                            async_cls: type) -> None:
    io = IO_METHODS[(sync_cls, async_cls)]
    checked = 0
    for name in sorted(public_names(sync_cls) | {"__init__"}):
        sync_attr = inspect.getattr_static(sync_cls, name)
        async_attr = inspect.getattr_static(async_cls, name)
        if isinstance(sync_attr, property):
            assert isinstance(async_attr, property), name
            continue
        assert callable(sync_attr) and callable(async_attr), name
        sync_params, async_params = params(sync_attr), params(async_attr)
        assert [p[:2] for p in sync_params] == [p[:2] for p in async_params], name
        for (pname, _, sync_default), (_, _, async_default) in zip(sync_params, async_params,
                                                                    strict=True):
            allowed = ALLOWED_DEFAULT_DIFFERENCES.get((name, pname))
            if allowed is not None:
                assert (sync_default, async_default) == allowed
            else:
                assert sync_default == async_default, f"{name}({pname}=...)"
        assert not inspect.iscoroutinefunction(sync_attr), name
        assert inspect.iscoroutinefunction(async_attr) == (name in io), name
        iterates = name in ITERATORS.get((sync_cls, async_cls), set())
        assert inspect.isgeneratorfunction(sync_attr) == iterates, name
        assert inspect.isasyncgenfunction(async_attr) == iterates, name
        checked += 1
    assert checked >= len(io) + 1


@pytest.mark.parametrize(("sync_cls", "async_cls"), CM_PAIRS, ids=PAIR_IDS[:7])
def test_context_managers_match(sync_cls: type, async_cls: type) -> None:
    for sync_name, async_name in CONTEXT.items():
        sync_method = getattr(sync_cls, sync_name)
        async_method = getattr(async_cls, async_name)
        assert not inspect.iscoroutinefunction(sync_method)
        assert inspect.iscoroutinefunction(async_method)
        assert len(params(sync_method)) == len(params(async_method))
    # The asyncio client must not pretend to be a sync context manager, nor vice versa.
    assert not hasattr(async_cls, "__enter__")
    assert not hasattr(sync_cls, "__aenter__")


@pytest.mark.parametrize("factory_name, sync_handle, async_handle", [
    ("lock", Lock, AsyncLock), ("semaphore", Semaphore, AsyncSemaphore),
    ("rwlock", ReadWriteLock, AsyncReadWriteLock), ("election", Election, AsyncElection)])
def test_factory_defaults_match_the_handle_constructor(factory_name: str, sync_handle: type,
                                                        async_handle: type) -> None:
    for manager, handle in ((Redlock, sync_handle), (AsyncRedlock, async_handle)):
        factory = {p.name: p.default for p in inspect.signature(
            getattr(manager, factory_name)).parameters.values() if p.name != "self"}
        ctor = {p.name: p.default for p in inspect.signature(handle.__init__).parameters
                .values() if p.name not in ("self", "registry")}
        assert factory == ctor


# The operator's tools and what they return: at redlock.admin only (issue 41).
ADMIN_EXPORTS = {"Admin", "AsyncAdmin", "LockStatus", "NodeLockStatus", "ReleaseReport",
                 "ReleaseStatus", "RepairReport", "RepairStatus", "Members", "MembersChange"}


def test_the_operator_tools_live_in_redlock_admin() -> None:
    assert set(redlock.admin.__all__) == ADMIN_EXPORTS
    for name in ADMIN_EXPORTS:
        assert getattr(redlock.admin, name) is not None, name
        assert name not in redlock.__all__ and not hasattr(redlock, name), name
    for tool in IO_METHODS[(Admin, AsyncAdmin)]:  # on the admin, not on the managers
        assert not hasattr(Redlock, tool) and not hasattr(AsyncRedlock, tool), tool


def test_exports_cover_the_contract() -> None:
    contract = {"Redlock", "AsyncRedlock", "RedlockError", "LockNotAcquired", "LockLost"}
    assert contract <= set(redlock.__all__)
    assert {"Lock", "AsyncLock", "QuorumUnavailable", "NotHeld", "ClusterAmnesiaError",
            "NodeResult", "Outcome"} <= set(redlock.__all__)
    assert len(redlock.__all__) == len(set(redlock.__all__))
    for name in redlock.__all__:
        assert getattr(redlock, name) is not None, name
    namespace: dict[str, object] = {}
    exec("from redlock import *", namespace)
    assert contract <= set(namespace)


def test_exception_tree_is_rooted_at_redlock_error() -> None:
    assert issubclass(LockNotAcquired, RedlockError)
    assert issubclass(QuorumUnavailable, LockNotAcquired)
    # Nodes of a newer format leave too few for a quorum: an outage that retrying cannot end.
    assert issubclass(redlock.NodeFormatError, QuorumUnavailable)
    assert issubclass(LockLost, RedlockError)
    assert issubclass(NotHeld, RedlockError)
    assert issubclass(ClusterAmnesiaError, RedlockError)
    assert issubclass(RedlockError, Exception)
    # Every exception class the errors module defines hangs off the root...
    defined = [obj for obj in vars(redlock.errors).values()
               if isinstance(obj, type) and issubclass(obj, BaseException)
               and obj.__module__ == "redlock.errors"]
    assert len(defined) >= 6
    assert all(issubclass(cls, RedlockError) for cls in defined)
    # ...and is exported.
    assert {cls.__name__ for cls in defined} <= set(redlock.__all__)
    # Bad arguments are the builtins, not library errors.
    assert not issubclass(RedlockError, (TypeError, ValueError))


def _library_errors() -> list[type[RedlockError]]:
    return [obj for obj in vars(redlock.errors).values()
            if isinstance(obj, type) and issubclass(obj, RedlockError)]


def test_failures_carry_resource_and_outcomes() -> None:
    for cls in _library_errors():
        err = cls("msg", resource="r")
        assert err.resource == "r"
        assert err.outcomes == ()
    assert ClusterAmnesiaError("msg").resource is None
    assert ClusterAmnesiaError("msg").outcomes == ()


@pytest.mark.parametrize("cls", _library_errors(), ids=lambda cls: cls.__name__)
def test_every_error_survives_pickling_with_its_context(cls: type[RedlockError]) -> None:
    # Errors cross process boundaries (multiprocessing pools, task queues).
    outcomes = (NodeResult("10.0.0.1:6379", Outcome.REFUSED, "held", pttl_ms=42),
                NodeResult("10.0.0.2:6379", Outcome.ERROR, "TimeoutError: no reply"))
    err = cls("could not acquire 'r'", resource="r", outcomes=outcomes)
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is cls
    assert str(copy) == "could not acquire 'r'"
    assert copy.resource == "r"
    assert copy.outcomes == outcomes


def test_py_typed_is_shipped() -> None:
    marker = importlib.resources.files("redlock").joinpath("py.typed")
    assert marker.is_file()
