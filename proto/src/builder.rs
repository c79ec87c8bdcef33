//! Building a record batch on the producer side.
//!
//! Records are encoded as they are pushed; [`BatchBuilder::build`]
//! compresses them and writes the header. The batch's base timestamp is the
//! first record's timestamp (deltas may be negative), its max timestamp the
//! largest, its base offset 0 (the broker assigns offsets with
//! [`crate::batch::set_base_offset`]) and offset deltas `0..len`.

use bytes::{Bytes, BytesMut};

use crate::batch::{
    compute_crc, set_crc, Attributes, BatchError, BatchHeader, Compression, HEADER_BYTES,
    LOG_OVERHEAD, MAGIC,
};
use crate::compression::{compress, ZSTD_LEVEL_DEFAULT};
use crate::record::RecordData;

/// Accumulates records into one batch.
#[derive(Debug, Clone)]
pub struct BatchBuilder {
    /// Producer id; -1 (the default) for a non-idempotent producer.
    pub producer_id: i64,
    /// Producer epoch; -1 by default.
    pub producer_epoch: i16,
    /// Sequence number of the first record; -1 by default.
    pub base_sequence: i32,
    /// Partition leader epoch; -1 by default (the broker stamps it).
    pub partition_leader_epoch: i32,
    /// Whether to set the transactional attribute; false by default.
    pub transactional: bool,
    /// Whether to set the control attribute (a transaction marker, written
    /// by the broker only); false by default.
    pub control: bool,
    compression: Compression,
    zstd_level: i32,
    /// `HEADER_BYTES` reserved for the header, then the encoded records (so
    /// that [`BatchBuilder::finish`] builds an uncompressed batch in place).
    records: Vec<u8>,
    count: i32,
    base_timestamp: i64,
    max_timestamp: i64,
}

impl BatchBuilder {
    /// An empty builder for `codec`. Fails with
    /// [`BatchError::UnsupportedCompression`] for gzip and snappy.
    pub fn new(codec: Compression) -> Result<Self, BatchError> {
        match codec {
            Compression::None | Compression::Lz4 | Compression::Zstd => {}
            Compression::Gzip | Compression::Snappy => {
                return Err(BatchError::UnsupportedCompression(codec))
            }
        }
        Ok(BatchBuilder {
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            partition_leader_epoch: -1,
            transactional: false,
            control: false,
            compression: codec,
            zstd_level: ZSTD_LEVEL_DEFAULT,
            records: vec![0; HEADER_BYTES],
            count: 0,
            base_timestamp: 0,
            max_timestamp: 0,
        })
    }

    /// Reserves room for `bytes` more bytes of encoded records (avoids
    /// growing the buffer record by record when the batch size is known).
    pub fn reserve(&mut self, bytes: usize) {
        self.records.reserve(bytes);
    }

    /// Sets the zstd level (default [`ZSTD_LEVEL_DEFAULT`]; ignored by other
    /// codecs; zstd clamps out-of-range levels).
    pub fn zstd_level(mut self, level: i32) -> Self {
        self.zstd_level = level;
        self
    }

    /// The codec the batch will use.
    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// Appends a record; its offset delta is the number of records before
    /// it. Fails (leaving the builder unchanged) if a field is too large,
    /// the timestamp delta overflows, or the batch already holds
    /// `i32::MAX` records.
    pub fn push(&mut self, record: &RecordData) -> Result<(), BatchError> {
        if self.count == i32::MAX {
            return Err(BatchError::TooLarge("record count"));
        }
        let base = if self.count == 0 {
            record.timestamp
        } else {
            self.base_timestamp
        };
        let delta = record
            .timestamp
            .checked_sub(base)
            .ok_or(BatchError::TooLarge("timestamp delta"))?;
        record.encode(delta, self.count, &mut self.records)?;
        self.max_timestamp = if self.count == 0 {
            record.timestamp
        } else {
            self.max_timestamp.max(record.timestamp)
        };
        self.base_timestamp = base;
        self.count += 1;
        Ok(())
    }

    /// Number of records pushed.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Whether no record has been pushed.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Size of the batch if built uncompressed; with compression it is an
    /// estimate (usually an overestimate).
    pub fn estimated_size(&self) -> usize {
        self.records.len()
    }

    /// The first record's timestamp, once a record was pushed.
    pub fn base_timestamp(&self) -> Option<i64> {
        (self.count > 0).then_some(self.base_timestamp)
    }

    /// The largest timestamp pushed, once a record was pushed.
    pub fn max_timestamp(&self) -> Option<i64> {
        (self.count > 0).then_some(self.max_timestamp)
    }

