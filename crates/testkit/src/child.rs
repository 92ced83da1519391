//! One child process held by a guard: stopped (SIGTERM, then SIGKILL after a grace) and reaped
//! when dropped, and registered in [`PidRegistry::global`] meanwhile so the signal handler of
//! [`crate::cleanup::clean_up_on_signals`] kills it too.

use std::io::BufRead;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

use crate::KitError;
use crate::cleanup::PidRegistry;

/// How often [`terminate`] looks whether the child has exited.
const EXIT_POLL: Duration = Duration::from_millis(10);

/// A command for `program` whose process the kernel SIGKILLs when the thread that spawns it
/// ends (`PR_SET_PDEATHSIG`), so a child survives no crash of its parent, even a SIGKILL that
/// runs no cleanup. Spawn it from a thread that outlives the child (`main`, typically).
pub fn command_dying_with_parent(program: &Path) -> Command {
    let parent = rustix::process::getpid();
    let mut command = Command::new(program);
    // SAFETY: the closure runs in the forked child before exec and only makes two system calls
    // (prctl, getppid), both async-signal-safe; it allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
            // The parent may have died before the prctl: then nobody would send the signal.
            if rustix::process::getppid() != Some(parent) {
                return Err(std::io::Error::other("the parent exited before the child started"));
            }
            Ok(())
        });
    }
    command
}

/// Stops `child`: SIGTERM (and SIGCONT, so a stopped child sees it), then SIGKILL if it has not
/// exited within `grace`; reaps it either way. A zero grace SIGKILLs at once.
pub fn terminate(child: &mut Child, grace: Duration) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    if !grace.is_zero() {
        if let Some(pid) = Pid::from_raw(child.id() as i32) {
            // It may have exited since try_wait: then there is nothing to signal.
            let _ = kill_process(pid, Signal::TERM);
            let _ = kill_process(pid, Signal::CONT);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(EXIT_POLL);
        }
    }
    // Already gone is fine; the wait reaps it whatever happened.
    let _ = child.kill();
    let _ = child.wait();
}

/// A child process that is terminated (see [`terminate`]) and reaped when dropped.
#[derive(Debug)]
pub struct Guarded {
    child: Child,
    grace: Duration,
}

impl Guarded {
    /// Spawns `command`; dropping the guard gives the child `grace` to exit after SIGTERM.
    pub fn spawn(command: &mut Command, grace: Duration) -> Result<Self, KitError> {
        let child = command.spawn().map_err(|source| KitError::Spawn {
            program: command.get_program().to_string_lossy().into_owned(),
            source,
        })?;
        PidRegistry::global().add(child.id() as i32);
        Ok(Self { child, grace })
    }

    /// The child (to take its pipes, signal it, or wait for it).
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Sends each line the child writes to stdout (which must be piped) to `lines`, tagged
    /// with `id`, from a thread that ends with the child's stdout.
    pub fn forward_lines(&mut self, id: u16, lines: &Sender<(u16, String)>) -> Result<(), KitError> {
        let stdout = self.child.stdout.take().ok_or_else(|| KitError::Spawn {
            program: format!("process {id}"),
            source: std::io::Error::other("stdout is not piped"),
        })?;
        let tx = lines.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send((id, line)).is_err() {
                    break;
                }
            }
        });
        Ok(())
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        terminate(&mut self.child, self.grace);
        PidRegistry::global().remove(self.child.id() as i32);
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;

    use super::*;

    #[test]
    fn a_guarded_child_is_terminated_and_reaped_when_dropped() {
        let mut guarded = Guarded::spawn(Command::new("sleep").arg("30"), Duration::from_secs(10)).expect("sleep");
        let pid = guarded.child().id() as i32;
        assert!(PidRegistry::global().contains(pid));
        drop(guarded);
        assert!(!PidRegistry::global().contains(pid), "unregistered");
        let gone = rustix::process::test_kill_process(Pid::from_raw(pid).expect("pid"));
        assert!(gone.is_err(), "the child was reaped (its pid no longer exists)");
    }

    #[test]
    fn terminate_stops_a_stopped_child_with_sigterm() {
        let mut child = Command::new("sleep").arg("30").spawn().expect("sleep");
        kill_process(Pid::from_raw(child.id() as i32).expect("pid"), Signal::STOP).expect("SIGSTOP");
        terminate(&mut child, Duration::from_secs(30));
        assert_eq!(child.wait().expect("reaped").signal(), Some(Signal::TERM.as_raw()), "SIGTERM, not SIGKILL");
    }

    #[test]
    fn forwarded_lines_are_tagged() {
        let mut command = Command::new("printf");
        command.arg("one\\ntwo\\n").stdout(Stdio::piped());
        let mut guarded = Guarded::spawn(&mut command, Duration::ZERO).expect("printf");
        let (tx, rx) = std::sync::mpsc::channel();
        guarded.forward_lines(7, &tx).expect("piped");
        drop(tx);
        let lines: Vec<(u16, String)> = rx.iter().collect();
        assert_eq!(lines, [(7, "one".to_string()), (7, "two".to_string())]);
    }

    #[test]
    fn a_child_dying_with_its_parent_starts_normally() {
        let mut child = command_dying_with_parent(Path::new("true")).spawn().expect("true");
        assert!(child.wait().expect("exit").success());
    }
}
