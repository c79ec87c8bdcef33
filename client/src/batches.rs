//! Splitting a fetched payload into whole record batches.

use bytes::Bytes;
use weir_proto::batch::{BatchError, BatchHeader};

/// The batches one fetch returned for one partition.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FetchedBatches {
    /// Whole record batches in offset order, each a slice of the response
    /// frame (no copy). The first may start before the requested offset:
    /// skip the records below it. CRCs are not checked here
    /// ([`weir_proto::reader::RecordBatch::parse`] does).
    pub batches: Vec<Bytes>,
    /// Offset the next appended record gets.
    pub high_watermark: u64,
    /// First offset still in the log.
    pub log_start_offset: u64,
    /// The last stable offset: a read_committed reader's end (the high
    /// watermark when no transaction is open).
    pub last_stable_offset: u64,
    /// Read committed: the transactions aborted within the fetched range
    /// as (producer id, first offset), by first offset; a reader skips
    /// the producer's transactional batches from there up to its abort
    /// marker. Empty for a read_uncommitted fetch.
    pub aborted: Vec<(i64, u64)>,
    /// The offset the partition was read from: the request's, or for a
    /// [`FetchPartition::CONTINUE`](weir_proto::messages::FetchPartition::CONTINUE)
    /// where the connection's previous fetch of it ended.
    pub fetch_offset: u64,
}

impl FetchedBatches {
    /// The offset after the last fetched batch, if any batch was fetched:
    /// where the next fetch continues.
    pub fn next_offset(&self) -> Option<u64> {
        let last = self.batches.last()?;
        let h = BatchHeader::peek(last).ok()?;
        u64::try_from(h.last_offset()).ok().map(|o| o + 1)
    }
}

/// Splits `data` (one partition's batches, back to back) into whole
/// batches with [`BatchHeader::parse_framed`]. A partial batch at the end
/// (a server may cut the last one at `max_bytes`) is dropped; any other
/// framing error fails.
pub fn split_batches(data: &Bytes) -> Result<Vec<Bytes>, BatchError> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < data.len() {
        match BatchHeader::parse_framed(&data[at..]) {
            Ok(h) => {
                out.push(data.slice(at..at + h.total_len()));
                at += h.total_len();
            }
            Err(BatchError::ShortHeader { .. } | BatchError::LengthPastEnd { .. })
                if !out.is_empty() =>
            {
                break
            }
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_proto::batch::{set_base_offset, Compression};
    use weir_proto::builder::BatchBuilder;
    use weir_proto::record::RecordData;

    fn batch(base: i64, n: usize) -> Bytes {
        let mut b = BatchBuilder::new(Compression::None).unwrap();
        for i in 0..n {
            b.push(&RecordData {
                value: Some(Bytes::from(format!("v{i}"))),
                timestamp: 1,
                ..RecordData::default()
            })
            .unwrap();
        }
        let mut out = b.build().unwrap();
        set_base_offset(&mut out, base);
        out.freeze()
    }

    #[test]
    fn splits_whole_batches_and_drops_a_cut_tail() {
        let (a, b, c) = (batch(0, 3), batch(3, 2), batch(5, 4));
        let mut all = Vec::new();
        for x in [&a, &b, &c] {
            all.extend_from_slice(x);
        }
        let all = Bytes::from(all);
        assert_eq!(split_batches(&all).unwrap(), vec![a.clone(), b.clone(), c]);
        let cut = all.slice(..a.len() + b.len() + 10);
        let got = split_batches(&cut).unwrap();
        assert_eq!(got, vec![a.clone(), b]);
        let f = FetchedBatches {
            batches: got,
            high_watermark: 9,
            ..Default::default()
        };
        assert_eq!(f.next_offset(), Some(5));
        assert_eq!(FetchedBatches::default().next_offset(), None);
        assert!(split_batches(&Bytes::new()).unwrap().is_empty());
    }

    #[test]
    fn rejects_garbage() {
        assert!(split_batches(&Bytes::from_static(&[0u8; 100])).is_err());
        assert!(split_batches(&Bytes::from_static(b"short")).is_err());
    }
}
