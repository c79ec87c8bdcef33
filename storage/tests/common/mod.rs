//! Helpers shared by the storage integration tests.
#![allow(dead_code)]

use std::future::Future;
use std::path::Path;

use bytes::{BufMut, BytesMut};
use glommio::{LocalExecutorBuilder, Placement};
use weir_proto::batch;

/// Runs `f` on a fresh glommio executor and waits for it.
pub fn run<F, Fut>(f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    run_ret(f)
}

/// How often a test executor wakes up on its own (see [`run_ret`]).
pub const TEST_EXECUTOR_TICK_MS: u64 = 10;

/// A valid batch of `records` records whose records section is `payload`
/// (opaque to storage), timestamps `ts..=ts_max`.
pub fn batch_with(records: i32, payload: &[u8], ts: i64, ts_max: i64) -> BytesMut {
    let mut b = BytesMut::with_capacity(batch::HEADER_BYTES + payload.len());
    b.put_i64(0); // base offset
    b.put_i32((batch::HEADER_BYTES - batch::LOG_OVERHEAD + payload.len()) as i32);
    b.put_i32(0); // leader epoch
    b.put_i8(2); // magic
    b.put_u32(0); // crc, set below
    b.put_i16(0); // attributes
    b.put_i32(records - 1); // last offset delta
    b.put_i64(ts);
    b.put_i64(ts_max);
    b.put_i64(-1); // producer id
    b.put_i16(-1);
    b.put_i32(-1);
    b.put_i32(records);
    b.put_slice(payload);
    let crc = batch::compute_crc(&b);
    batch::set_crc(&mut b, crc);
    b
}

/// A batch with one timestamp.
pub fn batch(records: i32, payload: &[u8], ts: i64) -> BytesMut {
    batch_with(records, payload, ts, ts)
}

/// Deterministic payload for batch number `i`.
pub fn payload(i: u64, len: usize) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Batch bytes as stored at `base_offset`.
pub fn stored(mut b: BytesMut, base_offset: u64) -> Vec<u8> {
    batch::set_base_offset(&mut b, base_offset as i64);
    b.to_vec()
}

/// The `.log` files in a partition directory, sorted.
pub fn log_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    v.sort();
    v
}

/// Runs `f` on a fresh glommio executor and returns what it returns.
pub fn run_ret<T, F, Fut>(f: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T> + 'static,
{
    LocalExecutorBuilder::new(Placement::Unbound)
        .spawn(move || async move {
            // A glommio 0.9 executor with nothing but one I/O wait in flight
            // was seen asleep in io_uring_enter for minutes during recovery
            // (a missed wake-up; a ptrace attach, which interrupts the
            // syscall, unstuck it). A broker's cores always have timers
            // armed (≤ 50 ms); a test executor gets one here, so such a
            // stall costs milliseconds instead of hanging the suite.
            glommio::spawn_local(async {
                loop {
                    glommio::timer::sleep(std::time::Duration::from_millis(TEST_EXECUTOR_TICK_MS))
                        .await;
                }
            })
            .detach();
            f().await
        })
        .expect("glommio executor starts (check `ulimit -l`)")
        .join()
        .expect("test body panicked")
}

/// A small deterministic RNG (splitmix64).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// An RNG started from `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// A number in `lo..hi` (`hi > lo`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo)
    }
}

