"""`Local` and `AsyncLocal`: idemgate's engine inside this process.

The engine itself (the same executor as the gateway's, compiled into `idemgate._native`)
claims, performs, records and recovers; nothing of that is decided here. This module is the
Python face over it:

- `Local(url, tenant=, environment=)` / `AsyncLocal(...)` — one engine over one store:
  `sqlite://PATH` (several processes of one host may share the file) or `postgres://…`, in
  the gateway's schema. Opening it starts the background recoverer; `close()` (or leaving a
  `with` block) stops it.
- `@local.tool(name, ...)` — registers a function as the effect of a tool and returns a
  `LocalTool`: calling it invokes the tool under the current `workflow` / `step` identity and
  returns the labelled outcome (`Applied`, `Replayed`, `InFlight`, `Rejected`, `Unknown`).
- `local.invoke(tool, arguments, workflow_id=, step_id=)`, `local.step(name)`,
  `local.operation(key)` and the operator's methods — the surface of the gateway `Client`, so
  code moves between the two by changing one constructor.

Each tool's function is wrapped in an *adapter* (`_functions`) that calls it and answers a
small tuple saying what it did; every exception of the user's code is caught and described in
Python, and the engine classifies the tuple.
"""

from __future__ import annotations

import asyncio
import atexit
import datetime
import functools
import inspect
import logging
import warnings
import weakref
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Any,
    Awaitable,
    Callable,
    Literal,
    Mapping,
    Optional,
    Sequence,
    Union,
)

from . import _identity
from ._functions import (
    _approval,
    _argument_of,
    _authorize_adapter,
    _background_loop,
    _check_name,
    _is_async,
    _lookup_adapter,
    _perform_adapter,
    _poll_adapter,
    _retention,
    _signature_of,
)
from ._client import RaiseOn, _raise_on
from ._effects import AuthRequest
from ._identity import StepScope, WorkflowScope
from ._models import Operation, OperationPage, OperationRecord
from ._outcomes import (
    Applied,
    MissingIdentityError,
    NotFoundError,
    Outcome,
    Rejected,
    RejectedError,
    Replayed,
    UnknownToolError,
    error_for,
    parse_outcome,
)

if TYPE_CHECKING:
    from ._native import NativeLocal

log = logging.getLogger("idemgate")

EffectClass = Literal["key_based", "irreversible", "natural_idempotent", "read"]
_EFFECT_CLASSES = ("key_based", "irreversible", "natural_idempotent", "read")

DEFAULT_ENVIRONMENT = "development"
DEFAULT_TIMEOUT = 60.0

# ---------------------------------------------------------------------------------------------
# Outcomes from the engine's tuples.


def _outcome(answer: Sequence[Any]) -> Outcome:
    label, key, reference, safe, next_action, retry_after, result, code, message = answer
    body = {
        "outcome": label,
        "status": label,
        "operation_key": key,
        "effect_reference": reference,
        "safe_to_repeat": safe,
        "next_action": next_action,
        "retry_after_seconds": retry_after,
        "result": result,
        "error": None if code is None else {"code": code, "message": message},
    }
    # No HTTP is involved in process: the outcome's `http_status` is 0.
    return parse_outcome(body, 0)


def _checked(
    outcome: Outcome, tool: str, registered: Mapping[str, Any], raise_on: frozenset[str]
) -> Outcome:
    """The outcome, or the exception it always raises (a missing identity, an unknown tool),
    or the one `raise_on` asks for."""
    if isinstance(outcome, Rejected):
        if outcome.code == "missing_operation_key":
            raise MissingIdentityError(tool, f"none was given ({outcome.message})", outcome)
        if outcome.code == "unknown_tool":
            raise UnknownToolError(tool, outcome, None, list(registered))
    if outcome.label in raise_on:
        raise error_for(outcome)
    return outcome


