//! The harness the `microrep wrap` tests share: a running `microrep wrap` around a real server,
//! its output, its replicas, the leader's port, and the check that nothing is left behind.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

/// One wrapped cluster at a time: three replicas and three servers already fill two cores.
static ONE_CLUSTER: Mutex<()> = Mutex::new(());

pub(crate) fn one_cluster() -> std::sync::MutexGuard<'static, ()> {
    ONE_CLUSTER.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether `server` is missing from `PATH` (saying so: the tests then skip). Under CI, which
/// installs it (scripts/setup.sh), a missing server is a failure instead.
pub(crate) fn server_missing(server: &str) -> bool {
    let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).any(|d| d.join(server).is_file());
    if !found {
        assert!(std::env::var_os("CI").is_none(), "{server} is not installed, and CI must run these tests");
        eprintln!("wrap: SKIPPED: {server} is not installed (scripts/setup.sh installs it)");
    }
    !found
}

/// Builds the shim next to the microrep binary under test (same target directory and profile).
fn shim() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_microrep"));
    let so = exe.with_file_name("libmicrorep_interpose.so");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build.args(["build", "--quiet", "-p", "microrep-interpose"]);
    if exe.parent().and_then(Path::file_name).is_some_and(|p| p == "release") {
        build.arg("--release");
    }
    let status = build.status().expect("run cargo build -p microrep-interpose");
    assert!(status.success() && so.is_file(), "could not build {}", so.display());
    so
}

/// A running `microrep wrap`: SIGTERM and reaped when dropped, even on a failed assertion.
pub(crate) struct Wrap {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
    pub(crate) base_port: u16,
}

impl Wrap {
    /// `microrep wrap --replicas N --base-port B OPTIONS -- SERVER`.
    pub(crate) fn start(replicas: u16, base_port: u16, options: &[&str], server: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_microrep"))
            .args(["wrap", "--replicas", &replicas.to_string(), "--base-port", &base_port.to_string()])
            .args(options)
            .arg("--preload")
            .arg(shim())
            .arg("--")
            .args(server)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run microrep wrap");
        let (tx, lines) = mpsc::channel();
        let forward = |output: Box<dyn Read + Send>, tx: mpsc::Sender<String>| {
            std::thread::spawn(move || {
                for line in BufReader::new(output).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            })
        };
        forward(Box::new(child.stdout.take().expect("stdout")), tx.clone());
        forward(Box::new(child.stderr.take().expect("stderr")), tx);
        Self { child, lines, seen: Vec::new(), base_port }
    }

    pub(crate) fn output(&mut self) -> String {
        self.seen.extend(self.lines.try_iter());
        self.seen.join("\n")
    }

    /// Each replica's (process id, working directory), from the start-up lines, once every
    /// replica started its node and its server.
    pub(crate) fn replicas(&mut self, n: usize) -> Vec<(u32, PathBuf)> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = self.output();
            let started = (0..n).all(|i| text.contains(&format!("replica {i}: server pid ")));
            let found: Vec<(u32, PathBuf)> = (0..n)
                .filter_map(|i| {
                    let line = text.lines().find(|l| l.starts_with(&format!("replica {i}: pid ")))?;
                    let pid = line.split("pid ").nth(1)?.split(',').next()?.parse().ok()?;
                    Some((pid, PathBuf::from(line.split(", dir ").nth(1)?)))
                })
                .collect();
            if started && found.len() == n {
                return found;
            }
            assert!(Instant::now() < deadline, "replicas did not start:\n{text}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn addr(&self, i: usize) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.base_port + i as u16))
    }

    /// The replica among `among` whose server `answers` (followers close client connections).
    pub(crate) fn leader(&mut self, among: &[usize], answers: impl Fn(SocketAddr) -> bool) -> usize {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(&i) = among.iter().find(|&&i| answers(self.addr(i))) {
                return i;
            }
            assert!(Instant::now() < deadline, "no leader served clients within 60 s:\n{}", self.output());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until `microrep wrap` printed a line containing `text`.
    pub(crate) fn wait_for_line(&mut self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.output().contains(text) {
            assert!(Instant::now() < deadline, "no line with {text:?}:\n{}", self.output());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops `microrep wrap` and checks that every replica process it started (restarted ones
    /// included) and its scratch directory are gone.
    pub(crate) fn assert_cleaned_up(mut self, dirs: &[(u32, PathBuf)]) {
        let scratch = dirs[0].1.parent().expect("scratch").to_path_buf();
        let text = self.output();
        let restarted = text.lines().filter_map(|l| l.split(": restarted, pid ").nth(1)?.parse::<u32>().ok());
        let pids: Vec<u32> = dirs.iter().map(|(pid, _)| *pid).chain(restarted).collect();
        drop(self);
        assert!(!scratch.exists(), "microrep wrap left {} behind", scratch.display());
        for pid in pids {
            assert!(!Path::new(&format!("/proc/{pid}")).exists(), "replica process {pid} survived");
        }
    }
}

impl Drop for Wrap {
    fn drop(&mut self) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).expect("pid");
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
