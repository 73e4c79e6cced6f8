//! The history file: one JSON object per line, each an [`Entry`] tagged by `kind`. The runner
//! writes it while the workload runs (clients, the fake downstream and the nemesis append to
//! one [`Recorder`]); the checker reads it back. docs/history.md describes every member.

use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// One line of a history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Entry {
    /// The run's parameters, first line: enough to replay it (`seed`).
    Meta {
        seed: u64,
        settings: serde_json::Value,
    },
    /// A client sends one delivery of an operation.
    Invoke {
        at: u64,
        call: u64,
        client: u32,
        /// `http` (API v1) or `mcp` (`/mcp`, JSON-RPC `tools/call`).
        face: String,
        gateway: u32,
        tool: String,
        key: String,
    },
    /// What came back for `call`. `outcome` is the label (`applied`, `replayed`, `in_flight`,
    /// `rejected`, `unknown`), absent when no answer arrived (`error` says why: a refused
    /// connection, a reset, a client timeout).
    Answer {
        at: u64,
        call: u64,
        key: String,
        outcome: Option<String>,
        reference: Option<String>,
        safe_to_repeat: Option<bool>,
        code: Option<String>,
        error: Option<String>,
    },
    /// A perform request reached the fake downstream (whatever it then did with it).
    Arrival {
        at: u64,
        tool: String,
        key: String,
        /// The fault the fake injected for this request (`none`, `lost`, `error`,
        /// `timeout`, `refuse`, `busy`).
        fault: String,
    },
    /// The fake downstream performed an effect for `key`, named by `reference`.
    Effect {
        at: u64,
        tool: String,
        key: String,
        reference: String,
    },
    /// Something the nemesis did: a gateway killed or started, the database restarted.
    Nemesis { at: u64, what: String },
    /// The operation's record as read after the workload stopped and recovery had time to
    /// act: `outcome` is what a poll of it answers now.
    Final {
        at: u64,
        key: String,
        outcome: Option<String>,
        reference: Option<String>,
        error: Option<String>,
    },
}

/// Appends entries to a history file from many tasks, each line written whole.
#[derive(Clone)]
pub struct Recorder {
    inner: Arc<Mutex<std::io::BufWriter<std::fs::File>>>,
    start: Instant,
}

impl Recorder {
    pub fn create(path: &Path) -> std::io::Result<Recorder> {
        let file = std::fs::File::create(path)?;
        Ok(Recorder {
            inner: Arc::new(Mutex::new(std::io::BufWriter::new(file))),
            start: Instant::now(),
        })
    }

    /// Milliseconds since the run started: the `at` of every entry.
    pub fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    pub fn record(&self, entry: &Entry) {
        let line = serde_json::to_string(entry).expect("an entry serialises");
        let mut out = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        // A history that cannot be written is a failed run: say so loudly.
        writeln!(out, "{line}").expect("writing the history file");
    }

    pub fn flush(&self) {
        let mut out = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        out.flush().expect("flushing the history file");
    }
}

/// Reads a history file; a line that is not an entry is an error naming its number.
pub fn read(path: &Path) -> anyhow::Result<Vec<Entry>> {
    let file = std::fs::File::open(path)
        .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?;
    let mut entries = Vec::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let entry = serde_json::from_str(&line).map_err(|e| {
            anyhow::anyhow!("{}:{}: not a history entry: {e}", path.display(), n + 1)
        })?;
        entries.push(entry);
    }
    Ok(entries)
}

/// Writes entries as a history file (the self-test's mutated copies).
pub fn write(path: &Path, entries: &[Entry]) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for entry in entries {
        writeln!(out, "{}", serde_json::to_string(entry).expect("serialises"))?;
    }
    out.flush()
}
