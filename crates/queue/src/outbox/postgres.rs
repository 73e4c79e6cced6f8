//! The outbox in the application's PostgreSQL database (tokio-postgres).

use tokio_postgres::{Client, Transaction};

use super::{Entry, Error, Parked, checked, now_millis};
use crate::envelope::{Envelope, Limits};

/// The outbox table and its index (`sql/outbox.postgres.sql`), and the table of parked entries
/// (`sql/outbox_parked.postgres.sql`). Idempotent.
pub const DDL: &str = concat!(
    include_str!("../../sql/outbox.postgres.sql"),
    include_str!("../../sql/outbox_parked.postgres.sql")
);

/// Creates the outbox table if it does not exist.
pub async fn install(client: &Client) -> Result<(), Error> {
    client.batch_execute(DDL).await?;
    Ok(())
}

/// Writes `envelope` into the outbox inside the application's transaction `tx`: it commits
/// with the business write, or not at all. Returns the entry's row id. An envelope a consumer
/// with the default limits (256 KiB, depth 32) would refuse is refused here, nothing written.
pub async fn enqueue(tx: &Transaction<'_>, envelope: &Envelope) -> Result<i64, Error> {
    enqueue_within(tx, envelope, Limits::default()).await
}

/// [`enqueue`] for a consumer configured with other `[limits]`.
pub async fn enqueue_within(
    tx: &Transaction<'_>,
    envelope: &Envelope,
    limits: Limits,
) -> Result<i64, Error> {
    let text = checked(envelope, limits)?;
    let row = tx
        .query_one(
            "INSERT INTO idemgate_outbox (workflow_id, step_id, tool, envelope, created_at)
             VALUES ($1, $2, $3, $4, $5) RETURNING id",
            &[
                &envelope.workflow_id,
                &envelope.step_id,
                &envelope.tool,
                &text,
                &now_millis(),
            ],
        )
        .await?;
    Ok(row.get(0))
}

/// A publisher's view of a PostgreSQL outbox, over a client of its own.
pub struct PgOutbox {
    client: Client,
}

impl PgOutbox {
    /// Over `client`, making sure the table exists.
    pub async fn new(client: Client) -> Result<PgOutbox, Error> {
        install(&client).await?;
        Ok(PgOutbox { client })
    }

    /// Up to `limit` unsent entries, oldest first.
    pub async fn unsent(&self, limit: usize) -> Result<Vec<Entry>, Error> {
        let rows = self
            .client
            .query(
                "SELECT id, envelope, attempts FROM idemgate_outbox o
                 WHERE sent_at IS NULL
                   AND NOT EXISTS (SELECT 1 FROM idemgate_outbox_parked p WHERE p.id = o.id)
                 ORDER BY id LIMIT $1",
                &[&(limit as i64)],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| Entry {
                id: r.get(0),
                envelope: r.get(1),
                attempts: i64::from(r.get::<_, i32>(2)),
            })
            .collect())
    }

    /// Counts a publication of `ids` before it starts.
    pub async fn count_attempt(&self, ids: &[i64]) -> Result<(), Error> {
        self.client
            .execute(
                "UPDATE idemgate_outbox SET attempts = attempts + 1 WHERE id = ANY($1)",
                &[&ids],
            )
            .await?;
        Ok(())
    }

    /// Parks entry `id`: never offered again, kept with `reason`.
    pub async fn park(&self, id: i64, reason: &str) -> Result<(), Error> {
        self.client
            .execute(
                "INSERT INTO idemgate_outbox_parked (id, reason, parked_at) VALUES ($1, $2, $3)
                 ON CONFLICT (id) DO NOTHING",
                &[&id, &reason, &now_millis()],
            )
            .await?;
        Ok(())
    }

    /// Every parked entry, oldest first.
    pub async fn parked(&self) -> Result<Vec<Parked>, Error> {
        let rows = self
            .client
            .query(
                "SELECT id, reason FROM idemgate_outbox_parked ORDER BY id",
                &[],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| Parked {
                id: r.get(0),
                reason: r.get(1),
            })
            .collect())
    }

    /// Marks `ids` sent, in one statement.
    pub async fn mark_sent(&self, ids: &[i64]) -> Result<(), Error> {
        self.client
            .execute(
                "UPDATE idemgate_outbox SET sent_at = $1 WHERE id = ANY($2) AND sent_at IS NULL",
                &[&now_millis(), &ids],
            )
            .await?;
        Ok(())
    }
}
