//! The C and C++ examples, compiled against the checked-in header and the library cargo built
//! for this test run, then run: a replicated counter (against the shared and the static
//! library, and once as installed with its pkg-config file) and a 3-replica key-value cluster
//! that restores a restarted replica from a snapshot.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// A directory removed when the test ends, however it ends.
struct TempDir(PathBuf);

impl TempDir {
    fn new(base: &Path, what: &str) -> Self {
        let dir = base.join(format!("microrep-capi-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a temp dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where libmicrorep.so and .a are, built for this run: the test binary's profile directory
/// (cargo does not build a crate's cdylib and staticlib for its integration tests, so the
/// first caller builds them).
fn lib_dir() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("test binary path");
            let dir = exe.parent().and_then(Path::parent).expect("target profile dir").to_path_buf();
            let target = dir.parent().expect("target dir");
            let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
            cargo.args(["build", "--quiet", "-p", "microrep-capi", "--target-dir"]).arg(target);
            if dir.file_name().is_some_and(|n| n == "release") {
                cargo.arg("--release");
            }
            run(&mut cargo);
            dir
        })
        .clone()
}

/// Runs `cmd` to completion and returns its stdout; fails the test with its output if it fails.
fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?} failed ({}):\n{stdout}\n{stderr}", out.status);
    stdout.into_owned()
}

/// Compiles `example` with `compiler` and `flags` into `dir`, runs it (bounded by `timeout`)
/// on a fresh shm directory, and returns its output.
fn build_and_run(compiler: &str, std: &str, example: &str, flags: &[String], dir: &Path) -> String {
    let exe = dir.join(example.replace('.', "-"));
    let source = crate_dir().join("examples").join(example);
    let mut cc = Command::new(compiler);
    cc.args([std, "-Wall", "-Wextra", "-Werror", "-o"]).arg(&exe).arg(&source).args(flags);
    run(&mut cc);
    // Named after `dir`: each test's cluster has a directory of its own.
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let shm = TempDir::new(Path::new("/dev/shm"), &name);
    run(Command::new("timeout").arg("120").arg(&exe).arg(&shm.0))
}

fn shared_flags() -> Vec<String> {
    let lib = lib_dir();
    let include = crate_dir().join("include");
    vec![
        format!("-I{}", include.display()),
        format!("-L{}", lib.display()),
        "-lmicrorep".into(),
        format!("-Wl,-rpath,{}", lib.display()),
    ]
}

fn compiler(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.into())
}

fn assert_counter_output(out: &str) {
    let expected = "counter: 100 proposals committed, total 5050\n\
                    counter: 10 submissions polled to commit, total 5060\n\
                    counter: a follower says MICROREP_NOT_LEADER: not the leader\n\
                    counter: every replica at 5060\n\
                    counter: nodes stopped, user contexts released\n";
    assert_eq!(out, expected);
}

#[test]
fn the_c_counter_replicates_through_the_shared_library() {
    let dir = TempDir::new(&std::env::temp_dir(), "counter-shared");
    let out = build_and_run(&compiler("CC", "cc"), "-std=c11", "counter.c", &shared_flags(), &dir.0);
    assert_counter_output(&out);
}

#[test]
fn the_c_counter_replicates_through_the_static_library() {
    let dir = TempDir::new(&std::env::temp_dir(), "counter-static");
    let include = crate_dir().join("include");
    let mut flags = vec![format!("-I{}", include.display()), lib_dir().join("libmicrorep.a").display().to_string()];
    // What rustc says a static library of this crate needs (`--print native-static-libs`).
    flags.extend(["-lgcc_s", "-lutil", "-lrt", "-lpthread", "-lm", "-ldl", "-lc"].map(String::from));
    let out = build_and_run(&compiler("CC", "cc"), "-std=c11", "counter.c", &flags, &dir.0);
    assert_counter_output(&out);
    let exe = dir.0.join("counter-c");
    let needed = run(Command::new("ldd").arg(&exe));
    assert!(!needed.contains("libmicrorep"), "linked statically, yet: {needed}");
}

#[test]
fn the_cpp_cluster_follows_the_leader_and_restores_a_restarted_replica() {
    let dir = TempDir::new(&std::env::temp_dir(), "cluster");
    let out = build_and_run(&compiler("CXX", "c++"), "-std=c++17", "cluster.cpp", &shared_flags(), &dir.0);
    let expected = "cluster: bad setting: MICROREP_CONFIG: invalid configuration: (toml): TOML parse error";
    assert!(out.starts_with(expected), "{out}");
    let rest: Vec<&str> = out.lines().skip_while(|l| !l.starts_with("cluster: GET")).collect();
    assert_eq!(
        rest,
        [
            "cluster: GET k7 -> v7",
            "cluster: oversized command: MICROREP_TOO_LARGE",
            "cluster: restarted replica holds 250 keys, restored from a snapshot",
            "cluster: replicas 0 and 2 agree",
            "cluster: stopped",
        ]
    );
}

#[test]
fn an_installed_library_builds_the_counter_through_pkg_config() {
    let prefix = TempDir::new(&std::env::temp_dir(), "install");
    let script = crate_dir().join("../../scripts/capi-install.sh");
    run(Command::new(script).arg("--prefix").arg(&prefix.0).arg("--lib-dir").arg(lib_dir()));
    for f in ["lib/libmicrorep.so", "lib/libmicrorep.a", "include/microrep.h", "lib/pkgconfig/microrep.pc"] {
        assert!(prefix.0.join(f).is_file(), "{f} not installed");
    }
    let pc = prefix.0.join("lib/pkgconfig");
    let flags = run(Command::new("pkg-config").env("PKG_CONFIG_PATH", &pc).args(["--cflags", "--libs", "microrep"]));
    let version = run(Command::new("pkg-config").env("PKG_CONFIG_PATH", &pc).args(["--modversion", "microrep"]));
    assert_eq!(version.trim(), env!("CARGO_PKG_VERSION"));
    let mut flags: Vec<String> = flags.split_whitespace().map(String::from).collect();
    flags.push(format!("-Wl,-rpath,{}", prefix.0.join("lib").display()));
    let dir = TempDir::new(&std::env::temp_dir(), "counter-installed");
    let out = build_and_run(&compiler("CC", "cc"), "-std=c11", "counter.c", &flags, &dir.0);
    assert_counter_output(&out);
}
