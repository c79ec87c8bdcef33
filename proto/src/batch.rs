//! The record batch header: Kafka's RecordBatch v2, byte-compatible.
//!
//! ```text
//!  offset size field
//!       0    8 base_offset            (i64, big endian; rewritten by the broker)
//!       8    4 batch_length           (i32; bytes that follow this field)
//!      12    4 partition_leader_epoch (i32; rewritten by the broker)
//!      16    1 magic                  (i8, always 2)
//!      17    4 crc                    (u32, CRC32C of bytes 21..end)
//!      21    2 attributes             (i16; see `Attributes`)
//!      23    4 last_offset_delta      (i32)
//!      27    8 base_timestamp         (i64, ms)
//!      35    8 max_timestamp          (i64, ms)
//!      43    8 producer_id            (i64, -1 if none)
//!      51    2 producer_epoch         (i16)
//!      53    4 base_sequence          (i32)
//!      57    4 records_count          (i32)
//!      61    … records                (varint encoded, maybe compressed)
//! ```
//!
//! The CRC covers everything from `attributes` to the end, so the two fields
//! the broker rewrites (`base_offset`, `partition_leader_epoch`) never require
//! recomputing it.
//!
//! Invariant: every function here is total on arbitrary input — it returns a
//! [`BatchError`] and never panics or allocates in proportion to a field read
//! from the input.

use thiserror::Error;

/// Size of the fixed header that precedes the records.
pub const HEADER_BYTES: usize = 61;
/// Bytes before the `batch_length` field ends: base offset + length.
pub const LOG_OVERHEAD: usize = 12;
/// The only supported magic byte.
pub const MAGIC: i8 = 2;
/// Start of the CRC-covered region (the attributes field).
pub const CRC_START: usize = 21;
/// Largest batch this crate accepts (the `batch_length` field is an i32).
pub const BATCH_BYTES_MAX: usize = i32::MAX as usize;

const OFF_LENGTH: usize = 8;
const OFF_LEADER_EPOCH: usize = 12;
const OFF_MAGIC: usize = 16;
const OFF_CRC: usize = 17;
const OFF_ATTRIBUTES: usize = 21;
const OFF_LAST_OFFSET_DELTA: usize = 23;
const OFF_BASE_TIMESTAMP: usize = 27;
const OFF_MAX_TIMESTAMP: usize = 35;
const OFF_PRODUCER_ID: usize = 43;
const OFF_PRODUCER_EPOCH: usize = 51;
const OFF_BASE_SEQUENCE: usize = 53;
const OFF_RECORDS_COUNT: usize = 57;

const _: () = assert!(OFF_RECORDS_COUNT + 4 == HEADER_BYTES);
const _: () = assert!(OFF_CRC + 4 == CRC_START);

/// Compression codec of the records section (attribute bits 0..=2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Compression {
    /// Records stored as is.
    None,
    /// gzip (recognised, not produced or decoded by Weir).
    Gzip,
    /// snappy (recognised, not produced or decoded by Weir).
    Snappy,
    /// LZ4 frame format, as Kafka clients write it.
    Lz4,
    /// Zstandard.
    Zstd,
}

impl Compression {
    /// The codec id stored in the attribute bits.
    pub fn id(self) -> i16 {
        match self {
            Compression::None => 0,
            Compression::Gzip => 1,
            Compression::Snappy => 2,
            Compression::Lz4 => 3,
            Compression::Zstd => 4,
        }
    }

    /// The codec for an id, if it is one Kafka defines.
    pub fn from_id(id: i16) -> Option<Self> {
        Some(match id {
            0 => Compression::None,
            1 => Compression::Gzip,
            2 => Compression::Snappy,
            3 => Compression::Lz4,
            4 => Compression::Zstd,
            _ => return None,
        })
    }
}

/// How the batch's timestamps were assigned (attribute bit 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampType {
    /// Set by the producer.
    CreateTime,
    /// Set by the broker at append; every record has `max_timestamp`.
    LogAppendTime,
}

/// The attribute bits of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Attributes(pub i16);

impl Attributes {
    /// Attribute bit: timestamps are LogAppendTime.
    pub const TIMESTAMP_TYPE: i16 = 1 << 3;
    /// Attribute bit: the batch is part of a transaction.
    pub const TRANSACTIONAL: i16 = 1 << 4;
    /// Attribute bit: the batch is a control batch.
    pub const CONTROL: i16 = 1 << 5;
    /// Attribute bit: the base timestamp is a delete horizon (compaction).
    pub const DELETE_HORIZON: i16 = 1 << 6;

