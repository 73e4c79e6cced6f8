"""A tool's functions as the engine takes them, and its contract from the decorator's
arguments.

- Adapters: each of the user's functions (the effect, `lookup=`, `poll=`, `authorize=`) is
  wrapped in one that calls it and answers a small tuple saying what it did —
  `("committed", reference, result)`, `("not_sent", reason, retry_after)`, `("refused",
  message)`, `("ambiguous", evidence)`, … — so every exception of the user's code is caught
  and described here, in Python, and the engine (`idemgate._native`) classifies the tuple.
- The background event loop, for `async def` functions no waiting caller's loop runs.
- The input schema from a function's type hints, and the contract the decorator's arguments
  describe.
"""

from __future__ import annotations

import asyncio
import collections.abc
import enum
import inspect
import logging
import threading
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, Optional, Sequence, Union

from ._effects import AuthRequest, Job, JobGone, NotSent, Refused
from ._models import Receipt

log = logging.getLogger("idemgate")

DEFAULT_RETENTION: Mapping[str, Any] = {
    "record_ttl": "7d",
    "tombstone_ttl": "30d",
    "max_retry_window": "1d",
    "late_arrival": "reject",
}
# The longest evidence kept about an exception: its type and the start of its message.
MAX_EVIDENCE = 500

# ---------------------------------------------------------------------------------------------
# Adapters: the user's functions, called and described in the tuple the engine reads.


def _evidence(error: BaseException) -> str:
    kind = type(error)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    text = str(error)
    described = f"{name}: {text}" if text else name
    return described[:MAX_EVIDENCE]


def _receipt_parts(value: Receipt, whose: str) -> Optional[tuple[str, Any]]:
    if isinstance(value.reference, str) and value.reference:
        return value.reference, value.result
    log.error("%s returned a Receipt whose reference is not a non-empty str", whose)
    return None


# Return values that are a result and nothing else (neither a Receipt, a Job nor a coroutine),
# recognised by their exact type: the common answer, checked first.
_PLAIN = frozenset({dict, list, str, int, float, bool, type(None)})


def _answer_of(tool: str, value: Any) -> tuple[Any, ...]:
    """What a function's return value says it did."""
    if type(value) in _PLAIN:
        return ("committed", None, value)
    if isinstance(value, Receipt):
        parts = _receipt_parts(value, f"tool {tool!r}")
        if parts is None:
            return (
                "ambiguous",
                "the function returned a Receipt without a reference (a non-empty str); "
                "the effect may have happened",
                None,
            )
        return ("committed", parts[0], parts[1])
    if isinstance(value, Job):
        return ("job", value.job_id)
    if inspect.iscoroutine(value) and inspect.getcoroutinestate(value) == inspect.CORO_CREATED:
        # A coroutine that never started did nothing: a sync wrapper around an async function.
        value.close()
        return (
            "not_sent",
            "the function returned a coroutine without running it; declare the tool's "
            "function `async def`",
            None,
        )
    # A JSON value, kept as the result; the engine refuses (as ambiguous) one that is not JSON.
    return ("committed", None, value)


def _raised(tool: str, error: BaseException) -> tuple[Any, ...]:
    """What an exception of a tool's function says."""
    if isinstance(error, NotSent):
        return ("not_sent", error.reason, error.retry_after)
    if isinstance(error, Refused):
        return ("refused", str(error), None)
    log.warning(
        "tool %r raised %s: the effect may have happened; the engine recovers it by its "
        "lookup or leaves it unknown",
        tool,
        type(error).__name__,
        exc_info=error,
    )
    return ("ambiguous", _evidence(error), None)


def _perform_adapter(tool: str, function: Callable[..., Any], wants_key: bool, is_async: bool) -> Callable[..., Any]:
    if is_async:

        async def perform_async(arguments: dict[str, Any], key: str) -> tuple[Any, ...]:
            if wants_key:
                arguments["idempotency_key"] = key
            try:
                value = await function(**arguments)
            except BaseException as e:  # noqa: BLE001 - every exception is classified
                return _raised(tool, e)
            return _answer_of(tool, value)

        return perform_async

    def perform(arguments: dict[str, Any], key: str) -> tuple[Any, ...]:
        if wants_key:
            arguments["idempotency_key"] = key
        try:
            value = function(**arguments)
        except BaseException as e:  # noqa: BLE001 - every exception is classified
            return _raised(tool, e)
        return _answer_of(tool, value)

    return perform


def _found(tool: str, value: Any) -> tuple[Any, ...]:
    if value is None:
        return ("not_found",)
    if isinstance(value, Receipt):
        parts = _receipt_parts(value, f"the lookup of tool {tool!r}")
        if parts is not None:
            return ("found", parts[0], parts[1])
        return ("unavailable", "the lookup returned a Receipt without a reference")
    return ("unavailable", f"the lookup returned a value of type {type(value).__name__}, neither a Receipt nor None")


