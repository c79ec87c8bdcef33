//! The controller's durable Raft state, in `<data_dir>/raft/`:
//!
//! ```text
//! log        append-only records: [len u32 LE][crc32c u32 LE][rkyv WEntry]
//! vote       the last vote (rkyv WVote), replaced atomically
//! committed  how far the log is known committed (a hint, not fdatasync'd)
//! purged     the last purged log id (rkyv Option<WLogId>), replaced atomically
//! snapshot   the last snapshot (rkyv StoredSnapshot), replaced atomically
//! ```
//!
//! Every append is fdatasync'd before openraft is told it is stored, and
//! a vote is on disk before it is answered. "Replaced atomically" is:
//! write a temporary file, fdatasync it, rename it over, fsync the
//! directory. Recovery reads the log up to the first short or corrupt
//! record and cuts the file there (a torn tail is an append that was never
//! acknowledged). The metadata log is small, so the entries also live in
//! memory; a purge rewrites the file without the purged prefix once that
//! prefix is most of it.
//!
//! The state machine is in memory and rebuilt on start from the snapshot
//! plus the log entries after it (openraft re-applies them).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    AnyError, EntryPayload, LogId, RaftLogReader, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership, Vote,
};
use rkyv::{Archive, Deserialize, Serialize};
use tokio::sync::watch;

use super::{Entry, TypeConfig};
use crate::error::Error;
use crate::meta::{ClusterState, Outcome};
use crate::wire::{decode, encode, WEntry, WLogId, WSnapshotMeta, WVote};

type Node = openraft::BasicNode;

fn any(e: impl std::fmt::Display) -> AnyError {
    AnyError::error(e.to_string())
}

/// Writes `bytes` to `dir/name` atomically and durably (the project's
/// checkpoint writer: temporary file, fsync, rename, directory fsync).
fn replace_file(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    weir_storage::checkpoint::write_atomic(dir, name, bytes).map_err(std::io::Error::other)
}

