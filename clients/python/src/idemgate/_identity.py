"""Operation identity from the workflow's own state, held in a `contextvars.ContextVar`.

`with workflow(run_id):` names the workflow; `with step(name):` (or a client's `step(name)`)
names the step inside it. A context variable follows the code that runs, thread by thread and
asyncio task by task (a task copies the context it was created in), so two runs handled
concurrently never see each other's identity. Nothing here makes an identity up: a missing one
stays missing until the caller names it.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from types import TracebackType
from typing import Optional

from ._outcomes import InvalidIdentityError, MissingIdentityError

# The gateway's own bound for one part of an operation key (`limits.key_part_bytes`).
MAX_PART_BYTES = 128


@dataclass(frozen=True)
class Identity:
    """One operation's name as the application gives it: its workflow run and its step."""

    workflow_id: str
    step_id: str


@dataclass(frozen=True)
class _Scope:
    workflow_id: Optional[str]
    step_id: Optional[str]


_SCOPE: contextvars.ContextVar[_Scope] = contextvars.ContextVar(
    "idemgate_identity", default=_Scope(None, None)
)


def check_part(name: str, value: object) -> str:
    """A workflow_id or step_id as the gateway accepts it, or `InvalidIdentityError`."""
    # At most 32 characters are at most 128 bytes in UTF-8: the usual part is checked by this
    # line alone, on every call of a guarded function.
    if type(value) is str and 0 < len(value) <= MAX_PART_BYTES // 4 and ":" not in value:
        return value
    if not isinstance(value, str):
        raise InvalidIdentityError(f"{name} must be a string, not {type(value).__name__}")
    if value == "":
        raise InvalidIdentityError(f"{name} is empty")
    if ":" in value:
        raise InvalidIdentityError(
            f"{name} {value!r} contains ':', which separates the parts of an operation key"
        )
    if len(value.encode()) > MAX_PART_BYTES:
        raise InvalidIdentityError(f"{name} is longer than {MAX_PART_BYTES} bytes")
    return value


class _ScopeManager:
    """Sets the scope on entry and restores the previous one on exit, sync or async. One
    instance may be entered again (nested or later); each entry is undone by its own exit."""

    def __init__(self) -> None:
        self._tokens: list[contextvars.Token[_Scope]] = []

    def _scope(self, current: _Scope) -> _Scope:
        raise NotImplementedError

    def __enter__(self) -> "_ScopeManager":
        self._tokens.append(_SCOPE.set(self._scope(_SCOPE.get())))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _SCOPE.reset(self._tokens.pop())

    async def __aenter__(self) -> "_ScopeManager":
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)


class WorkflowScope(_ScopeManager):
    """`with workflow(run_id):` — every invocation inside belongs to this workflow run. Entering
    it clears any step named outside it."""

    def __init__(self, workflow_id: str) -> None:
        super().__init__()
        self.workflow_id = check_part("workflow_id", workflow_id)

    def _scope(self, current: _Scope) -> _Scope:
        return _Scope(self.workflow_id, None)

    def __enter__(self) -> "WorkflowScope":
        super().__enter__()
        return self


class StepScope(_ScopeManager):
    """`with step(name):` — invocations inside are this step of the current workflow."""

    def __init__(self, step_id: str) -> None:
        super().__init__()
        self.step_id = check_part("step_id", step_id)

    def _scope(self, current: _Scope) -> _Scope:
        return _Scope(current.workflow_id, self.step_id)

    def __enter__(self) -> "StepScope":
        super().__enter__()
        return self


def workflow(workflow_id: str) -> WorkflowScope:
    """Names the workflow run for the code inside `with` / `async with`: use the run id your
    workflow engine or application already keeps (a LangGraph thread id, a job id)."""
    return WorkflowScope(workflow_id)


def step(step_id: str) -> StepScope:
    """Names the step inside the current workflow: a name that is the same every time this
    step is attempted (the node's or activity's name), never a counter or a timestamp."""
    return StepScope(step_id)


def current_workflow_id() -> Optional[str]:
    return _SCOPE.get().workflow_id


def current_step_id() -> Optional[str]:
    return _SCOPE.get().step_id


def resolve(
    tool: str, workflow_id: Optional[str], step_id: Optional[str]
) -> Optional[Identity]:
    """The identity of one invocation: explicit arguments first, then the context. None when
    neither names anything; a half-named identity is an error naming the tool."""
    w, s = resolve_parts(tool, workflow_id, step_id)
    return None if w is None or s is None else Identity(w, s)


def resolve_parts(
    tool: str, workflow_id: Optional[str], step_id: Optional[str]
) -> tuple[Optional[str], Optional[str]]:
    """`resolve` as its two parts, both checked, or both None: what `Local.invoke` passes on."""
    if workflow_id is None or step_id is None:
        scope = _SCOPE.get()
        if workflow_id is None:
            workflow_id = scope.workflow_id
        if step_id is None:
            step_id = scope.step_id
        if workflow_id is None and step_id is None:
            return None, None
        if workflow_id is None:
            raise MissingIdentityError(tool, f"step {step_id!r} has no workflow_id")
        if step_id is None:
            raise MissingIdentityError(tool, f"workflow {workflow_id!r} names no step_id for this call")
    return check_part("workflow_id", workflow_id), check_part("step_id", step_id)