def _lookup_adapter(tool: str, function: Callable[..., Any], is_async: bool) -> Callable[..., Any]:
    def failed(error: BaseException) -> tuple[Any, ...]:
        log.warning("the lookup of tool %r raised %s", tool, type(error).__name__, exc_info=error)
        return ("unavailable", _evidence(error))

    if is_async:

        async def lookup_async(key: str) -> tuple[Any, ...]:
            try:
                return _found(tool, await function(key))
            except BaseException as e:  # noqa: BLE001
                return failed(e)

        return lookup_async

    def lookup(key: str) -> tuple[Any, ...]:
        try:
            return _found(tool, function(key))
        except BaseException as e:  # noqa: BLE001
            return failed(e)

    return lookup


def _polled(tool: str, value: Any) -> tuple[Any, ...]:
    if value is None:
        return ("running",)
    if isinstance(value, Receipt):
        parts = _receipt_parts(value, f"the job poller of tool {tool!r}")
        if parts is not None:
            return ("done", parts[0], parts[1])
        return ("unavailable", "the job poller returned a Receipt without a reference")
    return ("unavailable", f"the job poller returned a value of type {type(value).__name__}, neither a Receipt nor None")


def _poll_raised(tool: str, error: BaseException) -> tuple[Any, ...]:
    if isinstance(error, Refused):
        return ("failed", str(error))
    if isinstance(error, JobGone):
        return ("gone", error.reason)
    log.warning("the job poller of tool %r raised %s", tool, type(error).__name__, exc_info=error)
    return ("unavailable", _evidence(error))


def _poll_adapter(tool: str, function: Callable[..., Any], wants_key: bool, is_async: bool) -> Callable[..., Any]:
    def call(job_id: str, key: str) -> Any:
        return function(job_id, idempotency_key=key) if wants_key else function(job_id)

    if is_async:

        async def poll_async(job_id: str, key: str) -> tuple[Any, ...]:
            try:
                return _polled(tool, await call(job_id, key))
            except BaseException as e:  # noqa: BLE001
                return _poll_raised(tool, e)

        return poll_async

    def poll(job_id: str, key: str) -> tuple[Any, ...]:
        try:
            return _polled(tool, call(job_id, key))
        except BaseException as e:  # noqa: BLE001
            return _poll_raised(tool, e)

    return poll


def _decided(tool: str, value: Any) -> tuple[Any, ...]:
    if value is True:
        return ("allowed",)
    if value is False:
        return ("denied", f"the authorize hook of {tool} denied it")
    if isinstance(value, str):
        return ("denied", value)
    return ("unavailable", f"the authorize hook answered a value of type {type(value).__name__}, not a bool or str")


def _authorize_adapter(tool: str, function: Callable[..., Any], is_async: bool) -> Callable[..., Any]:
    def request(*fields: str) -> AuthRequest:
        tenant, actor, role, name, key, fingerprint, stage = fields
        return AuthRequest(tenant, actor, role, name, key or None, fingerprint, stage)  # type: ignore[arg-type]

    def failed(error: BaseException) -> tuple[Any, ...]:
        log.warning("the authorize hook of tool %r raised %s", tool, type(error).__name__, exc_info=error)
        return ("unavailable", _evidence(error))

    if is_async:

        async def authorize_async(*fields: str) -> tuple[Any, ...]:
            try:
                return _decided(tool, await function(request(*fields)))
            except BaseException as e:  # noqa: BLE001
                return failed(e)

        return authorize_async

    def authorize(*fields: str) -> tuple[Any, ...]:
        try:
            return _decided(tool, function(request(*fields)))
        except BaseException as e:  # noqa: BLE001
            return failed(e)

    return authorize


def _is_async(function: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
        getattr(function, "__call__", None)
    )


# ---------------------------------------------------------------------------------------------
# The background event loop, for `async def` functions no waiting caller's loop runs (a sync
# `Local`'s calls, the recoverer's).

_loop_lock = threading.Lock()
_loop: Optional[asyncio.AbstractEventLoop] = None


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _loop_lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            threading.Thread(target=run, name="idemgate-asyncio", daemon=True).start()
            ready.wait()
            _loop = loop
        return _loop


# ---------------------------------------------------------------------------------------------
# The input schema from the function's type hints.

_NONE = type(None)


