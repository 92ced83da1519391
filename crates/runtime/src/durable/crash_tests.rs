//! Crash consistency in the style of ALICE and CrashMonkey: the writer runs over a disk that
//! records its operations (create, write, fdatasync, directory fsync, remove); every prefix of
//! that trace is a crash point, and at each one the file system may have persisted any part of
//! what was not synced yet: a prefix of the last write (a torn record), its blocks in any order,
//! with garbage or zeros where nothing landed, file lengths before or after, directory entries
//! created or removed since the last directory fsync or not. Each such state is written to a
//! real directory and recovered with the real code, which must never fail, never lose a record
//! that was synced when the crash came, and never return a byte that was not written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use microrep_core::mu::{Configuration, MemberSet};

use super::disk::Disk;
use super::record::Kind;
use super::recover::{self, segment_name};
use super::writer::{Message, Writer};
use super::{DurableError, Recovered};

/// One operation of the trace; files are named by inode, as the writer's handles are.
#[derive(Clone, Debug)]
enum Op {
    Create(String, usize),
    Write { inode: usize, offset: u64, data: Vec<u8> },
    SyncData(usize),
    SyncDir,
    Rename(String, String),
    Remove(String),
}

/// The trace so far, and the inode each name holds now.
type Trace = (Vec<Op>, BTreeMap<String, usize>);

/// A disk that records every operation.
#[derive(Clone, Default)]
struct Recording(Arc<Mutex<Trace>>);

impl Recording {
    fn push(&self, op: Op) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).0.push(op);
    }

    fn ops(&self) -> Vec<Op> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).0.clone()
    }
}

impl Disk for Recording {
    type File = usize;

    fn create(&mut self, name: &str) -> std::io::Result<usize> {
        let mut inner = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let inode = inner.0.len();
        inner.1.insert(name.into(), inode);
        inner.0.push(Op::Create(name.into(), inode));
        Ok(inode)
    }
    fn open(&mut self, name: &str) -> std::io::Result<usize> {
        let inner = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        inner.1.get(name).copied().ok_or_else(|| std::io::ErrorKind::NotFound.into())
    }
    fn write_at(&mut self, file: &mut usize, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.push(Op::Write { inode: *file, offset, data: data.to_vec() });
        Ok(())
    }
    fn sync_data(&mut self, file: &mut usize) -> std::io::Result<()> {
        self.push(Op::SyncData(*file));
        Ok(())
    }
    fn sync_dir(&mut self) -> std::io::Result<()> {
        self.push(Op::SyncDir);
        Ok(())
    }
    fn rename(&mut self, from: &str, to: &str) -> std::io::Result<()> {
        let mut inner = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let inode = inner.1.remove(from).ok_or(std::io::ErrorKind::NotFound)?;
        inner.1.insert(to.into(), inode);
        inner.0.push(Op::Rename(from.into(), to.into()));
        Ok(())
    }
    fn remove(&mut self, name: &str) -> std::io::Result<()> {
        let mut inner = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        inner.1.remove(name);
        inner.0.push(Op::Remove(name.into()));
        Ok(())
    }
}

/// splitmix64: the test's only randomness, from a fixed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn payload(index: u64) -> Vec<u8> {
    let len = (index * 37 % 150) as usize;
    (0..len).map(|i| (index as u8).wrapping_mul(31).wrapping_add(i as u8)).collect()
}

fn state(index: u64) -> Vec<u8> {
    format!("state after {index} entries").into_bytes()
}

/// The configuration as of `index`: every membership record (`is_membership`) makes a new one.
fn configuration(index: u64) -> Configuration {
    let epoch = (0..index).filter(|&i| is_membership(i)).count() as u64;
    Configuration { members: MemberSet::first(3 + (epoch % 2) as u16), epoch }
}

fn is_membership(index: u64) -> bool {
    index % 11 == 6
}

/// What the log holds at `index`: a skipped entry, a membership change (the configuration it
/// leaves) or a command.
fn record_at(index: u64) -> (Kind, Vec<u8>) {
    if index % 9 == 4 {
        (Kind::Skip, Vec::new())
    } else if is_membership(index) {
        (Kind::Membership, configuration(index + 1).to_bytes().to_vec())
    } else {
        (Kind::Entry, payload(index))
    }
}

