//! Client quotas' budgets, node-wide: one [`Meter`] per quota kind and
//! (user, client id) tags (`weir_replication::security::quota_for` says
//! which), shared by every core — a client's connections on several cores
//! spend one budget. A meter is a token bucket: it refills at the quota's
//! rate up to [`BURST`] worth, and what a request spends beyond it is a
//! debt the client pays by waiting (the throttle time).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How much a client may spend at once after being idle: one second at
/// its rate (Kafka measures rates over 1-second windows).
pub const BURST: Duration = Duration::from_secs(1);

/// The longest a client is muted for one request; a larger debt carries
/// over to its next requests. Below clients' request timeouts (30 s by
/// default in Kafka's clients and the SDK): a request read after a mute
/// must still be answered in time.
pub const THROTTLE_MAX: Duration = Duration::from_secs(10);

/// Meters unused this long are forgotten once the node has many
/// (Kafka expires idle quota sensors after an hour).
const IDLE_EXPIRY: Duration = Duration::from_secs(3600);

/// Meters kept before idle ones are forgotten.
const METERS_SOFT_MAX: usize = 10_000;

/// Meters kept at most beyond those a connection holds: past it, every
/// meter no connection holds is forgotten (a client reconnecting then
/// starts with a full bucket), so clients inventing client ids cannot grow
/// the map without bound — it is bounded by the open connections.
const METERS_HARD_MAX: usize = 4 * METERS_SOFT_MAX;

/// Meters named in `/metrics`; the rest are summed under `_other`.
pub const METERS_IN_METRICS: usize = 50;

/// What a quota limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Bytes of produce requests per second.
    Produce,
    /// Bytes of fetch answers per second.
    Fetch,
    /// Microseconds of a core's time on requests, per second.
    Request,
}

impl Kind {
    /// All kinds, in index order.
    pub const ALL: [Kind; 3] = [Kind::Produce, Kind::Fetch, Kind::Request];

    /// Kafka's quota key.
    pub fn key(self) -> &'static str {
        use weir_replication::security::quota;
        match self {
            Kind::Produce => quota::PRODUCER_BYTE_RATE,
            Kind::Fetch => quota::CONSUMER_BYTE_RATE,
            Kind::Request => quota::REQUEST_PERCENTAGE,
        }
    }

    /// Units per second the quota's value allows (percent of a core in
    /// microseconds per second).
    pub fn rate(self, value: f64) -> f64 {
        match self {
            Kind::Request => value / 100.0 * 1e6,
            _ => value,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Kind::Produce => "produce",
            Kind::Fetch => "fetch",
            Kind::Request => "request",
        }
    }
}

/// A token bucket (sans-IO: the caller says what time it is).
#[derive(Debug, Clone)]
pub struct Bucket {
    tokens: f64,
    last: Instant,
}

impl Bucket {
    /// A full bucket for `rate`.
    pub fn new(rate: f64, now: Instant) -> Bucket {
        Bucket {
            tokens: rate * BURST.as_secs_f64(),
            last: now,
        }
    }

    fn refill(&mut self, rate: f64, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + rate * dt).min(rate * BURST.as_secs_f64());
        self.last = now.max(self.last);
    }

    /// Spends `amount` at `rate`; how long the client must wait before
    /// its spending is back within the rate (its debt over the rate).
    pub fn spend(&mut self, rate: f64, amount: f64, now: Instant) -> Duration {
        self.refill(rate, now);
        self.tokens -= amount;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / rate).min(THROTTLE_MAX)
        }
    }

    /// What can be spent now without a debt (at least nothing).
    pub fn available(&mut self, rate: f64, now: Instant) -> f64 {
        self.refill(rate, now);
        self.tokens.max(0.0)
    }

    /// How long until the spending so far is back within the rate (zero
    /// without a debt).
    pub fn debt(&mut self, rate: f64, now: Instant) -> Duration {
        self.refill(rate, now);
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / rate).min(THROTTLE_MAX)
        }
    }
}

