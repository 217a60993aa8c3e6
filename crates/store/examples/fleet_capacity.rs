//! How many gateway replicas one store carries: N simulated replicas against a real
//! `redis-server`, each doing what a busy replica's state and reader threads do, with the
//! same calls — its load appended to the load stream as it changes (`append_load`) and its
//! keys written once per sync interval (`publish_load`), its shared items appended
//! (`append_items`), and a reader blocked in `watch` on both streams. Prints, per fleet size, the store's CPU (its own process time
//! over the run, as a share of one core: Redis runs commands on one thread), the commands
//! and entries per second, and how late the readers saw the other replicas' entries.
//!
//!     cargo run --release -p rolter-store --example fleet_capacity -- \
//!         --replicas 3,10,20,40 --load-rate 1000 --item-rate 200 --seconds 5
//!
//! The clients run on the same machine as the server: on a small machine their threads
//! compete with it, so the lag is an upper bound and the store's CPU the figure to read.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use rolter_store::testing::RedisServer;
use rolter_store::{Cursor, Item, Store};

#[derive(Parser)]
struct Args {
    /// Fleet sizes to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "3,10,20")]
    replicas: Vec<usize>,
    /// Load publications per second per replica (a busy replica publishes at most 1000:
    /// one per millisecond).
    #[arg(long, default_value_t = 1000)]
    load_rate: u32,
    /// Item entries per second per replica (each a batch of `--items` prefixes).
    #[arg(long, default_value_t = 200)]
    item_rate: u32,
    /// Prefixes per item entry.
    #[arg(long, default_value_t = 8)]
    items: usize,
    /// Targets in the fleet (entries of a load publication).
    #[arg(long, default_value_t = 8)]
    targets: usize,
    /// How often a replica writes its load keys as well (`publish_load`), milliseconds: the
    /// sync interval; 0: at every publication.
    #[arg(long, default_value_t = 100)]
    keys_every_ms: u64,
    /// Seconds per fleet size.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
}

/// A process's user + system CPU time, in clock ticks (`/proc/<pid>/stat`).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let at = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    at(11) + at(12)
}

/// The store's total commands processed (`INFO stats`).
fn commands(store: &RedisServer) -> u64 {
    let client = redis::Client::open(store.url()).unwrap();
    let mut c = client.get_connection().unwrap();
    let info: String = redis::cmd("INFO").arg("stats").query(&mut c).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Paces a loop at `rate` per second.
struct Pace {
    start: Instant,
    done: u64,
    rate: u32,
}

impl Pace {
    fn next(&mut self) {
        self.done += 1;
        let due = self.start + Duration::from_secs_f64(self.done as f64 / f64::from(self.rate));
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
}

/// What the readers saw: entries and their lag in milliseconds.
#[derive(Default)]
struct Seen {
    entries: AtomicU64,
    lags: Mutex<Vec<u64>>,
}

fn writer(store: &RedisServer, prefix: &str, i: usize, a: &Args, stop: &AtomicBool) {
    let mut s = Store::connect(&store.settings(prefix)).unwrap();
    let replica = format!("gw{i}");
    let origin = format!("{replica}#1");
    let names: Vec<String> = (0..a.targets).map(|t| format!("t{t}")).collect();
    let items: Vec<Item> = (0..a.items)
        .map(|k| Item::Prefix {
            route: "chat".into(),
            target: names[k % names.len()].clone(),
            // About a 2 KiB prompt's chunk keys: 8 bytes per 64-byte chunk.
            data: vec![k as u8; 256],
        })
        .collect();
    let mut load = Pace {
        start: Instant::now(),
        done: 0,
        rate: a.load_rate.max(1),
    };
    let mut next_items = Instant::now();
    let item_gap = Duration::from_secs_f64(1.0 / f64::from(a.item_rate.max(1)));
    let mut n = 0u32;
    let keys_every = Duration::from_millis(a.keys_every_ms);
    let mut keys_due = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        n = n.wrapping_add(1);
        let counts: Vec<(&str, u32)> = names
            .iter()
            .enumerate()
            .map(|(t, name)| (name.as_str(), (n + t as u32) % 7))
            .collect();
        if Instant::now() >= keys_due {
            keys_due = Instant::now() + keys_every;
            s.publish_load(&replica, &counts, Duration::from_millis(300))
                .unwrap();
        } else {
            s.append_load(&replica, &counts).unwrap();
        }
        if a.item_rate > 0 && Instant::now() >= next_items {
            next_items += item_gap;
            s.append_items(&origin, &items, 10_000).unwrap();
        }
        load.next();
    }
}

fn reader(store: &RedisServer, prefix: &str, i: usize, seen: &Seen, stop: &AtomicBool) {
    let mut s = Store::connect(&store.settings(prefix)).unwrap();
    let replica = format!("gw{i}");
    let origin = format!("{replica}#1");
    let mut cursor: Cursor = s.watch_cursor().unwrap();
    let mut lags = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let news = s
            .watch(
                &origin,
                &replica,
                &mut cursor,
                64,
                Some(Duration::from_millis(100)),
            )
            .unwrap();
        let now = unix_ms();
        let n = news.entries.len() + news.loads.len();
        seen.entries.fetch_add(n as u64, Ordering::Relaxed);
        for ms in news
            .entries
            .iter()
            .map(|e| e.unix_ms)
            .chain(news.loads.iter().map(|l| l.unix_ms))
        {
            lags.push(now.saturating_sub(ms));
        }
    }
    seen.lags.lock().unwrap().extend(lags);
}

