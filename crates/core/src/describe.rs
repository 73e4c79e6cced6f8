//! The description a model reads of a tool: what it is for, when not to use it, and what a
//! repeated call returns. Plain text from a [`Contract`], shared by every face that shows a tool
//! to a model or a framework (MCP's `tools/list`, API v1's `GET /v1/tools`, the in-process
//! packages' adapters), so that each says the same thing.

use crate::contract::{self, Contract, EffectClass};

/// The description a model reads: what the tool is for, when not to use it, and what a repeated
/// call returns — under the `meta` identity rule.
pub fn describe(contract: &Contract) -> String {
    describe_with(contract, contract::Identity::Meta)
}

/// [`describe`] for a tool served under `identity` (the rule in effect for it: a contract's own
/// `identity` wins over the face's).
pub fn describe_with(contract: &Contract, identity: contract::Identity) -> String {
    let file = &contract.file;
    let mut out = String::new();
    match file.purpose.as_deref().map(str::trim) {
        Some(purpose) if !purpose.is_empty() => out.push_str(purpose),
        _ => out.push_str(&format!("Performs `{}`.", contract.name)),
    }
    let list = |out: &mut String, title: &str, items: &[String]| {
        if items.is_empty() {
            return;
        }
        out.push_str("\n\n");
        out.push_str(title);
        for item in items {
            out.push_str("\n- ");
            out.push_str(item.trim());
        }
    };
    list(&mut out, "Use when:", &file.use_when);
    list(&mut out, "Do not use when:", &file.do_not_use_when);
    out.push_str("\n\nRetries: ");
    match identity {
        contract::Identity::SessionWindow(window) => {
            out.push_str(&windowed_semantics(contract, window))
        }
        contract::Identity::Meta => out.push_str(retry_semantics(contract)),
    }
    out
}

/// The retry semantics of a tool whose calls are named by the session-window rule.
pub fn windowed_semantics(contract: &Contract, window: crate::duration::Span) -> String {
    let approval = if contract.effect_class == EffectClass::Irreversible {
        "Irreversible: an operation may wait for an operator's approval (`in_flight` with \
next_action `ask_for_approval`). "
    } else {
        ""
    };
    format!(
        "{approval}idemgate runs each operation once. You do not name operations: a call with \
the same arguments as one made less than {window} earlier in this session is the same operation — it \
performs no new effect and answers `replayed` with the stored result. So re-sending or retrying a call \
is always safe. If the user really wants the same thing done again, call with `repeat_of` set to the \
operation_key of the earlier answer; that is a new operation. Never use `repeat_of` to retry. \
`in_flight`: still running — do not call again; poll `idemgate_operation_status` with the \
operation_key. `unknown`: it may have happened and cannot be proved — do not call again; an \
operator reconciles it. `rejected`: this call did nothing; read error.code, and safe_to_repeat for whether the operation may be tried again. Every answer carries \
`status`, `next_action` and `safe_to_repeat`, and says which rule named the operation."
    )
}

fn retry_semantics(contract: &Contract) -> &'static str {
    const KEYED: &str = "idemgate runs each operation once. The operation is named by the \
application running you, not by you. Calling again for the same operation performs no new \
effect: it answers `replayed` with the stored result. `in_flight`: it is still running — do not \
call again; poll `idemgate_operation_status` with the operation_key. `unknown`: it may have \
happened and cannot be proved — do not call again; an operator reconciles it. `rejected`: \
this call did nothing; read error.code, and safe_to_repeat for whether the operation may be \
tried again. Every answer carries `status`, `next_action` and \
`safe_to_repeat`.";
    match contract.effect_class {
        EffectClass::Read => {
            "A read: no effect, calling again is harmless. Every answer carries `status` and \
`next_action`; `rejected` means nothing was read, see error.code."
        }
        EffectClass::NaturalIdempotent => {
            "An absolute update: repeating the same call sets the same value again and is \
harmless. When the application names the operation, a repeat answers `replayed` with the stored \
result. `rejected` with `precondition_failed` means the target changed since you read it: read \
it again before deciding. `unknown`: do not call again; an operator reconciles it."
        }
        EffectClass::KeyBased => KEYED,
        EffectClass::Irreversible => {
            "Irreversible. idemgate runs each operation once and may hold it for an operator's \
approval (`in_flight` with next_action `ask_for_approval`). The operation is named by the \
application running you, not by you. Calling again for the same operation performs no new \
effect: it answers `replayed` with the stored result. `in_flight`: do not call again; poll \
`idemgate_operation_status` with the operation_key. `unknown`: it may have happened and cannot \
be proved — do not call again; an operator reconciles it. `rejected`: this call did nothing; read \
error.code, and safe_to_repeat for whether the operation may be tried again."
        }
        EffectClass::NonIdempotent => {
            "Not executed: non_idempotent tools must be redesigned as keyed commands."
        }
    }
}