/// One budget, with its totals for `/metrics`.
#[derive(Debug)]
pub struct Meter {
    bucket: Mutex<Option<Bucket>>,
    /// Units spent (bytes, or microseconds).
    pub spent: AtomicU64,
    /// Milliseconds clients of this budget were throttled.
    pub throttled_ms: AtomicU64,
    /// When last spent, in seconds since the registry started.
    last_used_s: AtomicU64,
}

impl Meter {
    /// Spends `amount` at `rate` now: the throttle time.
    pub fn spend(&self, rate: f64, amount: f64, now: Instant) -> Duration {
        let throttle = {
            let mut b = self.bucket.lock().expect("not poisoned");
            b.get_or_insert_with(|| Bucket::new(rate, now))
                .spend(rate, amount, now)
        };
        self.spent.fetch_add(amount as u64, Ordering::Relaxed);
        if !throttle.is_zero() {
            self.throttled_ms
                .fetch_add(throttle.as_millis() as u64, Ordering::Relaxed);
        }
        throttle
    }

    /// What can be spent now without a debt.
    pub fn available(&self, rate: f64, now: Instant) -> f64 {
        let mut b = self.bucket.lock().expect("not poisoned");
        b.get_or_insert_with(|| Bucket::new(rate, now))
            .available(rate, now)
    }

    /// How long until the budget is out of debt (zero: it is not).
    pub fn debt(&self, rate: f64, now: Instant) -> Duration {
        let mut b = self.bucket.lock().expect("not poisoned");
        b.get_or_insert_with(|| Bucket::new(rate, now))
            .debt(rate, now)
    }
}

/// Whose budget: the kind, and the user and client-id tags.
pub type MeterKey = (Kind, Option<String>, Option<String>);

/// The node's meters.
#[derive(Debug)]
pub struct Meters {
    started: Instant,
    map: Mutex<Table>,
}

/// The meters, and the size at which new ones next start a sweep.
#[derive(Debug)]
struct Table {
    meters: HashMap<MeterKey, Arc<Meter>>,
    /// A sweep is a scan of every meter: it runs when the map has grown
    /// by half since the last one (never below [`METERS_SOFT_MAX`], never
    /// past [`METERS_HARD_MAX`]), so a flood of new client ids costs
    /// amortised constant time per meter, not a scan each.
    sweep_at: usize,
}

impl Default for Meters {
    fn default() -> Self {
        Meters {
            started: Instant::now(),
            map: Mutex::new(Table {
                meters: HashMap::new(),
                sweep_at: METERS_SOFT_MAX,
            }),
        }
    }
}

impl Meters {
    /// The meter of `key`, made if new.
    pub fn get(&self, key: MeterKey) -> Arc<Meter> {
        let now_s = self.started.elapsed().as_secs();
        let mut table = self.map.lock().expect("not poisoned");
        let Table {
            meters: map,
            sweep_at,
        } = &mut *table;
        if map.len() >= *sweep_at && !map.contains_key(&key) {
            let idle = IDLE_EXPIRY.as_secs();
            map.retain(|_, m| {
                Arc::strong_count(m) > 1
                    || now_s.saturating_sub(m.last_used_s.load(Ordering::Relaxed)) < idle
            });
            if map.len() >= METERS_HARD_MAX {
                map.retain(|_, m| Arc::strong_count(m) > 1);
            }
            *sweep_at = (map.len() + map.len() / 2).clamp(METERS_SOFT_MAX, METERS_HARD_MAX);
        }
        let m = map
            .entry(key)
            .or_insert_with(|| {
                Arc::new(Meter {
                    bucket: Mutex::new(None),
                    spent: AtomicU64::new(0),
                    throttled_ms: AtomicU64::new(0),
                    last_used_s: AtomicU64::new(now_s),
                })
            })
            .clone();
        m.last_used_s.store(now_s, Ordering::Relaxed);
        m
    }