    /// The compression codec, if the bits name a known one.
    pub fn compression(self) -> Option<Compression> {
        Compression::from_id(self.0 & 0x7)
    }
    /// The timestamp type.
    pub fn timestamp_type(self) -> TimestampType {
        if self.0 & Self::TIMESTAMP_TYPE != 0 {
            TimestampType::LogAppendTime
        } else {
            TimestampType::CreateTime
        }
    }
    /// Whether the transactional bit is set.
    pub fn is_transactional(self) -> bool {
        self.0 & Self::TRANSACTIONAL != 0
    }
    /// Whether the control bit is set.
    pub fn is_control(self) -> bool {
        self.0 & Self::CONTROL != 0
    }
}

/// Why a byte slice is not a valid record batch.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum BatchError {
    /// Fewer bytes than the fixed header.
    #[error("record batch truncated: {len} bytes, the header alone needs {HEADER_BYTES}")]
    ShortHeader {
        /// Bytes available.
        len: usize,
    },
    /// `batch_length` is negative or too small to hold the header.
    #[error("record batch length field {length} is invalid (minimum {})", HEADER_BYTES - LOG_OVERHEAD)]
    BadLength {
        /// The field's value.
        length: i32,
    },
    /// `batch_length` points past the bytes given.
    #[error("record batch length {needed} runs past the {available} bytes available")]
    LengthPastEnd {
        /// Bytes the length field claims (including the 12-byte prefix).
        needed: usize,
        /// Bytes actually there.
        available: usize,
    },
    /// The magic byte is not 2.
    #[error("unsupported record batch magic {magic} (only magic 2 is supported)")]
    BadMagic {
        /// The byte found.
        magic: i8,
    },
    /// The stored CRC does not match the bytes.
    #[error("record batch CRC mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BadCrc {
        /// CRC in the header.
        stored: u32,
        /// CRC of the bytes.
        computed: u32,
    },
    /// Attribute bits name no known codec.
    #[error("record batch names unknown compression codec {id}")]
    UnknownCompression {
        /// Codec id from the attributes.
        id: i16,
    },
    /// Record count is not positive or disagrees with `last_offset_delta`.
    #[error("record batch has {records_count} records but last_offset_delta {last_offset_delta}")]
    BadCount {
        /// The records count field.
        records_count: i32,
        /// The last offset delta field.
        last_offset_delta: i32,
    },
    /// Records could not be decoded (see the message).
    #[error("record batch records are malformed: {0}")]
    Records(&'static str),
    /// Compressed records could not be decompressed.
    #[error("record batch decompression ({codec:?}) failed: {reason}")]
    Decompress {
        /// The codec.
        codec: Compression,
        /// What the decoder said.
        reason: String,
    },
    /// Records could not be compressed.
    #[error("record batch compression ({codec:?}) failed: {reason}")]
    Compress {
        /// The codec.
        codec: Compression,
        /// What the encoder said.
        reason: String,
    },
    /// The codec is recognised but Weir does not implement it.
    #[error("compression codec {0:?} is not supported by Weir (use none, lz4 or zstd)")]
    UnsupportedCompression(Compression),
    /// A varint or varlong ends before its last byte.
    #[error("varint truncated")]
    VarintTruncated,
    /// A varint or varlong is longer than its type allows or overflows it.
    #[error("varint too long or overflows its type")]
    VarintOverlong,
    /// Decompressed records would exceed the limit (see
    /// [`crate::compression::DECOMPRESSED_BYTES_MAX`]).
    #[error("record batch decompression ({codec:?}) exceeds the {limit}-byte limit")]
    DecompressedTooLarge {
        /// The codec.
        codec: Compression,
        /// The limit that was hit.
        limit: usize,
    },
    /// A value is too large to encode (a length or count past `i32::MAX`,
    /// or a timestamp delta that overflows `i64`).
    #[error("cannot encode record batch: {0} too large")]
    TooLarge(&'static str),
    /// `build` was called on a builder holding no records.
    #[error("cannot build a record batch with no records")]
    Empty,
}

/// The decoded fixed header of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    /// Offset of the first record.
    pub base_offset: i64,
    /// Bytes following the `batch_length` field.
    pub batch_length: i32,
    /// Leader epoch stamped by the broker.
    pub partition_leader_epoch: i32,
    /// Magic byte (2).
    pub magic: i8,
    /// Stored CRC32C.
    pub crc: u32,
    /// Attribute bits.
    pub attributes: Attributes,
    /// Offset of the last record minus `base_offset`.
    pub last_offset_delta: i32,
    /// Timestamp of the first record (ms).
    pub base_timestamp: i64,
    /// Largest timestamp in the batch (ms).
    pub max_timestamp: i64,
    /// Producer id, -1 if none.
    pub producer_id: i64,
    /// Producer epoch.
    pub producer_epoch: i16,
    /// Sequence number of the first record.
    pub base_sequence: i32,
    /// Number of records.
    pub records_count: i32,
}

