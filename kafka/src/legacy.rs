//! Request versions Apache Kafka 4 removed (KIP-896) that Weir still serves
//! for clients that are upgraded rarely, and old Produce versions answered
//! with an error rather than a closed connection.
//!
//! `kafka-protocol` is generated from Kafka 4.1's schemas, so it cannot
//! read these versions. Each differs from the crate's lowest version only
//! in its shape (no message-format change), so its body is rewritten into
//! that version's bytes, decoded by the crate, served as usual, and the
//! answer encoded in the old version's shape:
//!
//! | request | rewritten as | answered as |
//! |---|---|---|
//! | OffsetCommit v0 | v2: generation -1, member "", retention -1 inserted | v2 (same shape) |
//! | OffsetCommit v1 | v2: retention -1 inserted, per-partition commit timestamp dropped | v2 (same shape) |
//! | OffsetFetch v0 | v1 (same shape; v0 read ZooKeeper in Kafka, Weir has one store) | v1 (same shape) |
//! | ListOffsets v0 | v1: per-partition `max_num_offsets` dropped | v0's `old_style_offsets`: the one offset v1 finds |
//! | Produce v0–2 | v3: a null transactional id inserted | refused: UNSUPPORTED_VERSION for every partition |
//!
//! Produce v0–2 carry message format v0/v1, which Weir does not store
//! (record batch v2 only). Apache Kafka 4 advertises Produce from v0 anyway
//! (KAFKA-18659: librdkafka up to 2.11 enables gzip, snappy and lz4 only if
//! the broker advertises Produce v0) and closes the connection on such a
//! request; Weir does the same advertising but answers every partition with
//! UNSUPPORTED_VERSION, so the client says why.
//!
//! Sans-IO: bytes in, bytes out. Every length read is checked against the
//! bytes left before anything is reserved.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ListOffsetsResponse};

use crate::error::UNSUPPORTED_VERSION;

/// How a version below the crate's floor is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Legacy {
    /// Decoded and answered at `as_version` after rewriting the body.
    Served {
        /// The version the rewritten body is decoded at.
        as_version: i16,
    },
    /// Parsed (at `as_version`) only to name its partitions in a refusal.
    Refused {
        /// The version the rewritten body is decoded at.
        as_version: i16,
    },
}

/// The legacy handling of `version` of `api`, if it is one.
pub fn legacy(api: ApiKey, version: i16) -> Option<Legacy> {
    match (api, version) {
        (ApiKey::OffsetCommit, 0 | 1) => Some(Legacy::Served { as_version: 2 }),
        (ApiKey::OffsetFetch, 0) => Some(Legacy::Served { as_version: 1 }),
        (ApiKey::ListOffsets, 0) => Some(Legacy::Served { as_version: 1 }),
        (ApiKey::Produce, 0..=2) => Some(Legacy::Refused { as_version: 3 }),
        _ => None,
    }
}

/// The lowest version ApiVersions advertises for `api`, where it differs
/// from the lowest served: Produce from v0 (KAFKA-18659, as Kafka 4 does).
pub fn advertised_min(api: ApiKey) -> Option<i16> {
    (api == ApiKey::Produce).then_some(0)
}

/// A cursor over a non-flexible body that copies what it reads to `out`
/// unless told to skip it.
struct Rewriter<'a> {
    body: &'a [u8],
    at: usize,
    out: BytesMut,
}

