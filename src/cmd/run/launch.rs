//! Starting the command under its watchdog, and the runner's handle on it.

use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use rustix::io::{FdFlags, dup2, fcntl_setfd};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::debug;

use super::watchdog::{HEARTBEAT_FD, Heartbeat, exit_code};

/// A started command: where its deadlines and stop go, and its exit code.
pub(crate) struct Supervised {
    pub heartbeats: mpsc::UnboundedSender<Heartbeat>,
    pub exit: JoinHandle<i32>,
}

/// Starts the command for one leader; tests substitute an in-process one.
pub(crate) trait Launcher: Send + Sync + 'static {
    /// Starts the command with `env` added; it is stopped by `deadline`
    /// unless a later deadline is sent.
    fn start(&self, env: Vec<(&'static str, String)>, deadline: Instant) -> std::io::Result<Supervised>;
}

/// Re-executes this binary as `leasehold __watchdog -- COMMAND…`.
pub(crate) struct WatchdogLauncher {
    pub exe: PathBuf,
    pub command: Vec<String>,
    pub grace: Duration,
}

impl Launcher for WatchdogLauncher {
    fn start(&self, env: Vec<(&'static str, String)>, deadline: Instant) -> std::io::Result<Supervised> {
        let (reader, writer) = std::io::pipe()?;
        let mut watchdog = tokio::process::Command::new(&self.exe);
        watchdog
            .arg("__watchdog")
            .arg("--grace-period")
            .arg(humantime::format_duration(self.grace).to_string())
            .arg("--")
            .args(&self.command)
            .envs(env);
        let fd = reader.as_raw_fd();
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            watchdog.pre_exec(move || {
                // SAFETY: in the child, the pipe's read end is open at `fd`.
                let pipe = BorrowedFd::borrow_raw(fd);
                if fd == HEARTBEAT_FD {
                    // dup2 onto itself would keep close-on-exec set.
                    fcntl_setfd(pipe, FdFlags::empty())?;
                } else {
                    // SAFETY: HEARTBEAT_FD is the watchdog's to own; never
                    // dropped here, so the child's fd stays open across exec.
                    let mut target = ManuallyDrop::new(OwnedFd::from_raw_fd(HEARTBEAT_FD));
                    dup2(pipe, &mut target)?;
                }
                Ok(())
            });
        }
        let mut child = watchdog.spawn()?;
        drop(reader);
        let mut pipe = Some(tokio::net::unix::pipe::Sender::from_owned_fd(OwnedFd::from(writer))?);
        let (heartbeats, mut rx) = mpsc::unbounded_channel();
        // The watchdog starts the command only after this first deadline.
        let _ = heartbeats.send(Heartbeat::Deadline(deadline));
        let exit = tokio::spawn(async move {
            loop {
                tokio::select! {
                    status = child.wait() => return status.map_or(1, exit_code),
                    heartbeat = rx.recv(), if pipe.is_some() => match (heartbeat, pipe.as_mut()) {
                        (Some(heartbeat), Some(writer)) => {
                            if let Err(e) = writer.write_all(heartbeat.encode().as_bytes()).await {
                                debug!(error = %e, "the watchdog's pipe is closed");
                            }
                        }
                        // Closing the pipe tells the watchdog to stop the command.
                        _ => pipe = None,
                    },
                }
            }
        });
        Ok(Supervised { heartbeats, exit })
    }
}
