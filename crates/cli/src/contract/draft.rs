//! The text `idemgate contract new` writes: a contract shaped by the class (what the contract
//! must say) and, where the tool's name says what it does, by the name (a refund has a payment
//! and an amount, a message a recipient and a text, a ticket a subject and a body).
//!
//! Every value the owner must replace carries [`PLACEHOLDER`] — the downstream's host, the
//! owner, an argument of a tool whose name says nothing — so `contract lint` reports each one
//! left in place (rule `placeholder`) and a draft never passes review as written.

/// The mark of a value to replace; `contract lint` looks for it, in any case, outside comments.
pub const PLACEHOLDER: &str = "CHANGE-ME";

/// What a draft can be shaped as: the effect class, and for a key-based tool how a lost answer
/// is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Read,
    NaturalIdempotent,
    /// Key-based; the downstream deduplicates on the key and offers a receipt lookup.
    KeyBased,
    /// Key-based; the downstream deduplicates on the key, nothing else.
    Deduplicating,
    /// Key-based; the downstream answers with a job, polled until it ends.
    Job,
    Irreversible,
}

impl Shape {
    fn effect_class(self) -> &'static str {
        match self {
            Shape::Read => "read",
            Shape::NaturalIdempotent => "natural_idempotent",
            Shape::KeyBased | Shape::Deduplicating | Shape::Job => "key_based",
            Shape::Irreversible => "irreversible",
        }
    }
}

/// What the tool's name says it acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    Refund,
    Payment,
    Message,
    Ticket,
    Report,
    /// The name says nothing: the arguments are placeholders.
    Unknown,
}

impl Subject {
    /// From the words of the name (split on `.`, `_`, `-`): the most specific subject any
    /// word names (`payments.refund` is a refund).
    pub fn of(name: &str) -> Subject {
        let named: Vec<Subject> =
            name.split(|c: char| !c.is_ascii_alphanumeric())
                .filter_map(|word| {
                    let word = word.to_ascii_lowercase();
                    let word = word.strip_suffix('s').unwrap_or(&word);
                    Some(match word {
                        "refund" | "reimburse" | "reimbursement" => Subject::Refund,
                        "payment" | "charge" | "pay" | "payout" | "transfer" | "invoice" => {
                            Subject::Payment
                        }
                        "email" | "mail" | "message" | "sms" | "notify" | "notification"
                        | "send" => Subject::Message,
                        "ticket" | "issue" | "incident" | "case" => Subject::Ticket,
                        "report" | "export" => Subject::Report,
                        _ => return None,
                    })
                })
                .collect();
        [
            Subject::Refund,
            Subject::Report,
            Subject::Ticket,
            Subject::Message,
            Subject::Payment,
        ]
        .into_iter()
        .find(|s| named.contains(s))
        .unwrap_or(Subject::Unknown)
    }

    /// The thing, in words, and the URL path it lives under.
    fn noun(self) -> (&'static str, &'static str) {
        match self {
            Subject::Refund => ("refund", "refunds"),
            Subject::Payment => ("payment", "payments"),
            Subject::Message => ("message", "messages"),
            Subject::Ticket => ("ticket", "tickets"),
            Subject::Report => ("report", "reports"),
            Subject::Unknown => ("record", "records"),
        }
    }

