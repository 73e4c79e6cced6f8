//! The generic plans of the hot statements are lookups by key whatever the table's statistics
//! say — above all on an empty table, where every plan costs the same and the one cached then
//! is kept until the next analyse (migration 0002 and `PgStore::connect` explain the trap).

mod common;

use common::admin;

use idemgate_store_postgres::testing::statements;

/// The generic plan of `sql` (with `params` parameters) on a connection set up like the
/// store's.
async fn generic_plan(client: &tokio_postgres::Client, sql: &str, params: usize) -> String {
    client
        .batch_execute("DEALLOCATE ALL; SET plan_cache_mode = force_generic_plan")
        .await
        .unwrap();
    client
        .batch_execute(&format!("PREPARE probe AS {sql}"))
        .await
        .unwrap();
    let args = vec!["NULL"; params].join(", ");
    let rows = client
        .simple_query(&format!("EXPLAIN EXECUTE probe({args})"))
        .await
        .unwrap();
    rows.iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every scan of `operations` in `plan` is an index lookup by key: no sequential scan, and
/// each index scan's condition names the key.
fn reads_by_key_only(plan: &str) -> Result<(), String> {
    for node in plan.split("->") {
        let head = node.lines().next().unwrap_or("");
        // Scans only: `Insert on operations` and `Update on operations` read nothing.
        if !(head.contains("Scan") && head.contains(" on operations")) {
            continue;
        }
        if head.contains("Seq Scan") {
            return Err(format!("sequential scan of operations:\n{plan}"));
        }
        let by_key = node.lines().any(|l| {
            (l.contains("Index Cond") || l.contains("Recheck Cond")) && l.contains("key =")
        });
        if !by_key {
            return Err(format!("a scan of operations not bounded by key:\n{plan}"));
        }
    }
    Ok(())
}

#[tokio::test]
async fn generic_plans_look_up_by_key_on_an_empty_table() {
    let db = database!();
    // Applies the migrations.
    drop(db.store().await);
    let client = admin(db.url()).await;
    for (name, value) in statements::PLANNER_SETTINGS {
        client
            .batch_execute(&format!("SET {name} = {value}"))
            .await
            .unwrap();
    }
    let hot = [
        ("GET", statements::GET, 2),
        ("CLAIM", statements::CLAIM, 29),
        ("TRANSITION", statements::TRANSITION, 25),
        ("CLAIM_BATCH", statements::CLAIM_BATCH, 30),
    ];
    let transition_batch = statements::transition_batch(4);
    // Never analysed; analysed while empty (what autovacuum leaves after everything was
    // purged); and truncated, as the benchmark does between runs.
    let states = [
        ("fresh", None),
        ("vacuumed empty", Some("VACUUM ANALYZE operations, events")),
        ("truncated", Some("TRUNCATE operations, events")),
    ];
    for (state, setup) in states {
        if let Some(setup) = setup {
            for statement in setup.split(';') {
                client.batch_execute(statement).await.unwrap();
            }
        }
        let hot = hot
            .iter()
            .copied()
            .chain([("TRANSITION_BATCH", transition_batch.as_str(), 26)]);
        for (name, sql, params) in hot {
            let plan = generic_plan(&client, sql, params).await;
            if let Err(e) = reads_by_key_only(&plan) {
                panic!("{name}, table {state}: {e}");
            }
        }
    }
}
