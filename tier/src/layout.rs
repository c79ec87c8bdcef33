//! The remote object layout of tiered storage.
//!
//! Every remote segment is a set of immutable objects under its
//! partition's folder, named by its base offset and a segment id unique to
//! the upload (a retried or concurrent upload never overwrites another):
//!
//! ```text
//! <prefix>/<topic>-<topic id>/<partition>/<base offset, 20 digits>-<segment id>.log
//!                                                                     .index
//!                                                                     .timeindex
//!                                                                     .epochs
//!                                                                     .txnindex (if any)
//! ```
//!
//! `.log` holds the segment's record batches byte for byte as stored,
//! `.index` and `.timeindex` its offset and time indexes in the local
//! files' formats (relative to the object's base offset and positions in
//! the object), `.epochs` the leader epochs of its records in Kafka's
//! `leader-epoch-checkpoint` text format, `.txnindex` (only for a segment
//! holding abort markers) the aborted transactions whose marker it holds,
//! in the local `.txnindex` format.

use std::fmt::Write as _;

/// One object of a remote segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    /// The record batches.
    Log,
    /// The offset index.
    Index,
    /// The time index.
    TimeIndex,
    /// The leader epochs.
    Epochs,
    /// The aborted transactions whose abort marker the segment holds
    /// (only for segments that hold some).
    TxnIndex,
    /// The producers' state as of the segment's end (Weir's
    /// `producer.snapshot` format, its offset the segment's end).
    ProducerSnapshot,
}

impl ObjectKind {
    /// Every kind (what deleting a segment deletes).
    pub const ALL: [ObjectKind; 6] = [
        ObjectKind::Log,
        ObjectKind::Index,
        ObjectKind::TimeIndex,
        ObjectKind::Epochs,
        ObjectKind::TxnIndex,
        ObjectKind::ProducerSnapshot,
    ];

    /// The object name's suffix.
    pub fn suffix(self) -> &'static str {
        match self {
            ObjectKind::Log => "log",
            ObjectKind::Index => "index",
            ObjectKind::TimeIndex => "timeindex",
            ObjectKind::Epochs => "epochs",
            ObjectKind::TxnIndex => "txnindex",
            ObjectKind::ProducerSnapshot => "snapshot",
        }
    }
}

/// A segment id as text (32 lowercase hex digits).
pub fn id_hex(id: &[u8; 16]) -> String {
    id.iter().fold(String::with_capacity(32), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// A topic id as a UUID's text.
fn uuid_text(id: &[u8; 16]) -> String {
    let h = id_hex(id);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The folder (key prefix, no trailing slash) of one partition's objects.
pub fn partition_dir(topic: &str, topic_id: &[u8; 16], partition: u32) -> String {
    format!("{topic}-{}/{partition}", uuid_text(topic_id))
}

/// The key of one object of a remote segment.
pub fn object_key(
    topic: &str,
    topic_id: &[u8; 16],
    partition: u32,
    base: u64,
    id: &[u8; 16],
    kind: ObjectKind,
) -> String {
    format!(
        "{}/{base:020}-{}.{}",
        partition_dir(topic, topic_id, partition),
        id_hex(id),
        kind.suffix()
    )
}

/// The segment id of an object key of this layout (for cleaning up
/// objects no metadata names).
pub fn parse_segment_id(key: &str) -> Option<[u8; 16]> {
    let name = key.rsplit('/').next()?;
    let (stem, _) = name.rsplit_once('.')?;
    let (_, hex) = stem.split_once('-')?;
    if hex.len() != 32 {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(id)
}

/// Leader epochs (epoch, first offset) in Kafka's
/// `leader-epoch-checkpoint` format: `0`, the count, one `epoch offset`
/// line each.
pub fn encode_epochs(epochs: &[(u32, u64)]) -> String {
    let mut s = format!("0\n{}\n", epochs.len());
    for (e, o) in epochs {
        let _ = writeln!(s, "{e} {o}");
    }
    s
}

/// Reads [`encode_epochs`]' format.
pub fn decode_epochs(text: &str) -> Option<Vec<(u32, u64)>> {
    let mut lines = text.lines();
    if lines.next()?.trim() != "0" {
        return None;
    }
    let n: usize = lines.next()?.trim().parse().ok()?;
    let out: Option<Vec<(u32, u64)>> = lines
        .take(n)
        .map(|l| {
            let (e, o) = l.trim().split_once(' ')?;
            Some((e.parse().ok()?, o.parse().ok()?))
        })
        .collect();
    out.filter(|v| v.len() == n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_the_partition_base_and_segment() {
        let id = [0xab; 16];
        let k = object_key("logs", &[1; 16], 3, 42, &id, ObjectKind::Index);
        assert_eq!(
            k,
            "logs-01010101-0101-0101-0101-010101010101/3/00000000000000000042-abababababababababababababababab.index"
        );
        assert_eq!(parse_segment_id(&k), Some(id));
        assert_eq!(parse_segment_id("logs-x/3/notes.txt"), None);
        let e = vec![(0, 0), (3, 1200)];
        assert_eq!(decode_epochs(&encode_epochs(&e)), Some(e));
        assert_eq!(decode_epochs("0\n2\n1 5\n"), None);
    }
}