    /// The system of record, for comments.
    fn system(self) -> &'static str {
        match self {
            Subject::Refund | Subject::Payment => "the payment provider",
            Subject::Message => "the message provider",
            Subject::Ticket => "the ticket system",
            Subject::Report => "the reporting service",
            Subject::Unknown => "the system of record",
        }
    }

    /// One sentence for `purpose` of a tool that makes the effect.
    fn purpose(self) -> &'static str {
        match self {
            Subject::Refund => "Refund part or all of one captured payment to the customer.",
            Subject::Payment => "Charge one customer one amount, once.",
            Subject::Message => "Send one message to one recipient.",
            Subject::Ticket => "Open one ticket in the ticket system.",
            Subject::Report => "Generate one report for one period as a background job.",
            Subject::Unknown => "CHANGE-ME (which business effect happens, in which system).",
        }
    }

    /// When not to call it (after "The agent only wants to know whether …").
    fn second_time(self) -> &'static str {
        match self {
            Subject::Refund => {
                "The user asks to refund the same payment again; a second refund is a new step with a new key."
            }
            Subject::Payment => {
                "The user asks to charge again; a second charge is a new step with a new key."
            }
            Subject::Message => {
                "The user asks to send it again; that is a new step with a new key."
            }
            Subject::Ticket => {
                "The user asks for a second ticket; that is a new step with a new key."
            }
            Subject::Report => {
                "The user asks for the same report again; read the one already made."
            }
            Subject::Unknown => "The user asks to do it again; that is a new step with a new key.",
        }
    }

    /// The arguments of the effect: `properties` lines at four spaces, the required and the
    /// material ones, and the normalisations (lines at four spaces, may be empty).
    fn arguments(self) -> Arguments {
        match self {
            Subject::Refund => Arguments {
                properties:
                    "    # The captured payment to refund, as the payment provider names it.
    payment_id:
      type: string
      minLength: 1
      maxLength: 64
    # In the currency's minor unit (cents): an integer, never a float.
    amount:
      type: integer
      minimum: 1
    currency:
      type: string
      pattern: \"^[A-Za-z]{3}$\"
    # Why, for the customer's statement; it does not change the refund.
    reason:
      type: string
      maxLength: 500
",
                required: "[payment_id, amount, currency]",
                fields: "[payment_id, amount, currency]",
                normalize: "    # Currency codes are compared trimmed and uppercased.\n    currency: [trim, uppercase]\n",
                reference: "/refund_id",
                receipt: "provider refund id",
            },
            Subject::Payment => Arguments {
                properties: "    # The customer to charge, as the payment provider names them.
    customer_id:
      type: string
      minLength: 1
      maxLength: 64
    # In the currency's minor unit (cents): an integer, never a float.
    amount:
      type: integer
      minimum: 1
    currency:
      type: string
      pattern: \"^[A-Za-z]{3}$\"
    # Shown on the customer's statement; it does not change the charge.
    description:
      type: string
      maxLength: 500
",
                required: "[customer_id, amount, currency]",
                fields: "[customer_id, amount, currency]",
                normalize: "    # Currency codes are compared trimmed and uppercased.\n    currency: [trim, uppercase]\n",
                reference: "/payment_id",
                receipt: "provider payment id",
            },
            Subject::Message => Arguments {
                properties: "    # The recipient's address.
    to:
      type: string
      minLength: 3
      maxLength: 254
    subject:
      type: string
      maxLength: 200
    text:
      type: string
      minLength: 1
      maxLength: 10000
",
                required: "[to, text]",
                fields: "[to, subject, text]",
                normalize: "    # The provider routes on the trimmed, lowercased address.\n    to: [trim, lowercase]\n",
                reference: "/message_id",
                receipt: "provider message id",
            },
            Subject::Ticket => Arguments {
                properties: "    subject:
      type: string
      minLength: 1
      maxLength: 200
    body:
      type: string
      maxLength: 20000
",
                required: "[subject, body]",
                fields: "[subject, body]",
                normalize: "    # The ticket system trims subjects and collapses their spaces itself.\n    subject: [trim, collapse_whitespace]\n",
                reference: "/id",
                receipt: "ticket id",
            },
            Subject::Report => Arguments {
                properties: "    # The first and the last day of the period (YYYY-MM-DD).
    from:
      type: string
      format: date
    to:
      type: string
      format: date
",
                required: "[from, to]",
                fields: "[from, to]",
                normalize: "",
                reference: "/report_id",
                receipt: "report id",
            },
            Subject::Unknown => Arguments {
                properties: "    # CHANGE-ME: the tool's own arguments, one property each.
    CHANGE-ME:
      type: string
      maxLength: 200
",
                required: "[CHANGE-ME]",
                fields: "[CHANGE-ME]",
                normalize: "",
                reference: "/id",
                receipt: "record id",
            },
        }
    }

    /// The argument that names the existing thing a read or an update is about.
    fn id_argument(self) -> String {
        match self {
            Subject::Unknown => "record_id".into(),
            other => format!("{}_id", other.noun().0),
        }
    }
}

struct Arguments {
    properties: &'static str,
    required: &'static str,
    fields: &'static str,
    normalize: &'static str,
    reference: &'static str,
    receipt: &'static str,
}

