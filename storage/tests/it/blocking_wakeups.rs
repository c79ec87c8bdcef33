//! A stress run after the glommio 0.9 stall (issue 31): an executor with
//! nothing else to do hands job after job to its blocking thread pool and
//! awaits each result, so that it is often asleep in `io_uring_enter` when
//! a job finishes. The finished job's wake-up travels eventfd → a READ on
//! the latency ring → a poll of that ring's fd on the main ring, where
//! the executor sleeps (glommio `sys/blocking.rs`, `sys/uring.rs`); a
//! stall was once seen there (see `docs/reliability.md`). No timer is
//! armed: a missed wake-up hangs the loop, and a watchdog thread then
//! fails the run with what the eventfds and rings show.
//!
//! Not in CI (a stress run): `WEIR_STALL_ITERATIONS=1000000 cargo nextest
//! run -p weir-storage --test it blocking_wakeups --run-ignored only
//! --no-capture`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use glommio::{LocalExecutorBuilder, Placement};

/// A watchdog's patience: no result for this long is a stall.
const STALL: Duration = Duration::from_secs(5);

/// What `/proc/self/fdinfo` says about the process's eventfds and rings.
fn fdinfo() -> String {
    let mut out = String::new();
    for e in std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
    {
        let target = std::fs::read_link(e.path()).unwrap_or_default();
        let t = target.to_string_lossy();
        if t.contains("eventfd") || t.contains("io_uring") {
            let info = std::fs::read_to_string(format!(
                "/proc/self/fdinfo/{}",
                e.file_name().to_string_lossy()
            ))
            .unwrap_or_default();
            let head: Vec<&str> = info.lines().take(12).collect();
            out.push_str(&format!(
                "fd {:?} → {t}:\n  {}\n",
                e.file_name(),
                head.join("\n  ")
            ));
        }
    }
    out
}

#[test]
#[ignore = "a stress run: WEIR_STALL_ITERATIONS results (default 200 000)"]
fn blocking_pool_results_wake_an_idle_executor() {
    let n: u64 = std::env::var("WEIR_STALL_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let progress = Arc::new(AtomicU64::new(0));
    let finished = Arc::new(AtomicBool::new(false));
    {
        let (progress, finished) = (progress.clone(), finished.clone());
        std::thread::spawn(move || {
            let (mut last, mut since) = (0, Instant::now());
            while !finished.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(200));
                let now = progress.load(Ordering::Acquire);
                if now != last {
                    (last, since) = (now, Instant::now());
                } else if since.elapsed() > STALL {
                    eprintln!(
                        "STALL: no blocking-pool result for {STALL:?} after {now} of {n}\n{}",
                        fdinfo()
                    );
                    std::process::exit(101);
                }
            }
        });
    }
    let started = Instant::now();
    let p = progress.clone();
    LocalExecutorBuilder::new(Placement::Unbound)
        .spawn(move || async move {
            let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
            for i in 1..=n {
                // xorshift64: a varying pause inside the job (0–127 µs),
                // so that the executor is sometimes asleep when it ends.
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let spin = Duration::from_micros(x % 128);
                let r = glommio::executor()
                    .spawn_blocking(move || {
                        let t = Instant::now();
                        while t.elapsed() < spin {
                            std::hint::spin_loop();
                        }
                        i
                    })
                    .await;
                assert_eq!(r, i);
                p.store(i, Ordering::Release);
            }
        })
        .expect("a glommio executor (check `ulimit -l`)")
        .join()
        .unwrap();
    finished.store(true, Ordering::Release);
    eprintln!(
        "{n} blocking-pool results in {:?}, no stall",
        started.elapsed()
    );
}