impl BatchHeader {
    /// Total size of the batch in bytes, including the 12-byte prefix.
    pub fn total_len(&self) -> usize {
        self.batch_length as usize + LOG_OVERHEAD
    }
    /// Offset of the last record in the batch.
    pub fn last_offset(&self) -> i64 {
        self.base_offset + self.last_offset_delta as i64
    }
    /// The record offsets covered by the batch (`last - base + 1`).
    pub fn offset_span(&self) -> u64 {
        self.last_offset_delta as u64 + 1
    }

    /// Reads the header fields without checking length, magic or CRC.
    /// Errors only when fewer than [`HEADER_BYTES`] are given.
    pub fn peek(buf: &[u8]) -> Result<BatchHeader, BatchError> {
        if buf.len() < HEADER_BYTES {
            return Err(BatchError::ShortHeader { len: buf.len() });
        }
        Ok(BatchHeader {
            base_offset: i64_at(buf, 0),
            batch_length: i32_at(buf, OFF_LENGTH),
            partition_leader_epoch: i32_at(buf, OFF_LEADER_EPOCH),
            magic: buf[OFF_MAGIC] as i8,
            crc: u32_at(buf, OFF_CRC),
            attributes: Attributes(i16_at(buf, OFF_ATTRIBUTES)),
            last_offset_delta: i32_at(buf, OFF_LAST_OFFSET_DELTA),
            base_timestamp: i64_at(buf, OFF_BASE_TIMESTAMP),
            max_timestamp: i64_at(buf, OFF_MAX_TIMESTAMP),
            producer_id: i64_at(buf, OFF_PRODUCER_ID),
            producer_epoch: i16_at(buf, OFF_PRODUCER_EPOCH),
            base_sequence: i32_at(buf, OFF_BASE_SEQUENCE),
            records_count: i32_at(buf, OFF_RECORDS_COUNT),
        })
    }

    /// Writes every header field, including `crc` as stored in `self`.
    pub fn write(&self, out: &mut [u8; HEADER_BYTES]) {
        out[0..8].copy_from_slice(&self.base_offset.to_be_bytes());
        out[OFF_LENGTH..OFF_LENGTH + 4].copy_from_slice(&self.batch_length.to_be_bytes());
        out[OFF_LEADER_EPOCH..OFF_LEADER_EPOCH + 4]
            .copy_from_slice(&self.partition_leader_epoch.to_be_bytes());
        out[OFF_MAGIC] = self.magic as u8;
        out[OFF_CRC..OFF_CRC + 4].copy_from_slice(&self.crc.to_be_bytes());
        out[OFF_ATTRIBUTES..OFF_ATTRIBUTES + 2].copy_from_slice(&self.attributes.0.to_be_bytes());
        out[OFF_LAST_OFFSET_DELTA..OFF_LAST_OFFSET_DELTA + 4]
            .copy_from_slice(&self.last_offset_delta.to_be_bytes());
        out[OFF_BASE_TIMESTAMP..OFF_BASE_TIMESTAMP + 8]
            .copy_from_slice(&self.base_timestamp.to_be_bytes());
        out[OFF_MAX_TIMESTAMP..OFF_MAX_TIMESTAMP + 8]
            .copy_from_slice(&self.max_timestamp.to_be_bytes());
        out[OFF_PRODUCER_ID..OFF_PRODUCER_ID + 8].copy_from_slice(&self.producer_id.to_be_bytes());
        out[OFF_PRODUCER_EPOCH..OFF_PRODUCER_EPOCH + 2]
            .copy_from_slice(&self.producer_epoch.to_be_bytes());
        out[OFF_BASE_SEQUENCE..OFF_BASE_SEQUENCE + 4]
            .copy_from_slice(&self.base_sequence.to_be_bytes());
        out[OFF_RECORDS_COUNT..OFF_RECORDS_COUNT + 4]
            .copy_from_slice(&self.records_count.to_be_bytes());
    }