/// A seed from `var` if set (to replay a failure), else from the clock.
pub fn seed_from_env(var: &str) -> u64 {
    match std::env::var(var) {
        Ok(s) => s.trim().parse().expect("seed is a u64"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
    }
}

/// Bytes of the numbered-batch prefix: batch number and seed.
pub const NUMBERED_PREFIX: usize = 16;

/// Batch number `i` of the stream `seed`: 1..=5 records, a payload whose
/// first 16 bytes are `i` and `seed` (so a batch found in a log can be
/// regenerated and compared), the rest deterministic bytes of a size drawn
/// from `i` (mostly small, some up to `max_len`), timestamp `1_000_000 + i`.
pub fn numbered_batch(seed: u64, i: u64, max_len: usize) -> BytesMut {
    let mut r = Rng::new(seed ^ i.wrapping_mul(0xD6E8_FEB8_6659_FD93));
    let pick = r.range(0, 100);
    let len = match pick {
        0..=69 => r.range(0, 2000),
        70..=94 => r.range(2000, 12_000),
        _ => r.range(12_000, 70_000),
    } as usize;
    let len = len.min(max_len);
    let records = 1 + (r.next_u64() % 5) as i32;
    let mut p = Vec::with_capacity(NUMBERED_PREFIX + len);
    p.extend_from_slice(&i.to_be_bytes());
    p.extend_from_slice(&seed.to_be_bytes());
    p.extend_from_slice(&payload(i ^ seed, len));
    batch(records, &p, 1_000_000 + i as i64)
}

/// The `(i, seed)` of a stored numbered batch, if it has the prefix.
pub fn batch_number(stored: &[u8]) -> Option<(u64, u64)> {
    let at = batch::HEADER_BYTES;
    let p = stored.get(at..at + NUMBERED_PREFIX)?;
    Some((
        u64::from_be_bytes(p[..8].try_into().ok()?),
        u64::from_be_bytes(p[8..].try_into().ok()?),
    ))
}

/// Reads every batch from `from` to the high watermark with reads of at
/// most `max_bytes`, checking that each read progresses. Returns `(base
/// offset, bytes)` of each batch.
pub async fn read_to_end(
    log: &weir_storage::PartitionLog,
    from: u64,
    max_bytes: u64,
) -> Result<Vec<(u64, bytes::Bytes)>, weir_storage::StorageError> {
    let mut out = Vec::new();
    let mut at = from;
    let hw = log.high_watermark();
    // Every read returns at least one batch of at least one record.
    for _ in 0..=hw.saturating_sub(from) {
        if at >= hw {
            break;
        }
        let r = log.read(at, max_bytes).await?;
        assert!(
            !r.batches.is_empty(),
            "read at {at} below the high watermark {hw} returned nothing"
        );
        assert!(r.next_offset > at, "read at {at} did not progress");
        for b in r.batches {
            let h = batch::BatchHeader::peek(&b).expect("stored batch has a header");
            out.push((h.base_offset as u64, b));
        }
        at = r.next_offset;
    }
    assert!(at >= hw, "read stopped at {at} before the end {hw}");
    Ok(out)
}

/// The name the test harness gives the test function `test` of the module
/// whose [`module_path!`] is `module`: the path without the crate's name
/// (`it::crash` and `crash_child` give `crash::crash_child`).
pub fn test_name(module: &str, test: &str) -> String {
    match module.split_once("::") {
        Some((_crate, path)) => format!("{path}::{test}"),
        None => test.to_string(),
    }
}

/// A command running one test of this test binary in a child process; the
/// test is named by its full path (see [`test_name`]). Panics unless the
/// binary has a test of exactly that name: `--exact` with a name of no test
/// runs nothing and succeeds, and the parent would test nothing.
pub fn child_test(name: &str) -> std::process::Command {
    let exe = std::env::current_exe().expect("test binary path");
    let list = std::process::Command::new(&exe)
        .args(["--list", "--exact", name])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("list this binary's tests");
    let listed = String::from_utf8_lossy(&list.stdout);
    assert!(
        list.status.success() && listed.lines().any(|l| l == format!("{name}: test")),
        "{} has no test named {name}: {listed}",
        exe.display()
    );
    let mut c = std::process::Command::new(exe);
    c.args(["--exact", name, "--nocapture", "--test-threads", "1"]);
    c
}

/// Where proptest keeps a module's failing cases: beside its file
/// (`it/model.rs` → `it/model.proptest-regressions`). Proptest's default
/// looks up for a `main.rs` and, finding `it/main.rs`, would use
/// `tests/proptest-regressions/model.txt` instead.
pub fn regressions_beside_source() -> Option<Box<dyn proptest::test_runner::FailurePersistence>> {
    Some(Box::new(
        proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
    ))
}

/// Parses a child's `ACK <i> <base>` line (only complete lines).
pub fn parse_ack(line: &str) -> Option<(u64, u64)> {
    let rest = line.strip_suffix('\n')?.strip_prefix("ACK ")?;
    let mut it = rest.split(' ');
    let i = it.next()?.parse().ok()?;
    let base = it.next()?.parse().ok()?;
    it.next().is_none().then_some((i, base))
}

/// A batch of `records` real (decodable) uncompressed records: values of
/// `value_len` deterministic bytes, record `r` at timestamp `ts + r`.
pub fn records_batch(seed: u64, records: usize, value_len: usize, ts: i64) -> BytesMut {
    use weir_proto::builder::BatchBuilder;
    use weir_proto::record::RecordData;
    let mut b = BatchBuilder::new(batch::Compression::None).expect("uncompressed builder");
    for r in 0..records.max(1) {
        b.push(&RecordData {
            key: Some(bytes::Bytes::from(format!("k{seed}-{r}"))),
            value: Some(bytes::Bytes::from(payload(
                seed.wrapping_mul(31).wrapping_add(r as u64),
                value_len,
            ))),
            headers: Vec::new(),
            timestamp: ts + r as i64,
        })
        .expect("record fits");
    }
    b.build().expect("batch builds")
}

/// Runs one I/O round trip on this executor so that files dropped without
/// an explicit close (glommio closes them at its next I/O cycle) are closed
/// before the executor exits; otherwise each such file leaks a descriptor.
pub async fn drain_file_closes(dir: &Path) {
    let p = dir.join(".drain-closes");
    std::fs::write(&p, [0u8; 4096]).unwrap();
    let f = glommio::io::DmaFile::open(&p).await.unwrap();
    f.close().await.unwrap();
    std::fs::remove_file(&p).unwrap();
}

/// Reads a child's output on a thread and sends each complete line
/// (newline included); the channel disconnects at end of output. The
/// receiver can wait with a timeout, so a hung child cannot hang the test.
pub fn line_reader(out: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut out = std::io::BufReader::new(out);
        loop {
            let mut line = String::new();
            match out.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            }
        }
    });
    rx
}
