//! One builder per role, from what applications already have: a bootstrap
//! list of host names, and Kafka-style properties.
//!
//! `build()` connects to the first reachable bootstrap server with
//! retries ([`Client::bootstrap`]), so an application started before its
//! broker waits for it (up to [`ClientConfig::bootstrap_timeout`]) instead
//! of failing. Settings come from the typed configs
//! ([`ProducerBuilder::config`]) and/or by Kafka's property names
//! ([`ProducerBuilder::from_config`]); a property error is reported by
//! `build()`.

use std::sync::Arc;

use crate::group_consumer::{GroupConsumer, GroupConsumerConfig};
use crate::producer::{DefaultPartitioner, Partitioner, Producer, ProducerConfig};
use crate::properties::{apply_client, apply_consumer, apply_producer, apply_share, PropertyError};
use crate::share_consumer::{ShareConsumer, ShareConsumerConfig};
use crate::transactional::TransactionalProducer;
use crate::{Client, ClientConfig, ClientError, Consumer, ConsumerConfig, Result};

/// The bootstrap list used when none is given.
pub const BOOTSTRAP_DEFAULT: &str = "127.0.0.1:9292";

/// Builds a [`Producer`]; from [`Producer::builder`].
///
/// ```no_run
/// # async fn demo() -> weir_client::Result<()> {
/// use weir_client::{Producer, ProducerRecord};
///
/// let producer = Producer::builder()
///     .bootstrap("broker1:9292,broker2:9292")
///     .from_config([("linger.ms", "10"), ("compression.type", "lz4")])
///     .build()
///     .await?;
/// producer.send_with(ProducerRecord::new("events", "hi"), |r| println!("{r:?}")).await?;
/// producer.close().await;
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until `build` is awaited"]
pub struct ProducerBuilder {
    bootstrap: Option<String>,
    client: ClientConfig,
    producer: ProducerConfig,
    partitioner: Arc<dyn Partitioner>,
    error: Option<PropertyError>,
}

impl Default for ProducerBuilder {
    fn default() -> Self {
        ProducerBuilder {
            bootstrap: None,
            client: ClientConfig::default(),
            producer: ProducerConfig::default(),
            partitioner: Arc::new(DefaultPartitioner),
            error: None,
        }
    }
}

impl std::fmt::Debug for ProducerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProducerBuilder")
            .field("bootstrap", &self.bootstrap)
            .field("client", &self.client)
            .field("producer", &self.producer)
            .finish()
    }
}

impl ProducerBuilder {
    /// The bootstrap servers: `"host:port,host:port"` (see
    /// [`crate::Bootstrap`]). Default [`BOOTSTRAP_DEFAULT`].
    pub fn bootstrap(mut self, servers: impl Into<String>) -> Self {
        self.bootstrap = Some(servers.into());
        self
    }

    /// Changes the producer settings.
    pub fn config(mut self, f: impl FnOnce(&mut ProducerConfig)) -> Self {
        f(&mut self.producer);
        self
    }

    /// Changes the connection settings.
    pub fn client_config(mut self, f: impl FnOnce(&mut ClientConfig)) -> Self {
        f(&mut self.client);
        self
    }

    /// The partitioner of records sent without a partition. Default
    /// [`DefaultPartitioner`].
    pub fn partitioner(mut self, p: impl Partitioner + 'static) -> Self {
        self.partitioner = Arc::new(p);
        self
    }

    /// Applies settings by Kafka's property names (see
    /// [`crate::properties`]): `bootstrap.servers`, `linger.ms`,
    /// `batch.size`, `acks`, `enable.idempotence`, `compression.type`,
    /// `retries`, `delivery.timeout.ms`, `request.timeout.ms`, …; in name
    /// order. The first unknown or invalid one makes `build` fail.
    pub fn from_config<K: AsRef<str>, V: AsRef<str>>(
        mut self,
        properties: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.error = self.error.take().or_else(|| {
            apply_all(
                properties,
                "producer",
                &mut self.bootstrap,
                &mut self.client,
                |name, value| apply_producer(&mut self.producer, name, value),
            )
            .err()
        });
        self
    }

