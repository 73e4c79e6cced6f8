//! Publishes one job envelope to a JetStream subject, as a producer would — twice, the way a
//! retried producer or a lost publish acknowledgement does. The consumer turns both into one
//! operation.
//!
//! ```text
//! cargo run -p idemgate-queue --example publish_job -- SUBJECT WORKFLOW_ID STEP_ID TOOL 'ARGUMENTS-JSON'
//! ```
//!
//! NATS is read from `IDEMGATE_NATS_URL` (default `nats://127.0.0.1:4222`).

use idemgate_queue::Envelope;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [subject, workflow_id, step_id, tool, arguments] = args.as_slice() else {
        eprintln!("usage: publish_job SUBJECT WORKFLOW_ID STEP_ID TOOL 'ARGUMENTS-JSON'");
        std::process::exit(2);
    };
    let envelope = Envelope {
        workflow_id: workflow_id.clone(),
        step_id: step_id.clone(),
        tool: tool.clone(),
        arguments: serde_json::from_str(arguments)?,
        actor: Some("publish_job example".into()),
    };
    let url = std::env::var("IDEMGATE_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let js = async_nats::jetstream::new(async_nats::connect(url.as_str()).await?);
    for _ in 0..2 {
        let ack = js
            .publish(subject.clone(), envelope.to_bytes().into())
            .await?
            .await?;
        println!(
            "published to stream {} as message {}",
            ack.stream, ack.sequence
        );
    }
    Ok(())
}