/// A checkpoint's payload at `index`: the configuration, then the state.
fn checkpoint(index: u64) -> Vec<u8> {
    [&configuration(index).to_bytes()[..], &state(index)].concat()
}

/// What the workload wrote: the trace, and after how many operations each durable index was
/// published.
struct Workload {
    ops: Vec<Op>,
    published: Vec<(usize, u64)>,
}

/// Entries 0..60 (every eleventh from 6 a membership change) in group commits of 1 to 6
/// messages, a checkpoint after 17 entries, one after
/// 40 taken once 43 were logged (the application applies behind the log), and a restored
/// snapshot that jumps from 50 to 53.
fn workload() -> Workload {
    let disk = Recording::default();
    let mut writer = Writer::create(disk.clone(), 0, &checkpoint(0)).expect("create");
    let mut rng = Rng(19);
    let mut messages = Vec::new();
    let mut index = 0;
    while index < 60 {
        if index == 50 {
            index = 53;
            messages.push(Message::Checkpoint { index, payload: checkpoint(index) });
        }
        if index == 17 {
            messages.push(Message::Checkpoint { index, payload: checkpoint(index) });
        }
        if index == 43 {
            messages.push(Message::Checkpoint { index: 40, payload: checkpoint(40) });
        }
        let (kind, payload) = record_at(index);
        messages.push(Message::Entry { index, kind, payload });
        index += 1;
    }
    let mut published = vec![(disk.ops().len(), 0)];
    let mut queue = messages.into_iter().peekable();
    while queue.peek().is_some() {
        let take = 1 + rng.below(6) as usize;
        let batch: Vec<Message> = queue.by_ref().take(take).collect();
        let durable = writer.write(batch).expect("write");
        published.push((disk.ops().len(), durable));
    }
    Workload { ops: disk.ops(), published }
}

/// One file as the crash left it.
#[derive(Clone, Default)]
struct FileState {
    synced: Vec<u8>,
    latest: Vec<u8>,
}

/// The state at a crash point: every file's synced and latest content (by inode), the
/// directory as of the last directory fsync, and the directory operations since, which a
/// journaling file system persists in order (any prefix of them may have landed).
struct Replayed {
    files: Vec<FileState>,
    synced_dir: BTreeMap<String, usize>,
    pending: Vec<Op>,
}

impl Replayed {
    fn new(ops: &[Op]) -> Self {
        let mut files = vec![FileState::default(); ops.len()];
        let (mut dir, mut synced_dir, mut pending) = (BTreeMap::new(), BTreeMap::new(), Vec::new());
        for op in ops {
            match op {
                Op::Create(..) | Op::Rename(..) | Op::Remove(..) => {
                    apply_dir(&mut dir, op);
                    pending.push(op.clone());
                }
                Op::Write { inode, offset, data } => {
                    let f = &mut files[*inode];
                    let end = *offset as usize + data.len();
                    if f.latest.len() < end {
                        f.latest.resize(end, 0);
                    }
                    f.latest[*offset as usize..end].copy_from_slice(data);
                }
                Op::SyncData(inode) => files[*inode].synced = files[*inode].latest.clone(),
                Op::SyncDir => {
                    synced_dir = dir.clone();
                    pending.clear();
                }
            }
        }
        Self { files, synced_dir, pending }
    }

    /// The directory if the first `landed` pending operations reached the disk.
    fn dir(&self, landed: usize) -> BTreeMap<String, usize> {
        let mut dir = self.synced_dir.clone();
        self.pending[..landed].iter().for_each(|op| apply_dir(&mut dir, op));
        dir
    }
}

fn apply_dir(dir: &mut BTreeMap<String, usize>, op: &Op) {
    match op {
        Op::Create(name, inode) => drop(dir.insert(name.clone(), *inode)),
        Op::Rename(from, to) => {
            if let Some(inode) = dir.remove(from) {
                dir.insert(to.clone(), inode);
            }
        }
        Op::Remove(name) => drop(dir.remove(name)),
        Op::Write { .. } | Op::SyncData(_) | Op::SyncDir => {}
    }
}

