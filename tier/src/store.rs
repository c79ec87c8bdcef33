//! The object store, on a runtime of its own.
//!
//! `object_store` runs on tokio; the broker's cores run glommio and must
//! not block. A [`RemoteStore`] owns a small multi-thread tokio runtime
//! (threads `weir-tier`): each call is spawned onto it and its answer
//! awaited from any executor. Requests in flight are bounded
//! ([`RemoteConfig::max_in_flight`]); each request has a timeout and is
//! retried with backoff (object_store's `RetryConfig`: 5xx answers such as
//! S3's 503 SlowDown, connection errors) until the retry timeout; reads
//! are bounded by [`RemoteConfig::read_timeout`] on top, so that a fetch
//! served from the remote tier fails fast instead of hanging.

use std::future::Future;
use std::ops::Range;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_lite::StreamExt;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;

use crate::pace::CopyPace;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig,
    WriteMultipart,
};

/// Where and how to reach the object store.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteConfig {
    /// `s3://bucket[/prefix]` (credentials, region and endpoint from the
    /// usual `AWS_*` variables or [`RemoteConfig::options`]),
    /// `gs://bucket[/prefix]` (`GOOGLE_*`), `az://container[/prefix]`
    /// (`AZURE_*`) or `file:///path` (a local directory).
    pub url: String,
    /// The store's options by object_store's names (S3: `endpoint`,
    /// `region`, `access_key_id`, …; GCS: `service_account_key`, …;
    /// Azure: `account_name`, `access_key`, …), after the environment's.
    pub options: Vec<(String, String)>,
    /// One request's timeout.
    pub request_timeout: Duration,
    /// Retries stop this long after a request's first attempt.
    pub retry_timeout: Duration,
    /// Retries of one request at most.
    pub max_retries: usize,
    /// A read (fetch from the remote tier) fails after this long, retries
    /// included.
    pub read_timeout: Duration,
    /// Requests in flight at most (every core's together).
    pub max_in_flight: usize,
    /// Objects larger than this are uploaded in parts of this size.
    pub part_bytes: usize,
    /// Bytes of segments copied to the store per second at most, every
    /// core's together (Kafka's
    /// `remote.log.manager.copy.max.bytes.per.second`); `None`: no cap.
    pub copy_max_bytes_per_sec: Option<u64>,
}

impl RemoteConfig {
    /// Defaults for `url`.
    pub fn new(url: impl Into<String>) -> Self {
        RemoteConfig {
            url: url.into(),
            options: Vec::new(),
            request_timeout: Duration::from_secs(30),
            retry_timeout: Duration::from_secs(60),
            max_retries: 10,
            read_timeout: Duration::from_secs(10),
            max_in_flight: 16,
            part_bytes: 8 << 20,
            copy_max_bytes_per_sec: None,
        }
    }
}

/// Why a remote call failed.
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    /// The configuration cannot be used.
    #[error("remote storage: {0}")]
    Config(String),
    /// No such object.
    #[error("remote object {0} not found")]
    NotFound(String),
    /// The store answered an error (after its retries).
    #[error("remote storage: {op} {key}: {message}")]
    Store {
        /// What was done.
        op: &'static str,
        /// The object.
        key: String,
        /// The store's error.
        message: String,
    },
    /// No answer in time.
    #[error("remote storage: {op} {key}: no answer within {after:?}")]
    TimedOut {
        /// What was done.
        op: &'static str,
        /// The object.
        key: String,
        /// The limit.
        after: Duration,
    },
    /// A local file to upload could not be read.
    #[error("reading {path} to upload it: {source}")]
    Local {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The store's runtime is gone (shutting down).
    #[error("remote storage is shutting down")]
    Stopped,
}

fn store_error(op: &'static str, key: &str, e: object_store::Error) -> TierError {
    match e {
        object_store::Error::NotFound { .. } => TierError::NotFound(key.to_string()),
        e => TierError::Store {
            op,
            key: key.to_string(),
            message: e.to_string(),
        },
    }
}