    /// `/metrics` lines: per budget, units spent and milliseconds
    /// throttled; the [`METERS_IN_METRICS`] that spent most are named,
    /// the others summed under `user="_other"`.
    pub fn render(&self, o: &mut String) {
        let mut rows: Vec<(MeterKey, u64, u64)> = self
            .map
            .lock()
            .expect("not poisoned")
            .meters
            .iter()
            .map(|(k, m)| {
                (
                    k.clone(),
                    m.spent.load(Ordering::Relaxed),
                    m.throttled_ms.load(Ordering::Relaxed),
                )
            })
            .collect();
        rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let mut other = [(0u64, 0u64); 3];
        let mut named = Vec::new();
        for (i, (k, spent, ms)) in rows.into_iter().enumerate() {
            if i < METERS_IN_METRICS {
                named.push((k, spent, ms));
            } else {
                let slot = &mut other[k.0 as usize];
                slot.0 += spent;
                slot.1 += ms;
            }
        }
        let _ = writeln!(
            o,
            "# HELP weir_quota_spent_total What clients under a quota spent on this node: bytes \
             (produce, fetch) or microseconds of request time (request), by budget.\n\
             # TYPE weir_quota_spent_total counter"
        );
        let label = |k: &MeterKey| {
            format!(
                "kind=\"{}\",user=\"{}\",client_id=\"{}\"",
                k.0.label(),
                escape(k.1.as_deref().unwrap_or("")),
                escape(k.2.as_deref().unwrap_or(""))
            )
        };
        for (k, spent, _) in &named {
            let _ = writeln!(o, "weir_quota_spent_total{{{}}} {spent}", label(k));
        }
        for kind in Kind::ALL {
            let (spent, _) = other[kind as usize];
            if spent > 0 {
                let k = (kind, Some("_other".to_string()), Some("_other".to_string()));
                let _ = writeln!(o, "weir_quota_spent_total{{{}}} {spent}", label(&k));
            }
        }
        let _ = writeln!(
            o,
            "# HELP weir_quota_throttle_seconds_total Time clients were throttled (their \
             connections muted) for going over a quota, by budget.\n\
             # TYPE weir_quota_throttle_seconds_total counter"
        );
        for (k, _, ms) in &named {
            let _ = writeln!(
                o,
                "weir_quota_throttle_seconds_total{{{}}} {}",
                label(k),
                *ms as f64 / 1000.0
            );
        }
        for kind in Kind::ALL {
            let (spent, ms) = other[kind as usize];
            if spent > 0 {
                let k = (kind, Some("_other".to_string()), Some("_other".to_string()));
                let _ = writeln!(
                    o,
                    "weir_quota_throttle_seconds_total{{{}}} {}",
                    label(&k),
                    ms as f64 / 1000.0
                );
            }
        }
    }
}

/// Per [`Kind`]: the rate and the budget, if a quota applies.
pub type Budgets = [Option<(f64, Arc<Meter>)>; 3];

/// A connection's budgets as last resolved.
#[derive(Debug)]
struct Resolved {
    generation: u64,
    principal: String,
    client_id: String,
    budgets: Budgets,
}

/// One connection's quota state: its client id, its budgets, its mute.
#[derive(Debug, Default)]
pub struct ClientQuotas {
    client_id: RefCell<String>,
    resolved: RefCell<Option<Resolved>>,
    muted_until: Cell<Option<Instant>>,
}

impl ClientQuotas {
    /// The client id of the request being served (Kafka's request
    /// header; the native protocol has none: empty).
    pub fn set_client_id(&self, id: &str) {
        if self.client_id.borrow().as_str() != id {
            *self.client_id.borrow_mut() = id.to_string();
        }
    }

    /// Until when the connection reads nothing (its throttle).
    pub fn muted_until(&self) -> Option<Instant> {
        self.muted_until.get().filter(|t| *t > Instant::now())
    }

    /// Mutes the connection until `until` (or longer, if it already is).
    pub fn mute(&self, until: Instant) {
        if self.muted_until.get().is_none_or(|t| t < until) {
            self.muted_until.set(Some(until));
        }
    }