const BLOCK: usize = 64;

/// Which unsynced blocks landed, whether the others hold garbage (or zeros), and whether the
/// file has its latest length (or its synced one).
type Variant = (Box<dyn Fn(usize) -> bool>, bool, bool);

/// The content a crash may leave of `f`: the synced bytes, and of the rest the blocks `keep`
/// chooses; a block not kept holds zeros or `garbage`; the length is the synced one or the
/// latest.
fn crashed(f: &FileState, keep: &dyn Fn(usize) -> bool, garbage: bool, long: bool) -> Vec<u8> {
    let mut out = if long { f.latest.clone() } else { f.latest[..f.synced.len().min(f.latest.len())].to_vec() };
    for block in (f.synced.len() / BLOCK)..out.len().div_ceil(BLOCK) {
        let range = (block * BLOCK).max(f.synced.len())..((block + 1) * BLOCK).min(out.len());
        if !keep(block) {
            for (i, byte) in out[range.clone()].iter_mut().enumerate() {
                *byte = if garbage { (range.start + i) as u8 ^ 0xA5 } else { 0 };
            }
        }
    }
    out
}

fn materialize(dir: &Path, files: &BTreeMap<String, Vec<u8>>) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("crash state directory");
    for (name, content) in files {
        std::fs::write(dir.join(name), content).expect("crash state file");
    }
}

/// Recovery of a crash state must hold every entry published durable and nothing else.
fn check(dir: &Path, durable: u64, what: &str) {
    let recovered: Recovered = match recover::recover(dir) {
        Ok(Some(r)) => r,
        Ok(None) if durable == 0 => return,
        Ok(None) => panic!("{what}: nothing recovered, {durable} was synced"),
        Err(e) => panic!("{what}: recovery failed: {e}"),
    };
    assert!(recovered.end() >= durable, "{what}: recovered up to {}, {durable} was synced", recovered.end());
    assert_eq!(recovered.state, state(recovered.checkpoint), "{what}: checkpoint {}", recovered.checkpoint);
    assert_eq!(recovered.configuration, Some(configuration(recovered.checkpoint)), "{what}: checkpoint configuration");
    for (i, (kind, bytes)) in recovered.entries.iter().enumerate() {
        let index = recovered.checkpoint + i as u64;
        assert_eq!((*kind, bytes.clone()), record_at(index), "{what}: entry {index}");
    }
}

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("microrep-durable-{name}-{}", std::process::id()))
}

#[test]
fn recovery_from_every_crash_state_keeps_every_synced_record_and_accepts_no_damaged_one() {
    let w = workload();
    let dir = scratch("crash");
    let mut rng = Rng(7);
    let mut states = 0;
    for k in 1..=w.ops.len() {
        let durable = w.published.iter().filter(|&&(at, _)| at <= k).map(|&(_, d)| d).max().unwrap_or(0);
        let replayed = Replayed::new(&w.ops[..k]);
        for landed in 0..=replayed.pending.len() {
            let names = replayed.dir(landed);
            // Content outcomes: whole, nothing, random subsets of the unsynced blocks
            // (reordered), over zeros or garbage.
            let mut variants: Vec<Variant> =
                vec![(Box::new(|_| true), false, true), (Box::new(|_| false), false, false)];
            for garbage in [false, true] {
                for _ in 0..6 {
                    let seed = rng.next();
                    variants.push((Box::new(move |b| (seed >> (b % 64)) & 1 == 1), garbage, true));
                }
            }
            for (keep, garbage, long) in &variants {
                let content: BTreeMap<String, Vec<u8>> = names
                    .iter()
                    .map(|(n, &inode)| (n.clone(), crashed(&replayed.files[inode], keep.as_ref(), *garbage, *long)))
                    .collect();
                materialize(&dir, &content);
                check(&dir, durable, &format!("crash after op {k}, {landed} directory operations landed"));
                states += 1;
            }
            // Every 8-byte prefix of each file's unsynced bytes (a torn write, in order).
            for (name, &inode) in &names {
                let f = &replayed.files[inode];
                for cut in (f.synced.len()..f.latest.len()).step_by(8) {
                    let mut content: BTreeMap<String, Vec<u8>> =
                        names.iter().map(|(n, &i)| (n.clone(), replayed.files[i].synced.clone())).collect();
                    content.insert(name.clone(), f.latest[..cut].to_vec());
                    materialize(&dir, &content);
                    check(&dir, durable, &format!("crash after op {k}, {name} torn at {cut}"));
                    states += 1;
                }
            }
        }
    }
    assert!(states > 1_000, "only {states} crash states");
    std::fs::remove_dir_all(&dir).expect("clean up");
}

