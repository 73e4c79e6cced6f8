"""The extension module `idemgate._native` (crates/py): the engine, as `idemgate.Local` and
`idemgate.AsyncLocal` use it. Not a public API; its signatures may change with the package."""

from contextvars import ContextVar
from typing import Any, Awaitable, Literal, Mapping, Optional, Union, overload

from ._outcomes import Applied, Replayed

# (label, operation_key, effect_reference, safe_to_repeat, next_action, retry_after_seconds,
#  result, error_code, error_message)
OutcomeTuple = tuple[
    str, Optional[str], Optional[str], bool, str, Optional[int], Any, Optional[str], Optional[str]
]
# An invocation's answer: an applied or replayed outcome made by the extension, else the tuple.
Answer = Union[Applied, Replayed, OutcomeTuple]
# ("found", body, outcome) | ("denied", outcome) | ("error", outcome) | None
OperationAnswer = Optional[tuple[Any, ...]]
# (level, rule, field, reason)
Finding = tuple[str, str, str, str]

def wait_for_functions() -> None: ...

class NativeLocal:
    def __init__(
        self,
        url: str,
        tenant: str,
        environment: str,
        actor: str,
        recover: bool,
        recovery_every: float,
        sweep_every: float,
        shapes: tuple[type[Applied], type[Replayed], ContextVar[Any], int],
        encryption_key_env: Optional[str] = None,
    ) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def environment(self) -> str: ...
    @property
    def tenant(self) -> str: ...
    def register(
        self,
        name: str,
        functions: Any,
        timeout: Optional[float],
        spec: Optional[Mapping[str, Any]] = None,
        contract_path: Optional[str] = None,
    ) -> list[Finding]: ...
    def tools(self) -> list[str]: ...
    @overload
    def invoke(
        self,
        tool: str,
        arguments: dict[str, Any],
        workflow_id: Optional[str],
        step_id: Optional[str],
        wait: Optional[float],
        asynchronous: Literal[False],
    ) -> Answer: ...
    @overload
    def invoke(
        self,
        tool: str,
        arguments: dict[str, Any],
        workflow_id: Optional[str],
        step_id: Optional[str],
        wait: Optional[float],
        asynchronous: Literal[True],
    ) -> Awaitable[Answer]: ...
    def call(
        self, tool: object, arguments: object, workflow_id: object, step_id: object
    ) -> Optional[Answer]: ...
    @overload
    def operation(self, key: str, asynchronous: Literal[False]) -> OperationAnswer: ...
    @overload
    def operation(self, key: str, asynchronous: Literal[True]) -> Awaitable[OperationAnswer]: ...
    @overload
    def operations(
        self,
        status: Optional[str],
        tool: Optional[str],
        after: Optional[str],
        limit: Optional[int],
        asynchronous: Literal[False],
    ) -> dict[str, Any]: ...
    @overload
    def operations(
        self,
        status: Optional[str],
        tool: Optional[str],
        after: Optional[str],
        limit: Optional[int],
        asynchronous: Literal[True],
    ) -> Awaitable[dict[str, Any]]: ...
    @overload
    def reconcile(
        self,
        key: str,
        resolution: Optional[Literal["applied", "not_applied"]],
        reference: Optional[str],
        result: Any,
        reason: Optional[str],
        asynchronous: Literal[False],
    ) -> OutcomeTuple: ...
    @overload
    def reconcile(
        self,
        key: str,
        resolution: Optional[Literal["applied", "not_applied"]],
        reference: Optional[str],
        result: Any,
        reason: Optional[str],
        asynchronous: Literal[True],
    ) -> Awaitable[OutcomeTuple]: ...
    @overload
    def approve(
        self, key: str, fingerprint: Optional[str], reason: Optional[str], asynchronous: Literal[False]
    ) -> OutcomeTuple: ...
    @overload
    def approve(
        self, key: str, fingerprint: Optional[str], reason: Optional[str], asynchronous: Literal[True]
    ) -> Awaitable[OutcomeTuple]: ...
    @overload
    def deny(self, key: str, reason: Optional[str], asynchronous: Literal[False]) -> OutcomeTuple: ...
    @overload
    def deny(self, key: str, reason: Optional[str], asynchronous: Literal[True]) -> Awaitable[OutcomeTuple]: ...
    def close(self) -> None: ...
