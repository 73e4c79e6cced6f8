"""`Client` and `AsyncClient`: API v1 over httpx.

Every method is written once, in `_Core`, as a flow: a generator that yields each request as
data (`_Request`: method, path, headers, body) or a pause, is sent the answer, and returns what
it read from it. `Client` and `AsyncClient` differ only in how they run a flow: one sends its
requests and sleeps its pauses synchronously, the other awaits them.

Neither retries on its own: one call of a method is one request (two when an invocation without
identity first asks the gateway whether the tool needs one). The only resending is `invoke_resending`, which the caller asks for and which keeps the
operation identity, so a resend can only ever be answered from the same operation's record.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from types import TracebackType
from typing import (
    Any,
    Callable,
    Collection,
    Generator,
    Generic,
    Mapping,
    Optional,
    TypeVar,
    Union,
    cast,
)
from urllib.parse import quote

import httpx

from . import _identity
from ._identity import Identity, StepScope, WorkflowScope
from ._models import Operation, OperationPage, OperationRecord, ToolInfo
from ._outcomes import (
    LABELS,
    AnswerLost,
    AuthenticationError,
    GatewayUnavailable,
    IdemgateError,
    MissingIdentityError,
    NotFoundError,
    Outcome,
    ProtocolError,
    Rejected,
    RejectedError,
    TransportError,
    UnknownToolError,
    error_for,
    parse_outcome,
)

RaiseOn = Union[str, Collection[str]]
"""Which outcomes raise instead of returning: labels among `in_flight`, `rejected`, `unknown`,
or `"not_done"` for all three."""

NOT_DONE = frozenset({"in_flight", "rejected", "unknown"})
DEFAULT_TIMEOUT = 30.0
CONNECT_TIMEOUT = 5.0
# Past this, `wait=` is the gateway's to cap (its `limits.max_wait_seconds`, 30 by default).
MAX_WAIT = 300
MAX_RESEND_ATTEMPTS = 10


def _raise_on(value: Optional[RaiseOn]) -> frozenset[str]:
    if value is None:
        return frozenset()
    if isinstance(value, str):
        if value == "not_done":
            return NOT_DONE
        value = (value,)
    labels = frozenset(value)
    wrong = sorted(labels - NOT_DONE)
    if wrong:
        raise ValueError(
            f"raise_on takes in_flight, rejected, unknown or 'not_done'; not {', '.join(wrong)}"
            + (" (applied and replayed are never errors)" if set(wrong) & set(LABELS) else "")
        )
    return labels


@dataclass(frozen=True)
class _Request:
    method: str
    path: str
    json: Any = None
    headers: Optional[Mapping[str, str]] = None
    params: Optional[Mapping[str, str]] = None
    timeout: Optional[httpx.Timeout] = None
    # Whether an answer that never arrives leaves an effect in doubt.
    effectful: bool = False
    identity: Optional[Identity] = None


@dataclass(frozen=True)
class _Pause:
    """A wait between two attempts of `invoke_resending`."""

    seconds: float


T = TypeVar("T")
_Flow = Generator[Union[_Request, _Pause], Optional[httpx.Response], T]
"""A method as data: it yields requests (and is sent their answers) and pauses (and is sent
None), and returns its result."""


def _with_reason(body: dict[str, Any], reason: Optional[str]) -> dict[str, Any]:
    """An operator action's body with its reason for the audit log; a reason must say
    something (the gateway records "no reason given" when it is left out)."""
    if reason is None:
        return body
    if not isinstance(reason, str) or not reason.strip():
        raise ValueError("reason: give a non-empty text, or leave it out")
    return {**body, "reason": reason}


def _key_path(key: str) -> str:
    if not isinstance(key, str) or not key:
        raise ValueError("an operation key is a non-empty string tenant:environment:workflow:step")
    return quote(key, safe="")


class _Core:
    """What both clients share: configuration, request building and answer reading."""

    def __init__(
        self, base_url: str, token: str, *, timeout: float, raise_on: Optional[RaiseOn]
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http:// or https:// URL, not {base_url!r}")
        if not isinstance(token, str) or not token.strip():
            raise ValueError("token is empty: pass the bearer token the gateway issued")
        self.base_url = base_url.rstrip("/")
        self._token = token
        self._timeout = float(timeout)
        self._raise_on = _raise_on(raise_on)
        self._tools: dict[str, ToolInfo] = {}

    def _headers(self) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self._token}",
            "Accept": "application/json, application/problem+json",
            "User-Agent": "idemgate-python/0.1",
        }

    def _http_timeout(self, extra: float = 0.0) -> httpx.Timeout:
        return httpx.Timeout(self._timeout + extra, connect=min(CONNECT_TIMEOUT, self._timeout))

    # -- requests ------------------------------------------------------------------------------

    def _invoke_request(
        self,
        tool: str,
        arguments: Optional[Mapping[str, Any]],
        identity: Optional[Identity],
        wait: Optional[float],
    ) -> _Request:
        if not isinstance(tool, str) or not tool:
            raise ValueError("tool must be a tool's name, such as 'tickets.create'")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, Mapping):
            raise TypeError(f"arguments must be a mapping, not {type(arguments).__name__}")
        body: dict[str, Any] = {"arguments": dict(arguments)}
        if identity is not None:
            body["workflow_id"] = identity.workflow_id
            body["step_id"] = identity.step_id
        headers: dict[str, str] = {}
        extra = 0.0
        if wait is not None:
            if isinstance(wait, bool) or not isinstance(wait, (int, float)) or wait < 0:
                raise ValueError(f"wait is a number of seconds >= 0, not {wait!r}")
            seconds = min(int(math.ceil(wait)), MAX_WAIT)
            headers["Prefer"] = f"wait={seconds}"
            extra = float(seconds)
        return _Request(
            "POST",
            f"/v1/tools/{quote(tool, safe='')}/invoke",
            json=body,
            headers=headers,
            timeout=self._http_timeout(extra),
            effectful=True,
            identity=identity,
        )

    def _reconcile_request(self, key: str, body: Optional[Mapping[str, Any]]) -> _Request:
        # An operator's resolution changes the record: a lost answer leaves it in doubt.
        return _Request(
            "POST", f"/v1/operations/{_key_path(key)}/reconcile", json=body, effectful=True
        )

    def _list_request(
        self,
        status: Optional[str],
        tool: Optional[str],
        after: Optional[str],
        limit: Optional[int],
    ) -> _Request:
        params = {
            name: str(value)
            for name, value in (("status", status), ("tool", tool), ("after", after), ("limit", limit))
            if value is not None
        }
        return _Request("GET", "/v1/operations", params=params)

    # -- answers -------------------------------------------------------------------------------

    def _transport_error(self, exc: httpx.TransportError, req: _Request) -> TransportError:
        url = self.base_url + req.path
        reason = str(exc) or type(exc).__name__
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)) or (
            isinstance(exc, httpx.UnsupportedProtocol)
        ):
            return GatewayUnavailable(
                f"the idemgate gateway at {self.base_url} is unreachable ({reason}); "
                "nothing was sent. Is `idemgate serve` running there?",
                url,
            )
        if req.effectful:
            who = (
                f" for workflow {req.identity.workflow_id!r} step {req.identity.step_id!r}"
                if req.identity
                else ""
            )
            return AnswerLost(
                f"no answer from the idemgate gateway at {url}{who} ({reason}): the request may "
                "have been carried out. Resend it with the same workflow_id and step_id "
                "(invoke_resending does), or read the operation; never under a new identity.",
                url,
                None,
            )
        return AnswerLost(f"no answer from the idemgate gateway at {url} ({reason})", url, None)

    def _body(self, response: httpx.Response, req: _Request) -> Any:
        try:
            return response.json()
        except ValueError:
            url = self.base_url + req.path
            if response.status_code >= 500:
                # A proxy's error page, say: the gateway may or may not have had the request.
                raise AnswerLost(
                    f"the idemgate gateway at {url} answered HTTP {response.status_code} "
                    "without an API answer; the request may have been carried out",
                    url,
                    None,
                ) from None
            raise ProtocolError(
                f"{url} answered HTTP {response.status_code} with a body that is not JSON; "
                f"is {self.base_url} an idemgate gateway?"
            ) from None

    def _refusal(
        self, outcome: Rejected, req: _Request, tool: Optional[str] = None
    ) -> Optional[IdemgateError]:
        """The exception a rejection always raises (bad configuration or input), if any."""
        if outcome.code == "unauthorized":
            return AuthenticationError(
                f"the idemgate gateway at {self.base_url} refused the bearer token "
                f"({outcome.message}); check the token passed as Client(token=...)",
                outcome,
            )
        if outcome.code == "unknown_tool":
            return UnknownToolError(tool or req.path, outcome, self.base_url)
        if outcome.code == "missing_operation_key" and tool is not None:
            return MissingIdentityError(tool, f"none was given ({outcome.message})", outcome)
        if outcome.code == "not_found":
            return NotFoundError(f"{self.base_url}{req.path}: {outcome.message}", outcome)
        return None

    def _outcome(
        self,
        response: httpx.Response,
        req: _Request,
        *,
        tool: Optional[str] = None,
        raise_on: frozenset[str] = frozenset(),
    ) -> Outcome:
        outcome = parse_outcome(
            self._body(response, req), response.status_code, response.headers.get("retry-after")
        )
        if isinstance(outcome, Rejected):
            refusal = self._refusal(outcome, req, tool)
            if refusal is not None:
                raise refusal
        if outcome.label in raise_on:
            raise error_for(outcome)
        return outcome

    def _document(self, response: httpx.Response, req: _Request) -> Any:
        """The JSON of a read; a problem answer raises."""
        body = self._body(response, req)
        if response.status_code >= 400 or (
            isinstance(body, Mapping) and body.get("outcome") == "rejected"
        ):
            outcome = parse_outcome(body, response.status_code)
            if isinstance(outcome, Rejected):
                raise self._refusal(outcome, req) or RejectedError(
                    f"{self.base_url}{req.path}: {outcome.code} "
                    f"(HTTP {response.status_code}): {outcome.message}",
                    outcome,
                )
            raise ProtocolError(f"{req.path} answered HTTP {response.status_code}")
        return body

    def _tool_info(self, response: httpx.Response, req: _Request, name: str) -> ToolInfo:
        try:
            info = ToolInfo.from_json(self._document(response, req))
        except UnknownToolError as e:
            raise UnknownToolError(name, e.outcome, self.base_url) from None
        self._tools[info.name] = info
        return info

    def _tool_list(self, response: httpx.Response, req: _Request) -> list[ToolInfo]:
        body = self._document(response, req)
        entries = body.get("tools") if isinstance(body, Mapping) else None
        if not isinstance(entries, list):
            raise ProtocolError("GET /v1/tools answered without a `tools` list")
        tools = [ToolInfo.from_json(t) for t in entries]
        self._tools.update((t.name, t) for t in tools)
        return tools

    def _page(self, response: httpx.Response, req: _Request) -> OperationPage:
        body = self._document(response, req)
        entries = body.get("operations") if isinstance(body, Mapping) else None
        if not isinstance(entries, list):
            raise ProtocolError("GET /v1/operations answered without an `operations` list")
        after = body.get("next_after")
        return OperationPage(
            tuple(OperationRecord.from_json(e) for e in entries),
            after if isinstance(after, str) else None,
        )

    def _operation(self, response: httpx.Response, req: _Request) -> Operation:
        return Operation.from_json(self._document(response, req), response.status_code)

    @staticmethod
    def _require_identity(tool: str, info: Optional[ToolInfo]) -> None:
        if info is not None and info.needs_identity:
            raise MissingIdentityError(
                tool, f"none was given ({tool} is {info.effect_class}: its operation identity is required)"
            )

    @staticmethod
    def _resend_identity(
        tool: str, workflow_id: Optional[str], step_id: Optional[str], attempts: int
    ) -> Identity:
        if isinstance(attempts, bool) or not isinstance(attempts, int) or not (
            1 <= attempts <= MAX_RESEND_ATTEMPTS
        ):
            raise ValueError(f"attempts is between 1 and {MAX_RESEND_ATTEMPTS}, not {attempts!r}")
        identity = _identity.resolve(tool, workflow_id, step_id)
        if identity is None:
            raise MissingIdentityError(
                tool, "none was given: resending is only safe under one fixed identity"
            )
        return identity

    # -- flows: every public method once, its I/O left to the client that runs it ---------------

    def _exchange(self, req: _Request) -> _Flow[httpx.Response]:
        """Sends `req` (a read once more, see `_read_again`); a lost answer raises ours."""
        for attempt in range(2):
            try:
                response = yield req
            except httpx.TransportError as e:
                if attempt == 0 and _read_again(req, e):
                    continue
                raise self._transport_error(e, req) from e
            if response is None:
                raise AssertionError("a request was answered without a response")
            return response
        raise AssertionError("unreachable")

    def _call(self, req: _Request, read: Callable[[httpx.Response, _Request], T]) -> _Flow[T]:
        response = yield from self._exchange(req)
        return read(response, req)

    def _http_arguments(self, req: _Request) -> dict[str, Any]:
        """`req` as the keyword arguments of `httpx.Client.request` (or the async one's)."""
        return {
            "method": req.method,
            "url": req.path,
            "json": req.json,
            "headers": req.headers,
            "params": req.params,
            "timeout": req.timeout or self._http_timeout(),
        }

    def _http_options(self) -> dict[str, Any]:
        """The options of the `httpx.Client` (or `httpx.AsyncClient`) under a client."""
        return {
            "base_url": self.base_url,
            "headers": self._headers(),
            "timeout": self._http_timeout(),
            "follow_redirects": False,
            "trust_env": False,
        }

    def _invoke_flow(
        self,
        tool: str,
        arguments: Optional[Mapping[str, Any]],
        workflow_id: Optional[str],
        step_id: Optional[str],
        wait: Optional[float],
        raise_on: Optional[RaiseOn],
    ) -> _Flow[Outcome]:
        identity = _identity.resolve(tool, workflow_id, step_id)
        if identity is None:
            self._require_identity(tool, (yield from self._known_tool_flow(tool)))
        req = self._invoke_request(tool, arguments, identity, wait)
        chosen = self._raise_on if raise_on is None else _raise_on(raise_on)
        response = yield from self._exchange(req)
        return self._outcome(response, req, tool=tool, raise_on=chosen)

    def _invoke_resending_flow(
        self,
        tool: str,
        arguments: Optional[Mapping[str, Any]],
        workflow_id: Optional[str],
        step_id: Optional[str],
        wait: Optional[float],
        raise_on: Optional[RaiseOn],
        attempts: int,
        backoff: float,
    ) -> _Flow[Outcome]:
        identity = self._resend_identity(tool, workflow_id, step_id, attempts)
        last: Optional[TransportError] = None
        for attempt in range(attempts):
            try:
                return (
                    yield from self._invoke_flow(
                        tool, arguments, identity.workflow_id, identity.step_id, wait, raise_on
                    )
                )
            except TransportError as e:
                last = e
                if attempt + 1 < attempts:
                    yield _Pause(_backoff(backoff, attempt))
        assert last is not None
        raise last

    def _tools_flow(self) -> _Flow[list[ToolInfo]]:
        return self._call(_Request("GET", "/v1/tools"), self._tool_list)

    def _tool_flow(self, name: str) -> _Flow[ToolInfo]:
        req = _Request("GET", f"/v1/tools/{quote(name, safe='')}")
        return self._call(req, lambda response, req: self._tool_info(response, req, name))

    def _known_tool_flow(self, name: str) -> _Flow[Optional[ToolInfo]]:
        if name in self._tools:
            return self._tools[name]
        try:
            return (yield from self._tool_flow(name))
        except NotFoundError:
            # A gateway without `GET /v1/tools/{tool}`: the invocation's answer will say.
            return None

    def _operation_flow(self, operation_key: str) -> _Flow[Operation]:
        req = _Request("GET", f"/v1/operations/{_key_path(operation_key)}")
        return self._call(req, self._operation)

    def _operations_flow(
        self,
        status: Optional[str],
        tool: Optional[str],
        after: Optional[str],
        limit: Optional[int],
    ) -> _Flow[OperationPage]:
        return self._call(self._list_request(status, tool, after, limit), self._page)

    def _reconcile_flow(
        self, operation_key: str, body: Optional[Mapping[str, Any]] = None
    ) -> _Flow[Outcome]:
        return self._call(self._reconcile_request(operation_key, body), self._outcome)

    def _lookup_flow(self, operation_key: str, reason: Optional[str]) -> _Flow[Outcome]:
        """No body looks the receipt up; a reason needs the explicit `lookup` resolution."""
        body = None if reason is None else {"resolution": "lookup", "reason": reason}
        return self._reconcile_flow(operation_key, body)

    def _not_applied_flow(self, operation_key: str, reason: Optional[str]) -> _Flow[Outcome]:
        return self._reconcile_flow(operation_key, _with_reason({"resolution": "not_applied"}, reason))

    def _resolve_applied_flow(
        self, operation_key: str, effect_reference: str, result: Any, reason: Optional[str]
    ) -> _Flow[Outcome]:
        body = {"resolution": "applied", "effect_reference": effect_reference, "result": result}
        return self._reconcile_flow(operation_key, _with_reason(body, reason))

    def _decide_flow(
        self,
        operation_key: str,
        decision: str,
        fingerprint: Optional[str],
        reason: Optional[str],
    ) -> _Flow[Outcome]:
        """`approve` (bound to a fingerprint when given) or `deny`, each with a reason."""
        body: dict[str, Any] = {} if fingerprint is None else {"fingerprint": fingerprint}
        body = _with_reason(body, reason)
        req = _Request(
            "POST",
            f"/v1/operations/{_key_path(operation_key)}/{decision}",
            json=body,
            effectful=True,
        )
        return self._call(req, self._outcome)

    @staticmethod
    def workflow(workflow_id: str) -> WorkflowScope:
        """`with client.workflow(run_id):` (`async with` as well) — the same as
        `idemgate.workflow(run_id)`."""
        return WorkflowScope(workflow_id)


class _Run(Generic[T]):
    """One flow being run: the next thing it asks for, given the answer to the last."""

    def __init__(self, flow: _Flow[T]) -> None:
        self._flow = flow
        self._response: Optional[httpx.Response] = None
        self._error: Optional[httpx.TransportError] = None
        self.result: T

    def next(self) -> Optional[Union[_Request, _Pause]]:
        """The next request or pause, or None once the flow has returned (see `result`)."""
        error, self._error = self._error, None
        response, self._response = self._response, None
        try:
            return self._flow.throw(error) if error is not None else self._flow.send(response)
        except StopIteration as done:
            self.result = cast(T, done.value)
            return None

    def answer(self, response: httpx.Response) -> None:
        self._response = response

    def fail(self, error: httpx.TransportError) -> None:
        self._error = error


def _read_again(req: _Request, error: httpx.TransportError) -> bool:
    """Whether a read is sent once more: a GET whose connection closed before any answer.

    A kept-alive connection can be closed by the server just as the next request goes out (the
    gateway closes one after refusing a request whose body it did not read). A GET changes
    nothing, so sending it again on a new connection is harmless; a POST is never sent again
    here, because its first attempt may have been carried out.
    """
    return req.method == "GET" and isinstance(error, (httpx.RemoteProtocolError, httpx.ReadError))


def _backoff(backoff: float, attempt: int) -> float:
    return float(min(backoff * (2**attempt), 10.0))


class Client(_Core):
    """A synchronous API v1 client. Use it as a context manager, or call `close()`.

    `raise_on` makes the chosen outcomes raise (`InFlightError`, `RejectedError`,
    `UnknownOutcomeError`) instead of returning; each call may override it.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        raise_on: Optional[RaiseOn] = None,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        super().__init__(base_url, token, timeout=timeout, raise_on=raise_on)
        self._http = httpx.Client(transport=transport, **self._http_options())

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _run(self, flow: _Flow[T]) -> T:
        """Runs a flow: its requests sent and its pauses slept here, in this thread."""
        run = _Run(flow)
        while (step := run.next()) is not None:
            if isinstance(step, _Pause):
                time.sleep(step.seconds)
                continue
            try:
                run.answer(self._http.request(**self._http_arguments(step)))
            except httpx.TransportError as e:
                run.fail(e)
        return run.result

    # -- identity ------------------------------------------------------------------------------

    def step(self, step_id: str) -> "Step":
        """A step of the current workflow: `client.step("record_issue").invoke(tool, args)`,
        or `with client.step("record_issue"):` around code that invokes."""
        return Step(self, step_id)

    # -- invoking ------------------------------------------------------------------------------

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
        `workflow(...)` / `step(...)` scope. `wait=N` asks the gateway to wait up to N seconds
        for an operation in flight to settle (`Prefer: wait=N`).
        """
        return self._run(self._invoke_flow(tool, arguments, workflow_id, step_id, wait, raise_on))

    def invoke_resending(
        self,
        tool: str,
        arguments: Optional[Mapping[str, Any]] = None,
        *,
        workflow_id: Optional[str] = None,
        step_id: Optional[str] = None,
        wait: Optional[float] = None,
        raise_on: Optional[RaiseOn] = None,
        attempts: int = 3,
        backoff: float = 0.5,
    ) -> Outcome:
        """`invoke`, sent again (at most `attempts` times in all) while the gateway cannot be
        reached or its answer is lost — always with the same identity and arguments, so every
        attempt is the same operation and the gateway performs it at most once. Outcomes are
        never resent: an `unknown` stays unknown. Needs an identity."""
        return self._run(
            self._invoke_resending_flow(
                tool, arguments, workflow_id, step_id, wait, raise_on, attempts, backoff
            )
        )

    # -- reading -------------------------------------------------------------------------------

    def tools(self) -> list[ToolInfo]:
        """`GET /v1/tools`: every loaded tool with its model-facing description and schema."""
        return self._run(self._tools_flow())

    def tool(self, name: str) -> ToolInfo:
        """`GET /v1/tools/{name}`; an unknown name raises `UnknownToolError`."""
        return self._run(self._tool_flow(name))

    def operation(self, operation_key: str) -> Operation:
        """`GET /v1/operations/{key}`: record, receipt, current outcome and events."""
        return self._run(self._operation_flow(operation_key))

    # -- operator ------------------------------------------------------------------------------

    def operations(
        self,
        status: Optional[str] = None,
        tool: Optional[str] = None,
        after: Optional[str] = None,
        limit: Optional[int] = None,
    ) -> OperationPage:
        """`GET /v1/operations` (operator): `status="unknown"` is the reconciliation queue."""
        return self._run(self._operations_flow(status, tool, after, limit))

    def reconcile(self, operation_key: str, *, reason: Optional[str] = None) -> Outcome:
        """Asks the gateway to look the receipt up now (operator). Every operator method takes
        `reason`, recorded in the audit log ("no reason given" when left out)."""
        return self._run(self._lookup_flow(operation_key, reason))

    def resolve_applied(
        self,
        operation_key: str,
        effect_reference: str,
        result: Any = None,
        *,
        reason: Optional[str] = None,
    ) -> Outcome:
        """Records that the effect happened, with its reference and result (operator)."""
        flow = self._resolve_applied_flow(operation_key, effect_reference, result, reason)
        return self._run(flow)

    def resolve_not_applied(self, operation_key: str, *, reason: Optional[str] = None) -> Outcome:
        """Records that the effect did not happen: the key may run again (operator)."""
        return self._run(self._not_applied_flow(operation_key, reason))

    def approve(
        self,
        operation_key: str,
        fingerprint: Optional[str] = None,
        *,
        reason: Optional[str] = None,
    ) -> Outcome:
        """Approves an operation awaiting approval, bound to `fingerprint` when given."""
        return self._run(self._decide_flow(operation_key, "approve", fingerprint, reason))

    def deny(self, operation_key: str, reason: Optional[str] = None) -> Outcome:
        """Denies an operation awaiting approval; its answer is the `approval_denied` refusal."""
        return self._run(self._decide_flow(operation_key, "deny", None, reason))


class AsyncClient(_Core):
    """The asynchronous twin of `Client`: the same methods, awaited. Use `async with`."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        raise_on: Optional[RaiseOn] = None,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        super().__init__(base_url, token, timeout=timeout, raise_on=raise_on)
        self._http = httpx.AsyncClient(transport=transport, **self._http_options())

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _run(self, flow: _Flow[T]) -> T:
        """Runs a flow: its requests sent and its pauses slept, awaited."""
        run = _Run(flow)
        while (step := run.next()) is not None:
            if isinstance(step, _Pause):
                await asyncio.sleep(step.seconds)
                continue
            try:
                run.answer(await self._http.request(**self._http_arguments(step)))
            except httpx.TransportError as e:
                run.fail(e)
        return run.result

    def step(self, step_id: str) -> "AsyncStep":
        """A step of the current workflow: `await client.step("record_issue").invoke(...)`."""
        return AsyncStep(self, step_id)

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
        """See `Client.invoke`."""
        flow = self._invoke_flow(tool, arguments, workflow_id, step_id, wait, raise_on)
        return await self._run(flow)

    async def invoke_resending(
        self,
        tool: str,
        arguments: Optional[Mapping[str, Any]] = None,
        *,
        workflow_id: Optional[str] = None,
        step_id: Optional[str] = None,
        wait: Optional[float] = None,
        raise_on: Optional[RaiseOn] = None,
        attempts: int = 3,
        backoff: float = 0.5,
    ) -> Outcome:
        """See `Client.invoke_resending`."""
        return await self._run(
            self._invoke_resending_flow(
                tool, arguments, workflow_id, step_id, wait, raise_on, attempts, backoff
            )
        )

    async def tools(self) -> list[ToolInfo]:
        return await self._run(self._tools_flow())

    async def tool(self, name: str) -> ToolInfo:
        return await self._run(self._tool_flow(name))

    async def operation(self, operation_key: str) -> Operation:
        return await self._run(self._operation_flow(operation_key))

    async def operations(
        self,
        status: Optional[str] = None,
        tool: Optional[str] = None,
        after: Optional[str] = None,
        limit: Optional[int] = None,
    ) -> OperationPage:
        return await self._run(self._operations_flow(status, tool, after, limit))

    async def reconcile(self, operation_key: str, *, reason: Optional[str] = None) -> Outcome:
        return await self._run(self._lookup_flow(operation_key, reason))

    async def resolve_applied(
        self,
        operation_key: str,
        effect_reference: str,
        result: Any = None,
        *,
        reason: Optional[str] = None,
    ) -> Outcome:
        flow = self._resolve_applied_flow(operation_key, effect_reference, result, reason)
        return await self._run(flow)

    async def resolve_not_applied(
        self, operation_key: str, *, reason: Optional[str] = None
    ) -> Outcome:
        return await self._run(self._not_applied_flow(operation_key, reason))

    async def approve(
        self,
        operation_key: str,
        fingerprint: Optional[str] = None,
        *,
        reason: Optional[str] = None,
    ) -> Outcome:
        return await self._run(self._decide_flow(operation_key, "approve", fingerprint, reason))

    async def deny(self, operation_key: str, reason: Optional[str] = None) -> Outcome:
        return await self._run(self._decide_flow(operation_key, "deny", None, reason))


class Step(StepScope):
    """One step of the current workflow, bound to a `Client`."""

    def __init__(self, client: Client, step_id: str) -> None:
        super().__init__(step_id)
        self._client = client

    def __enter__(self) -> "Step":
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
        return self._client.invoke(
            tool, arguments, step_id=self.step_id, wait=wait, raise_on=raise_on
        )

    def invoke_resending(
        self,
        tool: str,
        arguments: Optional[Mapping[str, Any]] = None,
        *,
        wait: Optional[float] = None,
        raise_on: Optional[RaiseOn] = None,
        attempts: int = 3,
        backoff: float = 0.5,
    ) -> Outcome:
        return self._client.invoke_resending(
            tool,
            arguments,
            step_id=self.step_id,
            wait=wait,
            raise_on=raise_on,
            attempts=attempts,
            backoff=backoff,
        )


class AsyncStep(StepScope):
    """One step of the current workflow, bound to an `AsyncClient`."""

    def __init__(self, client: AsyncClient, step_id: str) -> None:
        super().__init__(step_id)
        self._client = client

    def __enter__(self) -> "AsyncStep":
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
        return await self._client.invoke(
            tool, arguments, step_id=self.step_id, wait=wait, raise_on=raise_on
        )

    async def invoke_resending(
        self,
        tool: str,
        arguments: Optional[Mapping[str, Any]] = None,
        *,
        wait: Optional[float] = None,
        raise_on: Optional[RaiseOn] = None,
        attempts: int = 3,
        backoff: float = 0.5,
    ) -> Outcome:
        return await self._client.invoke_resending(
            tool,
            arguments,
            step_id=self.step_id,
            wait=wait,
            raise_on=raise_on,
            attempts=attempts,
            backoff=backoff,
        )