/// Everything synced, then one byte of a synced record flipped: an error naming the file and
/// the offset (a later write follows it), never a silent truncation.
#[test]
fn a_damaged_synced_record_followed_by_later_writes_is_an_error_naming_file_and_offset() {
    let w = workload();
    let replayed = Replayed::new(&w.ops);
    let files: BTreeMap<String, Vec<u8>> =
        replayed.dir(0).into_iter().map(|(n, inode)| (n, replayed.files[inode].synced.clone())).collect();
    let newest = files.keys().rfind(|n| n.ends_with(".log")).expect("a segment").clone();
    let content = &files[&newest];
    // Every record but those of the last write (a damaged one of those is a torn tail).
    let mut records = Vec::new();
    let mut at = 0;
    while let Ok(r) = super::record::decode(content, at) {
        records.push((at, r.batch));
        at += r.len;
    }
    let last_write = records.last().expect("records").1;
    let dir = scratch("damaged");
    for &(record, _) in records.iter().skip(1).filter(|&&(at, _)| at < last_write) {
        let mut damaged = files.clone();
        damaged.get_mut(&newest).expect("newest")[record as usize + 16] ^= 0x10;
        materialize(&dir, &damaged);
        match recover::recover(&dir) {
            Err(DurableError::Corrupt { path, offset, .. }) => {
                assert_eq!((path, offset), (dir.join(&newest), record));
            }
            other => panic!("record at {record} damaged: {other:?}"),
        }
        let after = std::fs::read(dir.join(&newest)).expect("still there");
        assert_eq!(after, damaged[&newest], "the damaged file was left as it was");
    }
    // A damaged checkpoint with no older segment to fall back on.
    let only = segment_name(53);
    let mut damaged: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut bytes = files[&only].clone();
    bytes[45] ^= 1;
    damaged.insert(only.clone(), bytes);
    materialize(&dir, &damaged);
    assert!(
        matches!(recover::recover(&dir), Err(DurableError::Corrupt { offset: 0, ref path, .. }) if *path == dir.join(&only))
    );
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn a_log_written_before_logs_held_configurations_recovers_with_the_initial_one() {
    let dir = scratch("initial-checkpoint");
    let mut bytes = Vec::new();
    super::record::encode(Kind::InitialCheckpoint, 0, b"old state", 0, 0, &mut bytes);
    let at = bytes.len() as u64;
    super::record::encode(Kind::Entry, 0, b"set x 1", at, at, &mut bytes);
    materialize(&dir, &BTreeMap::from([(segment_name(0), bytes)]));
    let recovered = recover::recover(&dir).expect("recovers").expect("a segment");
    assert_eq!((recovered.configuration, &recovered.state[..]), (None, &b"old state"[..]));
    assert_eq!(recovered.entries, vec![(Kind::Entry, b"set x 1".to_vec())]);
    // A membership record whose configuration names no member is damage, not a change.
    let mut bytes = Vec::new();
    super::record::encode(Kind::Checkpoint, 0, &checkpoint(0), 0, 0, &mut bytes);
    let at = bytes.len() as u64;
    super::record::encode(Kind::Membership, 0, &[0u8; Configuration::BYTES], at, at, &mut bytes);
    materialize(&dir, &BTreeMap::from([(segment_name(0), bytes)]));
    assert!(matches!(recover::recover(&dir), Err(DurableError::Corrupt { offset, .. }) if offset == at));
    std::fs::remove_dir_all(&dir).expect("clean up");
}