/// The object store of a node's tiered storage. Cheap to clone; callable
/// from any executor.
#[derive(Clone)]
pub struct RemoteStore {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn ObjectStore>,
    /// The directory of a `file://` store: a write killed half way leaves
    /// a staging file (`<name>#<n>`) beside the object's name there, which
    /// [`RemoteStore::delete`] removes too.
    local_root: Option<PathBuf>,
    runtime: Option<tokio::runtime::Runtime>,
    in_flight: Arc<tokio::sync::Semaphore>,
    /// The pace of copies, if capped.
    copy_pace: Option<CopyPace>,
    config: RemoteConfig,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl std::fmt::Debug for RemoteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RemoteStore({})", self.inner.config.url)
    }
}

impl RemoteStore {
    /// Opens the store `config` names (nothing is sent yet: a store that
    /// cannot be reached shows in the first calls' errors).
    pub fn open(config: RemoteConfig) -> Result<RemoteStore, TierError> {
        // reqwest is built without a default crypto provider: rustls with
        // ring, as the rest of the broker.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let store = build(&config)?;
        let local_root = config.url.trim().strip_prefix("file://").map(PathBuf::from);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(8)
            .thread_name("weir-tier")
            .on_thread_start(background_priority)
            .enable_all()
            .build()
            .map_err(|e| TierError::Config(format!("cannot start its runtime: {e}")))?;
        Ok(RemoteStore {
            inner: Arc::new(Inner {
                store,
                runtime: Some(runtime),
                local_root,
                in_flight: Arc::new(tokio::sync::Semaphore::new(config.max_in_flight.max(1))),
                copy_pace: config.copy_max_bytes_per_sec.map(CopyPace::new),
                config,
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &RemoteConfig {
        &self.inner.config
    }

    /// How long to wait before copying `bytes` more of a segment to the
    /// store, under [`RemoteConfig::copy_max_bytes_per_sec`] (zero without
    /// a cap); the bytes are counted as copied then.
    pub fn copy_delay(&self, bytes: u64) -> Duration {
        self.inner.copy_pace.as_ref().map_or(Duration::ZERO, |p| {
            p.delay(std::time::Instant::now(), bytes)
        })
    }

    /// Runs `f` on the store's runtime, one of the requests in flight.
    async fn run<T, F>(&self, f: F) -> Result<T, TierError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, TierError>> + Send + 'static,
    {
        let rt = self.inner.runtime.as_ref().ok_or(TierError::Stopped)?;
        let permits = self.inner.in_flight.clone();
        rt.spawn(async move {
            let _permit = permits
                .acquire_owned()
                .await
                .map_err(|_| TierError::Stopped)?;
            f.await
        })
        .await
        .map_err(|_| TierError::Stopped)?
    }

    /// Writes an object whole.
    pub async fn put(&self, key: &str, data: Bytes) -> Result<(), TierError> {
        let (store, k) = (self.inner.store.clone(), key.to_string());
        self.run(async move {
            store
                .put(&ObjectPath::from(k.as_str()), PutPayload::from(data))
                .await
                .map_err(|e| store_error("put", &k, e))?;
            Ok(())
        })
        .await
    }

    /// Starts writing the object `key` of `len` bytes from parts handed to
    /// [`Upload::write`] (from any executor; two parts queued at most):
    /// one request if it is at most [`RemoteConfig::part_bytes`], else a
    /// multipart upload, aborted if the parts do not add up to `len`.
    pub fn upload(&self, key: &str, len: u64) -> Result<Upload, TierError> {
        let rt = self.inner.runtime.as_ref().ok_or(TierError::Stopped)?;
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(2);
        let (store, k) = (self.inner.store.clone(), key.to_string());
        let part = self.inner.config.part_bytes.max(5 << 20);
        let permits = self.inner.in_flight.clone();
        let done = rt.spawn(async move {
            let _permit = permits
                .acquire_owned()
                .await
                .map_err(|_| TierError::Stopped)?;
            let loc = ObjectPath::from(k.as_str());
            let short = |got: u64| TierError::Store {
                op: "upload",
                key: k.clone(),
                message: format!("given {got} bytes of {len}"),
            };
            if len <= part as u64 {
                let mut buf = bytes::BytesMut::with_capacity(len as usize);
                while let Some(b) = rx.recv().await {
                    buf.extend_from_slice(&b);
                }
                if buf.len() as u64 != len {
                    return Err(short(buf.len() as u64));
                }
                store
                    .put(&loc, PutPayload::from(buf.freeze()))
                    .await
                    .map_err(|e| store_error("put", &k, e))?;
                return Ok(());
            }
            let upload = store
                .put_multipart(&loc)
                .await
                .map_err(|e| store_error("start multipart upload of", &k, e))?;
            let mut w = WriteMultipart::new_with_chunk_size(upload, part);
            let mut total = 0u64;
            while let Some(b) = rx.recv().await {
                if let Err(e) = w.wait_for_capacity(2).await {
                    return Err(store_error("upload a part of", &k, e));
                }
                total += b.len() as u64;
                w.put(b);
            }
            if total != len {
                let _ = w.abort().await;
                return Err(short(total));
            }
            w.finish()
                .await
                .map_err(|e| store_error("finish multipart upload of", &k, e))?;
            Ok(())
        });
        Ok(Upload { tx: Some(tx), done })
    }

    /// Reads bytes `range` of a local file on the store's blocking threads
    /// (for a caller that must not block, as a glommio core).
    pub async fn read_local(&self, path: PathBuf, range: Range<u64>) -> Result<Bytes, TierError> {
        self.run(read_file(path, range)).await
    }

    /// Reads bytes `range` of an object, within the read timeout.
    pub async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, TierError> {
        let (store, k) = (self.inner.store.clone(), key.to_string());
        let after = self.inner.config.read_timeout;
        self.run(async move {
            let loc = ObjectPath::from(k.as_str());
            match tokio::time::timeout(after, store.get_range(&loc, range)).await {
                Ok(r) => r.map_err(|e| store_error("read", &k, e)),
                Err(_) => Err(TierError::TimedOut {
                    op: "read",
                    key: k,
                    after,
                }),
            }
        })
        .await
    }

    /// Reads a whole object, within the read timeout.
    pub async fn get(&self, key: &str) -> Result<Bytes, TierError> {
        let (store, k) = (self.inner.store.clone(), key.to_string());
        let after = self.inner.config.read_timeout;
        self.run(async move {
            let loc = ObjectPath::from(k.as_str());
            let read = async {
                store
                    .get(&loc)
                    .await
                    .map_err(|e| store_error("read", &k, e))?
                    .bytes()
                    .await
                    .map_err(|e| store_error("read", &k, e))
            };
            match tokio::time::timeout(after, read).await {
                Ok(r) => r,
                Err(_) => Err(TierError::TimedOut {
                    op: "read",
                    key: k.clone(),
                    after,
                }),
            }
        })
        .await
    }

    /// Deletes an object; one already gone is no error. In a `file://`
    /// store, the staging files a killed write of it left go too.
    pub async fn delete(&self, key: &str) -> Result<(), TierError> {
        let (store, k) = (self.inner.store.clone(), key.to_string());
        let staged = self.inner.local_root.as_ref().map(|r| r.join(key));
        self.run(async move {
            match store.delete(&ObjectPath::from(k.as_str())).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(store_error("delete", &k, e)),
            }
            if let Some(path) = staged {
                tokio::task::spawn_blocking(move || remove_staged(&path))
                    .await
                    .map_err(|_| TierError::Stopped)?;
            }
            Ok(())
        })
        .await
    }

    /// The keys under a folder (`prefix`, no trailing slash), at any
    /// depth, each with when it was last written (the store's clock).
    pub async fn list(&self, prefix: &str) -> Result<Vec<(String, SystemTime)>, TierError> {
        let (store, p) = (self.inner.store.clone(), prefix.to_string());
        self.run(async move {
            let loc = ObjectPath::from(p.as_str());
            let mut stream = store.list(Some(&loc));
            let mut out = Vec::new();
            while let Some(meta) = stream.next().await {
                match meta {
                    Ok(m) => out.push((m.location.to_string(), SystemTime::from(m.last_modified))),
                    Err(object_store::Error::NotFound { .. }) => break,
                    Err(e) => return Err(store_error("list", &p, e)),
                }
            }
            Ok(out)
        })
        .await
    }
}

/// An object being written part by part ([`RemoteStore::upload`]).
pub struct Upload {
    tx: Option<tokio::sync::mpsc::Sender<Bytes>>,
    done: tokio::task::JoinHandle<Result<(), TierError>>,
}

impl Upload {
    /// Hands over the next bytes (waits while two parts are queued).
    pub async fn write(&mut self, bytes: Bytes) -> Result<(), TierError> {
        let sent = match &self.tx {
            Some(tx) => tx.send(bytes).await.is_ok(),
            None => false,
        };
        if sent {
            return Ok(());
        }
        // The upload ended early: its error.
        self.tx = None;
        match (&mut self.done).await {
            Ok(Err(e)) => Err(e),
            _ => Err(TierError::Stopped),
        }
    }

    /// Every byte handed over: waits until the object is written.
    pub async fn finish(mut self) -> Result<(), TierError> {
        self.tx = None;
        (&mut self.done).await.map_err(|_| TierError::Stopped)?
    }
}

/// Lowers the calling thread's CPU and I/O priority: the object store's
/// threads (copying segments, HTTP, reading files to upload) yield to the
/// broker's cores, whose produce latency would otherwise pay for every
/// upload on a machine with few CPUs (docs/benchmarks.md, "Tiered
/// storage"). Best effort: a refusal changes nothing else.
fn background_priority() {
    // SAFETY: plain syscalls on the calling thread's own id.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 10);
        // ioprio_set(IOPRIO_WHO_PROCESS, tid, IOPRIO_CLASS_IDLE): the
        // files read for uploads (from disk: segments are written with
        // direct I/O, so not in the page cache) queue behind the cores'
        // writes — mq-deadline serves reads first otherwise — and its
        // aging (prio_aging_expire) keeps them from starving.
        const IOPRIO_WHO_PROCESS: libc::c_long = 1;
        const IOPRIO_CLASS_IDLE: libc::c_long = 3;
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            tid as libc::c_long,
            IOPRIO_CLASS_IDLE << 13,
        );
    }
}

/// Removes `<path>#*`: what a write to `path` killed half way left.
fn remove_staged(path: &std::path::Path) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return;
    };
    let prefix = format!("{}#", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Reads bytes `range` of a local file on a blocking thread.
async fn read_file(path: PathBuf, range: Range<u64>) -> Result<Bytes, TierError> {
    tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::open(&path).map_err(|source| TierError::Local {
            path: path.clone(),
            source,
        })?;
        let mut buf = vec![0u8; (range.end - range.start) as usize];
        f.read_exact_at(&mut buf, range.start)
            .map_err(|source| TierError::Local { path, source })?;
        Ok(Bytes::from(buf))
    })
    .await
    .map_err(|_| TierError::Stopped)?
}

