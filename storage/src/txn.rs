//! Transactions in a partition's log (Kafka's KIP-98 layout): the markers
//! that end a transaction and the index of aborted transactions.
//!
//! **Markers** are control batches, byte for byte Kafka's: the
//! transactional and control attribute bits, the producer's id and epoch,
//! no sequence (-1), one record whose key is `version: i16 = 0, type: i16`
//! (0 abort, 1 commit) and whose value is `version: i16 = 0,
//! coordinator_epoch: i32`. Only the broker writes them
//! ([`marker_batch`]); a producer's control batch is refused.
//!
//! **The aborted-transaction index** (`<base>.txnindex` beside each
//! segment, Kafka's format): one 34-byte entry per aborted transaction
//! whose abort marker is in that segment — `version: i16 = 0,
//! producer_id: i64, first_offset: i64, last_offset: i64` (the marker's
//! offset), `last_stable_offset: i64` (the partition's when the abort was
//! written) — big-endian, in marker order. A read-committed fetch answers
//! the aborted transactions overlapping its range from it
//! (`PartitionLog::aborted_transactions`) without reading the log.

use bytes::{Bytes, BytesMut};
use weir_proto::batch::{BatchError, Compression};
use weir_proto::builder::BatchBuilder;
use weir_proto::reader::RecordBatch;
use weir_proto::record::RecordData;

/// What a marker says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerKind {
    /// The transaction is aborted: its records are never read committed.
    Abort,
    /// The transaction is committed.
    Commit,
}

/// A transaction marker's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Marker {
    /// Commit or abort.
    pub kind: MarkerKind,
    /// The epoch of the transaction coordinator that wrote it.
    pub coordinator_epoch: i32,
}

/// Bytes of one index entry.
pub const ENTRY_BYTES: usize = 34;
/// Extension of an index file.
pub const INDEX_SUFFIX: &str = "txnindex";

/// The control batch of a marker of producer `pid` at `epoch`.
pub fn marker_batch(pid: i64, epoch: i16, marker: Marker, timestamp: i64) -> BytesMut {
    let mut key = Vec::with_capacity(4);
    key.extend_from_slice(&0i16.to_be_bytes());
    let kind: i16 = match marker.kind {
        MarkerKind::Abort => 0,
        MarkerKind::Commit => 1,
    };
    key.extend_from_slice(&kind.to_be_bytes());
    let mut value = Vec::with_capacity(6);
    value.extend_from_slice(&0i16.to_be_bytes());
    value.extend_from_slice(&marker.coordinator_epoch.to_be_bytes());
    let mut b = BatchBuilder::new(Compression::None).expect("uncompressed batches are built");
    b.producer_id = pid;
    b.producer_epoch = epoch;
    b.transactional = true;
    b.control = true;
    b.push(&RecordData {
        key: Some(Bytes::from(key)),
        value: Some(Bytes::from(value)),
        headers: Vec::new(),
        timestamp,
    })
    .expect("a marker record fits");
    b.finish().expect("a marker batch has a record")
}

/// The marker of a control batch (`batch`: the whole batch), or why it is
/// not one.
pub fn marker_of(batch: &[u8]) -> Result<Marker, String> {
    let parsed = RecordBatch::parse(batch).map_err(|e: BatchError| e.to_string())?;
    let h = parsed.header();
    if !h.attributes.is_control() {
        return Err("not a control batch".into());
    }
    let records = parsed.records().map_err(|e| e.to_string())?;
    let record = records
        .iter()
        .next()
        .ok_or("a control batch without a record")?
        .map_err(|e| e.to_string())?;
    let key = record.record.key.ok_or("a control record without a key")?;
    if key.len() < 4 {
        return Err(format!("a control record key of {} bytes", key.len()));
    }
    let kind = match i16::from_be_bytes([key[2], key[3]]) {
        0 => MarkerKind::Abort,
        1 => MarkerKind::Commit,
        t => {
            return Err(format!(
                "control record type {t} is not a transaction marker"
            ))
        }
    };
    let coordinator_epoch = record
        .record
        .value
        .filter(|v| v.len() >= 6)
        .map_or(-1, |v| i32::from_be_bytes([v[2], v[3], v[4], v[5]]));
    Ok(Marker {
        kind,
        coordinator_epoch,
    })
}

