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
        ("CLAIM", statements::CLAIM, 25),
        ("TRANSITION", statements::TRANSITION, 25),
        ("CLAIM_BATCH", statements::CLAIM_BATCH, 25),
        // Reads no table; listed so that a change that makes it read one is checked too.
        ("DUPLICATE_LOCK", statements::DUPLICATE_LOCK, 1),
    ];
    let transition_batch = statements::transition_batch(4);
    // Never analysed; analysed while empty (what autovacuum leaves after everything was
    // purged); and truncated, as the benchmark does between runs.
    let states = [
        ("fresh", None),
        ("vacuumed empty", Some("VACUUM ANALYZE operations")),
        ("truncated", Some("TRUNCATE operations")),
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
            .chain([("TRANSITION_BATCH", transition_batch.as_str(), 25)]);
        for (name, sql, params) in hot {
            let plan = generic_plan(&client, sql, params).await;
            if let Err(e) = reads_by_key_only(&plan) {
                panic!("{name}, table {state}: {e}");
            }
        }
    }
}

/// The plan of `sql` for the parameter values `args` (SQL literals), as the store's connections
/// get it for the statements it runs unnamed, planned for their values.
async fn custom_plan(client: &tokio_postgres::Client, sql: &str, args: &[&str]) -> String {
    client
        .batch_execute("DEALLOCATE ALL; SET plan_cache_mode = force_custom_plan")
        .await
        .unwrap();
    client
        .batch_execute(&format!("PREPARE probe AS {sql}"))
        .await
        .unwrap();
    let rows = client
        .simple_query(&format!("EXPLAIN EXECUTE probe({})", args.join(", ")))
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

/// The scans by environment read their own partial index (migration 0004), bounded by the
/// environment, in the order of their answer, on a table where settled rows far outnumber the
/// others, as they do in production.
#[tokio::test]
async fn scans_by_environment_read_their_partial_indexes() {
    let db = database!();
    drop(db.store().await);
    let client = admin(db.url()).await;
    for (name, value) in statements::PLANNER_SETTINGS {
        client
            .batch_execute(&format!("SET {name} = {value}"))
            .await
            .unwrap();
    }
    // Twenty thousand settled rows over two environments, a few hundred of every other kind.
    client
        .batch_execute(
            "INSERT INTO operations (tenant, key, tool, tool_version, fingerprint,
                 canonicalization, status, fence, lease_owner, lease_expires_at, dispatch,
                 effect_reference, error_code, actor, created_at, updated_at, expires_at,
                 purge_at, intent_window)
             SELECT 'acme', 'acme:' || env || ':wf:' || i, 'tickets.create', '1',
                 'sha256:' || md5(i::text), 1, status, 1,
                 CASE WHEN status = 'pending' THEN 'w1' END,
                 CASE WHEN status IN ('pending', 'awaiting_approval') THEN i END,
                 CASE WHEN status = 'pending' THEN 'sent' END,
                 CASE WHEN status IN ('applied', 'tombstone') THEN 'ref-' || i END,
                 CASE WHEN status = 'failed_permanent' THEN 'downstream_rejected' END,
                 'agent', i, i, i + 1000, i + 2000, i % 2 = 0
             FROM generate_series(1, 22000) AS i,
                 LATERAL (SELECT CASE WHEN i % 2 = 0 THEN 'prod' ELSE 'staging' END AS env,
                     CASE
                         WHEN i <= 20000 THEN 'applied'
                         WHEN i <= 20400 THEN 'pending'
                         WHEN i <= 20800 THEN 'awaiting_approval'
                         WHEN i <= 21200 THEN 'failed_permanent'
                         WHEN i <= 21600 THEN 'tombstone'
                         ELSE 'unknown'
                     END AS status) AS s;
             ANALYZE operations",
        )
        .await
        .unwrap();
    let list_pending = statements::list(true, true, true, false, false);
    let list_tool = statements::list(true, true, false, true, false);
    let list_queue_tool = statements::list(true, true, true, true, false);
    let cases: [(&str, &str, &[&str], &[&str]); 9] = [
        (
            "DUE",
            statements::DUE,
            &["'prod'", "30000", "100"],
            &["operations_due"],
        ),
        (
            "DUE_AFTER",
            statements::DUE_AFTER,
            &["'prod'", "30000", "100", "20500", "'acme:prod:wf:20500'"],
            &["operations_due"],
        ),
        (
            "SWEEP",
            statements::SWEEP,
            &["30000", "100", "'sweeper'", "'prod'", "100"],
            &["operations_purgeable", "operations_expiring"],
        ),
        (
            "DUPLICATE",
            statements::DUPLICATE,
            &[
                "'acme'",
                "'tickets.create'",
                "'sha256:00'",
                "0",
                "'acme:prod:wf:1'",
                "'prod'",
            ],
            &["operations_fingerprint"],
        ),
        // A listing reads only the rows of its status, through either index that holds them
        // (the planner weighs the due index's environment against the other's key order).
        (
            "listing pending by environment",
            &list_pending,
            &["'acme'", "'prod'", "'pending'", "100"],
            &["operations_due|operations_by_tenant_status"],
        ),
        (
            "listing the queue by environment",
            &list_pending,
            &["'acme'", "'prod'", "'unknown'", "100"],
            &["operations_by_tenant_status"],
        ),
        // Applied rows are in no listing index (migration 0008): most of the table, read in
        // the listing's key order until the page is full.
        (
            "listing applied records by environment",
            &list_pending,
            &["'acme'", "'prod'", "'applied'", "100"],
            &["operations_pkey"],
        ),
        // No index by tool (migration 0009): the tenant's primary-key range, in key order.
        (
            "listing one tool by environment",
            &list_tool,
            &["'acme'", "'prod'", "'tickets.create'", "100"],
            &["operations_pkey"],
        ),
        // With a status of the queue, its few rows.
        (
            "listing the queue of one tool by environment",
            &list_queue_tool,
            &["'acme'", "'prod'", "'unknown'", "'tickets.create'", "100"],
            &["operations_by_tenant_status"],
        ),
    ];
    for (name, sql, args, indexes) in cases {
        let plan = custom_plan(&client, sql, args).await;
        for index in indexes {
            let found = index.split('|').any(|one| plan.contains(one));
            assert!(found, "{name}: {index}\n{plan}");
        }
        assert!(!plan.contains("Seq Scan"), "{name} scans the table\n{plan}");
        // The scans of the recoverer and the sweeper read their rows in their answer's order
        // and stop at the limit.
        if matches!(name, "DUE" | "DUE_AFTER" | "SWEEP") {
            assert!(!plan.contains("Sort"), "{name} sorts\n{plan}");
            assert!(
                plan.contains("split_part(key, ':'::text, 2) = 'prod'::text"),
                "{name} is not bounded by its environment\n{plan}"
            );
        }
    }
}