/// The text of a new contract for `name`, written to `file`, reviewed next on `review`.
pub fn draft(name: &str, shape: Shape, file: &str, review: &str) -> String {
    let subject = Subject::of(name);
    let mut out = String::new();
    let class = shape.effect_class();
    out.push_str(&format!(
        "\
# {name}: the contract of a `{class}` tool, drafted by `idemgate contract new`.
#
# Every field is a decision for the tool's owner: each comment says what the field means and
# what to change. Every value marked {PLACEHOLDER} is a placeholder for yours (the downstream's
# address, the owner{args}): `idemgate contract lint {file}` reports each one left in place as
# an error. See what a request's fingerprint would be with
# `idemgate contract fingerprint {file} --args '<the arguments as JSON>'`.

# What agents call, and what the gateway routes on (`POST /v1/tools/<name>/invoke`):
# A-Z, a-z, 0-9, `.`, `_`, `-`. Keep it once agents use it: a new name is a new tool.
name: {name}
# Part of every fingerprint. Bump it when the same arguments start to mean a different
# effect, so an operation claimed under the old meaning is never replayed as the new one.
version: \"1\"
",
        args = if subject == Subject::Unknown {
            ", the arguments"
        } else {
            ""
        },
    ));
    out.push_str(&intent(shape, subject));
    out.push_str(&class_comment(shape));
    out.push_str(&format!("effect_class: {class}\n"));
    if shape != Shape::Read {
        out.push_str(KEY);
    }
    out.push_str(&schema(shape, subject));
    if shape != Shape::Read {
        out.push_str(&fingerprint(shape, subject));
    }
    out.push_str(&downstream(shape, subject));
    if shape != Shape::Read {
        out.push_str(security(shape));
        out.push_str(retention(shape));
    }
    out.push_str(&format!(
        "\
owner:
  # The team or on-call rotation that works this tool's `unknown` outcomes (the
  # reconciliation queue).
  reconciliation: {PLACEHOLDER}-oncall
  # When this contract is reviewed next (YYYY-MM-DD).
  next_review: \"{review}\"
"
    ));
    out
}

const KEY: &str = "\
operation_key:
  # Who names the operation: the application, from its own durable workflow state (the run
  # and the step). Never the model, a tool-call id, the clock or a random number.
  supplied_by: application
  # What the key is namespaced by; the gateway builds tenant:environment:workflow_id:step_id.
  scope: [tenant, environment, workflow_id, step_id]
  # A retry of the same step reuses its key; a deliberate second action is a new step.
  reused_for_retry: true
";

fn intent(shape: Shape, subject: Subject) -> String {
    let (noun, _) = subject.noun();
    let (purpose, use_when, do_not) = match shape {
        Shape::Read => (
            format!("Read one {noun}, its status and its version. No effect."),
            format!("The agent needs the current state of a {noun} before deciding what to do."),
            vec![format!(
                "The agent wants to change the {noun}; use the tool that changes it."
            )],
        ),
        Shape::NaturalIdempotent => (
            format!("Set the status of one existing {noun}."),
            format!(
                "The workflow decided the {noun}'s new status, having read its current version."
            ),
            vec![
                format!("The {noun} does not exist yet; create it with its own tool."),
                format!("The agent has not read the {noun}'s current version."),
            ],
        ),
        _ => (
            subject.purpose().to_string(),
            match shape {
                Shape::Irreversible => format!(
                    "The workflow decided the {noun} must happen, and an operator will approve it."
                ),
                _ => {
                    format!("The workflow has validated the {noun} and needs it done exactly once.")
                }
            },
            vec![
                format!(
                    "The agent only wants to know whether the {noun} happened; read the operation instead."
                ),
                subject.second_time().to_string(),
            ],
        ),
    };
    let mut out = format!(
        "\
# One sentence: which business effect happens, in which system. The model reads it.
purpose: {purpose}
# When the model should call this tool.
use_when:
  - {use_when}
# When it must not: to check or read, or to do the same thing again on purpose.
do_not_use_when:
"
    );
    for line in do_not {
        out.push_str(&format!("  - {line}\n"));
    }
    out
}

fn class_comment(shape: Shape) -> String {
    match shape {
        Shape::Read => "# read: no effect, no claim, no key; authorization still applies.\n",
        Shape::NaturalIdempotent => {
            "# natural_idempotent: an absolute update (set X to V); repeating it changes nothing more.\n\
             # The key is optional: with one, a repeat is answered from the record.\n"
        }
        Shape::KeyBased | Shape::Deduplicating | Shape::Job => {
            "# key_based: one effect per operation key, a durable claim, and a receipt replayed to every\n\
             # later delivery of the key.\n"
        }
        Shape::Irreversible => {
            "# irreversible: key-based, and what happened cannot be undone, so an operator approves each\n\
             # operation before its effect.\n"
        }
    }
    .to_string()
}

