//! `idemgate token new`: a minted token authenticates with its role at a real `idemgate serve`
//! whose configuration holds exactly the lines the command printed.

mod support;

use serde_json::{Value, json};
use support::{Gateway, config_head, example_contracts, idemgate, invoke_as, key, ops};

/// The token line and the TOML lines (from the first comment on) of a text answer.
fn parse(stdout: &str) -> (String, String) {
    let token = stdout
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("idg_"))
        .expect("a token line")
        .to_string();
    let toml = &stdout[stdout.find("\n# ").expect("the TOML lines") + 1..];
    (token, toml.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minted_token_authenticates_with_its_role() {
    let operator = idemgate(
        None,
        None,
        &[
            "token", "new", "--tenant", "acme", "--role", "operator", "--name", "carol",
        ],
    );
    assert_eq!(operator.code, 0, "{operator:?}");
    let (operator_token, operator_toml) = parse(&operator.stdout);

    // The printed lines parse, and hold the hash, never the token.
    let parsed: toml::Value = toml::from_str(&operator_toml).expect("the printed TOML parses");
    let entry = &parsed["tenants"][0];
    assert_eq!(entry["name"].as_str(), Some("acme"));
    let t = &entry["tokens"][0];
    assert_eq!(t["name"].as_str(), Some("carol"));
    assert_eq!(t["role"].as_str(), Some("operator"));
    assert_eq!(
        t["sha256"].as_str(),
        Some(idemgate_server::auth::hash_token(&operator_token).as_str())
    );
    assert!(!operator_toml.contains(&operator_token));
    assert_eq!(operator_token.len(), 4 + 64, "{operator_token}");

    let agent = idemgate(
        None,
        None,
        &[
            "token", "new", "--tenant", "acme", "--role", "agent", "--name", "dave", "--json",
        ],
    );
    assert_eq!(agent.code, 0, "{agent:?}");
    let agent = agent.json();
    let agent_token = agent["token"].as_str().unwrap().to_string();
    assert_ne!(agent_token, operator_token);
    assert_eq!(agent["role"], "agent");
    // A tenant already configured takes only the token's table.
    let agent_toml = agent["toml"].as_str().unwrap();
    let agent_lines = &agent_toml[agent_toml.find("[[tenants.tokens]]").unwrap()..];

    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "{}\n{operator_toml}\n{agent_lines}",
        config_head(dir.path(), &example_contracts(), true)
    );
    let gateway = Gateway::start(dir, &config);

    // The agent token invokes; the operator token resolves, recorded under its holder's name.
    let workflow = "sandbox-timeout-1";
    let unknown = invoke_as(
        &gateway,
        &agent_token,
        "tickets.set_status",
        workflow,
        "close",
        json!({ "ticket_id": "ticket_1", "status": "solved", "expected_version": 1 }),
    )
    .await;
    assert_eq!(unknown.body["outcome"], "unknown", "{unknown:?}");
    let k = key(workflow, "close");
    let list = ops(&gateway, &operator_token, &["list"]).await;
    assert_eq!(list.code, 0, "{list:?}");
    assert!(list.stdout.contains(&k), "{list:?}");
    let resolve = ops(
        &gateway,
        &operator_token,
        &["reconcile", &k, "--applied", "--reference", "ticket_1@v2"],
    )
    .await;
    assert_eq!(resolve.code, 0, "{resolve:?}");
    assert!(resolve.stdout.contains("by carol"), "{resolve:?}");

    // The agent token is an agent's: operator actions are refused as such.
    let refused = ops(&gateway, &agent_token, &["list"]).await;
    assert_eq!(refused.code, 2, "{refused:?}");
    assert!(refused.stderr.contains("is an agent token"), "{refused:?}");
    // A token minted but never configured is not accepted.
    let stray = idemgate(
        None,
        None,
        &[
            "token", "new", "--tenant", "acme", "--role", "operator", "--name", "eve", "--json",
        ],
    )
    .json();
    let stranger = ops(&gateway, stray["token"].as_str().unwrap(), &["list"]).await;
    assert_eq!(stranger.code, 2, "{stranger:?}");
    assert!(stranger.stderr.contains("401"), "{stranger:?}");
}

#[test]
fn bad_input_is_refused_by_name() {
    for (args, says) in [
        (
            vec!["--tenant", "a:b", "--role", "agent", "--name", "n"],
            "--tenant",
        ),
        (
            vec!["--tenant", "a b", "--role", "agent", "--name", "n"],
            "--tenant",
        ),
        (
            vec!["--tenant", "acme", "--role", "admin", "--name", "n"],
            "admin",
        ),
        (
            vec!["--tenant", "acme", "--role", "agent", "--name", " "],
            "--name",
        ),
        (vec!["--tenant", "acme", "--role", "agent"], "--name"),
    ] {
        let mut all = vec!["token", "new"];
        all.extend(&args);
        let run = idemgate(None, None, &all);
        assert_eq!(run.code, 2, "{args:?}: {run:?}");
        assert!(run.stderr.contains(says), "{args:?}: {run:?}");
        assert!(
            !run.stdout.contains("idg_"),
            "no token for bad input: {run:?}"
        );
    }
}

#[test]
fn names_that_need_quoting_still_give_lines_that_parse() {
    let run = idemgate(
        None,
        None,
        &[
            "token",
            "new",
            "--tenant",
            "acme",
            "--role",
            "agent",
            "--name",
            "O'Brien \"ops\" \\ bot",
        ],
    );
    assert_eq!(run.code, 0, "{run:?}");
    let (_, toml) = parse(&run.stdout);
    let parsed: Value = toml::from_str::<toml::Value>(&toml)
        .map(|v| serde_json::to_value(v).unwrap())
        .expect("the printed TOML parses");
    assert_eq!(
        parsed["tenants"][0]["tokens"][0]["name"],
        "O'Brien \"ops\" \\ bot"
    );
}