fn read_optional(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// An [`Error::Corrupt`] maker for `map_err`.
fn corrupt(path: &Path) -> impl FnOnce(String) -> Error {
    let path = path.to_path_buf();
    move |message| Error::Corrupt { path, message }
}

const RECORD_HEADER: usize = 8;

/// Log entries by index, each with the file offset its record starts at.
type Entries = BTreeMap<u64, (Entry, u64)>;

fn record(entry: &Entry) -> Vec<u8> {
    let body = encode(&WEntry::from(entry));
    let mut out = Vec::with_capacity(RECORD_HEADER + body.len());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// The Raft log and vote on disk, entries cached in memory.
pub struct LogStore {
    dir: PathBuf,
    file: File,
    /// Entries by index, and the file offset each record starts at
    /// (shared with the readers replication uses).
    entries: Arc<Mutex<Entries>>,
    /// File length (the end of the last good record).
    len: u64,
    /// Offset of the first record still needed (records before it are purged).
    purged_offset: u64,
    vote: Option<Vote<u64>>,
    purged: Option<LogId<u64>>,
}

/// The format of the Raft directory (log records, vote, snapshot: the rkyv
/// layout of `wire` and `meta`), in its `format` file. 1: the first
/// cluster build (no file); 2: per-core replication ports and
/// `AlterPartition`; 3: partition reassignments (`ReassignPartition`, a
/// partition's target replicas); 4: users, ACLs and quotas
/// (`ClusterState::security` and four commands after the others); 5:
/// tiered storage's remote log metadata (`ClusterState::remote` and four
/// commands after the others). A format-3 or -4 directory is migrated in
/// place ([`migrate`]).
pub const FORMAT: u32 = 5;

/// `size_of::<ArchivedCommand>()` in format 3: format-3 and -4 log records
/// are read in format 5 only while it stays so (a test checks).
#[cfg(test)]
const FORMAT_3_ARCHIVED_COMMAND_BYTES: usize = 88;

/// The cluster state of format 3: [`ClusterState`] without `security`.
#[derive(Archive, Serialize, Deserialize, Debug)]
struct ClusterStateV3 {
    cluster_id: String,
    nodes: BTreeMap<u64, crate::meta::NodeState>,
    topics: BTreeMap<String, crate::meta::TopicState>,
    version: u64,
    next_producer_id: i64,
}

/// The cluster state of format 4: [`ClusterState`] without `remote`.
#[derive(Archive, Serialize, Deserialize, Debug)]
struct ClusterStateV4 {
    cluster_id: String,
    nodes: BTreeMap<u64, crate::meta::NodeState>,
    topics: BTreeMap<String, crate::meta::TopicState>,
    version: u64,
    next_producer_id: i64,
    security: crate::security::SecurityState,
}

/// Migrates a format-3 or -4 Raft directory: its log records and vote
/// read the same in format 5 (the commands added come after the others
/// and are no larger), its snapshot gains the empty states added since.
/// The snapshot is replaced atomically before the marker says 5, so a
/// crash in between leaves an old marker over a newer snapshot, which the
/// next start recognises (it is not an old encoding) and finishes.
fn migrate(dir: &Path, from: u32) -> crate::Result<()> {
    let path = dir.join("snapshot");
    if let Some(bytes) = read_optional(&path).map_err(Error::io("reading", &path))? {
        let mut stored: StoredSnapshot = decode(&bytes).map_err(corrupt(&path))?;
        // A value of another layout that happens to decode does not encode
        // back to the same bytes (rkyv's encoding is deterministic).
        let data = &stored.data;
        let v3 = decode::<ClusterStateV3>(data)
            .ok()
            .filter(|v| encode(v) == *data);
        let v4 = match v3 {
            Some(old) => Some(ClusterStateV4 {
                cluster_id: old.cluster_id,
                nodes: old.nodes,
                topics: old.topics,
                version: old.version,
                next_producer_id: old.next_producer_id,
                security: Default::default(),
            }),
            None => decode::<ClusterStateV4>(data)
                .ok()
                .filter(|v| encode(v) == *data),
        };
        if let Some(old) = v4 {
            let state = ClusterState {
                cluster_id: old.cluster_id,
                nodes: old.nodes,
                topics: old.topics,
                version: old.version,
                next_producer_id: old.next_producer_id,
                security: old.security,
                remote: Default::default(),
            };
            stored.data = encode(&state);
            replace_file(dir, "snapshot", &encode(&stored))
                .map_err(Error::io("replacing", &path))?;
        }
    }
    weir_storage::checkpoint::write_atomic(dir, "format", FORMAT.to_string().as_bytes()).map_err(
        |source| Error::Replace {
            path: dir.join("format"),
            source,
        },
    )?;
    tracing::info!(dir = %dir.display(), from, to = FORMAT, "Raft directory migrated");
    Ok(())
}

/// Refuses a Raft directory of another format; marks a new one.
fn check_format(dir: &Path) -> crate::Result<()> {
    let marker = dir.join("format");
    match read_optional(&marker).map_err(Error::io("reading", &marker))? {
        Some(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            // The parse error says no more than the message does.
            let found: u32 = text.trim().parse().map_err(|_| Error::FormatMarker {
                path: marker.clone(),
                text: text.to_string(),
            })?;
            if found == 3 || found == 4 {
                return migrate(dir, found);
            }
            if found != FORMAT {
                return Err(Error::RaftFormat {
                    dir: dir.to_path_buf(),
                    found,
                    reads: FORMAT,
                });
            }
            Ok(())
        }
        None => {
            let used = ["log", "vote", "snapshot"]
                .iter()
                .any(|f| std::fs::metadata(dir.join(f)).is_ok_and(|m| m.len() > 0));
            if used {
                return Err(Error::RaftFormatUnmarked {
                    dir: dir.to_path_buf(),
                    reads: FORMAT,
                });
            }
            weir_storage::checkpoint::write_atomic(dir, "format", FORMAT.to_string().as_bytes())
                .map_err(|source| Error::Replace {
                    path: marker,
                    source,
                })
        }
    }
}

impl LogStore {
    /// Opens (or creates) the log in `dir`, cutting a torn tail. A
    /// directory written in another format is refused (its records would
    /// not decode, and would be cut as a torn tail).
    pub fn open(dir: &Path) -> crate::Result<Self> {
        std::fs::create_dir_all(dir).map_err(Error::io("creating", dir))?;
        check_format(dir)?;
        let path = dir.join("log");
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .map_err(Error::io("opening", &path))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(Error::io("reading", &path))?;
        let mut entries = BTreeMap::new();
        let mut pos = 0usize;
        while pos + RECORD_HEADER <= bytes.len() {
            let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().expect("4")) as usize;
            let crc = u32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().expect("4"));
            let Some(body) = bytes.get(pos + RECORD_HEADER..pos + RECORD_HEADER + len) else {
                break;
            };
            if crc32c::crc32c(body) != crc {
                break;
            }
            let Ok(entry) = decode::<WEntry>(body) else {
                break;
            };
            let entry: Entry = entry.into();
            // A truncation is a cut of the file, so indexes only grow; a
            // record at or below an earlier index would be a bug, not a tear.
            entries.insert(entry.log_id.index, (entry, pos as u64));
            pos += RECORD_HEADER + len;
        }
        if pos < bytes.len() {
            tracing::warn!(
                path = %path.display(),
                kept = pos,
                cut = bytes.len() - pos,
                "cutting a torn or corrupt tail off the Raft log"
            );
            file.set_len(pos as u64)
                .map_err(Error::io("truncating", &path))?;
            file.sync_all().map_err(Error::io("syncing", &path))?;
        }
        let vote_path = dir.join("vote");
        let vote = read_optional(&vote_path)
            .map_err(Error::io("reading", &vote_path))?
            .map(|b| decode::<WVote>(&b).map(Into::into))
            .transpose()
            .map_err(corrupt(&vote_path))?;
        let purged_path = dir.join("purged");
        let purged = read_optional(&purged_path)
            .map_err(Error::io("reading", &purged_path))?
            .map(|b| decode::<Option<WLogId>>(&b))
            .transpose()
            .map_err(corrupt(&purged_path))?
            .flatten()
            .map(Into::into);
        let purged_index: Option<u64> = purged.map(|p: LogId<u64>| p.index);
        if let Some(p) = purged_index {
            entries.retain(|i, _| *i > p);
        }
        let purged_offset = entries.values().next().map_or(pos as u64, |(_, o)| *o);
        Ok(Self {
            dir: dir.to_path_buf(),
            file,
            entries: Arc::new(Mutex::new(entries)),
            len: pos as u64,
            purged_offset,
            vote,
            purged,
        })
    }

    /// Whether nothing was ever stored: no vote, no entry, none purged.
    pub fn is_empty(&self) -> bool {
        self.vote.is_none() && self.purged.is_none() && self.entries().is_empty()
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().expect("not poisoned")
    }

    fn last_log_id(&self) -> Option<LogId<u64>> {
        self.entries()
            .values()
            .next_back()
            .map(|(e, _)| e.log_id)
            .or(self.purged)
    }

    fn write_records(&mut self, entries: Vec<Entry>) -> std::io::Result<()> {
        let mut buf = Vec::new();
        let mut placed = Vec::with_capacity(entries.len());
        for entry in entries {
            let offset = self.len + buf.len() as u64;
            buf.extend_from_slice(&record(&entry));
            placed.push((entry, offset));
        }
        self.file.write_all(&buf)?;
        self.file.sync_data()?;
        self.len += buf.len() as u64;
        let mut entries = self.entries();
        for (entry, offset) in placed {
            entries.insert(entry.log_id.index, (entry, offset));
        }
        Ok(())
    }

    /// Rewrites the log without the purged prefix.
    fn compact(&mut self) -> std::io::Result<()> {
        let mut buf = Vec::new();
        let mut offsets = Vec::new();
        for (index, (entry, _)) in self.entries().iter() {
            offsets.push((*index, buf.len() as u64));
            buf.extend_from_slice(&record(entry));
        }
        replace_file(&self.dir, "log", &buf)?;
        self.file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(self.dir.join("log"))?;
        let entries = self.entries.clone();
        let mut entries = entries.lock().expect("not poisoned");
        for (index, offset) in offsets {
            if let Some(slot) = entries.get_mut(&index) {
                slot.1 = offset;
            }
        }
        self.len = buf.len() as u64;
        self.purged_offset = 0;
        Ok(())
    }
}