impl<'a> Rewriter<'a> {
    fn new(body: &'a [u8]) -> Self {
        Rewriter {
            body,
            at: 0,
            out: BytesMut::with_capacity(body.len() + 16),
        }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.body.len())
            .ok_or_else(|| format!("{what}: {n} bytes past the end of the body"))?;
        let b = &self.body[self.at..end];
        self.at = end;
        Ok(b)
    }

    /// Copies `n` bytes.
    fn copy(&mut self, n: usize, what: &str) -> Result<(), String> {
        let b = self.take(n, what)?;
        self.out.put_slice(b);
        Ok(())
    }

    fn i16(&mut self, what: &str) -> Result<i16, String> {
        let b = self.take(2, what)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    fn i32(&mut self, what: &str) -> Result<i32, String> {
        let b = self.take(4, what)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// Copies a (nullable) string.
    fn copy_str(&mut self, what: &str) -> Result<(), String> {
        let len = self.i16(what)?;
        self.out.put_i16(len);
        if len > 0 {
            self.copy(len as usize, what)?;
        } else if len < -1 {
            return Err(format!("{what}: string length {len}"));
        }
        Ok(())
    }

    /// Copies an array's count and returns it, checked against the bytes
    /// left (each element takes at least `min` bytes).
    fn copy_count(&mut self, min: usize, what: &str) -> Result<usize, String> {
        let n = self.i32(what)?;
        self.out.put_i32(n);
        if n < 0 {
            // A null array: nothing follows.
            return Ok(0);
        }
        let n = n as usize;
        if n > (self.body.len() - self.at) / min {
            return Err(format!("{what}: {n} elements cannot fit the body"));
        }
        Ok(n)
    }

    /// Copies everything left.
    fn rest(mut self) -> Bytes {
        let rest = &self.body[self.at..];
        self.out.put_slice(rest);
        self.out.freeze()
    }
}

/// Rewrites the body of a legacy request (the bytes after the request
/// header) into the bytes of the version [`legacy`] names.
pub fn rewrite_body(api: ApiKey, version: i16, body: &[u8]) -> Result<Bytes, String> {
    let mut r = Rewriter::new(body);
    match (api, version) {
        (ApiKey::OffsetCommit, 0) => {
            r.copy_str("group id")?;
            r.out.put_i32(-1); // generation id
            r.out.put_i16(0); // member id ""
            r.out.put_i64(-1); // retention time: the broker's
            Ok(r.rest())
        }
        (ApiKey::OffsetCommit, 1) => {
            r.copy_str("group id")?;
            r.copy(4, "generation id")?;
            r.copy_str("member id")?;
            r.out.put_i64(-1);
            for _ in 0..r.copy_count(6, "topics")? {
                r.copy_str("topic")?;
                for _ in 0..r.copy_count(22, "partitions")? {
                    r.copy(4 + 8, "partition and offset")?;
                    // The commit timestamp: Weir stamps commits itself.
                    r.take(8, "commit timestamp")?;
                    r.copy_str("metadata")?;
                }
            }
            Ok(r.rest())
        }
        (ApiKey::OffsetFetch, 0) => Ok(Bytes::copy_from_slice(body)),
        (ApiKey::ListOffsets, 0) => {
            r.copy(4, "replica id")?;
            for _ in 0..r.copy_count(6, "topics")? {
                r.copy_str("topic")?;
                for _ in 0..r.copy_count(16, "partitions")? {
                    r.copy(4 + 8, "partition and timestamp")?;
                    // max_num_offsets: one offset is answered.
                    r.take(4, "max offsets")?;
                }
            }
            Ok(r.rest())
        }
        (ApiKey::Produce, 0..=2) => {
            r.out.put_i16(-1); // transactional id: null
            Ok(r.rest())
        }
        _ => Err(format!(
            "version {version} of api key {} is not legacy",
            api as i16
        )),
    }
}

/// The body of a ListOffsets v0 answer from the v1 answer Weir computed:
/// each partition's `old_style_offsets` holds the offset found (none where
/// there is none or an error).
pub fn list_offsets_v0_body(r: &ListOffsetsResponse) -> BytesMut {
    let mut out = BytesMut::new();
    out.put_i32(r.topics.len() as i32);
    for t in &r.topics {
        put_str(&mut out, t.name.as_str());
        out.put_i32(t.partitions.len() as i32);
        for p in &t.partitions {
            out.put_i32(p.partition_index);
            out.put_i16(p.error_code);
            if p.error_code == 0 && p.offset >= 0 {
                out.put_i32(1);
                out.put_i64(p.offset);
            } else {
                out.put_i32(0);
            }
        }
    }
    out
}

/// The body of a Produce v0–2 answer refusing every partition of
/// `topics` (name, partition indexes) with UNSUPPORTED_VERSION.
pub fn produce_refusal_body(version: i16, topics: &[(String, Vec<i32>)]) -> BytesMut {
    let mut out = BytesMut::new();
    out.put_i32(topics.len() as i32);
    for (name, partitions) in topics {
        put_str(&mut out, name);
        out.put_i32(partitions.len() as i32);
        for p in partitions {
            out.put_i32(*p);
            out.put_i16(UNSUPPORTED_VERSION);
            out.put_i64(-1); // base offset
            if version >= 2 {
                out.put_i64(-1); // log append time
            }
        }
    }
    if version >= 1 {
        out.put_i32(0); // throttle time
    }
    out
}

fn put_str(out: &mut BytesMut, s: &str) {
    // Topic names are bounded far below i16::MAX (249 bytes).
    out.put_i16(s.len().min(i16::MAX as usize) as i16);
    out.put_slice(&s.as_bytes()[..s.len().min(i16::MAX as usize)]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn str16(s: &str) -> Vec<u8> {
        let mut v = (s.len() as i16).to_be_bytes().to_vec();
        v.extend_from_slice(s.as_bytes());
        v
    }

    #[test]
    fn offset_commit_v1_becomes_v2_without_the_commit_timestamp() {
        let mut v1 = str16("g");
        v1.extend(7i32.to_be_bytes());
        v1.extend(str16("m"));
        v1.extend(1i32.to_be_bytes());
        v1.extend(str16("t"));
        v1.extend(1i32.to_be_bytes());
        v1.extend(3i32.to_be_bytes());
        v1.extend(42i64.to_be_bytes());
        v1.extend(123i64.to_be_bytes());
        v1.extend(str16("meta"));
        let mut v2 = str16("g");
        v2.extend(7i32.to_be_bytes());
        v2.extend(str16("m"));
        v2.extend((-1i64).to_be_bytes());
        v2.extend(1i32.to_be_bytes());
        v2.extend(str16("t"));
        v2.extend(1i32.to_be_bytes());
        v2.extend(3i32.to_be_bytes());
        v2.extend(42i64.to_be_bytes());
        v2.extend(str16("meta"));
        assert_eq!(
            &rewrite_body(ApiKey::OffsetCommit, 1, &v1).unwrap()[..],
            &v2[..]
        );
        // Every truncation is an error, never a panic.
        for n in 0..v1.len() {
            let _ = rewrite_body(ApiKey::OffsetCommit, 1, &v1[..n]);
        }
        assert!(rewrite_body(ApiKey::OffsetCommit, 1, &v1[..v1.len() - 3]).is_err());
    }

    #[test]
    fn hostile_counts_are_refused_before_anything_is_reserved() {
        let mut body = 0i32.to_be_bytes().to_vec(); // replica id
        body.extend(i32::MAX.to_be_bytes());
        let e = rewrite_body(ApiKey::ListOffsets, 0, &body).unwrap_err();
        assert!(e.contains("cannot fit"), "{e}");
    }
}
