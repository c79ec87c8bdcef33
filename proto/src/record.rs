//! One record inside a v2 batch's (uncompressed) records section.
//!
//! ```text
//! length          varint   bytes that follow this field
//! attributes      i8       unused, 0
//! timestampDelta  varlong  relative to the batch's base_timestamp
//! offsetDelta     varint   relative to the batch's base_offset
//! keyLength       varint   -1 = null
//! key             bytes
//! valueLength     varint   -1 = null
//! value           bytes
//! headersCount    varint
//! headers         [keyLength varint, key bytes (UTF-8),
//!                  valueLength varint (-1 = null), value bytes]
//! ```
//!
//! [`Record`] is a zero-copy view that [`Record::parse`] checks completely,
//! so reading its headers cannot fail. [`RecordData`] is the owned form a
//! producer builds batches from.

use bytes::{BufMut, Bytes};

use crate::batch::BatchError;
use crate::varint::{
    decode_varint, decode_varlong, put_varint, put_varlong, varint_len, varlong_len,
};

/// Smallest encoded record: a one-byte varint for each of length,
/// timestampDelta, offsetDelta, keyLength, valueLength and headersCount,
/// plus the attributes byte.
pub const RECORD_BYTES_MIN: usize = 7;

/// A record borrowed from a records section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// Record attributes (unused by Kafka, normally 0).
    pub attributes: i8,
    /// Timestamp minus the batch's base timestamp.
    pub timestamp_delta: i64,
    /// Offset minus the batch's base offset.
    pub offset_delta: i32,
    /// The key; `None` when null.
    pub key: Option<&'a [u8]>,
    /// The value; `None` when null (a tombstone).
    pub value: Option<&'a [u8]>,
    headers_count: u32,
    headers: &'a [u8],
}

/// One record header, borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header<'a> {
    /// The key's bytes (UTF-8 by Kafka's contract; not checked here).
    pub key: &'a [u8],
    /// The value; `None` when null.
    pub value: Option<&'a [u8]>,
}

impl<'a> Header<'a> {
    /// The key as text, if it is valid UTF-8.
    pub fn key_str(&self) -> Option<&'a str> {
        std::str::from_utf8(self.key).ok()
    }
}

impl<'a> Record<'a> {
    /// Parses the record at the start of `buf`, returning it and the bytes it
    /// occupies (length prefix included). Fails if the length field runs past
    /// `buf` or disagrees with the fields it encloses, or if any field is
    /// malformed. Header keys are not checked to be UTF-8.
    pub fn parse(buf: &'a [u8]) -> Result<(Record<'a>, usize), BatchError> {
        let (length, prefix) = decode_varint(buf)?;
        let length =
            usize::try_from(length).map_err(|_| BatchError::Records("negative record length"))?;
        let end = prefix
            .checked_add(length)
            .filter(|&end| end <= buf.len())
            .ok_or(BatchError::Records(
                "record length runs past the records section",
            ))?;
        let mut cur = Cursor {
            buf: &buf[prefix..end],
            pos: 0,
        };
        let attributes = cur.u8()? as i8;
        let timestamp_delta = cur.varlong()?;
        let offset_delta = cur.varint()?;
        let key = cur.nullable_bytes()?;
        let value = cur.nullable_bytes()?;
        let headers_count = u32::try_from(cur.varint()?)
            .map_err(|_| BatchError::Records("negative record header count"))?;
        let headers_start = cur.pos;
        // Each header takes at least two bytes, so this loop is bounded by
        // the record's length, whatever the count claims.
        for _ in 0..headers_count {
            cur.nullable_bytes()?
                .ok_or(BatchError::Records("null record header key"))?;
            cur.nullable_bytes()?;
        }
        if cur.pos != cur.buf.len() {
            return Err(BatchError::Records("record length exceeds its fields"));
        }
        let record = Record {
            attributes,
            timestamp_delta,
            offset_delta,
            key,
            value,
            headers_count,
            headers: &cur.buf[headers_start..],
        };
        Ok((record, end))
    }

    /// Number of headers.
    pub fn headers_len(&self) -> usize {
        self.headers_count as usize
    }

    /// The headers, in order.
    pub fn headers(&self) -> Headers<'a> {
        Headers {
            cur: Cursor {
                buf: self.headers,
                pos: 0,
            },
            remaining: self.headers_count,
        }
    }
}