def _action(answer: Sequence[Any], key: str) -> Outcome:
    outcome = _outcome(answer)
    if isinstance(outcome, Rejected) and outcome.code == "not_found":
        raise NotFoundError(f"no operation {key} for this Local's tenant and environment", outcome)
    return outcome


def _not_found(key: str) -> NotFoundError:
    outcome = _outcome(("rejected", None, None, False, "none", None, None, "not_found", "no such operation"))
    assert isinstance(outcome, Rejected)
    return NotFoundError(f"no operation {key} for this Local's tenant and environment", outcome)


def _rfc3339(millis: Optional[int]) -> Optional[str]:
    if millis is None:
        return None
    at = datetime.datetime.fromtimestamp(millis / 1000, tz=datetime.timezone.utc)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{millis % 1000:03d}Z"


def _with_times(body: dict[str, Any]) -> dict[str, Any]:
    """A record's members with the times beside their milliseconds in RFC 3339, as API v1
    writes them (`created_at_rfc3339`, …; an event's `at_rfc3339`)."""
    for name in ("created_at", "updated_at", "expires_at"):
        body[f"{name}_rfc3339"] = _rfc3339(body.get(name))
    for event in body.get("events") or []:
        event["at_rfc3339"] = _rfc3339(event.get("at"))
    return body


def _operation(answer: Any, key: str) -> Operation:
    if answer is None:
        raise _not_found(key)
    if answer[0] == "found":
        body = _with_times(dict(answer[1]))
        outcome = _outcome(answer[2])
        body["outcome"] = dict(outcome.raw)
        return Operation.from_json(body, 0)
    outcome = _outcome(answer[1])
    assert isinstance(outcome, Rejected)
    raise RejectedError(f"operation {key}: {outcome.code}: {outcome.message}", outcome)


def _page(answer: Mapping[str, Any]) -> OperationPage:
    after = answer.get("next_after")
    return OperationPage(
        tuple(OperationRecord.from_json(_with_times(e)) for e in answer["operations"]),
        after if isinstance(after, str) else None,
    )


def _reason(reason: Optional[str]) -> Optional[str]:
    if reason is not None and (not isinstance(reason, str) or not reason.strip()):
        raise ValueError("reason: give a non-empty text, or leave it out")
    return reason


def _key(key: Any) -> str:
    if not isinstance(key, str) or not key:
        raise ValueError("an operation key is a non-empty string tenant:environment:workflow:step")
    return key


def _wait(wait: Optional[float]) -> Optional[float]:
    if wait is None:
        return None
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or wait < 0:
        raise ValueError(f"wait is a number of seconds >= 0, not {wait!r}")
    return float(wait) or None


# ---------------------------------------------------------------------------------------------
# Locals.

_open: "weakref.WeakSet[_LocalCore]" = weakref.WeakSet()
_exit_registered = False


def _close_all() -> None:
    """At interpreter exit: stop every recoverer before the interpreter goes away under it, then
    wait for the tools' functions still running on idemgate's runner threads (one past its
    timeout, say), as Python waits for its own threads: the interpreter ends a thread that takes
    its lock back once its exit has begun, and ending a runner that way aborts the process."""
    for local in list(_open):
        try:
            local._native.close()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
    from ._native import wait_for_functions

    wait_for_functions()