fn schema(shape: Shape, subject: Subject) -> String {
    let (properties, required) = match shape {
        Shape::Read => {
            let id = subject.id_argument();
            (
                format!("    {id}:\n      type: string\n      minLength: 1\n      maxLength: 64\n"),
                format!("[{id}]"),
            )
        }
        Shape::NaturalIdempotent => {
            let id = subject.id_argument();
            (
                format!(
                    "    {id}:\n      type: string\n      minLength: 1\n      maxLength: 64\n    \
                     # The statuses the system of record knows.\n    status:\n      type: string\n      \
                     enum: [open, pending, closed]\n    # The version the agent read.\n    \
                     expected_version:\n      type: integer\n      minimum: 0\n"
                ),
                format!("[{id}, status, expected_version]"),
            )
        }
        _ => {
            let a = subject.arguments();
            (a.properties.to_string(), a.required.to_string())
        }
    };
    format!(
        "\
# The JSON Schema of the arguments. Keep `additionalProperties: false` so an unknown argument
# is refused, not ignored.
input_schema:
  type: object
  properties:
{properties}  required: {required}
  additionalProperties: false
"
    )
}

fn fingerprint(shape: Shape, subject: Subject) -> String {
    if shape == Shape::NaturalIdempotent {
        let id = subject.id_argument();
        return format!(
            "\
request_fingerprint:
  # The material fields: what identifies the update and the value it sets.
  fields: [{id}, status, expected_version]
"
        );
    }
    let a = subject.arguments();
    let normalize = if a.normalize.is_empty() {
        String::new()
    } else {
        format!(
            "  # Normalisations the system of record applies itself, so that equal requests\n  \
             # fingerprint alike. Remove any your downstream does not apply.\n  normalize:\n{}",
            a.normalize
        )
    };
    format!(
        "\
request_fingerprint:
  # The material fields: every argument that changes the effect, and none that describes the
  # delivery (a trace id, a retry count, a timestamp, the key).
  fields: {fields}
{normalize}  # What a changed request under the same key gets: rejected, with no effect.
  mismatch: rejected
",
        fields = a.fields
    )
}

fn downstream(shape: Shape, subject: Subject) -> String {
    let (noun, path) = subject.noun();
    let system = subject.system();
    let host = format!("https://{PLACEHOLDER}.invalid");
    match shape {
        Shape::Read => format!(
            "\
# {system}, where the read goes. A read has no key, no receipt and no retention.
downstream:
  http:
    # The HTTP method of the read.
    method: GET
    # Where the read goes ({PLACEHOLDER}: {system}'s address); `{{{id}}}` is filled from
    # the arguments.
    url: {host}/{path}/{{{id}}}
    # A JSON pointer into the answer: the reference of what was read.
    reference: /id
",
            id = subject.id_argument()
        ),
        Shape::NaturalIdempotent => format!(
            "\
downstream:
  # The argument sent as a version precondition (If-Match): the update applies only to the
  # version the agent read, so a retry cannot overwrite a newer change.
  version_precondition: expected_version
  # What the receipt is, for reviewers.
  receipt: {noun} version after the update
  http:
    # The HTTP method of the update: an absolute write.
    method: PUT
    # Where the update is sent ({PLACEHOLDER}: {system}'s address); `{{{id}}}` is filled
    # from the arguments.
    url: {host}/{path}/{{{id}}}/status
    # A JSON pointer into the answer: the effect's reference.
    reference: /id
",
            id = subject.id_argument()
        ),
        Shape::Job => {
            let a = subject.arguments();
            format!(
                "\
downstream:
  # {system} deduplicates on the Idempotency-Key the gateway sends: a resend after a lost
  # answer cannot start a second job.
  deduplicates_by_key: true
  # It answers with a job, which the gateway polls until it ends; the operation stays
  # `in_flight` meanwhile.
  async_jobs: true
  # What the receipt is, for reviewers.
  receipt: job id, then the {receipt}
  http:
    # The HTTP method that starts the job.
    method: POST
    # Where the job is started ({PLACEHOLDER}: {system}'s address).
    url: {host}/{path}
    # The header that carries the operation key on every request.
    idempotency_header: Idempotency-Key
    # A JSON pointer into an answer that is already final: the effect's reference.
    reference: {reference}
    job:
      # A JSON pointer into the first answer: the job's id.
      id: /job_id
      # Where the job is polled; `{{job_id}}` is filled from the first answer.
      poll_url: {host}/jobs/{{job_id}}
      # A JSON pointer into a poll's answer: the job's state, and the states that end it.
      state: /status
      done: [done]
      failed: [failed]
      # A JSON pointer into the last poll's answer: the effect's reference.
      reference: {reference}
    # Bounds on one attempt; an answer later than `total` counts as lost.
    timeouts:
      connect: 2s
      total: 10s
",
                receipt = a.receipt,
                reference = a.reference
            )
        }
        Shape::KeyBased | Shape::Deduplicating | Shape::Irreversible => {
            let a = subject.arguments();
            let (dedup, lookup) = match shape {
                Shape::KeyBased => (true, true),
                Shape::Deduplicating => (true, false),
                _ => (false, true),
            };
            let mut out = format!(
                "\
downstream:
  # Whether {system} deduplicates on the Idempotency-Key the gateway sends; then a resend
  # after a lost answer cannot make a second effect.
  deduplicates_by_key: {dedup}
  # Whether it can be asked for the effect made under a key; then a lost answer is settled by
  # a lookup. With neither, a lost answer can only end in `unknown`.
  receipt_lookup: {lookup}
  # What the receipt is, for reviewers: the reference the system of record gives the effect.
  receipt: {receipt}
  http:
    # The HTTP method of the effect.
    method: POST
    # Where the effect is sent ({PLACEHOLDER}: {system}'s address).
    url: {host}/{path}
    # The header that carries the operation key on every request.
    idempotency_header: Idempotency-Key
    # A JSON pointer into the answer: the effect's reference.
    reference: {reference}
",
                receipt = a.receipt,
                reference = a.reference
            );
            if lookup {
                out.push_str(&format!(
                    "    lookup:\n      # The receipt lookup by operation key.\n      \
                     url: {host}/{path}/by-key/{{operation_key}}\n"
                ));
            }
            out.push_str(
                "    # Bounds on one attempt; an answer later than `total` counts as lost.\n    \
                 timeouts:\n      connect: 2s\n      total: 10s\n",
            );
            out
        }
    }
}