/// Iterator over a [`Record`]'s headers.
#[derive(Debug, Clone)]
pub struct Headers<'a> {
    cur: Cursor<'a>,
    remaining: u32,
}

impl<'a> Iterator for Headers<'a> {
    type Item = Header<'a>;

    fn next(&mut self) -> Option<Header<'a>> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        // `Record::parse` checked these bytes; failure here is unreachable
        // but ends the iteration rather than panicking.
        let key = self.cur.nullable_bytes().ok().flatten()?;
        let value = self.cur.nullable_bytes().ok()?;
        Some(Header { key, value })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.remaining as usize))
    }
}

/// An owned record, as a producer hands it to [`crate::builder::BatchBuilder`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordData {
    /// The key; `None` for null.
    pub key: Option<Bytes>,
    /// The value; `None` for null.
    pub value: Option<Bytes>,
    /// Headers in order; duplicate keys are allowed.
    pub headers: Vec<(String, Option<Bytes>)>,
    /// Timestamp in milliseconds.
    pub timestamp: i64,
}

impl RecordData {
    /// Encoded size of this record with the given deltas, length prefix
    /// included. Fails if a length or count does not fit an i32.
    pub fn encoded_len(
        &self,
        timestamp_delta: i64,
        offset_delta: i32,
    ) -> Result<usize, BatchError> {
        let body = self.body_len(timestamp_delta, offset_delta)?;
        Ok(varint_len(body) + body as usize)
    }

    /// Appends the encoded record to `out`. Nothing is written on error.
    pub fn encode<B: BufMut>(
        &self,
        timestamp_delta: i64,
        offset_delta: i32,
        out: &mut B,
    ) -> Result<(), BatchError> {
        let body = self.body_len(timestamp_delta, offset_delta)?;
        put_varint(out, body);
        out.put_u8(0);
        put_varlong(out, timestamp_delta);
        put_varint(out, offset_delta);
        put_nullable(out, self.key.as_deref());
        put_nullable(out, self.value.as_deref());
        put_varint(out, self.headers.len() as i32);
        for (key, value) in &self.headers {
            put_nullable(out, Some(key.as_bytes()));
            put_nullable(out, value.as_deref());
        }
        Ok(())
    }

    /// Length of everything after the length prefix, checked to fit an i32
    /// (which also bounds every length and count inside).
    fn body_len(&self, timestamp_delta: i64, offset_delta: i32) -> Result<i32, BatchError> {
        let mut len = 1 + varlong_len(timestamp_delta) + varint_len(offset_delta);
        len = add(len, nullable_len(self.key.as_deref())?)?;
        len = add(len, nullable_len(self.value.as_deref())?)?;
        let count = i32::try_from(self.headers.len())
            .map_err(|_| BatchError::TooLarge("record header count"))?;
        len = add(len, varint_len(count))?;
        for (key, value) in &self.headers {
            len = add(len, nullable_len(Some(key.as_bytes()))?)?;
            len = add(len, nullable_len(value.as_deref())?)?;
        }
        i32::try_from(len).map_err(|_| BatchError::TooLarge("record"))
    }
}

fn add(a: usize, b: usize) -> Result<usize, BatchError> {
    a.checked_add(b).ok_or(BatchError::TooLarge("record"))
}

fn nullable_len(bytes: Option<&[u8]>) -> Result<usize, BatchError> {
    match bytes {
        None => Ok(varint_len(-1)),
        Some(b) => {
            let n = i32::try_from(b.len()).map_err(|_| BatchError::TooLarge("record field"))?;
            Ok(varint_len(n) + b.len())
        }
    }
}

/// Callers have checked `bytes.len()` fits an i32 via [`nullable_len`].
fn put_nullable<B: BufMut>(out: &mut B, bytes: Option<&[u8]>) {
    match bytes {
        None => put_varint(out, -1),
        Some(b) => {
            put_varint(out, b.len() as i32);
            out.put_slice(b);
        }
    }
}

/// Reads fields from one record's bytes; running out of them means the
/// record's length field is shorter than its fields.
#[derive(Debug, Clone)]
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

const SHORT: BatchError = BatchError::Records("record fields run past its length");

