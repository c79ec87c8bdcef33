//! Reading the records of a batch.
//!
//! [`RecordBatch::parse`] validates a batch; [`RecordBatch::records`] gives
//! its records section, decompressed into an owned buffer when the batch is
//! compressed and borrowed otherwise; [`DecodedRecords::iter`] yields
//! zero-copy [`DecodedRecord`]s with absolute offsets and timestamps.
//!
//! Nothing here allocates in proportion to a count read from the input:
//! the iterator checks `records_count` against the bytes actually present.

use std::borrow::Cow;

use crate::batch::{validate, BatchError, BatchHeader, Compression, TimestampType, HEADER_BYTES};
use crate::compression::decompress;
use crate::record::{Record, RECORD_BYTES_MIN};

/// A validated batch borrowed from a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordBatch<'a> {
    header: BatchHeader,
    compression: Compression,
    bytes: &'a [u8],
}

impl<'a> RecordBatch<'a> {
    /// Validates the batch at the start of `buf` (see
    /// [`crate::batch::validate`]); bytes after it are ignored.
    pub fn parse(buf: &'a [u8]) -> Result<Self, BatchError> {
        let header = validate(buf)?;
        let id = header.attributes.0 & 0x7;
        let compression = Compression::from_id(id).ok_or(BatchError::UnknownCompression { id })?;
        let bytes = buf
            .get(..header.total_len())
            .ok_or(BatchError::Records("batch length past the buffer"))?;
        Ok(RecordBatch {
            header,
            compression,
            bytes,
        })
    }

    /// The batch header.
    pub fn header(&self) -> &BatchHeader {
        &self.header
    }

    /// The codec of the records section.
    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// The whole batch, header included.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The records section as stored (compressed if the batch is).
    pub fn records_section(&self) -> &'a [u8] {
        self.bytes.get(HEADER_BYTES..).unwrap_or(&[])
    }

    /// The records, decompressed if need be (bounded by
    /// [`crate::compression::DECOMPRESSED_BYTES_MAX`]).
    pub fn records(&self) -> Result<DecodedRecords<'a>, BatchError> {
        let section = self.records_section();
        let data = match self.compression {
            Compression::None => Cow::Borrowed(section),
            codec => Cow::Owned(decompress(codec, section)?),
        };
        DecodedRecords::new(self.header, data)
    }
}

/// The uncompressed records section of a batch, ready to iterate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedRecords<'a> {
    header: BatchHeader,
    data: Cow<'a, [u8]>,
}

impl<'a> DecodedRecords<'a> {
    /// Pairs a header with its uncompressed records section. Fails if the
    /// header's `records_count` is negative or more than the section could
    /// possibly hold.
    pub fn new(header: BatchHeader, data: Cow<'a, [u8]>) -> Result<Self, BatchError> {
        let count = usize::try_from(header.records_count)
            .map_err(|_| BatchError::Records("negative records count"))?;
        if count > data.len() / RECORD_BYTES_MIN {
            return Err(BatchError::Records(
                "records count exceeds what the records section can hold",
            ));
        }
        Ok(DecodedRecords { header, data })
    }

    /// The batch header.
    pub fn header(&self) -> &BatchHeader {
        &self.header
    }

    /// The uncompressed records section.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// Iterates over the records. Each item is a record or the first error;
    /// after an error the iteration ends.
    pub fn iter(&self) -> RecordIter<'_> {
        let h = &self.header;
        RecordIter {
            data: &self.data,
            pos: 0,
            remaining: u32::try_from(h.records_count).unwrap_or(0),
            base_offset: h.base_offset,
            base_timestamp: h.base_timestamp,
            log_append_time: match h.attributes.timestamp_type() {
                TimestampType::LogAppendTime => Some(h.max_timestamp),
                TimestampType::CreateTime => None,
            },
            done: false,
        }
    }
}

impl<'b> IntoIterator for &'b DecodedRecords<'_> {
    type Item = Result<DecodedRecord<'b>, BatchError>;
    type IntoIter = RecordIter<'b>;

    fn into_iter(self) -> RecordIter<'b> {
        self.iter()
    }
}

/// A record with its absolute offset and timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodedRecord<'a> {
    /// `base_offset + offset_delta`.
    pub offset: i64,
    /// `base_timestamp + timestamp_delta`, or the batch's `max_timestamp`
    /// for LogAppendTime batches.
    pub timestamp: i64,
    /// The record itself.
    pub record: Record<'a>,
}

/// Iterator returned by [`DecodedRecords::iter`].
#[derive(Debug, Clone)]
pub struct RecordIter<'a> {
    data: &'a [u8],
    pos: usize,
    remaining: u32,
    base_offset: i64,
    base_timestamp: i64,
    log_append_time: Option<i64>,
    done: bool,
}