/// The object store `config.url` names.
fn build(config: &RemoteConfig) -> Result<Arc<dyn ObjectStore>, TierError> {
    let url = config.url.trim();
    if let Some(path) = url.strip_prefix("file://") {
        if !path.starts_with('/') {
            return Err(TierError::Config(format!(
                "{url}: a file URL names an absolute path (file:///var/lib/weir-remote)"
            )));
        }
        std::fs::create_dir_all(path)
            .map_err(|e| TierError::Config(format!("cannot create {path}: {e}")))?;
        let fs = LocalFileSystem::new_with_prefix(path)
            .map_err(|e| TierError::Config(format!("{url}: {e}")))?
            .with_automatic_cleanup(true);
        return Ok(Arc::new(fs));
    }
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if !matches!(scheme, "s3" | "gs" | "az") {
        return Err(TierError::Config(format!(
            "{url}: unsupported remote storage URL (s3://bucket[/prefix], gs://bucket[/prefix], \
             az://container[/prefix] or file:///path)"
        )));
    }
    if bucket.is_empty() {
        return Err(TierError::Config(format!("{url}: no bucket")));
    }
    let retry = RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            base: 2.0,
        },
        max_retries: config.max_retries,
        retry_timeout: config.retry_timeout,
    };
    // An endpoint over plain HTTP (a local S3- or Azure-compatible store)
    // needs `allow_http`; `with_client_options` replaces what `from_env`
    // read, so the variables are read here, and the options given come
    // after.
    let env = |k: &str| std::env::var(k).ok();
    let endpoint = config
        .options
        .iter()
        .find(|(k, _)| {
            matches!(
                k.as_str(),
                "endpoint" | "aws_endpoint" | "endpoint_url" | "azure_storage_endpoint"
            )
        })
        .map(|(_, v)| v.clone());
    let plain_http = match scheme {
        "s3" => {
            endpoint
                .or_else(|| env("AWS_ENDPOINT").or_else(|| env("AWS_ENDPOINT_URL")))
                .is_some_and(|e| e.starts_with("http://"))
                || env("AWS_ALLOW_HTTP").is_some_and(|v| v == "true")
        }
        "az" => {
            endpoint
                .or_else(|| env("AZURE_STORAGE_ENDPOINT"))
                .is_some_and(|e| e.starts_with("http://"))
                || env("AZURE_ALLOW_HTTP").is_some_and(|v| v == "true")
        }
        _ => false,
    };
    let client = ClientOptions::new()
        .with_timeout(config.request_timeout)
        .with_connect_timeout(Duration::from_secs(5))
        .with_allow_http(plain_http);
    let built = |e: object_store::Error| TierError::Config(format!("{url}: {e}"));
    let options = &config.options;
    let store: Arc<dyn ObjectStore> = match scheme {
        "s3" => {
            let b = AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .with_retry(retry)
                .with_client_options(client);
            let b = with_options(b, options, scheme, |b, k: AmazonS3ConfigKey, v| {
                b.with_config(k, v)
            })?;
            Arc::new(b.build().map_err(built)?)
        }
        "gs" => {
            let b = GoogleCloudStorageBuilder::from_env()
                .with_bucket_name(bucket)
                .with_retry(retry)
                .with_client_options(client);
            let b = with_options(b, options, scheme, |b, k: GoogleConfigKey, v| {
                b.with_config(k, v)
            })?;
            Arc::new(b.build().map_err(built)?)
        }
        _ => {
            let b = MicrosoftAzureBuilder::from_env()
                .with_container_name(bucket)
                .with_retry(retry)
                .with_client_options(client);
            let b = with_options(b, options, scheme, |b, k: AzureConfigKey, v| {
                b.with_config(k, v)
            })?;
            Arc::new(b.build().map_err(built)?)
        }
    };
    let prefix = prefix.trim_matches('/');
    Ok(if prefix.is_empty() {
        store
    } else {
        Arc::new(PrefixStore::new(store, prefix))
    })
}

