//! An application that keeps its orders in SQLite and enqueues each order's confirmation job
//! in the same transaction as the order (the transactional outbox). Run it, then
//! `idemgate outbox publish --database sqlite://PATH --subject SUBJECT` delivers the jobs.
//!
//! ```text
//! cargo run -p idemgate-queue --example outbox_sqlite -- app.db 3
//! ```

use idemgate_queue::Envelope;
use idemgate_queue::outbox;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "app.db".into());
    let orders: u32 = args.next().map(|n| n.parse()).transpose()?.unwrap_or(3);

    let mut conn = rusqlite::Connection::open(&path)?;
    conn.execute_batch(
        "PRAGMA journal_mode = WAL;
         CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, subject TEXT NOT NULL);",
    )?;
    outbox::sqlite::install(&conn)?;
    let first: i64 = conn.query_row("SELECT coalesce(max(id), 0) + 1 FROM orders", [], |r| {
        r.get(0)
    })?;
    for id in first..first + i64::from(orders) {
        // The business write and its job commit together, or neither does.
        let tx = conn.transaction()?;
        tx.execute(
            "INSERT INTO orders (id, subject) VALUES (?1, ?2)",
            rusqlite::params![id, format!("Order {id} needs a follow-up")],
        )?;
        let entry = outbox::sqlite::enqueue(
            &tx,
            &Envelope {
                // The order's own identity names the operation: a redelivered job, a
                // republished entry, a retried consumer all land on this one key.
                workflow_id: format!("order_{id}"),
                step_id: "follow_up_ticket".into(),
                tool: "tickets.create".into(),
                arguments: serde_json::json!({
                    "subject": format!("Order {id} needs a follow-up"),
                    "body": "Created from the order's outbox entry.",
                }),
                actor: Some("orders-service".into()),
            },
        )?;
        tx.commit()?;
        println!("order {id} committed with outbox entry {entry}");
    }
    Ok(())
}
