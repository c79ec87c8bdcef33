//! Which reads of a partition log are sequential: the read-ahead's
//! trigger ([`crate::log::PartitionLog::read`]).
//!
//! A log has several readers at once — consumer groups at different
//! positions, a share group's members taking the next batches in turn
//! (their reads finishing in any order) — so "sequential" cannot mean
//! "starts where the last read ended". A log keeps the ends of the last
//! [`STREAMS`] read streams; a read continues a stream when it starts at
//! its end or past it by no more than its own length (a share member's
//! read finishing before the one just behind it), and then moves that
//! stream's end on. A read that continues none starts a stream in place
//! of the one least recently continued; a read behind a stream's end
//! (the slower of two interleaved reads) moves nothing.

/// Read streams a log follows at once.
pub const STREAMS: usize = 4;

/// The ends of a log's read streams.
#[derive(Debug, Clone)]
pub struct ReadStreams {
    /// Each stream's end and when it was last continued (0: free).
    ends: [(u64, u64); STREAMS],
    /// Counts reads (the recency of each stream).
    tick: u64,
}

impl Default for ReadStreams {
    fn default() -> Self {
        ReadStreams {
            ends: [(0, 0); STREAMS],
            tick: 0,
        }
    }
}

impl ReadStreams {
    /// Notes a read of `from..to` (offsets; `to` one past its last);
    /// whether it continued a stream (its read-ahead may start at `to`).
    pub fn read(&mut self, from: u64, to: u64) -> bool {
        if to <= from {
            return false;
        }
        self.tick += 1;
        let len = to - from;
        let live = |(_, used): &(u64, u64)| *used > 0;
        if let Some(s) = self
            .ends
            .iter_mut()
            .filter(|s| live(s))
            .find(|(end, _)| *end <= from && from - *end <= len)
        {
            *s = (to, self.tick);
            return true;
        }
        // Behind a stream's end and reaching into it: the slower of two
        // interleaved reads of that stream.
        if let Some(s) = self
            .ends
            .iter_mut()
            .filter(|s| live(s))
            .find(|(end, _)| from < *end && to + len >= *end)
        {
            s.1 = self.tick;
            return false;
        }
        let oldest = self
            .ends
            .iter_mut()
            .min_by_key(|(_, used)| *used)
            .expect("STREAMS > 0");
        *oldest = (to, self.tick);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_reader_in_order_is_sequential_from_its_second_read() {
        let mut s = ReadStreams::default();
        assert!(!s.read(0, 100), "a first read starts a stream");
        assert!(s.read(100, 200));
        assert!(s.read(200, 300));
        assert!(!s.read(5_000, 5_100), "a jump starts another");
        assert!(s.read(5_100, 5_200));
    }

    #[test]
    fn two_readers_at_different_positions_are_both_sequential() {
        let mut s = ReadStreams::default();
        assert!(!s.read(0, 100));
        assert!(!s.read(10_000, 10_100));
        for i in 1..50 {
            assert!(
                s.read(i * 100, (i + 1) * 100),
                "reader at the start, read {i}"
            );
            assert!(
                s.read(10_000 + i * 100, 10_000 + (i + 1) * 100),
                "reader further on, read {i}"
            );
        }
    }

    #[test]
    fn interleaved_reads_finishing_out_of_order_keep_the_stream() {
        // A share group's members: each takes the next 100 offsets, and
        // the read of a later range may finish first.
        let mut s = ReadStreams::default();
        assert!(!s.read(0, 100));
        assert!(s.read(200, 300), "past the end by no more than itself");
        assert!(!s.read(100, 200), "the slower one: behind the end");
        assert!(s.read(300, 400));
        assert!(s.read(500, 600));
        assert!(!s.read(400, 500));
        assert!(s.read(600, 700));
    }

    #[test]
    fn a_random_reader_never_looks_sequential_and_a_fifth_stream_evicts_the_stalest() {
        let mut s = ReadStreams::default();
        for (i, at) in [90_000u64, 3_000, 55_000, 1_000_000, 7].iter().enumerate() {
            assert!(!s.read(*at, at + 10), "random read {i}");
        }
        // The last four are still followed.
        assert!(s.read(3_010, 3_020));
        assert!(s.read(17, 27));
        // 90 000's stream was the least recently used: gone.
        assert!(!s.read(90_010, 90_020));
    }

    #[test]
    fn empty_reads_change_nothing() {
        let mut s = ReadStreams::default();
        assert!(!s.read(0, 100));
        assert!(!s.read(100, 100));
        assert!(s.read(100, 200));
    }
}