/// Sets `options` (object_store's option names, parsed as the store's
/// keys `K`) on builder `b`; an unknown name is refused.
fn with_options<B, K: FromStr>(
    mut b: B,
    options: &[(String, String)],
    scheme: &str,
    set: impl Fn(B, K, &str) -> B,
) -> Result<B, TierError> {
    for (k, v) in options {
        let key = K::from_str(k)
            .map_err(|_| TierError::Config(format!("unknown {scheme}:// option `{k}`")))?;
        b = set(b, key, v);
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block<T>(f: impl Future<Output = T>) -> T {
        futures_lite::future::block_on(f)
    }

    #[test]
    fn each_scheme_builds_its_store_and_refuses_what_it_does_not_know() {
        let open = |url: &str, options: &[(&str, &str)]| {
            let mut c = RemoteConfig::new(url);
            c.options = options
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            RemoteStore::open(c).map(|_| ())
        };
        let err = |r: Result<(), TierError>| r.unwrap_err().to_string();
        // Google Cloud Storage: a service account key (here one that needs
        // no token, as for an emulator) and a bucket.
        let key = r#"{"private_key": "", "private_key_id": "", "client_email": "x", "disable_oauth": true, "gcs_base_url": "http://127.0.0.1:1"}"#;
        open("gs://archive/weir", &[("service_account_key", key)]).unwrap();
        // Azure Blob Storage: an account, its key, a container.
        let az = [
            ("account_name", "devstoreaccount1"),
            ("access_key", "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="),
            ("endpoint", "http://127.0.0.1:1/devstoreaccount1"),
        ];
        open("az://archive", &az).unwrap();
        assert!(
            err(open("az://archive", &[("region", "x")])).contains("unknown az:// option `region`")
        );
        assert!(err(open("gs://", &[])).contains("no bucket"));
        let e = err(open("hdfs://x/y", &[]));
        assert!(
            e.contains("gs://bucket") && e.contains("az://container"),
            "{e}"
        );
    }

    #[test]
    fn a_directory_store_round_trips_objects_and_parts() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = RemoteConfig::new(format!("file://{}", dir.path().display()));
        cfg.part_bytes = 5 << 20;
        let s = RemoteStore::open(cfg).unwrap();
        let src = dir.path().join("src");
        let data: Vec<u8> = (0..(12u32 << 20)).map(|i| (i % 251) as u8).collect();
        std::fs::write(&src, &data).unwrap();
        // 11 MiB in one piece: three parts.
        let mut up = s.upload("t/0/a.log", 11 << 20).unwrap();
        block(up.write(Bytes::copy_from_slice(&data[1 << 20..]))).unwrap();
        block(up.finish()).unwrap();
        let got = block(s.get_range("t/0/a.log", 0..(11 << 20))).unwrap();
        assert!(got[..] == data[1 << 20..], "the object is what was written");
        // A local file's range, read on the store's threads.
        let head = block(s.read_local(src.clone(), 5..9)).unwrap();
        assert_eq!(&head[..], &data[5..9]);
        // Part by part: 11 MiB in pieces of 1 MiB, then one too short.
        let mut up = s.upload("t/0/b.log", 11 << 20).unwrap();
        for piece in data[1 << 20..].chunks(1 << 20) {
            block(up.write(Bytes::copy_from_slice(piece))).unwrap();
        }
        block(up.finish()).unwrap();
        let got = block(s.get("t/0/b.log")).unwrap();
        assert!(got[..] == data[1 << 20..]);
        let mut up = s.upload("t/0/c.log", 100).unwrap();
        block(up.write(Bytes::from_static(b"short"))).unwrap();
        assert!(block(up.finish()).is_err());
        assert!(matches!(
            block(s.get("t/0/c.log")),
            Err(TierError::NotFound(_))
        ));
        block(s.delete("t/0/b.log")).unwrap();
        block(s.put("t/0/a.index", Bytes::from_static(b"idx"))).unwrap();
        assert_eq!(&block(s.get("t/0/a.index")).unwrap()[..], b"idx");
        let mut keys: Vec<String> = block(s.list("t"))
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        keys.sort();
        assert_eq!(keys, vec!["t/0/a.index", "t/0/a.log"]);
        // What a killed write leaves goes with the object.
        std::fs::write(dir.path().join("t/0/a.log#3"), b"half").unwrap();
        block(s.delete("t/0/a.log")).unwrap();
        block(s.delete("t/0/a.log")).unwrap();
        assert!(!dir.path().join("t/0/a.log#3").exists());
        assert!(matches!(
            block(s.get("t/0/a.log")),
            Err(TierError::NotFound(_))
        ));
        assert!(RemoteStore::open(RemoteConfig::new("ftp://x")).is_err());
        assert!(RemoteStore::open(RemoteConfig::new("file://relative")).is_err());
    }
}