    /// The producer settings so far.
    pub fn producer_config(&self) -> &ProducerConfig {
        &self.producer
    }

    /// Connects (retrying, see [`Client::bootstrap`]) and starts the
    /// producer. With [`ProducerConfig::io_thread`] (the default) this
    /// needs a tokio runtime only for the connection attempt; the producer
    /// then works on its own thread.
    pub async fn build(self) -> Result<Producer> {
        if let Some(e) = self.error {
            return Err(ClientError::Config(e));
        }
        let servers = self.bootstrap.as_deref().unwrap_or(BOOTSTRAP_DEFAULT);
        let client = Client::bootstrap(servers, self.client).await?;
        Ok(Producer::with_partitioner(
            client,
            self.producer,
            self.partitioner,
        ))
    }

    /// Connects (as [`ProducerBuilder::build`]) and makes a transactional
    /// producer of the `transactional.id` property (or
    /// [`ClientConfig::transactional_id`]), with `transaction.timeout.ms`;
    /// call its `init_transactions` next.
    pub async fn build_transactional(self) -> Result<TransactionalProducer> {
        if let Some(e) = self.error {
            return Err(ClientError::Config(e));
        }
        if self.client.transactional_id.is_none() {
            return Err(ClientError::InvalidArgument(
                "a transactional producer needs `transactional.id`".into(),
            ));
        }
        let servers = self.bootstrap.as_deref().unwrap_or(BOOTSTRAP_DEFAULT);
        let client = Client::bootstrap(servers, self.client).await?;
        TransactionalProducer::with_client(client, self.producer)
    }
}

/// Builds a [`Consumer`] (manual assignment) or a [`GroupConsumer`]; from
/// [`Consumer::builder`].
///
/// ```no_run
/// # async fn demo() -> weir_client::Result<()> {
/// use weir_client::Consumer;
///
/// let mut consumer = Consumer::builder()
///     .bootstrap("localhost:9292")
///     .from_config([("auto.offset.reset", "earliest")])
///     .build()
///     .await?;
/// consumer.assign(vec![("events".to_string(), 0)]);
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is awaited"]
pub struct ConsumerBuilder {
    bootstrap: Option<String>,
    topics: Vec<String>,
    client: ClientConfig,
    consumer: GroupConsumerConfig,
    error: Option<PropertyError>,
}

impl Default for ConsumerBuilder {
    fn default() -> Self {
        ConsumerBuilder {
            bootstrap: None,
            topics: Vec::new(),
            client: ClientConfig::default(),
            consumer: GroupConsumerConfig::new(""),
            error: None,
        }
    }
}

impl ConsumerBuilder {
    /// The bootstrap servers: `"host:port,host:port"` (see
    /// [`crate::Bootstrap`]). Default [`BOOTSTRAP_DEFAULT`].
    pub fn bootstrap(mut self, servers: impl Into<String>) -> Self {
        self.bootstrap = Some(servers.into());
        self
    }

    /// Topics to read: [`ConsumerBuilder::build`] assigns every partition
    /// they have when it connects (partitions added later are not read),
    /// [`ConsumerBuilder::build_group`] subscribes the member to them.
    pub fn topics<T: Into<String>>(mut self, topics: impl IntoIterator<Item = T>) -> Self {
        self.topics.extend(topics.into_iter().map(Into::into));
        self
    }

    /// The consumer group ([`ConsumerBuilder::build_group`]).
    pub fn group_id(mut self, group: impl Into<String>) -> Self {
        self.consumer.group_id = group.into();
        self
    }

    /// Changes the fetch settings.
    pub fn config(mut self, f: impl FnOnce(&mut ConsumerConfig)) -> Self {
        f(&mut self.consumer.consumer);
        self
    }

    /// Changes the group settings (and, in them, the fetch settings).
    pub fn group_config(mut self, f: impl FnOnce(&mut GroupConsumerConfig)) -> Self {
        f(&mut self.consumer);
        self
    }