fn range_entries(entries: &Mutex<Entries>, range: impl RangeBounds<u64>) -> Vec<Entry> {
    let entries = entries.lock().expect("not poisoned");
    entries.range(range).map(|(_, (e, _))| e.clone()).collect()
}

/// Reads log entries for replication (the same entries the store holds).
pub struct LogReader {
    entries: Arc<Mutex<Entries>>,
}

impl RaftLogReader<TypeConfig> for LogReader {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + std::fmt::Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError<u64>> {
        Ok(range_entries(&self.entries, range))
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + std::fmt::Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError<u64>> {
        Ok(range_entries(&self.entries, range))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogReader;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<u64>> {
        Ok(LogState {
            last_purged_log_id: self.purged,
            last_log_id: self.last_log_id(),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        LogReader {
            entries: self.entries.clone(),
        }
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError<u64>> {
        replace_file(&self.dir, "vote", &encode(&WVote::from(*vote)))
            .map_err(|e| StorageIOError::write_vote(any(e)))?;
        self.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError<u64>> {
        Ok(self.vote)
    }

    /// Remembers how far the log is known committed, so a restarted node
    /// applies its committed entries at once (its metadata is there before
    /// any leader is elected). A hint: written without fdatasync, since a
    /// lost or older value only means less is applied before the first
    /// leader's commit.
    async fn save_committed(
        &mut self,
        committed: Option<LogId<u64>>,
    ) -> Result<(), StorageError<u64>> {
        let bytes = encode(&committed.map(WLogId::from));
        let write = || -> std::io::Result<()> {
            let tmp = self.dir.join("committed.tmp");
            std::fs::write(&tmp, &bytes)?;
            std::fs::rename(&tmp, self.dir.join("committed"))
        };
        write().map_err(|e| StorageIOError::write_logs(any(e)))?;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, StorageError<u64>> {
        let bytes = read_optional(&self.dir.join("committed"))
            .map_err(|e| StorageIOError::read_logs(any(e)))?;
        // Unreadable (a crash mid-write): no hint.
        let committed = bytes
            .and_then(|b| decode::<Option<WLogId>>(&b).ok())
            .flatten();
        // Never past the log's end (a truncated tail).
        let last = self.last_log_id().map(|l| l.index);
        Ok(committed
            .map(LogId::from)
            .filter(|c| last.is_some_and(|l| c.index <= l)))
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<u64>>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let result = self.write_records(entries.into_iter().collect());
        let err = result.as_ref().err().map(any);
        callback.log_io_completed(result);
        match err {
            Some(e) => Err(StorageIOError::write_logs(e).into()),
            None => Ok(()),
        }
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        // Remove entries at and after log_id.index.
        let Some(offset) = self.entries().get(&log_id.index).map(|(_, o)| *o) else {
            return Ok(());
        };
        let cut = || -> std::io::Result<()> {
            self.file.set_len(offset)?;
            self.file.sync_all()
        };
        cut().map_err(|e| StorageIOError::write_logs(any(e)))?;
        self.len = offset;
        self.entries().split_off(&log_id.index);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        replace_file(&self.dir, "purged", &encode(&Some(WLogId::from(log_id))))
            .map_err(|e| StorageIOError::write_logs(any(e)))?;
        self.purged = Some(log_id);
        let first_kept = {
            let mut entries = self.entries();
            let kept = entries.split_off(&(log_id.index + 1));
            *entries = kept;
            entries.values().next().map(|(_, o)| *o)
        };
        self.purged_offset = first_kept.unwrap_or(self.len);
        if self.purged_offset > 1 << 20 && self.purged_offset * 2 > self.len {
            self.compact()
                .map_err(|e| StorageIOError::write_logs(any(e)))?;
        }
        Ok(())
    }
}

/// A snapshot as stored in `raft/snapshot`.
#[derive(Archive, Serialize, Deserialize, Debug, Clone)]
struct StoredSnapshot {
    meta: WSnapshotMeta,
    /// rkyv-encoded [`ClusterState`].
    data: Vec<u8>,
}

/// The metadata state machine: the [`ClusterState`], published on a watch
/// channel after every apply so the node's cores (and tests) see each
/// version as it is applied.
pub struct StateMachine {
    dir: PathBuf,
    state: ClusterState,
    last_applied: Option<LogId<u64>>,
    membership: StoredMembership<u64, Node>,
    /// The last snapshot stored (shared with the builders, which store new ones).
    snapshot: Arc<Mutex<Option<StoredSnapshot>>>,
    publish: watch::Sender<Arc<ClusterState>>,
}

impl StateMachine {
    /// Opens the state machine in `dir`: the last snapshot, if any.
    pub fn open(dir: &Path, publish: watch::Sender<Arc<ClusterState>>) -> crate::Result<Self> {
        std::fs::create_dir_all(dir).map_err(Error::io("creating", dir))?;
        let mut sm = Self {
            dir: dir.to_path_buf(),
            state: ClusterState::default(),
            last_applied: None,
            membership: StoredMembership::default(),
            snapshot: Arc::default(),
            publish,
        };
        let path = dir.join("snapshot");
        if let Some(bytes) = read_optional(&path).map_err(Error::io("reading", &path))? {
            let stored: StoredSnapshot = decode(&bytes).map_err(corrupt(&path))?;
            sm.load(&stored)
                .map_err(|message| Error::Malformed { message })?;
            *sm.snapshot.lock().expect("not poisoned") = Some(stored);
        }
        Ok(sm)
    }

    fn load(&mut self, stored: &StoredSnapshot) -> Result<(), String> {
        let meta: SnapshotMeta<u64, Node> = (&stored.meta).into();
        self.state = decode(&stored.data)?;
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership;
        self.publish.send_replace(Arc::new(self.state.clone()));
        Ok(())
    }

    fn current(&self) -> StoredSnapshot {
        let meta = SnapshotMeta {
            last_log_id: self.last_applied,
            last_membership: self.membership.clone(),
            snapshot_id: format!(
                "{}-{}",
                self.last_applied.map_or(0, |l| l.leader_id.term),
                self.last_applied.map_or(0, |l| l.index)
            ),
        };
        StoredSnapshot {
            meta: (&meta).into(),
            data: encode(&self.state),
        }
    }
}

/// Stores `stored` as the node's snapshot and remembers it as the current one.
fn persist(
    dir: &Path,
    slot: &Mutex<Option<StoredSnapshot>>,
    stored: StoredSnapshot,
) -> std::io::Result<Snapshot<TypeConfig>> {
    replace_file(dir, "snapshot", &encode(&stored))?;
    let snapshot = to_snapshot(&stored);
    *slot.lock().expect("not poisoned") = Some(stored);
    Ok(snapshot)
}

fn to_snapshot(stored: &StoredSnapshot) -> Snapshot<TypeConfig> {
    Snapshot {
        meta: (&stored.meta).into(),
        snapshot: Box::new(stored.data.clone()),
    }
}

/// Builds snapshots: a copy of the state taken when openraft asks.
pub struct SnapshotBuilder {
    stored: StoredSnapshot,
    dir: PathBuf,
    slot: Arc<Mutex<Option<StoredSnapshot>>>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<u64>> {
        persist(&self.dir, &self.slot, self.stored.clone())
            .map_err(|e| StorageIOError::write_snapshot(None, any(e)).into())
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<u64>>, StoredMembership<u64, Node>), StorageError<u64>> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Outcome>, StorageError<u64>>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut out = Vec::new();
        for entry in entries {
            let index = entry.log_id.index;
            self.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => {
                    self.state.touch(index);
                    out.push(Outcome {
                        version: index,
                        ..Outcome::default()
                    });
                }
                EntryPayload::Normal(command) => out.push(self.state.apply(index, &command)),
                EntryPayload::Membership(m) => {
                    self.membership = StoredMembership::new(Some(entry.log_id), m);
                    self.state.touch(index);
                    out.push(Outcome {
                        version: index,
                        ..Outcome::default()
                    });
                }
            }
        }
        self.publish.send_replace(Arc::new(self.state.clone()));
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            stored: self.current(),
            dir: self.dir.clone(),
            slot: self.snapshot.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Vec<u8>>, StorageError<u64>> {
        Ok(Box::default())
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, Node>,
        snapshot: Box<Vec<u8>>,
    ) -> Result<(), StorageError<u64>> {
        let stored = StoredSnapshot {
            meta: meta.into(),
            data: *snapshot,
        };
        self.load(&stored)
            .map_err(|e| StorageIOError::read_snapshot(None, any(e)))?;
        persist(&self.dir, &self.snapshot, stored)
            .map_err(|e| StorageIOError::write_snapshot(None, any(e)))?;
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<u64>> {
        Ok(self
            .snapshot
            .lock()
            .expect("not poisoned")
            .as_ref()
            .map(to_snapshot))
    }
}

#[cfg(test)]
mod tests {
    use openraft::storage::RaftLogStorageExt;
    use openraft::CommittedLeaderId;

    use super::*;
    use crate::meta::Command;

    fn entry(term: u64, index: u64) -> Entry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Normal(Command::DeleteTopic {
                name: format!("t{index}"),
            }),
        }
    }

    fn indexes(store: &LogStore) -> Vec<(u64, u64)> {
        store
            .entries()
            .values()
            .map(|(e, _)| (e.log_id.leader_id.term, e.log_id.index))
            .collect()
    }

    #[tokio::test]
    async fn the_log_survives_reopening_a_torn_tail_truncation_and_purge() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = LogStore::open(dir.path()).unwrap();
        store
            .blocking_append((1..=5).map(|i| entry(1, i)))
            .await
            .unwrap();
        store.save_vote(&Vote::new_committed(1, 1)).await.unwrap();
        drop(store);

        // A torn record at the end (an append that never completed).
        let log = dir.path().join("log");
        let good_len = std::fs::metadata(&log).unwrap().len();
        let mut f = OpenOptions::new().append(true).open(&log).unwrap();
        f.write_all(&[40, 0, 0, 0, 1, 2, 3, 4, 5, 6]).unwrap();
        drop(f);
        let mut store = LogStore::open(dir.path()).unwrap();
        assert_eq!(std::fs::metadata(&log).unwrap().len(), good_len);
        assert_eq!(indexes(&store), (1..=5).map(|i| (1, i)).collect::<Vec<_>>());
        assert_eq!(
            store.read_vote().await.unwrap(),
            Some(Vote::new_committed(1, 1))
        );

        // A new leader overwrites the tail from index 4.
        store
            .truncate(LogId::new(CommittedLeaderId::new(1, 1), 4))
            .await
            .unwrap();
        store.blocking_append([entry(2, 4)]).await.unwrap();
        drop(store);
        let mut store = LogStore::open(dir.path()).unwrap();
        assert_eq!(indexes(&store), vec![(1, 1), (1, 2), (1, 3), (2, 4)]);

        // Purged entries stay purged.
        store
            .purge(LogId::new(CommittedLeaderId::new(1, 1), 2))
            .await
            .unwrap();
        drop(store);
        let mut store = LogStore::open(dir.path()).unwrap();
        assert_eq!(indexes(&store), vec![(1, 3), (2, 4)]);
        let state = store.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id.unwrap().index, 2);
        assert_eq!(state.last_log_id.unwrap().index, 4);
        assert_eq!(
            store.try_get_log_entries(3..5).await.unwrap().len(),
            2,
            "reads see the entries kept"
        );
    }

    #[test]
    fn a_raft_directory_of_another_format_is_refused_not_cut() {
        let dir = tempfile::tempdir().unwrap();
        // A fresh directory is marked with this build's format.
        drop(LogStore::open(dir.path()).unwrap());
        let marker = dir.path().join("format");
        assert_eq!(
            std::fs::read_to_string(&marker).unwrap(),
            FORMAT.to_string()
        );
        // An unmarked directory with a log: written by the first build.
        let old = tempfile::tempdir().unwrap();
        std::fs::write(old.path().join("log"), b"records of format 1").unwrap();
        let e = LogStore::open(old.path()).err().unwrap().to_string();
        assert!(e.contains("format 1"), "{e}");
        assert_eq!(
            std::fs::read(old.path().join("log")).unwrap(),
            b"records of format 1",
            "nothing cut"
        );
        // A newer format.
        std::fs::write(&marker, b"99").unwrap();
        let e = LogStore::open(dir.path()).err().unwrap().to_string();
        assert!(e.contains("format 99"), "{e}");
    }

    #[test]
    fn format_3_and_4_directories_are_migrated_with_their_snapshots() {
        use crate::meta::TopicState;
        let dir = tempfile::tempdir().unwrap();
        let mut topics = BTreeMap::new();
        topics.insert(
            "t".to_string(),
            TopicState {
                id: [7; 16],
                configs: BTreeMap::new(),
                partitions: Vec::new(),
            },
        );
        let old = ClusterStateV3 {
            cluster_id: "c1".into(),
            nodes: BTreeMap::new(),
            topics,
            version: 9,
            next_producer_id: 1000,
        };
        let stored = StoredSnapshot {
            meta: crate::wire::WSnapshotMeta {
                last_log_id: None,
                membership_log_id: None,
                membership: crate::wire::WMembership {
                    configs: vec![vec![1]],
                    nodes: vec![(1, "127.0.0.1:1".into())],
                },
                snapshot_id: "s".into(),
            },
            data: encode(&old),
        };
        std::fs::write(dir.path().join("snapshot"), encode(&stored)).unwrap();
        std::fs::write(dir.path().join("format"), b"3").unwrap();
        // Twice: the second open finds format 5 and changes nothing.
        for _ in 0..2 {
            drop(LogStore::open(dir.path()).unwrap());
            let (tx, _rx) = watch::channel(Arc::new(ClusterState::default()));
            let sm = StateMachine::open(dir.path(), tx).unwrap();
            assert_eq!(sm.state.cluster_id, "c1");
            assert_eq!(sm.state.version, 9);
            assert_eq!(sm.state.next_producer_id, 1000);
            assert_eq!(sm.state.topics["t"].id, [7; 16]);
            assert_eq!(sm.state.security, Default::default());
            assert_eq!(sm.state.remote, Default::default());
            assert_eq!(
                std::fs::read_to_string(dir.path().join("format")).unwrap(),
                "5"
            );
        }
        // A migration cut short after the snapshot was replaced: marker 3
        // or 4 over a format-5 snapshot is finished, not misread.
        for marker in [b"3", b"4"] {
            std::fs::write(dir.path().join("format"), marker).unwrap();
            drop(LogStore::open(dir.path()).unwrap());
            let (tx, _rx) = watch::channel(Arc::new(ClusterState::default()));
            assert_eq!(StateMachine::open(dir.path(), tx).unwrap().state.version, 9);
        }
        // A format-4 snapshot (with users) gains the remote state.
        let mut security = crate::security::SecurityState::default();
        security.alter_scram(
            &[],
            &[crate::security::ScramUpsertion {
                user: "alice".into(),
                mechanism: 1,
                credential: crate::security::StoredScram {
                    salt: vec![1; 16],
                    iterations: 4096,
                    stored_key: vec![2; 32],
                    server_key: vec![3; 32],
                },
            }],
        );
        let v4 = ClusterStateV4 {
            cluster_id: "c1".into(),
            nodes: BTreeMap::new(),
            topics: BTreeMap::new(),
            version: 11,
            next_producer_id: 1000,
            security: security.clone(),
        };
        let stored = StoredSnapshot {
            data: encode(&v4),
            ..stored
        };
        std::fs::write(dir.path().join("snapshot"), encode(&stored)).unwrap();
        std::fs::write(dir.path().join("format"), b"4").unwrap();
        drop(LogStore::open(dir.path()).unwrap());
        let (tx, _rx) = watch::channel(Arc::new(ClusterState::default()));
        let sm = StateMachine::open(dir.path(), tx).unwrap();
        assert_eq!((sm.state.version, &sm.state.security), (11, &security));
        // Format-3 log records read the same: the commands added are no
        // larger than the largest one before them.
        let before = std::mem::size_of::<crate::meta::ArchivedCommand>();
        assert_eq!(before, FORMAT_3_ARCHIVED_COMMAND_BYTES, "a command grew");
    }

    #[tokio::test]
    async fn a_corrupt_record_ends_the_log_where_it_starts() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = LogStore::open(dir.path()).unwrap();
        store
            .blocking_append((1..=3).map(|i| entry(1, i)))
            .await
            .unwrap();
        let third = store.entries()[&3].1;
        drop(store);
        let log = dir.path().join("log");
        let mut bytes = std::fs::read(&log).unwrap();
        let flip = third as usize + RECORD_HEADER + 2;
        bytes[flip] ^= 0xff;
        std::fs::write(&log, &bytes).unwrap();
        let store = LogStore::open(dir.path()).unwrap();
        assert_eq!(indexes(&store), vec![(1, 1), (1, 2)]);
        assert_eq!(std::fs::metadata(&log).unwrap().len(), third);
    }
}
