//! The `__transaction_state` record: a transactional id (the key) and its
//! whole metadata (the value; null: the id expired). Weir's own layout,
//! big-endian, every length checked on the way in (a record is read back
//! only from Weir's own log, but a damaged one must be refused, not
//! trusted):
//!
//! ```text
//! key:   version u16 = 0 | id_len u16 | id (UTF-8)
//! value: version u16 = 0 | producer_id i64 | previous_producer_id i64
//!        | next_producer_id i64 | producer_epoch i16 | last_producer_epoch i16
//!        | timeout_ms u32 | state u8 | protocol u8 (1 or 2)
//!        | start_ms i64 | update_ms i64
//!        | topics u32, then per topic: name_len u16 | name | partitions u32
//!          | partition u32 ...
//! ```
//!
//! States: 0 Empty, 1 Ongoing, 2 PrepareCommit, 3 PrepareAbort,
//! 4 CompleteCommit, 5 CompleteAbort, 6 Dead.

use std::collections::BTreeSet;

use crate::coordinator::{
    Record, TransactionVersion, TxnMetadata, TxnState, TOPIC_BYTES_MAX, TRANSACTIONAL_ID_BYTES_MAX,
    TXN_PARTITIONS_MAX,
};

const VERSION: u16 = 0;

/// The key of `transactional_id`'s record.
pub fn encode_key(transactional_id: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + transactional_id.len());
    out.extend_from_slice(&VERSION.to_be_bytes());
    put_str(&mut out, transactional_id);
    out
}

/// The value of a record.
pub fn encode_value(m: &TxnMetadata) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + m.partitions.len() * 8);
    out.extend_from_slice(&VERSION.to_be_bytes());
    out.extend_from_slice(&m.producer_id.to_be_bytes());
    out.extend_from_slice(&m.previous_producer_id.to_be_bytes());
    out.extend_from_slice(&m.next_producer_id.to_be_bytes());
    out.extend_from_slice(&m.producer_epoch.to_be_bytes());
    out.extend_from_slice(&m.last_producer_epoch.to_be_bytes());
    out.extend_from_slice(&m.timeout_ms.to_be_bytes());
    out.push(state_id(m.state));
    out.push(match m.version {
        TransactionVersion::V1 => 1,
        TransactionVersion::V2 => 2,
    });
    out.extend_from_slice(&m.start_ms.to_be_bytes());
    out.extend_from_slice(&m.update_ms.to_be_bytes());
    let mut topics: Vec<(&str, Vec<u32>)> = Vec::new();
    for (t, p) in &m.partitions {
        match topics.last_mut() {
            Some((last, ps)) if *last == t.as_str() => ps.push(*p),
            _ => topics.push((t, vec![*p])),
        }
    }
    out.extend_from_slice(&(topics.len() as u32).to_be_bytes());
    for (t, ps) in topics {
        put_str(&mut out, t);
        out.extend_from_slice(&(ps.len() as u32).to_be_bytes());
        for p in ps {
            out.extend_from_slice(&p.to_be_bytes());
        }
    }
    out
}

/// A record of the log: key and value (`None`: a tombstone).
pub fn encode(record: &Record) -> (Vec<u8>, Option<Vec<u8>>) {
    (encode_key(&record.0), record.1.as_ref().map(encode_value))
}

/// Parses a record; `Err` says what is wrong.
pub fn decode(key: &[u8], value: Option<&[u8]>) -> Result<Record, String> {
    let mut k = Reader { buf: key, at: 0 };
    let version = k.u16()?;
    if version != VERSION {
        return Err(format!("key version {version}"));
    }
    let id = k.str(TRANSACTIONAL_ID_BYTES_MAX)?;
    k.end()?;
    if id.is_empty() {
        return Err("an empty transactional id".into());
    }
    let Some(value) = value else {
        return Ok((id, None));
    };
    let mut r = Reader { buf: value, at: 0 };
    let version = r.u16()?;
    if version != VERSION {
        return Err(format!("value version {version}"));
    }
    let producer_id = r.u64()? as i64;
    let previous_producer_id = r.u64()? as i64;
    let next_producer_id = r.u64()? as i64;
    let producer_epoch = r.u16()? as i16;
    let last_producer_epoch = r.u16()? as i16;
    let timeout_ms = r.u32()?;
    let state = match r.u8()? {
        0 => TxnState::Empty,
        1 => TxnState::Ongoing,
        2 => TxnState::PrepareCommit,
        3 => TxnState::PrepareAbort,
        4 => TxnState::CompleteCommit,
        5 => TxnState::CompleteAbort,
        6 => TxnState::Dead,
        s => return Err(format!("state {s}")),
    };
    let version = match r.u8()? {
        1 => TransactionVersion::V1,
        2 => TransactionVersion::V2,
        v => return Err(format!("protocol {v}")),
    };
    let start_ms = r.u64()? as i64;
    let update_ms = r.u64()? as i64;
    let topics = r.u32()? as usize;
    let mut partitions = BTreeSet::new();
    for _ in 0..topics {
        let t = r.str(TOPIC_BYTES_MAX)?;
        let n = r.u32()? as usize;
        if partitions.len() + n > TXN_PARTITIONS_MAX {
            return Err(format!("more than {TXN_PARTITIONS_MAX} partitions"));
        }
        for _ in 0..n {
            partitions.insert((t.clone(), r.u32()?));
        }
    }
    r.end()?;
    if producer_id < 0 || producer_epoch < 0 {
        return Err(format!("producer {producer_id} epoch {producer_epoch}"));
    }
    Ok((
        id.clone(),
        Some(TxnMetadata {
            transactional_id: id,
            producer_id,
            previous_producer_id,
            next_producer_id,
            producer_epoch,
            last_producer_epoch,
            timeout_ms,
            state,
            partitions,
            start_ms,
            update_ms,
            version,
        }),
    ))
}

fn state_id(s: TxnState) -> u8 {
    match s {
        TxnState::Empty => 0,
        TxnState::Ongoing => 1,
        TxnState::PrepareCommit => 2,
        TxnState::PrepareAbort => 3,
        TxnState::CompleteCommit => 4,
        TxnState::CompleteAbort => 5,
        TxnState::Dead => 6,
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u16).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Big-endian reads with bounds checks.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let b = self
            .buf
            .get(self.at..self.at + n)
            .ok_or_else(|| format!("truncated at byte {}", self.at))?;
        self.at += n;
        Ok(b)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_be_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn str(&mut self, max: usize) -> Result<String, String> {
        let n = self.u16()? as usize;
        if n > max {
            return Err(format!("a string of {n} bytes (at most {max})"));
        }
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| "a string not UTF-8".to_string())
    }
    fn end(&self) -> Result<(), String> {
        if self.at == self.buf.len() {
            Ok(())
        } else {
            Err(format!("{} bytes after the end", self.buf.len() - self.at))
        }
    }
}