    /// Encodes the complete batch: header (base offset 0, CRC set) followed
    /// by the compressed records. Fails with [`BatchError::Empty`] when no
    /// record was pushed, or [`BatchError::TooLarge`] when the batch does
    /// not fit Kafka's i32 length.
    pub fn build(&self) -> Result<BytesMut, BatchError> {
        if self.count == 0 {
            return Err(BatchError::Empty);
        }
        let mut buf = Vec::with_capacity(self.estimated_size());
        buf.resize(HEADER_BYTES, 0);
        compress(
            self.compression,
            &self.records[HEADER_BYTES..],
            self.zstd_level,
            &mut buf,
        )?;
        self.seal(&mut buf)?;
        // Unique, so this conversion does not copy.
        Ok(BytesMut::from(Bytes::from(buf)))
    }

    /// As [`BatchBuilder::build`], consuming the builder: an uncompressed
    /// batch is completed in the builder's own buffer, without copying the
    /// records.
    pub fn finish(mut self) -> Result<BytesMut, BatchError> {
        if self.compression != Compression::None {
            return self.build();
        }
        if self.count == 0 {
            return Err(BatchError::Empty);
        }
        let mut buf = std::mem::take(&mut self.records);
        self.seal(&mut buf)?;
        Ok(BytesMut::from(Bytes::from(buf)))
    }

    /// Writes the header (base offset 0) and the CRC into `buf`, whose
    /// first `HEADER_BYTES` are reserved for it and the rest are the
    /// (compressed) records.
    fn seal(&self, buf: &mut [u8]) -> Result<(), BatchError> {
        let batch_length =
            i32::try_from(buf.len() - LOG_OVERHEAD).map_err(|_| BatchError::TooLarge("batch"))?;
        let mut attributes = self.compression.id();
        if self.transactional {
            attributes |= Attributes::TRANSACTIONAL;
        }
        if self.control {
            attributes |= Attributes::CONTROL;
        }
        let header = BatchHeader {
            base_offset: 0,
            batch_length,
            partition_leader_epoch: self.partition_leader_epoch,
            magic: MAGIC,
            crc: 0,
            attributes: Attributes(attributes),
            last_offset_delta: self.count - 1,
            base_timestamp: self.base_timestamp,
            max_timestamp: self.max_timestamp,
            producer_id: self.producer_id,
            producer_epoch: self.producer_epoch,
            base_sequence: self.base_sequence,
            records_count: self.count,
        };
        let head: &mut [u8; HEADER_BYTES] = (&mut buf[..HEADER_BYTES])
            .try_into()
            .map_err(|_| BatchError::TooLarge("batch"))?;
        header.write(head);
        let crc = compute_crc(buf);
        set_crc(buf, crc);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::validate;

    fn rec(ts: i64) -> RecordData {
        RecordData {
            value: Some(Bytes::from_static(b"v")),
            timestamp: ts,
            ..RecordData::default()
        }
    }

    #[test]
    fn finish_equals_build() {
        for codec in [Compression::None, Compression::Lz4, Compression::Zstd] {
            let mut b = BatchBuilder::new(codec).unwrap();
            b.producer_id = 7;
            b.base_sequence = 3;
            for ts in [100, 50, 300] {
                b.push(&rec(ts)).unwrap();
            }
            let built = b.build().unwrap();
            assert_eq!(b.clone().finish().unwrap(), built, "{codec:?}");
            validate(&built).unwrap();
        }
        assert_eq!(
            BatchBuilder::new(Compression::None).unwrap().finish(),
            Err(BatchError::Empty)
        );
    }

    #[test]
    fn header_fields() {
        let mut b = BatchBuilder::new(Compression::None).unwrap();
        assert!(b.is_empty());
        assert_eq!(b.build(), Err(BatchError::Empty));
        for ts in [100, 50, 300, 200] {
            b.push(&rec(ts)).unwrap();
        }
        assert_eq!(b.len(), 4);
        let batch = b.build().unwrap();
        assert_eq!(batch.len(), b.estimated_size());
        let h = validate(&batch).unwrap();
        assert_eq!(h.total_len(), batch.len());
        assert_eq!(
            (h.base_offset, h.last_offset_delta, h.records_count),
            (0, 3, 4)
        );
        assert_eq!((h.base_timestamp, h.max_timestamp), (100, 300));
        assert_eq!(
            (h.producer_id, h.producer_epoch, h.base_sequence),
            (-1, -1, -1)
        );
        assert_eq!(h.partition_leader_epoch, -1);
        assert_eq!(h.attributes, Attributes(0));
    }

    #[test]
    fn unsupported_codecs_and_overflow() {
        assert!(BatchBuilder::new(Compression::Gzip).is_err());
        assert!(BatchBuilder::new(Compression::Snappy).is_err());
        let mut b = BatchBuilder::new(Compression::Zstd).unwrap().zstd_level(1);
        b.push(&rec(i64::MAX)).unwrap();
        assert_eq!(
            b.push(&rec(-2)),
            Err(BatchError::TooLarge("timestamp delta"))
        );
        assert_eq!(b.len(), 1);
        b.transactional = true;
        let h = validate(&b.build().unwrap()).unwrap();
        assert!(h.attributes.is_transactional());
        assert_eq!(h.attributes.compression(), Some(Compression::Zstd));
    }
}