    /// Changes the connection settings.
    pub fn client_config(mut self, f: impl FnOnce(&mut ClientConfig)) -> Self {
        f(&mut self.client);
        self
    }

    /// Applies settings by Kafka's property names (see
    /// [`crate::properties`]): `bootstrap.servers`, `group.id`,
    /// `auto.offset.reset`, `max.poll.records`, `fetch.max.bytes`,
    /// `enable.auto.commit`, `session.timeout.ms`, …; in name order. The
    /// first unknown or invalid one makes `build` fail.
    pub fn from_config<K: AsRef<str>, V: AsRef<str>>(
        mut self,
        properties: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.error = self.error.take().or_else(|| {
            apply_all(
                properties,
                "consumer",
                &mut self.bootstrap,
                &mut self.client,
                |name, value| apply_consumer(&mut self.consumer, name, value),
            )
            .err()
        });
        self
    }

    async fn connect(&mut self) -> Result<Client> {
        if let Some(e) = self.error.take() {
            return Err(ClientError::Config(e));
        }
        let servers = self.bootstrap.as_deref().unwrap_or(BOOTSTRAP_DEFAULT);
        Client::bootstrap(servers, self.client.clone()).await
    }

    /// Connects (retrying, see [`Client::bootstrap`]) and makes a consumer
    /// of manually assigned partitions: those of the
    /// [`ConsumerBuilder::topics`], or none (then call
    /// [`Consumer::assign`]).
    pub async fn build(mut self) -> Result<Consumer> {
        let client = self.connect().await?;
        let mut partitions = Vec::new();
        for topic in &self.topics {
            let n = client.topic_metadata(topic).await?.partitions.len() as u32;
            partitions.extend((0..n).map(|p| (topic.clone(), p)));
        }
        let mut consumer = Consumer::new(client, self.consumer.consumer);
        if !partitions.is_empty() {
            consumer.assign(partitions);
        }
        Ok(consumer)
    }

    /// Connects and makes a member of the group set with
    /// [`ConsumerBuilder::group_id`] or `group.id`, subscribed to the
    /// [`ConsumerBuilder::topics`] if any were given (else call
    /// [`GroupConsumer::subscribe`] to join).
    pub async fn build_group(mut self) -> Result<GroupConsumer> {
        if self.consumer.group_id.is_empty() {
            return Err(ClientError::InvalidArgument(
                "a group consumer needs a group id (group_id or `group.id`)".into(),
            ));
        }
        let client = self.connect().await?;
        let mut member = GroupConsumer::new(client, self.consumer);
        if !self.topics.is_empty() {
            let topics: Vec<&str> = self.topics.iter().map(String::as_str).collect();
            member.subscribe(&topics).await?;
        }
        Ok(member)
    }
}

/// Builds a [`ShareConsumer`], a member of a share group; from
/// [`ShareConsumer::builder`].
///
/// ```no_run
/// # async fn demo() -> weir_client::Result<()> {
/// use weir_client::ShareConsumer;
///
/// let mut workers = ShareConsumer::builder()
///     .bootstrap("localhost:9292")
///     .topics(["events"])
///     .from_config([
///         ("group.id", "enrich"),
///         ("share.acquire.mode", "record_limit"),
///         ("max.poll.records", "50"),
///     ])
///     .build()
///     .await?;
/// for r in workers.poll(std::time::Duration::from_secs(1)).await? {
///     println!("{:?}", r.record.value);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until `build` is awaited"]
pub struct ShareConsumerBuilder {
    bootstrap: Option<String>,
    topics: Vec<String>,
    client: ClientConfig,
    share: ShareConsumerConfig,
    error: Option<PropertyError>,
}

impl Default for ShareConsumerBuilder {
    fn default() -> Self {
        ShareConsumerBuilder {
            bootstrap: None,
            topics: Vec::new(),
            client: ClientConfig::default(),
            share: ShareConsumerConfig::new(""),
            error: None,
        }
    }
}