impl<'a> Cursor<'a> {
    fn rest(&self) -> &'a [u8] {
        self.buf.get(self.pos..).unwrap_or(&[])
    }

    fn u8(&mut self) -> Result<u8, BatchError> {
        let b = *self.rest().first().ok_or(SHORT)?;
        self.pos += 1;
        Ok(b)
    }

    fn varint(&mut self) -> Result<i32, BatchError> {
        let (v, n) = decode_varint(self.rest()).map_err(short_if_truncated)?;
        self.pos += n;
        Ok(v)
    }

    fn varlong(&mut self) -> Result<i64, BatchError> {
        let (v, n) = decode_varlong(self.rest()).map_err(short_if_truncated)?;
        self.pos += n;
        Ok(v)
    }

    /// A varint length (-1 = null) and that many bytes.
    fn nullable_bytes(&mut self) -> Result<Option<&'a [u8]>, BatchError> {
        let len = self.varint()?;
        if len == -1 {
            return Ok(None);
        }
        let len =
            usize::try_from(len).map_err(|_| BatchError::Records("negative length in record"))?;
        let bytes = self.rest().get(..len).ok_or(SHORT)?;
        self.pos += len;
        Ok(Some(bytes))
    }
}

fn short_if_truncated(e: BatchError) -> BatchError {
    match e {
        BatchError::VarintTruncated => SHORT,
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RecordData {
        RecordData {
            key: Some(Bytes::from_static(b"k")),
            value: None,
            headers: vec![
                ("h".into(), Some(Bytes::from_static(b"v"))),
                ("n".into(), None),
            ],
            timestamp: 0,
        }
    }

    #[test]
    fn round_trip() {
        let data = sample();
        let mut out = Vec::new();
        data.encode(-5, 3, &mut out).unwrap();
        assert_eq!(out.len(), data.encoded_len(-5, 3).unwrap());
        let (r, n) = Record::parse(&out).unwrap();
        assert_eq!(n, out.len());
        assert_eq!((r.timestamp_delta, r.offset_delta), (-5, 3));
        assert_eq!((r.key, r.value), (Some(&b"k"[..]), None));
        let headers: Vec<_> = r.headers().collect();
        assert_eq!(
            headers,
            [
                Header {
                    key: b"h",
                    value: Some(b"v")
                },
                Header {
                    key: b"n",
                    value: None
                }
            ]
        );
        assert_eq!(headers[0].key_str(), Some("h"));
    }

    #[test]
    fn minimal_record_is_seven_bytes() {
        let mut out = Vec::new();
        RecordData::default().encode(0, 0, &mut out).unwrap();
        assert_eq!(out.len(), RECORD_BYTES_MIN);
    }

    #[test]
    fn length_disagreeing_with_fields_is_rejected() {
        let mut out = Vec::new();
        sample().encode(0, 0, &mut out).unwrap();
        // Length one too short: the fields run past it.
        let mut short = out.clone();
        short[0] -= 2; // zigzag: -2 is one less
        assert!(matches!(Record::parse(&short), Err(BatchError::Records(_))));
        // Length one too long: a stray byte inside the record.
        let mut long = out.clone();
        long[0] += 2;
        long.push(0);
        assert!(matches!(Record::parse(&long), Err(BatchError::Records(_))));
        // Length past the buffer.
        assert!(matches!(
            Record::parse(&out[..out.len() - 1]),
            Err(BatchError::Records(_))
        ));
    }

    #[test]
    fn huge_header_count_is_bounded_by_length() {
        // length 7: attrs, ts, off, key null, value null, count = i32::MAX
        let mut out = vec![0x0e, 0, 0, 0];
        out.extend([0x01, 0x01]);
        out.extend([0xfe, 0xff, 0xff, 0xff, 0x0f]);
        out[0] = 2 * (out.len() as u8 - 1);
        assert!(Record::parse(&out).is_err());
    }

    #[test]
    fn bad_lengths_are_rejected() {
        // key length -2
        let rec = [0x0c, 0, 0, 0, 0x03, 0x01, 0x00];
        assert!(matches!(
            Record::parse(&rec[..]),
            Err(BatchError::Records(_))
        ));
        // negative record length
        assert!(Record::parse(&[0x01]).is_err());
        assert!(Record::parse(&[]).is_err());
    }
}
