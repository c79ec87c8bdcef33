//! A batch claiming `records_count = i32::MAX` over a tiny body must fail
//! without allocating in proportion to the count. A counting global
//! allocator records the largest single allocation (this binary holds only
//! this test, so nothing else allocates concurrently).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use weir_proto::batch::HEADER_BYTES;
use weir_proto::builder::BatchBuilder;
use weir_proto::reader::RecordBatch;
use weir_proto::record::RecordData;

struct Counting;

static LARGEST: AtomicUsize = AtomicUsize::new(0);
static TOTAL: AtomicUsize = AtomicUsize::new(0);

// SAFETY: delegates to the system allocator, only recording sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        TOTAL.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        TOTAL.fetch_add(new_size, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[test]
fn huge_records_count_does_not_allocate() {
    for codec in CODECS {
        let mut b = BatchBuilder::new(codec).unwrap();
        b.push(&RecordData::default()).unwrap();
        let mut buf = b.build().unwrap().to_vec();
        assert!(buf.len() < HEADER_BYTES + 64);
        patch(&mut buf, OFF_LAST_OFFSET_DELTA, &i32::MAX.to_be_bytes());
        patch(&mut buf, OFF_RECORDS_COUNT, &i32::MAX.to_be_bytes());

        LARGEST.store(0, Ordering::Relaxed);
        TOTAL.store(0, Ordering::Relaxed);
        let rb = RecordBatch::parse(&buf).unwrap();
        let err = rb.records().map(|r| r.iter().count());
        let (largest, total) = (
            LARGEST.load(Ordering::Relaxed),
            TOTAL.load(Ordering::Relaxed),
        );
        assert!(err.is_err(), "{codec:?}");
        // Decompression uses a 64 KiB chunk plus the codec's own state.
        assert!(
            largest <= 1 << 20,
            "{codec:?}: largest allocation {largest}"
        );
        assert!(total <= 4 << 20, "{codec:?}: total allocated {total}");
    }
}