def _text_argument(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{name} is a non-empty str")
    return value


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{name} is a number of seconds above 0")
    return float(value)


class _LocalCore:
    """What `Local` and `AsyncLocal` share: the engine, the registry of tools, and the
    decorator."""

    _tool_class: type["LocalTool"]

    def __init__(
        self,
        url: str,
        *,
        tenant: str = "default",
        environment: str = DEFAULT_ENVIRONMENT,
        actor: str = "local",
        recover: bool = True,
        recovery_interval: float = 2.0,
        sweep_interval: float = 300.0,
        encryption_key_env: Optional[str] = None,
        raise_on: Optional[RaiseOn] = None,
    ) -> None:
        global _exit_registered
        if not isinstance(url, str) or not url.startswith(("sqlite://", "postgres://", "postgresql://")):
            raise ValueError("url is sqlite://PATH or postgres://USER@HOST/DATABASE")
        _text_argument("tenant", tenant)
        _text_argument("environment", environment)
        _text_argument("actor", actor)
        if encryption_key_env is not None:
            _text_argument("encryption_key_env", encryption_key_env)
        self._raise_on = _raise_on(raise_on)
        from ._native import NativeLocal  # the extension loads with the first Local, not at import

        self._native: NativeLocal = NativeLocal(
            url,
            tenant,
            environment,
            actor,
            bool(recover),
            _seconds("recovery_interval", recovery_interval),
            _seconds("sweep_interval", sweep_interval),
            (Applied, Replayed, _identity._SCOPE, _identity.MAX_PART_BYTES),
            encryption_key_env,
        )
        self._tools: dict[str, LocalTool] = {}
        self.url = url
        _open.add(self)
        if not _exit_registered:
            atexit.register(_close_all)
            _exit_registered = True

    @property
    def tenant(self) -> str:
        return self._native.tenant

    @property
    def environment(self) -> str:
        return self._native.environment

    @property
    def closed(self) -> bool:
        return self._native.closed

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, tenant={self.tenant!r}, environment={self.environment!r})"

    # -- tools ---------------------------------------------------------------------------------

    def tool(
        self,
        name: str,
        *,
        effect_class: EffectClass = "key_based",
        fingerprint: Optional[Sequence[str]] = None,
        version: str = "1",
        lookup: Optional[Callable[..., Any]] = None,
        authorize: Optional[Callable[[AuthRequest], Any]] = None,
        approval: Union[Literal["always", "never"], Mapping[str, Any], None] = None,
        retention: Optional[Mapping[str, Any]] = None,
        timeout: Optional[float] = DEFAULT_TIMEOUT,
        contract: Optional[str] = None,
        input_schema: Optional[Mapping[str, Any]] = None,
        deduplicates_by_key: bool = False,
        poll: Optional[Callable[..., Any]] = None,
        lease_seconds: Optional[int] = None,
        description: Optional[str] = None,
    ) -> Callable[[Callable[..., Any]], Any]:
        """Registers the decorated function as the effect of the tool `name`.

        The contract is the decorator's arguments — `effect_class` (`key_based` by default),
        `fingerprint` (the material argument names; all arguments by default), `version`,
        `lookup` (the receipt lookup by operation key: returns a `Receipt` or None),
        `authorize`, `approval` (`"always"`, `"never"` or `{argument: [values]}`),
        `retention`, `timeout` (seconds, 60 by default; None for none: the caller then waits
        for the function however long it takes, and a caller alone off the main thread runs it
        on its own thread, saving a hand-off), `deduplicates_by_key` (the function's
        downstream deduplicates on the key it is given, so an ambiguous call may be resent),
        `poll` (the job poller for functions that return a `Job`), `lease_seconds` — or a
        contract file (`contract="contracts/refunds.issue.yaml"`, read and linted as the
        gateway does, with no `downstream.http`). The input schema is `input_schema` or comes
        from the function's type hints.

        The function receives the tool's arguments and, if it declares it, `idempotency_key`
        (the operation key, to pass to its system of record).
        """
        name = _check_name(name)
        local = self

        def register(function: Callable[..., Any]) -> LocalTool:
            if not callable(function):
                raise TypeError(f"@tool({name!r}) decorates a function")
            local._register(
                name,
                function,
                effect_class=effect_class,
                fingerprint=fingerprint,
                version=version,
                lookup=lookup,
                authorize=authorize,
                approval=approval,
                retention=retention,
                timeout=timeout,
                contract=contract,
                input_schema=input_schema,
                deduplicates_by_key=deduplicates_by_key,
                poll=poll,
                lease_seconds=lease_seconds,
                description=description,
            )
            return local._tools[name]

        return register

    def _register(
        self,
        name: str,
        function: Callable[..., Any],
        *,
        effect_class: str,
        fingerprint: Optional[Sequence[str]],
        version: str,
        lookup: Optional[Callable[..., Any]],
        authorize: Optional[Callable[..., Any]],
        approval: Any,
        retention: Optional[Mapping[str, Any]],
        timeout: Optional[float],
        contract: Optional[str],
        input_schema: Optional[Mapping[str, Any]],
        deduplicates_by_key: bool,
        poll: Optional[Callable[..., Any]],
        lease_seconds: Optional[int],
        description: Optional[str],
    ) -> None:
        where = f"@tool({name!r})"
        for argument, value in (("lookup", lookup), ("authorize", authorize), ("poll", poll)):
            if value is not None and not callable(value):
                raise TypeError(f"{where}: {argument} is a function")
        if timeout is not None:
            timeout = _seconds(f"{where}: timeout", timeout)
        signature = _signature_of(name, function)
        spec: Optional[dict[str, Any]] = None
        if contract is not None:
            if not isinstance(contract, str):
                raise TypeError(f"{where}: contract is the path of a contract file")
            given = [
                argument
                for argument, value, default in (
                    ("effect_class", effect_class, "key_based"),
                    ("fingerprint", fingerprint, None),
                    ("version", version, "1"),
                    ("approval", approval, None),
                    ("retention", retention, None),
                    ("input_schema", input_schema, None),
                    ("deduplicates_by_key", deduplicates_by_key, False),
                    ("lease_seconds", lease_seconds, None),
                    ("description", description, None),
                )
                if value != default
            ]
            if given:
                raise ValueError(
                    f"{where}: {given[0]} is the contract file's to say; give either contract= "
                    "or the contract's fields as arguments"
                )
        else:
            if effect_class not in _EFFECT_CLASSES:
                raise ValueError(f"{where}: effect_class is one of {', '.join(_EFFECT_CLASSES)}")
            if not isinstance(version, str) or not version.strip():
                raise ValueError(f"{where}: version is a non-empty str")
            if fingerprint is not None and (
                isinstance(fingerprint, str)
                or not isinstance(fingerprint, Sequence)
                or not all(isinstance(f, str) for f in fingerprint)
            ):
                raise TypeError(f"{where}: fingerprint is a list of argument names")
            if input_schema is not None and not isinstance(input_schema, Mapping):
                raise TypeError(f"{where}: input_schema is a JSON Schema (a mapping)")
            if lease_seconds is not None and (isinstance(lease_seconds, bool) or not isinstance(lease_seconds, int)):
                raise TypeError(f"{where}: lease_seconds is a whole number of seconds")
            fields = list(fingerprint) if fingerprint is not None else ["*"]
            defaults = {k: v for k, v in signature.defaults.items() if fields == ["*"] or k in fields}
            purpose = description or (inspect.getdoc(function) or "").strip().split("\n\n")[0] or None
            spec = {
                "name": name,
                "version": version,
                "effect_class": effect_class,
                "operation_key": {
                    "supplied_by": "application",
                    "scope": ["tenant", "environment", "workflow_id", "step_id"],
                    "reused_for_retry": True,
                },
                "input_schema": dict(input_schema) if input_schema is not None else signature.schema,
                "request_fingerprint": {
                    "fields": fields,
                    "defaults": defaults if input_schema is None else {},
                },
                "downstream": {
                    "deduplicates_by_key": bool(deduplicates_by_key),
                    "receipt_lookup": lookup is not None,
                    "async_jobs": poll is not None,
                },
                "security": {"recheck_authorization": True, **_approval(name, approval)},
            }
            if purpose:
                spec["purpose"] = purpose
            if effect_class != "read" or retention is not None:
                spec["retention"] = _retention(name, retention)
            if lease_seconds is not None:
                spec["lease_seconds"] = lease_seconds
        asynchronous = {
            "perform": _is_async(function),
            "lookup": lookup is not None and _is_async(lookup),
            "poll": poll is not None and _is_async(poll),
            "authorize": authorize is not None and _is_async(authorize),
        }
        poll_wants_key = poll is not None and "idempotency_key" in inspect.signature(poll).parameters
        functions = _Functions(
            perform=_perform_adapter(name, function, signature.wants_key, asynchronous["perform"]),
            perform_is_async=asynchronous["perform"],
            lookup=None if lookup is None else _lookup_adapter(name, lookup, asynchronous["lookup"]),
            lookup_is_async=asynchronous["lookup"],
            poll=None if poll is None else _poll_adapter(name, poll, poll_wants_key, asynchronous["poll"]),
            poll_is_async=asynchronous["poll"],
            authorize=None if authorize is None else _authorize_adapter(name, authorize, asynchronous["authorize"]),
            authorize_is_async=asynchronous["authorize"],
            event_loop=_background_loop() if any(asynchronous.values()) else None,
        )
        try:
            findings = self._native.register(name, functions, timeout, spec, contract)
        except ValueError as e:
            if len(e.args) == 2:
                message, field = e.args
                raise ValueError(f"{where}: {_argument_of(field)}: {message}") from None
            raise ValueError(f"{where}: {e}") from None
        for level, rule, field, reason in findings:
            warnings.warn(ContractWarning(f"{contract}: {level} {rule} ({field}): {reason}"), stacklevel=4)
        tool = self._tool_class(self, name, function, signature.call)
        # What a framework adapter shows the model: the contract's schema and purpose when the
        # decorator gave them, else the function's type hints and docstring.
        tool.input_schema = dict(spec["input_schema"]) if spec is not None else signature.schema
        tool.description = (
            (spec or {}).get("purpose") or (inspect.getdoc(function) or "").strip().split("\n\n")[0] or name
        )
        tool.effect_class = spec["effect_class"] if spec is not None else None
        self._tools[name] = tool

    def _invoke_arguments(
        self, tool: str, arguments: Optional[Mapping[str, Any]], workflow_id: Optional[str], step_id: Optional[str]
    ) -> tuple[dict[str, Any], Optional[str], Optional[str]]:
        if not isinstance(tool, str) or not tool:
            raise ValueError("tool must be a tool's name, such as 'refunds.issue'")
        if arguments is None:
            arguments = {}
        elif type(arguments) is not dict:
            if not isinstance(arguments, Mapping):
                raise TypeError(f"arguments must be a mapping, not {type(arguments).__name__}")
            arguments = dict(arguments)
        # A dict goes as it is: the extension reads it into JSON at once, before anything else
        # runs, so a later change by the caller cannot reach the operation.
        w, s = _identity.resolve_parts(tool, workflow_id, step_id)
        return arguments, w, s

    def _raise_for(self, raise_on: Optional[RaiseOn]) -> frozenset[str]:
        return self._raise_on if raise_on is None else _raise_on(raise_on)

    @staticmethod
    def workflow(workflow_id: str) -> WorkflowScope:
        """`with local.workflow(run_id):` — the same as `idemgate.workflow(run_id)`."""
        return WorkflowScope(workflow_id)