/// One aborted transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxn {
    /// Its producer.
    pub producer_id: i64,
    /// Offset of its first batch.
    pub first_offset: u64,
    /// Offset of its abort marker.
    pub last_offset: u64,
    /// The partition's last stable offset when the marker was written.
    pub last_stable_offset: u64,
}

/// An index file's bytes for `entries`.
pub fn encode(entries: &[AbortedTxn]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * ENTRY_BYTES);
    for e in entries {
        out.extend_from_slice(&0i16.to_be_bytes());
        out.extend_from_slice(&e.producer_id.to_be_bytes());
        out.extend_from_slice(&(e.first_offset as i64).to_be_bytes());
        out.extend_from_slice(&(e.last_offset as i64).to_be_bytes());
        out.extend_from_slice(&(e.last_stable_offset as i64).to_be_bytes());
    }
    out
}

/// Parses an index file; a torn last entry (a crash while it was written)
/// is dropped, anything implausible is an error.
pub fn decode(bytes: &[u8]) -> Result<Vec<AbortedTxn>, String> {
    let mut out = Vec::with_capacity(bytes.len() / ENTRY_BYTES);
    for (i, e) in bytes.chunks_exact(ENTRY_BYTES).enumerate() {
        let i64_at = |at: usize| i64::from_be_bytes(e[at..at + 8].try_into().expect("8 bytes"));
        let version = i16::from_be_bytes([e[0], e[1]]);
        let (pid, first, last, lso) = (i64_at(2), i64_at(10), i64_at(18), i64_at(26));
        if version != 0 || pid < 0 || first < 0 || last < first || lso < 0 {
            return Err(format!("entry {i} is not an aborted transaction's"));
        }
        out.push(AbortedTxn {
            producer_id: pid,
            first_offset: first as u64,
            last_offset: last as u64,
            last_stable_offset: lso as u64,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_batch_is_kafkas_control_batch_and_parses_back() {
        let m = Marker {
            kind: MarkerKind::Commit,
            coordinator_epoch: 7,
        };
        let b = marker_batch(42, 3, m, 1_700_000_000_000);
        let h = weir_proto::batch::validate(&b).unwrap();
        assert!(h.attributes.is_control() && h.attributes.is_transactional());
        assert_eq!(
            (
                h.producer_id,
                h.producer_epoch,
                h.base_sequence,
                h.records_count
            ),
            (42, 3, -1, 1)
        );
        assert_eq!(marker_of(&b).unwrap(), m);
        // The record: key 0000 0001, value 0000 00000007 (Kafka's bytes).
        let parsed = RecordBatch::parse(&b).unwrap();
        let records = parsed.records().unwrap();
        let r = records.iter().next().unwrap().unwrap();
        assert_eq!(r.record.key, Some(&[0u8, 0, 0, 1][..]));
        assert_eq!(r.record.value, Some(&[0u8, 0, 0, 0, 0, 7][..]));
        let abort = marker_batch(
            42,
            3,
            Marker {
                kind: MarkerKind::Abort,
                coordinator_epoch: 0,
            },
            0,
        );
        assert_eq!(marker_of(&abort).unwrap().kind, MarkerKind::Abort);
        // A data batch is not a marker.
        let mut data = BatchBuilder::new(Compression::None).unwrap();
        data.push(&RecordData {
            key: None,
            value: Some(Bytes::from_static(b"v")),
            headers: Vec::new(),
            timestamp: 0,
        })
        .unwrap();
        assert!(marker_of(&data.finish().unwrap()).is_err());
    }

    #[test]
    fn the_index_round_trips_and_drops_a_torn_tail() {
        let e = |pid, first, last| AbortedTxn {
            producer_id: pid,
            first_offset: first,
            last_offset: last,
            last_stable_offset: first,
        };
        let entries = [e(1, 0, 10), e(2, 5, 20), e(3, 30, 31)];
        let mut bytes = encode(&entries);
        assert_eq!(bytes.len(), 3 * ENTRY_BYTES);
        assert_eq!(decode(&bytes).unwrap(), entries);
        bytes.extend_from_slice(&[0; 10]);
        assert_eq!(decode(&bytes).unwrap(), entries);
        let mut bad = encode(&[e(1, 10, 5)]);
        assert!(decode(&bad).is_err());
        bad = encode(&entries);
        bad[0] = 9;
        assert!(decode(&bad).is_err());
    }
}
