//! `tinygpt` started in the background and followed line by line, so that a test acts when the
//! process has reached a state it prints (a step taken, a file written), never after a guessed
//! time: CI's two cores are busy with other tests, and a process may take seconds to start.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;

/// A running `tinygpt` whose standard output has been read up to a line the test waited for;
/// the rest is drained in the background so the process never blocks on a full pipe.
pub struct Watched {
    child: Child,
    /// The lines read before (and including) the one waited for.
    pub seen: Vec<String>,
    rest: Option<JoinHandle<Vec<String>>>,
    stderr: Option<JoinHandle<String>>,
}

impl Watched {
    /// `tinygpt args` in `dir`, once it prints a line for which `until` holds. A process that
    /// ends first fails the test with what it printed.
    pub fn start_until(dir: &Path, args: &[&str], until: impl Fn(&str) -> bool) -> Self {
        Self::spawn_until(super::command(dir, args), until)
    }

    /// `command` (a `tinygpt`, or a launcher of several), once it prints a line for which
    /// `until` holds.
    pub fn spawn_until(mut command: Command, until: impl Fn(&str) -> bool) -> Self {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the binary runs");
        let err = BufReader::new(child.stderr.take().unwrap());
        let stderr = std::thread::spawn(move || {
            err.lines()
                .map_while(Result::ok)
                .map(|l| l + "\n")
                .collect()
        });
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut seen = Vec::new();
        let mut reached = false;
        for line in lines.by_ref().map_while(Result::ok) {
            reached = until(&line);
            seen.push(line);
            if reached {
                break;
            }
        }
        if !reached {
            let status = child.wait().unwrap();
            let err = stderr.join().unwrap();
            panic!("{command:?} ended ({status}) before the line waited for:\n{seen:#?}\n{err}");
        }
        let rest = std::thread::spawn(move || lines.map_while(Result::ok).collect());
        Self {
            child,
            seen,
            rest: Some(rest),
            stderr: Some(stderr),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (`INT`, as Ctrl-C does, `TERM`, `KILL`).
    pub fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -{signal}");
    }

    /// Waits for the process to end: its exit code, every line it printed to standard output,
    /// and its standard error.
    pub fn wait(mut self) -> (Option<i32>, Vec<String>, String) {
        let code = self.child.wait().unwrap().code();
        let mut lines = std::mem::take(&mut self.seen);
        lines.extend(self.rest.take().unwrap().join().unwrap());
        let err = self.stderr.take().unwrap().join().unwrap();
        (code, lines, err)
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