@dataclass
class _Functions:
    """A tool's adapters as the extension takes them."""

    perform: Callable[..., Any]
    perform_is_async: bool
    lookup: Optional[Callable[..., Any]]
    lookup_is_async: bool
    poll: Optional[Callable[..., Any]]
    poll_is_async: bool
    authorize: Optional[Callable[..., Any]]
    authorize_is_async: bool
    event_loop: Optional[asyncio.AbstractEventLoop]


class ContractWarning(UserWarning):
    """A finding of the contract linter on a tool's contract file (`idemgate contract lint`
    gives the same findings)."""


class Local(_LocalCore):
    """idemgate's engine in this process, over one store; every method waits for its answer
    with the interpreter lock released, so other threads run meanwhile.

    `Local("sqlite://ops.sqlite", tenant="acme", environment="production")` — the store is
    `sqlite://PATH` (relative or absolute; several processes of one host may share the file)
    or `postgres://…` (many hosts; the gateway's schema). `actor` is recorded as who asked (and
    who acted, for the operator's methods). The background recoverer runs every
    `recovery_interval` seconds unless `recover=False`; `close()`, or leaving `with`, stops it.
    """

    def __enter__(self) -> "Local":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stops the recoverer; the Local takes no more calls. Closing twice does nothing."""
        self._native.close()
        _open.discard(self)

    def step(self, step_id: str) -> "LocalStep":
        """A step of the current workflow: `local.step("refund").invoke(tool, arguments)`, or
        `with local.step("refund"):` around calls of guarded functions."""
        return LocalStep(self, step_id)

    def invoke(
        self,
        tool: str,
        arguments: Optional[Mapping[str, Any]] = None,
        *,
        workflow_id: Optional[str] = None,
        step_id: Optional[str] = None,
        wait: Optional[float] = None,
        raise_on: Optional[RaiseOn] = None,
    ) -> Outcome:
        """Invokes `tool` once and returns its labelled outcome.

        The identity is `workflow_id` and `step_id` when given, else the current
        `workflow(...)` / `step(...)` scope; a key-based tool without one raises
        `MissingIdentityError` and nothing is stored. `wait=N` waits up to N seconds for an
        operation in flight (another caller's, or a job) to settle.
        """
        checks = self._raise_on if raise_on is None else _raise_on(raise_on)
        # The usual call (a tool's name, a dict of arguments, plain identity parts, no wait) is
        # checked and delivered by the extension, which answers `None` for any other, with
        # nothing done: that one is checked here first.
        answer = None if wait is not None else self._native.call(tool, arguments, workflow_id, step_id)
        if answer is None:
            args, w, s = self._invoke_arguments(tool, arguments, workflow_id, step_id)
            answer = self._native.invoke(tool, args, w, s, _wait(wait), False)
        if isinstance(answer, tuple):
            return _checked(_outcome(answer), tool, self._tools, checks)
        # An `applied` or `replayed` outcome, made by the extension: never raised.
        return answer

    def operation(self, operation_key: str) -> Operation:
        """The operation's record, receipt, current outcome and events (reading it polls an
        accepted job). A key of another tenant or environment raises `NotFoundError`, exactly
        as a missing one."""
        key = _key(operation_key)
        return _operation(self._native.operation(key, False), key)

    def operations(
        self,
        status: Optional[str] = None,
        tool: Optional[str] = None,
        after: Optional[str] = None,
        limit: Optional[int] = None,
    ) -> OperationPage:
        """This Local's operations by key; `status="unknown"` is the reconciliation queue."""
        return _page(self._native.operations(status, tool, after, limit, False))

    def reconcile(self, operation_key: str, *, reason: Optional[str] = None) -> Outcome:
        """Looks the receipt up now (the tool's `lookup=`) and settles the operation if found."""
        key = _key(operation_key)
        return _action(self._native.reconcile(key, None, None, None, _reason(reason), False), key)

    def resolve_applied(
        self, operation_key: str, effect_reference: str, result: Any = None, *, reason: Optional[str] = None
    ) -> Outcome:
        """Records that the effect happened, with its reference and result."""
        key = _key(operation_key)
        answer = self._native.reconcile(key, "applied", effect_reference, result, _reason(reason), False)
        return _action(answer, key)

    def resolve_not_applied(self, operation_key: str, *, reason: Optional[str] = None) -> Outcome:
        """Records that the effect did not happen: the key may run again (by a new delivery)."""
        key = _key(operation_key)
        return _action(self._native.reconcile(key, "not_applied", None, None, _reason(reason), False), key)

    def approve(self, operation_key: str, fingerprint: Optional[str] = None, *, reason: Optional[str] = None) -> Outcome:
        """Approves an operation awaiting approval (bound to `fingerprint` when given); its
        effect runs now, with the original caller's authorization rechecked."""
        key = _key(operation_key)
        return _action(self._native.approve(key, fingerprint, _reason(reason), False), key)

    def deny(self, operation_key: str, reason: Optional[str] = None) -> Outcome:
        """Denies an operation awaiting approval; its answer is the `approval_denied` refusal."""
        key = _key(operation_key)
        return _action(self._native.deny(key, _reason(reason), False), key)