fn security(shape: Shape) -> &'static str {
    if shape == Shape::Irreversible {
        "\
security:
  # Ask the authorization hook again before every effect and every replay. Keep it true.
  recheck_authorization: true
  # Every operation waits for an operator (`POST /v1/operations/{operation_key}/approve`).
  # Keep it: the linter refuses an irreversible tool without approval.
  approval: always
"
    } else {
        "\
security:
  # Ask the authorization hook again before every effect and every replay, so a retry cannot
  # outlive a revoked permission. Keep it true.
  recheck_authorization: true
  # Whether an operator approves an operation before its effect: never, always, or
  # when_matches (with `approval_when: {argument: [values]}`).
  approval: never
"
    }
}

fn retention(shape: Shape) -> &'static str {
    match shape {
        Shape::Irreversible => {
            "\
retention:
  # How long the whole record is kept after the operation settles.
  record_ttl: 14d
  # How long a small tombstone is kept after that, so a late retry still finds the key.
  tombstone_ttl: 90d
  # What a delivery after the record expired gets: tombstone replays the reference only.
  late_arrival: tombstone
  # The longest a retry of one step can arrive after its first delivery; it is also how long
  # an operation waits for approval. record_ttl + tombstone_ttl must cover it.
  max_retry_window: 2d
"
        }
        Shape::NaturalIdempotent => {
            "\
retention:
  # How long the record of an update is kept after it settles.
  record_ttl: 1d
  # How long a small tombstone is kept after that.
  tombstone_ttl: 7d
  # What a delivery after the tombstone gets: reject, tombstone or reconcile.
  late_arrival: reject
  # The longest a retry can arrive after its first delivery.
  max_retry_window: 1d
"
        }
        _ => {
            "\
retention:
  # How long the whole record (the result included) is kept after the operation settles.
  record_ttl: 7d
  # How long a small tombstone is kept after that, so a late retry still finds the key.
  tombstone_ttl: 30d
  # What a delivery after the tombstone gets: reject, tombstone (the reference only), or
  # reconcile (an operator decides).
  late_arrival: reject
  # The longest a retry of one step can arrive after its first delivery (queues, restarts,
  # resumed workflows). record_ttl + tombstone_ttl must cover it.
  max_retry_window: 1d
"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_says_what_the_tool_acts_on() {
        for (name, subject) in [
            ("refunds.issue", Subject::Refund),
            ("payments.refund", Subject::Refund),
            ("payments.charge", Subject::Payment),
            ("stripe_create_refund", Subject::Refund),
            ("email.send", Subject::Message),
            ("notify-customer", Subject::Message),
            ("tickets.create", Subject::Ticket),
            ("reports.generate", Subject::Report),
            ("inventory.adjust", Subject::Unknown),
        ] {
            assert_eq!(Subject::of(name), subject, "{name}");
        }
    }
}