impl<'a> RecordIter<'a> {
    fn step(&mut self) -> Option<Result<DecodedRecord<'a>, BatchError>> {
        let rest = self.data.get(self.pos..).unwrap_or(&[]);
        if self.remaining == 0 {
            return (!rest.is_empty()).then_some(Err(BatchError::Records(
                "trailing bytes after the last record",
            )));
        }
        if rest.is_empty() {
            return Some(Err(BatchError::Records(
                "records section ends before records count records",
            )));
        }
        Some(self.decode(rest))
    }

    fn decode(&mut self, rest: &'a [u8]) -> Result<DecodedRecord<'a>, BatchError> {
        let (record, used) = Record::parse(rest)?;
        let offset = self
            .base_offset
            .checked_add(i64::from(record.offset_delta))
            .ok_or(BatchError::Records("record offset overflows"))?;
        let timestamp = match self.log_append_time {
            Some(t) => t,
            None => self
                .base_timestamp
                .checked_add(record.timestamp_delta)
                .ok_or(BatchError::Records("record timestamp overflows"))?,
        };
        self.pos += used;
        self.remaining -= 1;
        Ok(DecodedRecord {
            offset,
            timestamp,
            record,
        })
    }
}

impl<'a> Iterator for RecordIter<'a> {
    type Item = Result<DecodedRecord<'a>, BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let item = self.step();
        if !matches!(item, Some(Ok(_))) {
            self.done = true;
        }
        item
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.done {
            (0, Some(0))
        } else {
            (0, Some(self.remaining as usize + 1))
        }
    }
}

impl std::iter::FusedIterator for RecordIter<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::{compute_crc, set_base_offset, set_crc, Attributes};
    use crate::builder::BatchBuilder;
    use crate::record::RecordData;
    use bytes::Bytes;

    fn batch(codec: Compression, n: i64) -> Vec<u8> {
        let mut b = BatchBuilder::new(codec).unwrap();
        for i in 0..n {
            b.push(&RecordData {
                key: Some(Bytes::from(format!("k{i}"))),
                value: (i % 2 == 0).then(|| Bytes::from_static(b"value")),
                headers: vec![("h".into(), None)],
                timestamp: 1000 - i,
            })
            .unwrap();
        }
        b.build().unwrap().to_vec()
    }

    /// Overwrites a big-endian field and fixes the CRC.
    fn patch(buf: &mut [u8], at: usize, bytes: &[u8]) {
        buf[at..at + bytes.len()].copy_from_slice(bytes);
        let crc = compute_crc(buf);
        set_crc(buf, crc);
    }

    #[test]
    fn reads_back_with_absolute_fields() {
        for codec in [Compression::None, Compression::Lz4, Compression::Zstd] {
            let mut buf = batch(codec, 3);
            set_base_offset(&mut buf, 40);
            let rb = RecordBatch::parse(&buf).unwrap();
            assert_eq!(rb.compression(), codec);
            let records = rb.records().unwrap();
            let got: Vec<_> = records.iter().map(Result::unwrap).collect();
            assert_eq!(got.len(), 3);
            for (i, r) in got.iter().enumerate() {
                assert_eq!(r.offset, 40 + i as i64);
                assert_eq!(r.timestamp, 1000 - i as i64);
                assert_eq!(r.record.key, Some(format!("k{i}").as_bytes()));
                assert_eq!(r.record.headers().count(), 1);
            }
        }
    }

    #[test]
    fn log_append_time_uses_max_timestamp() {
        let mut buf = batch(Compression::None, 3);
        let attrs = Attributes::TIMESTAMP_TYPE.to_be_bytes();
        patch(&mut buf, 21, &attrs);
        patch(&mut buf, 35, &7777i64.to_be_bytes());
        let rb = RecordBatch::parse(&buf).unwrap();
        for r in &rb.records().unwrap() {
            assert_eq!(r.unwrap().timestamp, 7777);
        }
    }

    #[test]
    fn huge_records_count_fails_fast() {
        for codec in [Compression::None, Compression::Zstd] {
            let mut buf = batch(codec, 1);
            patch(&mut buf, 23, &i32::MAX.to_be_bytes()); // last_offset_delta
            patch(&mut buf, 57, &i32::MAX.to_be_bytes()); // records_count
            let rb = RecordBatch::parse(&buf).unwrap();
            assert!(matches!(rb.records(), Err(BatchError::Records(_))));
            // The iterator alone, without the up-front check, also stops.
            let data = Cow::Owned(decompress(codec, rb.records_section()).unwrap());
            let mut it = DecodedRecords {
                header: *rb.header(),
                data,
            };
            let n = it.iter().count();
            assert_eq!(n, 2, "one record then the error");
            assert!(it.iter().nth(1).unwrap().is_err());
            it.header.records_count = 1;
            assert!(it.iter().all(|r| r.is_ok()));
        }
    }

    #[test]
    fn count_mismatches_are_errors() {
        let mut buf = batch(Compression::None, 3);
        // Fewer records claimed than present: trailing bytes.
        patch(&mut buf, 57, &2i32.to_be_bytes());
        let records = RecordBatch::parse(&buf).unwrap().records().unwrap();
        let items: Vec<_> = records.iter().collect();
        assert_eq!(items.len(), 3);
        assert!(items[2].is_err());
        // More claimed than present: runs out.
        patch(&mut buf, 57, &3i32.to_be_bytes());
        let total = buf.len() as i32;
        let cut = 5;
        let mut short = buf[..buf.len() - cut].to_vec();
        patch(&mut short, 8, &(total - 12 - cut as i32).to_be_bytes());
        let records = RecordBatch::parse(&short).unwrap().records().unwrap();
        let items: Vec<_> = records.iter().collect();
        assert!(items.last().unwrap().is_err());
    }
}