impl ShareConsumerBuilder {
    /// The bootstrap servers: `"host:port,host:port"` (see
    /// [`crate::Bootstrap`]). Default [`BOOTSTRAP_DEFAULT`].
    pub fn bootstrap(mut self, servers: impl Into<String>) -> Self {
        self.bootstrap = Some(servers.into());
        self
    }

    /// The topics the member subscribes to once built.
    pub fn topics<T: Into<String>>(mut self, topics: impl IntoIterator<Item = T>) -> Self {
        self.topics.extend(topics.into_iter().map(Into::into));
        self
    }

    /// The share group (or `group.id`).
    pub fn group_id(mut self, group: impl Into<String>) -> Self {
        self.share.group_id = group.into();
        self
    }

    /// Changes the share consumer's settings.
    pub fn config(mut self, f: impl FnOnce(&mut ShareConsumerConfig)) -> Self {
        f(&mut self.share);
        self
    }

    /// Changes the connection settings.
    pub fn client_config(mut self, f: impl FnOnce(&mut ClientConfig)) -> Self {
        f(&mut self.client);
        self
    }

    /// Applies settings by Kafka's property names (see
    /// [`crate::properties`]): `bootstrap.servers`, the connection's, and
    /// Kafka's `ShareConsumer` ones — `group.id`,
    /// `share.acknowledgement.mode` (`implicit`, `explicit`),
    /// `share.acquire.mode` (`batch_optimized`, `record_limit`),
    /// `max.poll.records`, `fetch.max.wait.ms`,
    /// `max.partition.fetch.bytes`; in name order. The first unknown or
    /// invalid one makes `build` fail.
    pub fn from_config<K: AsRef<str>, V: AsRef<str>>(
        mut self,
        properties: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.error = self.error.take().or_else(|| {
            apply_all(
                properties,
                "share consumer",
                &mut self.bootstrap,
                &mut self.client,
                |name, value| apply_share(&mut self.share, name, value),
            )
            .err()
        });
        self
    }

    /// Connects (retrying, see [`Client::bootstrap`]) and makes a member
    /// of the share group set with [`ShareConsumerBuilder::group_id`] or
    /// `group.id`, subscribed to the [`ShareConsumerBuilder::topics`] if
    /// any were given (else call [`ShareConsumer::subscribe`]).
    pub async fn build(self) -> Result<ShareConsumer> {
        if let Some(e) = self.error {
            return Err(ClientError::Config(e));
        }
        if self.share.group_id.is_empty() {
            return Err(ClientError::InvalidArgument(
                "a share consumer needs a group id (group_id or `group.id`)".into(),
            ));
        }
        let servers = self.bootstrap.as_deref().unwrap_or(BOOTSTRAP_DEFAULT);
        let client = Client::bootstrap(servers, self.client).await?;
        let mut member = ShareConsumer::new(client, self.share);
        if !self.topics.is_empty() {
            let topics: Vec<&str> = self.topics.iter().map(String::as_str).collect();
            member.subscribe(&topics)?;
        }
        Ok(member)
    }
}

/// Applies Kafka-named properties in name order: `bootstrap.servers`, then
/// the connection settings, then the role's own (`apply_role`); the first
/// unknown or invalid one is the error.
fn apply_all<K: AsRef<str>, V: AsRef<str>>(
    properties: impl IntoIterator<Item = (K, V)>,
    role: &'static str,
    bootstrap: &mut Option<String>,
    client: &mut ClientConfig,
    mut apply_role: impl FnMut(&str, &str) -> std::result::Result<bool, PropertyError>,
) -> std::result::Result<(), PropertyError> {
    let props: crate::Properties = properties.into_iter().collect();
    for (name, value) in props.iter() {
        let known = if name == "bootstrap.servers" {
            *bootstrap = Some(value.to_string());
            true
        } else {
            apply_client(client, name, value)? || apply_role(name, value)?
        };
        if !known {
            return Err(PropertyError::Unknown {
                role,
                name: name.to_string(),
            });
        }
    }
    Ok(())
}