fn run(store: &RedisServer, n: usize, a: &Args) {
    let prefix = format!("cap{n}");
    let stop = AtomicBool::new(false);
    let seen = Seen::default();
    let pid = store.pid().expect("the server runs");
    let (mut cpu0, mut cmd0, mut t0) = (0, 0, Instant::now());
    std::thread::scope(|scope| {
        for i in 0..n {
            let (stop, seen, prefix) = (&stop, &seen, &prefix);
            scope.spawn(move || reader(store, prefix, i, seen, stop));
            scope.spawn(move || writer(store, prefix, i, a, stop));
        }
        // Past the connections and the first entries.
        std::thread::sleep(Duration::from_millis(500));
        (cpu0, cmd0, t0) = (cpu_ticks(pid), commands(store), Instant::now());
        seen.entries.store(0, Ordering::Relaxed);
        std::thread::sleep(Duration::from_secs(a.seconds));
        stop.store(true, Ordering::Relaxed);
    });
    let secs = t0.elapsed().as_secs_f64();
    let cpu = (cpu_ticks(pid) - cpu0) as f64 / 100.0 / secs;
    let cmds = (commands(store) - cmd0) as f64 / secs;
    let entries = seen.entries.load(Ordering::Relaxed) as f64 / secs;
    let mut lags = seen.lags.lock().unwrap().clone();
    lags.sort_unstable();
    let q = |p: f64| {
        lags.get(((lags.len() as f64 * p) as usize).min(lags.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    println!(
        "| {n} | {:.0} % | {:.0} | {:.0} | {} ms | {} ms |",
        cpu * 100.0,
        cmds,
        entries,
        q(0.5),
        q(0.99)
    );
}

fn main() {
    let a = Args::parse();
    if !RedisServer::available() {
        eprintln!("redis-server is not installed (apt-get install redis-server)");
        std::process::exit(1);
    }
    let store = RedisServer::start();
    println!(
        "{} load publications (keys every {} ms) and {} item entries of {} prefixes per second per replica, {} targets, {} s each",
        a.load_rate, a.keys_every_ms, a.item_rate, a.items, a.targets, a.seconds
    );
    println!(
        "| replicas | store CPU (one core) | commands/s | entries read/s | lag p50 | lag p99 |"
    );
    println!("|---|---|---|---|---|---|");
    for &n in &a.replicas {
        run(&store, n, &a);
    }
}
