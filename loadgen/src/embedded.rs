//! A Weir broker inside the benchmark's process (`weir-bench --embedded`),
//! over a temporary data directory, on free loopback ports.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{anyhow, Context};
use weir_broker::server::config::BrokerConfig;

/// A running embedded broker; stopped (cleanly) by [`Embedded::stop`] or
/// on drop.
#[derive(Debug)]
pub struct Embedded {
    /// Its shared native-protocol address.
    pub addr: SocketAddr,
    /// Its Kafka-protocol address.
    pub kafka: Option<SocketAddr>,
    /// Its metrics endpoint (`GET /metrics`).
    pub metrics: SocketAddr,
    /// Its OTLP/gRPC and OTLP/HTTP receivers (spans routed to the topic
    /// their resource's `weir.topic` names).
    pub otlp: (SocketAddr, SocketAddr),
    /// Its data directory.
    pub data_dir: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<anyhow::Result<()>>>,
    _dir: Option<tempfile::TempDir>,
}

impl Embedded {
    /// Starts a broker with `cores` cores over `data_dir` (a fresh
    /// temporary directory if `None`), and waits until it listens.
    pub fn start(cores: usize, data_dir: Option<PathBuf>) -> anyhow::Result<Embedded> {
        let (dir, path) = match data_dir {
            Some(p) => (None, p),
            None => {
                let d = tempfile::Builder::new()
                    .prefix("weir-bench-")
                    .tempdir()
                    .context("creating a temporary data directory")?;
                let p = d.path().to_path_buf();
                (Some(d), p)
            }
        };
        let config = BrokerConfig::embedded(path.clone(), cores);
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("weir-embedded".into())
            .spawn(move || {
                weir_broker::server::run_with(config, flag, |r| {
                    let otlp = r.otlp_grpc.zip(r.otlp_http);
                    let _ = tx.send((r.listen, r.kafka, r.metrics, otlp));
                })
            })
            .context("starting the embedded broker's thread")?;
        match rx.recv() {
            Ok((addr, kafka, metrics, otlp)) => Ok(Embedded {
                addr,
                kafka,
                metrics,
                otlp: otlp.context("the embedded broker has no OTLP receivers")?,
                data_dir: path,
                stop,
                thread: Some(thread),
                _dir: dir,
            }),
            Err(_) => {
                let e = match thread.join() {
                    Ok(Err(e)) => e,
                    Ok(Ok(())) => anyhow!("the embedded broker stopped before it was ready"),
                    Err(_) => anyhow!("the embedded broker panicked while starting"),
                };
                Err(e.context("starting the embedded broker"))
            }
        }
    }

    /// Stops the broker cleanly and waits for it.
    pub fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> anyhow::Result<()> {
        self.stop.store(true, Ordering::Release);
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(anyhow!("the embedded broker panicked")),
            None => Ok(()),
        }
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}