class AsyncLocal(_LocalCore):
    """The asyncio twin of `Local`: the same constructor (it opens the store before it
    returns) and methods, awaited. The event loop is never blocked: the engine runs on its own
    threads, and an `async def` tool's function runs on the loop of the call waiting for it.
    Use `async with`, or `await local.aclose()`."""

    async def __aenter__(self) -> "AsyncLocal":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stops the recoverer; the Local takes no more calls."""
        await asyncio.get_running_loop().run_in_executor(None, self._native.close)
        _open.discard(self)

    def close(self) -> None:
        """`aclose()` for code that is not async (it waits for the recoverer to stop)."""
        self._native.close()
        _open.discard(self)

    def step(self, step_id: str) -> "AsyncLocalStep":
        return AsyncLocalStep(self, step_id)

    async def invoke(
        self,
        tool: str,
        arguments: Optional[Mapping[str, Any]] = None,
        *,
        workflow_id: Optional[str] = None,
        step_id: Optional[str] = None,
        wait: Optional[float] = None,
        raise_on: Optional[RaiseOn] = None,
    ) -> Outcome:
        """See `Local.invoke`."""
        checks = self._raise_for(raise_on)
        args, w, s = self._invoke_arguments(tool, arguments, workflow_id, step_id)
        answer = await self._native.invoke(tool, args, w, s, _wait(wait), True)
        if isinstance(answer, tuple):
            return _checked(_outcome(answer), tool, self._tools, checks)
        return answer

    async def operation(self, operation_key: str) -> Operation:
        key = _key(operation_key)
        return _operation(await self._native.operation(key, True), key)

    async def operations(
        self,
        status: Optional[str] = None,
        tool: Optional[str] = None,
        after: Optional[str] = None,
        limit: Optional[int] = None,
    ) -> OperationPage:
        return _page(await self._native.operations(status, tool, after, limit, True))

    async def reconcile(self, operation_key: str, *, reason: Optional[str] = None) -> Outcome:
        key = _key(operation_key)
        return _action(await self._native.reconcile(key, None, None, None, _reason(reason), True), key)

    async def resolve_applied(
        self, operation_key: str, effect_reference: str, result: Any = None, *, reason: Optional[str] = None
    ) -> Outcome:
        key = _key(operation_key)
        answer = await self._native.reconcile(key, "applied", effect_reference, result, _reason(reason), True)
        return _action(answer, key)

    async def resolve_not_applied(self, operation_key: str, *, reason: Optional[str] = None) -> Outcome:
        key = _key(operation_key)
        answer = await self._native.reconcile(key, "not_applied", None, None, _reason(reason), True)
        return _action(answer, key)

    async def approve(
        self, operation_key: str, fingerprint: Optional[str] = None, *, reason: Optional[str] = None
    ) -> Outcome:
        key = _key(operation_key)
        return _action(await self._native.approve(key, fingerprint, _reason(reason), True), key)

    async def deny(self, operation_key: str, reason: Optional[str] = None) -> Outcome:
        key = _key(operation_key)
        return _action(await self._native.deny(key, _reason(reason), True), key)


# ---------------------------------------------------------------------------------------------
# Guarded functions and steps.


class LocalTool:
    """A function registered as a tool's effect. Calling it invokes the tool under the current
    `workflow` / `step` identity and returns the outcome; `invoke` takes the arguments as a
    mapping and the identity explicitly. `function` is the function itself (calling it
    directly bypasses the engine)."""

    input_schema: Mapping[str, Any]
    """The tool's arguments as JSON Schema (the decorator's `input_schema`, else from the
    function's type hints)."""
    description: str
    """The tool's purpose for a model: `description=`, else the docstring's first paragraph."""
    effect_class: Optional[str]
    """The decorator's effect class; None when the contract is a file."""

    def __init__(self, local: _LocalCore, name: str, function: Callable[..., Any], call: inspect.Signature) -> None:
        self.local = local
        self.name = name
        self.function = function
        self._call = call
        self.input_schema = {"type": "object"}
        self.description = name
        self.effect_class = None
        functools.update_wrapper(self, function)

    def __repr__(self) -> str:
        return f"<idemgate tool {self.name!r} of {self.local!r}>"

    def _arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        if "idempotency_key" in kwargs:
            raise TypeError(
                f"{self.name}: idempotency_key is the operation key, which idemgate passes to "
                "the function; name the operation with idemgate.workflow / step instead"
            )
        bound = self._call.bind(*args, **kwargs)
        arguments: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            if self._call.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                arguments.update(value)
            else:
                arguments[name] = value
        return arguments

    def __call__(self, *args: Any, **kwargs: Any) -> Outcome:
        local = self.local
        assert isinstance(local, Local)
        return local.invoke(self.name, self._arguments(args, kwargs))

    def invoke(
        self,
        arguments: Optional[Mapping[str, Any]] = None,
        *,
        workflow_id: Optional[str] = None,
        step_id: Optional[str] = None,
        wait: Optional[float] = None,
        raise_on: Optional[RaiseOn] = None,
    ) -> Outcome:
        local = self.local
        assert isinstance(local, Local)
        return local.invoke(
            self.name, arguments, workflow_id=workflow_id, step_id=step_id, wait=wait, raise_on=raise_on
        )


