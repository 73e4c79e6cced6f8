//! Log lines written to stderr by a thread of their own.
//!
//! A server logs a line per request and per delivery. Written from the worker threads straight
//! to stderr (which Rust does not buffer), each line was a `write` system call on the request's
//! path. Here the worker formats its line as before, hands the bytes to a bounded queue and
//! goes on; one logging thread writes whatever has queued up with one `write` per batch.
//!
//! Nothing is dropped: when the queue is full, a worker waits for room, as it waited for the
//! `write` before. The thread gathers lines for at most [`GATHER`] after the first of a batch, so
//! a line reaches stderr within about a millisecond. [`Lines::flush`] writes everything queued
//! before it returns; `main` calls it before the process exits.

use std::io::{self, Write};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::time::Duration;

/// Lines waiting for the logging thread, at most; a worker finding it full waits.
const QUEUE: usize = 8192;

/// How long the logging thread gathers lines after the first of a batch before writing them.
const GATHER: Duration = Duration::from_millis(1);

enum Message {
    Line(Vec<u8>),
    /// Write everything before this, then answer.
    Flush(SyncSender<()>),
}

/// The queue to the logging thread; a `MakeWriter` for `tracing_subscriber::fmt`.
#[derive(Clone)]
pub struct Lines {
    queue: Option<SyncSender<Message>>,
}

impl Lines {
    /// Starts the logging thread, writing to stderr. If no thread can be started, lines are
    /// written by their workers, as without it.
    pub fn stderr() -> Lines {
        Lines::to(io::stderr)
    }

    fn to<W: Write + 'static>(out: fn() -> W) -> Lines {
        let (queue, received) = mpsc::sync_channel(QUEUE);
        let started = std::thread::Builder::new()
            .name("idemgate-log".into())
            .spawn(move || write_lines(received, out()));
        Lines {
            queue: started.ok().map(|_| queue),
        }
    }

    /// Returns once every line queued before the call is written and stderr flushed.
    pub fn flush(&self) {
        let Some(queue) = &self.queue else {
            return;
        };
        let (done, written) = mpsc::sync_channel(1);
        if queue.send(Message::Flush(done)).is_ok() {
            let _ = written.recv();
        }
    }

    fn send(&self, line: Vec<u8>) {
        let unsent = match &self.queue {
            Some(queue) => match queue.send(Message::Line(line)) {
                Ok(()) => return,
                // The thread is gone (it panicked): the line is still written.
                Err(mpsc::SendError(Message::Line(line))) => line,
                Err(_) => return,
            },
            None => line,
        };
        let _ = io::stderr().write_all(&unsent);
    }
}

/// The logging thread: a batch is what arrives within [`GATHER`] of its first line, written
/// with as few `write` calls as its size needs, then flushed.
fn write_lines<W: Write>(received: Receiver<Message>, out: W) {
    let mut out = io::BufWriter::with_capacity(64 * 1024, out);
    while let Ok(first) = received.recv() {
        let mut next = Some(first);
        let mut gathered = false;
        loop {
            match next.take() {
                Some(Message::Line(line)) => {
                    let _ = out.write_all(&line);
                }
                Some(Message::Flush(done)) => {
                    let _ = out.flush();
                    let _ = done.send(());
                }
                None if gathered => break,
                None => {
                    std::thread::sleep(GATHER);
                    gathered = true;
                }
            }
            next = next.or_else(|| received.try_recv().ok());
        }
        let _ = out.flush();
    }
    let _ = out.flush();
}

/// One line being formatted; queued when the formatter drops it.
pub struct Line<'a> {
    bytes: Vec<u8>,
    lines: &'a Lines,
}

impl Write for Line<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for Line<'_> {
    fn drop(&mut self) {
        if !self.bytes.is_empty() {
            self.lines.send(std::mem::take(&mut self.bytes));
        }
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Lines {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Line<'a> {
        Line {
            bytes: Vec::new(),
            lines: self,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// What the logging thread wrote, and how many `write` calls it took.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<(Vec<u8>, usize)>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let mut s = self.0.lock().unwrap();
            s.0.extend_from_slice(buf);
            s.1 += 1;
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn lines_into(sink: &Sink) -> Lines {
        let (queue, received) = mpsc::sync_channel(QUEUE);
        let out = sink.clone();
        std::thread::spawn(move || write_lines(received, out));
        Lines { queue: Some(queue) }
    }

    #[test]
    fn every_line_is_written_in_order_by_the_time_flush_returns() {
        let sink = Sink::default();
        let lines = lines_into(&sink);
        let workers: Vec<_> = (0..4)
            .map(|w| {
                let lines = lines.clone();
                std::thread::spawn(move || {
                    for n in 0..5000 {
                        let mut line = tracing_subscriber::fmt::MakeWriter::make_writer(&lines);
                        writeln!(line, "w{w} n{n}").unwrap();
                    }
                })
            })
            .collect();
        workers.into_iter().for_each(|w| w.join().unwrap());
        lines.flush();
        let (bytes, writes) = sink.0.lock().unwrap().clone();
        let text = String::from_utf8(bytes).unwrap();
        for w in 0..4 {
            let numbers: Vec<usize> = text
                .lines()
                .filter_map(|l| l.strip_prefix(&format!("w{w} n")))
                .map(|n| n.parse().unwrap())
                .collect();
            assert_eq!(numbers, (0..5000).collect::<Vec<_>>(), "worker {w}");
        }
        assert_eq!(text.lines().count(), 20_000);
        // Batched: far fewer writes than lines.
        assert!(writes < 20_000 / 10, "{writes} writes for 20,000 lines");
    }
}