/// What a unique call writes besides its two heap tuples is one entry per index that holds its
/// pending row and one per index that holds its applied row. This pins the indexes of
/// `operations`, so that one more on the hot path is a decision, with its measurement, rather
/// than a side effect: the pending row is in the primary key and `operations_due`, the applied
/// row in the primary key and `operations_expiring` (every other index is partial, with a
/// predicate neither row of an ordinary call meets — the fingerprint index holds only calls
/// under a duplicate-intent window, the job indexes only pending jobs and unknown ones:
/// migrations 0003, 0004, 0006, 0008, 0010), and nothing is indexed across tenants or by tool
/// (0009).
#[tokio::test]
async fn the_indexes_a_unique_call_writes() {
    let db = database!();
    drop(db.store().await);
    let client = admin(db.url()).await;
    let rows = client
        .query(
            "SELECT indexname, indexdef FROM pg_indexes
             WHERE schemaname = current_schema() AND tablename = 'operations'
             ORDER BY indexname",
            &[],
        )
        .await
        .unwrap();
    let names: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(
        names,
        [
            "operations_by_job",
            "operations_by_status",
            "operations_by_tenant_status",
            "operations_due",
            "operations_expiring",
            "operations_fingerprint",
            "operations_pkey",
            "operations_purgeable",
            "operations_unknown_by_job",
        ],
        "the indexes of operations changed"
    );
    // Every index but the primary key is partial; of the statuses on a unique call's path,
    // `operations_due` admits the pending row and `operations_expiring` the applied one.
    for row in &rows {
        let (name, def): (String, String) = (row.get(0), row.get(1));
        let predicate = def.split(" WHERE ").nth(1).unwrap_or("");
        match name.as_str() {
            "operations_pkey" => assert!(predicate.is_empty(), "{def}"),
            "operations_due" => assert!(
                predicate.contains("ARRAY['pending'::text, 'awaiting_approval'::text]"),
                "{def}"
            ),
            "operations_expiring" => assert!(
                predicate.contains("ARRAY['applied'::text, 'failed_permanent'::text]"),
                "{def}"
            ),
            _ => assert!(!predicate.is_empty(), "{name} is not partial: {def}"),
        }
    }
}
