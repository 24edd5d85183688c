"""``@dlm.locked(...)``: run a function while holding a lock (docs/design.md §11.1).

Each call makes its own handle and acquires it like ``with lock:`` / ``async with lock:``. What
fits which client is checked when decorating: ``Redlock.locked`` refuses coroutine functions (the
lock would be held around creating the coroutine, not running it), ``AsyncRedlock.locked`` takes
coroutine functions only, and both refuse generator functions (the lock would be released before
the first item)."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from redlock._core.settings import validate_resource

F = TypeVar("F", bound=Callable[..., Any])


def _check_pass_lock(func: Callable[..., Any], pass_lock: str) -> None:
    try:
        parameters = inspect.signature(func).parameters
    except (TypeError, ValueError):  # no signature to check (some builtins): trust it
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    parameter = parameters.get(pass_lock)
    if parameter is None or parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
        raise TypeError(
            f"{func.__qualname__}() has no keyword parameter {pass_lock!r} to receive the"
            f" held lock (pass_lock={pass_lock!r}); declare it, e.g."
            f" `*, {pass_lock}: Lock | None = None`")


def _shape_error(func: Callable[..., Any], asynchronous: bool) -> str | None:
    name = getattr(func, "__qualname__", repr(func))
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        return (f"{name} is a generator function: the lock would be released before its"
                " first item; lock inside the generator instead (with/async with)")
    if asynchronous and not inspect.iscoroutinefunction(func):
        return (f"AsyncRedlock.locked() guards coroutine functions (async def), and"
                f" {name} is not one: use Redlock.locked() for plain functions")
    if not asynchronous and inspect.iscoroutinefunction(func):
        return (f"Redlock.locked() guards plain functions, and {name} is a coroutine"
                " function: the lock would only cover creating the coroutine, not running"
                " it; use AsyncRedlock.locked()")
    return None


def make_decorator(manager: Any, resource: str | Callable[..., str], lock_options: dict[str, Any],
                   pass_lock: str | None, *, asynchronous: bool) -> Callable[[F], F]:
    """The decorator ``manager.locked(...)`` returns (arguments checked here, at once)."""
    if not callable(resource):
        validate_resource(resource)
    if pass_lock is not None and (not isinstance(pass_lock, str) or not pass_lock.isidentifier()):
        raise TypeError(f"pass_lock must be a parameter name or None, not {pass_lock!r}")
    manager.lock("-", **lock_options)  # validates ttl, timeout... (sends nothing)

    def name_for(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        if callable(resource):
            return validate_resource(resource(*args, **kwargs))
        return resource

    def handle_for(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if pass_lock is not None and pass_lock in kwargs:
            raise TypeError(f"{pass_lock!r} is passed by @locked (the held lock), not by"
                            " the caller")
        return manager.lock(name_for(args, kwargs), **lock_options)

    def decorate(func: F) -> F:
        problem = _shape_error(func, asynchronous)
        if problem is not None:
            raise TypeError(problem)
        if pass_lock is not None:
            _check_pass_lock(func, pass_lock)

        if asynchronous:
            @functools.wraps(func)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                handle = handle_for(args, kwargs)
                async with handle:
                    if pass_lock is not None:
                        kwargs[pass_lock] = handle
                    return await func(*args, **kwargs)

            return run_async  # type: ignore[return-value]

        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            handle = handle_for(args, kwargs)
            with handle:
                if pass_lock is not None:
                    kwargs[pass_lock] = handle
                return func(*args, **kwargs)

        return run  # type: ignore[return-value]

    return decorate