def _type_schema(hint: Any) -> dict[str, Any]:
    """A JSON Schema for one parameter's type hint; `{}` (anything) where a hint says nothing
    JSON Schema can check."""
    if hint is Any or hint is inspect.Parameter.empty or hint is object:
        return {}
    if hint is _NONE or hint is None:
        return {"type": "null"}
    if hint is bool:
        return {"type": "boolean"}
    if hint is int:
        return {"type": "integer"}
    if hint is float:
        return {"type": "number"}
    if hint is str:
        return {"type": "string"}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        values = [m.value for m in hint]
        if all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in values):
            return {"enum": values}
        return {}
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Union or origin is getattr(types, "UnionType", None):
        options = [_type_schema(a) for a in args]
        return {} if any(o == {} for o in options) else {"anyOf": options}
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (list, tuple, set, frozenset, collections.abc.Sequence) or hint in (list, tuple):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return {"type": "array", "prefixItems": [_type_schema(a) for a in args], "items": False}
        item = args[0] if args else Any
        return {"type": "array", "items": _type_schema(item)}
    if origin in (dict, collections.abc.Mapping) or hint is dict:
        value = args[1] if len(args) == 2 else Any
        schema: dict[str, Any] = {"type": "object"}
        inner = _type_schema(value)
        if inner:
            schema["additionalProperties"] = inner
        return schema
    if typing.is_typeddict(hint):
        hints = typing.get_type_hints(hint)
        required = sorted(getattr(hint, "__required_keys__", hints.keys()))
        return {
            "type": "object",
            "properties": {k: _type_schema(v) for k, v in hints.items()},
            "required": required,
        }
    return {}


def _is_json(value: Any, depth: int = 0) -> bool:
    if depth > 32:
        return False
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return value == value and value not in (float("inf"), float("-inf"))
    if isinstance(value, (list, tuple)):
        return all(_is_json(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v, depth + 1) for k, v in value.items())
    return False


@dataclass(frozen=True)
class _Signature:
    """What the engine needs from a function's signature."""

    schema: dict[str, Any]
    defaults: dict[str, Any]
    wants_key: bool
    call: inspect.Signature


def _signature_of(tool: str, function: Callable[..., Any]) -> _Signature:
    signature = inspect.signature(function)
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # noqa: BLE001 - a hint that cannot be resolved checks nothing
        hints = {}
    properties: dict[str, Any] = {}
    required: list[str] = []
    defaults: dict[str, Any] = {}
    extra = False
    kept: list[inspect.Parameter] = []
    wants_key = False
    for name, p in signature.parameters.items():
        if name == "idempotency_key":
            wants_key = True
            continue
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            extra = True
            kept.append(p)
            continue
        if p.kind is inspect.Parameter.VAR_POSITIONAL or p.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise TypeError(
                f"@tool({tool!r}): parameter {name!r} cannot be passed by name; a tool's "
                "arguments are named (a JSON object), so use ordinary or keyword parameters"
            )
        kept.append(p)
        properties[name] = _type_schema(hints.get(name, p.annotation))
        if p.default is inspect.Parameter.empty:
            required.append(name)
        elif _is_json(p.default):
            defaults[name] = p.default
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": extra}
    if required:
        schema["required"] = required
    return _Signature(schema, defaults, wants_key, signature.replace(parameters=kept))


# ---------------------------------------------------------------------------------------------
# Contracts from the decorator's arguments.

# Which decorator argument a contract field comes from, for errors.
_ARGUMENT_OF = (
    ("request_fingerprint", "fingerprint"),
    ("input_schema", "input_schema"),
    ("retention", "retention"),
    ("security.approval", "approval"),
    ("lease_seconds", "lease_seconds"),
    ("downstream.deduplicates_by_key", "deduplicates_by_key"),
    ("downstream.receipt_lookup", "lookup"),
    ("downstream.async_jobs", "poll"),
    ("effect_class", "effect_class"),
    ("version", "version"),
    ("name", "name"),
    ("purpose", "description"),
)


def _argument_of(field: Optional[str]) -> str:
    for prefix, argument in _ARGUMENT_OF:
        if field is not None and field.startswith(prefix):
            return argument
    return field or "the contract"


def _approval(tool: str, approval: Any) -> dict[str, Any]:
    if approval is None:
        return {}
    if approval in ("always", "never"):
        return {"approval": approval}
    if isinstance(approval, Mapping) and approval:
        when: dict[str, list[Any]] = {}
        for field, values in approval.items():
            if not isinstance(field, str):
                raise TypeError(f"@tool({tool!r}): approval: a field name is a str")
            if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, set, frozenset)):
                values = [values]
            when[field] = list(values)
        return {"approval": "when_matches", "approval_when": when}
    raise ValueError(
        f"@tool({tool!r}): approval is 'always', 'never', or a mapping from an argument to the "
        "values that need an operator's approval"
    )


def _retention(tool: str, retention: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    if retention is None:
        return dict(DEFAULT_RETENTION)
    if not isinstance(retention, Mapping):
        raise TypeError(
            f"@tool({tool!r}): retention is a mapping of record_ttl, tombstone_ttl, "
            "max_retry_window and late_arrival"
        )
    unknown = sorted(set(retention) - set(DEFAULT_RETENTION))
    if unknown:
        raise ValueError(f"@tool({tool!r}): retention: unknown field {unknown[0]!r}")
    return {**DEFAULT_RETENTION, **retention}


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise TypeError("@local.tool: name is the tool's name, a non-empty str such as 'refunds.issue'")
    return name