    /// The budget of `kind` for `principal` under quota version
    /// `generation`: `resolve(principal, client id)` is asked only when
    /// one of the three changed since the last time.
    pub fn meter(
        &self,
        generation: u64,
        principal: &str,
        kind: Kind,
        resolve: impl FnOnce(&str, &str) -> Budgets,
    ) -> Option<(f64, Arc<Meter>)> {
        let client_id = self.client_id.borrow();
        let mut resolved = self.resolved.borrow_mut();
        let fresh = resolved.as_ref().is_some_and(|r| {
            r.generation == generation && r.client_id == *client_id && r.principal == principal
        });
        if !fresh {
            *resolved = Some(Resolved {
                generation,
                principal: principal.to_string(),
                client_id: client_id.clone(),
                budgets: resolve(principal, &client_id),
            });
        }
        resolved
            .as_ref()
            .and_then(|r| r.budgets[kind as usize].clone())
    }
}

/// A Prometheus label value: `\`, `"` and newlines escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_lets_a_burst_through_then_holds_the_rate() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut b = Bucket::new(1000.0, t0);
        // One second's worth at once is free.
        assert_eq!(b.spend(1000.0, 1000.0, t0), Duration::ZERO);
        // Then 500 more is half a second of debt.
        assert_eq!(b.spend(1000.0, 500.0, t0), Duration::from_millis(500));
        // Waiting it out pays the debt exactly.
        assert_eq!(b.spend(1000.0, 0.0, ms(500)), Duration::ZERO);
        assert_eq!(b.available(1000.0, ms(500)), 0.0);
        // Idle refills up to the burst, never beyond.
        assert_eq!(b.available(1000.0, ms(60_000)), 1000.0);
        // A client that always waits its throttle out gets the rate: 100
        // requests of 100 units take 9 s after the first second's burst.
        let mut b = Bucket::new(1000.0, t0);
        let mut now = t0;
        for _ in 0..100 {
            now += b.spend(1000.0, 100.0, now);
        }
        assert_eq!(now.duration_since(t0).as_millis(), 9000);
        // A debt beyond the cap carries over to the next request: 99 s
        // of it are paid only 99 s later.
        let mut b = Bucket::new(1.0, t0);
        assert_eq!(b.spend(1.0, 100.0, t0), THROTTLE_MAX);
        assert_eq!(b.spend(1.0, 0.0, t0 + THROTTLE_MAX * 3), THROTTLE_MAX);
        assert_eq!(
            b.spend(1.0, 0.0, t0 + Duration::from_secs(99)),
            Duration::ZERO
        );
    }

    #[test]
    fn meters_no_connection_holds_are_forgotten_past_the_hard_bound() {
        let m = Meters::default();
        let held = m.get((Kind::Produce, Some("held".into()), None));
        for i in 0..METERS_HARD_MAX + 10 {
            m.get((Kind::Fetch, None, Some(format!("c{i}"))));
        }
        let len = m.map.lock().unwrap().meters.len();
        assert!(len < METERS_HARD_MAX, "{len} meters kept");
        // The one a connection holds stays, with what it spent.
        held.spend(1e9, 5.0, Instant::now());
        let again = m.get((Kind::Produce, Some("held".into()), None));
        assert!(Arc::ptr_eq(&held, &again));
    }

    #[test]
    fn metrics_name_the_biggest_budgets_and_sum_the_rest() {
        let m = Meters::default();
        let now = Instant::now();
        for i in 0..(METERS_IN_METRICS + 5) {
            m.get((Kind::Produce, Some(format!("u{i}")), None))
                .spend(1e9, (i + 1) as f64, now);
        }
        let mut o = String::new();
        m.render(&mut o);
        let spent: Vec<&str> = o
            .lines()
            .filter(|l| l.starts_with("weir_quota_spent_total{"))
            .collect();
        assert_eq!(spent.len(), METERS_IN_METRICS + 1);
        // u0..u4 spent least: summed (1+2+3+4+5).
        assert!(o.contains(
            "weir_quota_spent_total{kind=\"produce\",user=\"_other\",client_id=\"_other\"} 15"
        ));
        assert!(o.contains("user=\"u54\""));
    }
}