class AsyncLocalTool(LocalTool):
    """A tool of an `AsyncLocal`: calling it returns an awaitable of the outcome."""

    def __call__(self, *args: Any, **kwargs: Any) -> Awaitable[Outcome]:  # type: ignore[override]
        local = self.local
        assert isinstance(local, AsyncLocal)
        return local.invoke(self.name, self._arguments(args, kwargs))

    def invoke(  # type: ignore[override]
        self,
        arguments: Optional[Mapping[str, Any]] = None,
        *,
        workflow_id: Optional[str] = None,
        step_id: Optional[str] = None,
        wait: Optional[float] = None,
        raise_on: Optional[RaiseOn] = None,
    ) -> Awaitable[Outcome]:
        local = self.local
        assert isinstance(local, AsyncLocal)
        return local.invoke(
            self.name, arguments, workflow_id=workflow_id, step_id=step_id, wait=wait, raise_on=raise_on
        )


Local._tool_class = LocalTool
AsyncLocal._tool_class = AsyncLocalTool


class LocalStep(StepScope):
    """One step of the current workflow, bound to a `Local`."""

    def __init__(self, local: Local, step_id: str) -> None:
        super().__init__(step_id)
        self._local = local

    def __enter__(self) -> "LocalStep":
        super().__enter__()
        return self

    def invoke(
        self,
        tool: str,
        arguments: Optional[Mapping[str, Any]] = None,
        *,
        wait: Optional[float] = None,
        raise_on: Optional[RaiseOn] = None,
    ) -> Outcome:
        return self._local.invoke(tool, arguments, step_id=self.step_id, wait=wait, raise_on=raise_on)


class AsyncLocalStep(StepScope):
    """One step of the current workflow, bound to an `AsyncLocal`."""

    def __init__(self, local: AsyncLocal, step_id: str) -> None:
        super().__init__(step_id)
        self._local = local

    def __enter__(self) -> "AsyncLocalStep":
        super().__enter__()
        return self

    async def invoke(
        self,
        tool: str,
        arguments: Optional[Mapping[str, Any]] = None,
        *,
        wait: Optional[float] = None,
        raise_on: Optional[RaiseOn] = None,
    ) -> Outcome:
        return await self._local.invoke(tool, arguments, step_id=self.step_id, wait=wait, raise_on=raise_on)
