//! A hostile body whose vector or string lengths claim billions of elements
//! must fail validation without allocating in proportion to the claim. A
//! counting global allocator records the largest single allocation (this
//! binary holds only this test, so nothing else allocates concurrently).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use weir_proto::frame::{decode_body, decode_request, encode_request, RequestHeader};
use weir_proto::messages::*;

struct Counting;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: delegates to the system allocator, only recording sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[test]
fn huge_lengths_in_bodies_do_not_allocate() {
    let req = CreateTopicsRequest {
        topics: (0..4)
            .map(|i| NewTopic {
                name: format!("a-rather-long-topic-name-{i}"),
                partitions: 8,
                configs: vec![("retention.ms".into(), "604800000".into())],
                replication_factor: 3,
            })
            .collect(),
    };
    let frame = encode_request(&RequestHeader::of::<CreateTopicsRequest>(1), &req, 0).unwrap();
    let (_, body, _) = decode_request(&frame).unwrap();
    let body = body.to_vec();
    assert!(body.len() < 1024);

    let mut rejected = 0;
    for i in 0..body.len().saturating_sub(3) {
        for claim in [u32::MAX, 0x7fff_ffff, 0x3fff_ffff, 0x0100_0000, 0x0001_0000] {
            let mut b = body.clone();
            b[i..i + 4].copy_from_slice(&claim.to_le_bytes());
            LARGEST.store(0, Ordering::Relaxed);
            let r = decode_body::<CreateTopicsRequest>(&b);
            let largest = LARGEST.load(Ordering::Relaxed);
            rejected += usize::from(r.is_err());
            assert!(
                largest <= 64 << 10,
                "patch {claim:#x} at {i}: largest allocation {largest}"
            );
        }
    }
    assert!(rejected > 0);
}