    /// Parses the header at the start of `buf` and checks the framing: the
    /// length field is sane and fits in `buf`, and the magic is 2. The CRC is
    /// not checked (see [`validate`]). `buf` may hold more bytes after the
    /// batch.
    pub fn parse_framed(buf: &[u8]) -> Result<BatchHeader, BatchError> {
        let h = Self::peek(buf)?;
        if h.batch_length < (HEADER_BYTES - LOG_OVERHEAD) as i32 {
            return Err(BatchError::BadLength {
                length: h.batch_length,
            });
        }
        let needed = h.total_len();
        if needed > buf.len() {
            return Err(BatchError::LengthPastEnd {
                needed,
                available: buf.len(),
            });
        }
        if h.magic != MAGIC {
            return Err(BatchError::BadMagic { magic: h.magic });
        }
        Ok(h)
    }
}

/// CRC32C over the CRC-covered region of a complete batch (`buf` must be
/// exactly one batch).
pub fn compute_crc(batch: &[u8]) -> u32 {
    crc32c::crc32c(&batch[CRC_START.min(batch.len())..])
}

/// Fully validates the batch at the start of `buf`: framing, magic, CRC,
/// a known codec, and a record count consistent with `last_offset_delta`
/// (`records_count - 1 <= last_offset_delta`; compaction leaves gaps, so the
/// delta may be larger, and may leave a batch with no records that still
/// covers its offsets, as Kafka does). Returns the header; the batch
/// occupies `buf[..header.total_len()]`.
pub fn validate(buf: &[u8]) -> Result<BatchHeader, BatchError> {
    let h = BatchHeader::parse_framed(buf)?;
    let computed = compute_crc(&buf[..h.total_len()]);
    if computed != h.crc {
        return Err(BatchError::BadCrc {
            stored: h.crc,
            computed,
        });
    }
    let codec = h.attributes.0 & 0x7;
    if Compression::from_id(codec).is_none() {
        return Err(BatchError::UnknownCompression { id: codec });
    }
    if h.records_count < 0
        || h.last_offset_delta < 0
        || (h.records_count > 0 && h.records_count - 1 > h.last_offset_delta)
    {
        return Err(BatchError::BadCount {
            records_count: h.records_count,
            last_offset_delta: h.last_offset_delta,
        });
    }
    Ok(h)
}

/// Rewrites the base offset of the batch at the start of `buf`. The CRC does
/// not cover this field, so it stays valid.
pub fn set_base_offset(buf: &mut [u8], base_offset: i64) {
    buf[0..8].copy_from_slice(&base_offset.to_be_bytes());
}

/// Rewrites the partition leader epoch of the batch at the start of `buf`.
/// The CRC does not cover this field.
pub fn set_partition_leader_epoch(buf: &mut [u8], epoch: i32) {
    buf[OFF_LEADER_EPOCH..OFF_LEADER_EPOCH + 4].copy_from_slice(&epoch.to_be_bytes());
}

/// Stores `crc` into the header of `buf` (used by builders after the rest
/// of the batch is final).
pub fn set_crc(buf: &mut [u8], crc: u32) {
    buf[OFF_CRC..OFF_CRC + 4].copy_from_slice(&crc.to_be_bytes());
}

/// Iterates over the complete, validated batches at the start of `buf`,
/// yielding `(header, byte range)`. Stops (yielding the error) at the first
/// invalid batch; a clean end of input ends the iteration.
pub fn batches(buf: &[u8]) -> BatchIter<'_> {
    BatchIter { buf, pos: 0 }
}

/// Iterator returned by [`batches`].
#[derive(Debug)]
pub struct BatchIter<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Iterator for BatchIter<'_> {
    type Item = Result<(BatchHeader, std::ops::Range<usize>), BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.buf.len() {
            return None;
        }
        match validate(&self.buf[self.pos..]) {
            Ok(h) => {
                let r = self.pos..self.pos + h.total_len();
                self.pos = r.end;
                Some(Ok((h, r)))
            }
            Err(e) => {
                self.pos = self.buf.len();
                Some(Err(e))
            }
        }
    }
}

fn i64_at(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn i16_at(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_input_is_rejected_without_panic() {
        for n in 0..HEADER_BYTES {
            assert!(matches!(
                validate(&vec![0u8; n]),
                Err(BatchError::ShortHeader { .. })
            ));
        }
        assert!(matches!(
            validate(&[0u8; 100]),
            Err(BatchError::BadLength { .. })
        ));
    }
}
