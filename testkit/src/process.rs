//! A child process a test started, signalled by its PID (never by name:
//! other tests' processes, and other people's, run beside it) and waited
//! for with a deadline.

use std::path::PathBuf;
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::wait::poll_until;

/// Longest wait for a process to exit after SIGTERM (a clean shutdown).
pub const STOP_WITHIN: Duration = Duration::from_secs(60);

/// Longest wait for a process to exit after SIGKILL.
pub const KILL_WITHIN: Duration = Duration::from_secs(30);

/// Where a process's stderr (a broker's log) goes.
#[derive(Debug, Clone, Default)]
pub enum Log {
    /// The test's own stderr (shown with the test's output).
    #[default]
    Inherit,
    /// Nowhere.
    Null,
    /// A file, created (or truncated) at start; [`Process::log`] reads it.
    File(PathBuf),
}

impl Log {
    pub(crate) fn stdio(&self) -> Stdio {
        match self {
            Log::Inherit => Stdio::inherit(),
            Log::Null => Stdio::null(),
            Log::File(path) => Stdio::from(
                std::fs::File::create(path)
                    .unwrap_or_else(|e| panic!("creating the log file {}: {e}", path.display())),
            ),
        }
    }
}

/// A running child process. Dropped while running, it is killed
/// (SIGKILL) and reaped.
#[derive(Debug)]
pub struct Process {
    child: Child,
    name: String,
    log: Log,
    /// Set once the process is reaped: its PID is no longer ours to signal.
    status: Option<ExitStatus>,
}

impl Process {
    /// Takes charge of `child`, whose stderr went where `log` says and
    /// whose stdout, if piped, someone drains. `name` names it in panics.
    pub(crate) fn new(child: Child, name: String, log: Log) -> Process {
        Process {
            child,
            name,
            log,
            status: None,
        }
    }

    /// Its name in messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its PID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` to it, by PID. Panics if it was already reaped (its
    /// PID may be another process's by now) or the signal cannot be sent.
    pub fn signal(&self, signal: libc::c_int) {
        assert!(
            self.status.is_none(),
            "{} already exited ({:?}): not signalling its old PID",
            self.name,
            self.status
        );
        // SAFETY: kill(2) with our own child's PID; it has not been
        // reaped, so the PID is still its.
        if unsafe { libc::kill(self.child.id() as libc::pid_t, signal) } != 0 {
            panic!(
                "kill -{signal} {} ({}): {}",
                self.child.id(),
                self.name,
                std::io::Error::last_os_error()
            );
        }
    }

    /// Sends it SIGHUP (a broker reads its certificate files again).
    pub fn hangup(&self) {
        self.signal(libc::SIGHUP);
    }

    /// Stops it where it is (SIGSTOP): it keeps its sockets and answers
    /// nothing until [`Process::resume`].
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Lets a paused process go on (SIGCONT).
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    /// Its exit status if it has exited (reaping it), without waiting.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self
                .child
                .try_wait()
                .unwrap_or_else(|e| panic!("waiting for {}: {e}", self.name));
            if self.status.is_some() {
                remove_faketime_leftovers(self.child.id());
            }
        }
        self.status
    }

    /// Its exit status once it has exited, waiting at most `limit`; `None`
    /// if it is still running then.
    pub fn wait_within(&mut self, limit: Duration) -> Option<ExitStatus> {
        poll_until(Instant::now() + limit, || self.try_wait().ok_or(())).ok()
    }

    /// SIGTERM (and SIGCONT, should it be paused), then waits at most
    /// [`STOP_WITHIN`] for it to exit: its exit status. Panics (after a
    /// SIGKILL) if it does not exit in time.
    pub fn stop(mut self) -> ExitStatus {
        if let Some(status) = self.status {
            return status;
        }
        self.signal(libc::SIGTERM);
        self.signal(libc::SIGCONT);
        match self.wait_within(STOP_WITHIN) {
            Some(status) => status,
            None => {
                self.end();
                panic!(
                    "{} did not exit within {STOP_WITHIN:?} of SIGTERM (killed)",
                    self.name
                );
            }
        }
    }

    /// SIGKILL, then waits at most [`KILL_WITHIN`] for it to exit: its
    /// exit status.
    pub fn kill(mut self) -> ExitStatus {
        self.end()
    }

    /// SIGKILL unless reaped, and reap (at most [`KILL_WITHIN`]).
    pub(crate) fn end(&mut self) -> ExitStatus {
        if self.status.is_none() {
            self.signal(libc::SIGKILL);
        }
        self.wait_within(KILL_WITHIN).unwrap_or_else(|| {
            panic!(
                "{} did not exit within {KILL_WITHIN:?} of SIGKILL",
                self.name
            )
        })
    }

    /// What it logged (its stderr) so far, if that went to a file; empty
    /// otherwise.
    pub fn log(&self) -> String {
        match &self.log {
            Log::File(path) => std::fs::read_to_string(path).unwrap_or_default(),
            Log::Inherit | Log::Null => String::new(),
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.status.is_none() {
            // SAFETY: as in `signal`; errors are ignored (a panic here
            // would abort a test that is already unwinding).
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGKILL) };
            self.status = self.child.wait().ok();
            remove_faketime_leftovers(self.child.id());
        }
    }
}

/// Where libfaketime keeps its per-process files.
const FAKETIME_SHM_DIR: &str = "/dev/shm";

/// libfaketime (the clock-fault tests run a node under it) creates a
/// shared-memory segment and a semaphore per process, named by its PID,
/// and removes them only when the process exits cleanly: every node
/// killed left two files in `/dev/shm`. Called once the process is reaped
/// (the PID was this test's child a moment ago); absent files are fine.
fn remove_faketime_leftovers(pid: u32) {
    for f in faketime_files(pid) {
        let _ = std::fs::remove_file(f);
    }
}

/// The files libfaketime makes for process `pid`.
fn faketime_files(pid: u32) -> [std::path::PathBuf; 2] {
    let dir = std::path::Path::new(FAKETIME_SHM_DIR);
    [
        dir.join(format!("faketime_shm_{pid}")),
        dir.join(format!("sem.faketime_sem_{pid}")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Command;

    fn sleeper() -> Process {
        let child = Command::new("sleep").arg("60").spawn().unwrap();
        Process::new(child, "sleep 60".into(), Log::Null)
    }

    #[test]
    fn paused_then_stopped_by_pid() {
        let mut p = sleeper();
        p.pause();
        assert_eq!(p.wait_within(Duration::from_millis(100)), None);
        p.resume();
        // SIGTERM ends `sleep`; a paused one too (stop sends SIGCONT).
        p.pause();
        let status = p.stop();
        assert_eq!(status.signal(), Some(libc::SIGTERM));
    }

    #[test]
    fn a_reaped_process_leaves_no_faketime_files() {
        let p = sleeper();
        let files = faketime_files(p.pid());
        // What libfaketime would have made for it.
        for f in &files {
            std::fs::write(f, b"").unwrap();
        }
        p.kill();
        for f in &files {
            assert!(!f.exists(), "{} left behind", f.display());
        }
    }

    #[test]
    fn killed_by_pid_and_never_signalled_again() {
        let mut p = sleeper();
        p.signal(libc::SIGKILL);
        let status = p.wait_within(Duration::from_secs(10)).unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        assert_eq!(p.kill().signal(), Some(libc::SIGKILL));
    }
}
