//! The `__share_group_state` record: one share partition's durable state
//! (Kafka keeps ShareSnapshot and ShareUpdate records there; Weir stores
//! a whole snapshot each time: a window is at most
//! `group.share.partition.max.record.locks` slots, written as runs).
//! Weir's own layout, big-endian, every length checked on the way in:
//!
//! ```text
//! key:   version u16 = 0 | group_len u16 | group (UTF-8)
//!        | topic_len u16 | topic (UTF-8) | partition u32
//! value: version u16 = 0 | state_epoch i32 | start u64 | end u64
//!        | runs u32, then per run: first u64 | last u64 | state u8
//!          | delivery_count u16
//! ```
//!
//! States: 0 Available, 2 Acknowledged, 4 Archived (Kafka's
//! RecordState bytes; Acquired, 1, is never stored). A null value deletes
//! the share partition's state (its group was deleted, or its offsets).

use crate::partition::{RecordState, ShareSnapshot, StateRun};

const VERSION: u16 = 0;

/// Runs in one record: a window of at most 10 000 slots has at most as
/// many runs.
pub const RUNS_MAX: usize = crate::limits::PARTITION_MAX_RECORD_LOCKS_MAX;

/// The key of a share partition: (group, topic, partition).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShareKey {
    /// The share group.
    pub group: String,
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
}

/// The record's key.
pub fn encode_key(k: &ShareKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(10 + k.group.len() + k.topic.len());
    out.extend_from_slice(&VERSION.to_be_bytes());
    put_str(&mut out, &k.group);
    put_str(&mut out, &k.topic);
    out.extend_from_slice(&k.partition.to_be_bytes());
    out
}

/// Reads a key back.
pub fn decode_key(b: &[u8]) -> Result<ShareKey, String> {
    let mut r = Reader(b);
    version(&mut r)?;
    let group = r.str()?;
    let topic = r.str()?;
    let partition = r.u32()?;
    r.end()?;
    Ok(ShareKey {
        group,
        topic,
        partition,
    })
}

/// The record's value.
pub fn encode_value(s: &ShareSnapshot) -> Vec<u8> {
    let mut out = Vec::with_capacity(26 + s.runs.len() * 19);
    out.extend_from_slice(&VERSION.to_be_bytes());
    out.extend_from_slice(&s.state_epoch.to_be_bytes());
    out.extend_from_slice(&s.start.to_be_bytes());
    out.extend_from_slice(&s.end.to_be_bytes());
    out.extend_from_slice(&(s.runs.len() as u32).to_be_bytes());
    for r in &s.runs {
        out.extend_from_slice(&r.first.to_be_bytes());
        out.extend_from_slice(&r.last.to_be_bytes());
        out.push(match r.state {
            RecordState::Available | RecordState::Acquired => 0,
            RecordState::Acknowledged => 2,
            RecordState::Archived => 4,
        });
        out.extend_from_slice(&r.delivery_count.to_be_bytes());
    }
    out
}

/// Reads a value back (refusing a damaged one).
pub fn decode_value(b: &[u8]) -> Result<ShareSnapshot, String> {
    let mut r = Reader(b);
    version(&mut r)?;
    let state_epoch = r.u32()? as i32;
    let start = r.u64()?;
    let end = r.u64()?;
    let n = r.u32()? as usize;
    if n > RUNS_MAX {
        return Err(format!("{n} runs (at most {RUNS_MAX})"));
    }
    let mut runs = Vec::with_capacity(n);
    for _ in 0..n {
        let first = r.u64()?;
        let last = r.u64()?;
        let state = match r.u8()? {
            0 => RecordState::Available,
            2 => RecordState::Acknowledged,
            4 => RecordState::Archived,
            s => return Err(format!("record state {s}")),
        };
        let delivery_count = r.u16()?;
        runs.push(StateRun {
            first,
            last,
            state,
            delivery_count,
        });
    }
    r.end()?;
    Ok(ShareSnapshot {
        state_epoch,
        start,
        end,
        runs,
    })
}

fn version(r: &mut Reader<'_>) -> Result<(), String> {
    match r.u16()? {
        VERSION => Ok(()),
        v => Err(format!("record version {v} (this build reads {VERSION})")),
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    let b = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
    out.extend_from_slice(&(b.len() as u16).to_be_bytes());
    out.extend_from_slice(b);
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!("{n} bytes wanted, {} left", self.0.len()));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn str(&mut self) -> Result<String, String> {
        let n = self.u16()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|e| e.to_string())
    }
    fn end(&self) -> Result<(), String> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(format!("{} bytes after the record", self.0.len()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values_round_trip_and_damage_is_refused() {
        let k = ShareKey {
            group: "workers".into(),
            topic: "telemetry".into(),
            partition: 5,
        };
        assert_eq!(decode_key(&encode_key(&k)), Ok(k.clone()));
        let s = ShareSnapshot {
            state_epoch: 3,
            start: 10,
            end: 20,
            runs: vec![
                StateRun {
                    first: 11,
                    last: 12,
                    state: RecordState::Acknowledged,
                    delivery_count: 1,
                },
                StateRun {
                    first: 15,
                    last: 15,
                    state: RecordState::Available,
                    delivery_count: 4,
                },
            ],
        };
        let v = encode_value(&s);
        assert_eq!(decode_value(&v), Ok(s));
        // Every truncation, a trailing byte, a bad state, another version.
        for n in 0..v.len() {
            assert!(decode_value(&v[..n]).is_err(), "{n}");
        }
        let mut long = v.clone();
        long.push(0);
        assert!(decode_value(&long).is_err());
        let mut bad = v.clone();
        bad[26 + 16] = 1;
        assert!(decode_value(&bad).is_err(), "Acquired is never stored");
        let mut other = v;
        other[1] = 9;
        assert!(decode_value(&other).is_err());
        let key = encode_key(&k);
        assert!(decode_key(&key[..key.len() - 1]).is_err());
    }
}
