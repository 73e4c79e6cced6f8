//! With the feature `openapi`: what the read models' schemas refer to for their string
//! members, built from the core's own lists (`ALL_CODES`, `RecordStatus::ALL`,
//! `EventKind::ALL`), so the OpenAPI document the HTTP face generates cannot drift from the
//! code that answers.

use std::borrow::Cow;

use idemgate_core::outcome::ALL_CODES;
use idemgate_core::record::{EventKind, RecordStatus};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

fn string_enum<'a>(description: &str, values: impl IntoIterator<Item = &'a str>) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some(description))
        .enum_values(Some(values))
        .into()
}

/// The schema of `error.code`: every [`idemgate_core::ErrorCode`].
pub struct ErrorCodeName;

impl PartialSchema for ErrorCodeName {
    fn schema() -> RefOr<Schema> {
        string_enum(
            "A stable snake_case error code; `/problems/<code>` explains it. New codes may be \
             added: a client treats an unknown one as a rejection it cannot act on by itself.",
            ALL_CODES.iter().map(|c| c.as_str()),
        )
    }
}

impl ToSchema for ErrorCodeName {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("ErrorCode")
    }
}

/// The schema of `record_status`: every [`RecordStatus`].
pub struct RecordStatusName;

impl PartialSchema for RecordStatusName {
    fn schema() -> RefOr<Schema> {
        string_enum(
            "The stored state of an operation; `unknown` is the reconciliation queue.",
            RecordStatus::ALL.iter().map(|s| s.as_str()),
        )
    }
}

impl ToSchema for RecordStatusName {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("RecordStatus")
    }
}

/// The schema of an event's `kind`: every [`EventKind`].
pub struct EventKindName;

impl PartialSchema for EventKindName {
    fn schema() -> RefOr<Schema> {
        string_enum(
            "One transition in an operation's trace.",
            EventKind::ALL.iter().map(|k| k.as_str()),
        )
    }
}

impl ToSchema for EventKindName {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("EventKind")
    }
}
