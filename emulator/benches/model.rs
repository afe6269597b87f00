//! NIC model benchmarks: Toeplitz, parse, full classify, table updates, and lookups
//! under a concurrent writer (our table vs dashmap vs a single RwLock<HashMap>).
//! Numbers: docs/performance.md.

use arfsnic::model::filter::{Action, FilterTable, Layout};
use arfsnic::model::nic::Nic;
use arfsnic::model::rss::{HashTypes, Rss, Toeplitz, MICROSOFT_KEY};
use arfsnic::wire::parse::{parse_frame_fast, parse_frame_slow};
use arfsnic::wire::{parse_frame, FlowKey, L4Proto};
use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use etherparse::PacketBuilder;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

fn key(i: u32) -> FlowKey {
    FlowKey::v4(L4Proto::Tcp, [10, (i >> 16) as u8, (i >> 8) as u8, i as u8], 40000, [10, 0, 0, 2], 80)
}

fn frame_for(k: &FlowKey, payload: usize) -> Vec<u8> {
    let mut v = Vec::new();
    let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    let s: [u8; 4] = k.src[..4].try_into().unwrap();
    let d: [u8; 4] = k.dst[..4].try_into().unwrap();
    b.ipv4(s, d, 64).tcp(k.sport, k.dport, 1, 1000).write(&mut v, &vec![0u8; payload]).unwrap();
    v
}

fn toeplitz(c: &mut Criterion) {
    let t = Toeplitz::new(&MICROSOFT_KEY).unwrap();
    let mut g = c.benchmark_group("toeplitz");
    g.throughput(Throughput::Elements(1));
    let v4 = [66u8, 9, 149, 187, 161, 142, 100, 80, 0x0a, 0xea, 0x06, 0xe6];
    g.bench_function("tcpv4_12B", |b| b.iter(|| t.hash(black_box(&v4))));
    let v6 = [0x3fu8; 36];
    g.bench_function("tcpv6_36B", |b| b.iter(|| t.hash(black_box(&v6))));
    g.bench_function("tcpv4_bit_serial_reference", |b| {
        b.iter(|| Toeplitz::hash_reference(&MICROSOFT_KEY, black_box(&v4)))
    });
    g.finish();
}

/// A 4-queue NIC with `rules` filters in a shared table, and 256 TCPv4 frames of which
/// half hit a rule (when there are rules) and half miss.
fn classify_rig(rules: u32) -> (Nic, Vec<Vec<u8>>) {
    let table = Arc::new(FilterTable::new(Layout::Shared, 1 << 17));
    for i in 0..rules {
        table.insert(i, key(i), Action::Queue((i % 4) as u16), 0).unwrap();
    }
    let nic = Nic::with_parts(Rss::new(&MICROSOFT_KEY, HashTypes::ALL, 128, 4).unwrap(), table);
    let frames = (0..256u32).map(|i| frame_for(&key(if i % 2 == 0 { i } else { 1_000_000 + i }), 18)).collect();
    (nic, frames)
}

fn classify(c: &mut Criterion) {
    let mut g = c.benchmark_group("classify");
    g.throughput(Throughput::Elements(1));
    let f = frame_for(&key(7), 18);
    // The etherparse path alone, the fast path alone (a TCPv4 frame is on it), and
    // `parse_frame` (fast path first, as classify uses it).
    g.bench_function("parse_only_etherparse", |b| b.iter(|| parse_frame_slow(black_box(&f)).unwrap()));
    g.bench_function("parse_only_fast", |b| b.iter(|| parse_frame_fast(black_box(&f)).unwrap()));
    g.bench_function("parse_only", |b| b.iter(|| parse_frame(black_box(&f)).unwrap()));
    for rules in [0u32, 1024, 65536] {
        let (nic, frames) = classify_rig(rules);
        let mut n = 0usize;
        g.bench_function(format!("parse_lookup_rss_{rules}_rules"), |b| {
            b.iter(|| {
                n = (n + 1) & 255;
                nic.classify_frame(black_box(&frames[n]), 1).unwrap().1
            })
        });
    }
    g.finish();
}

/// Classify as the datapath does it (`EmulatedNic::to_guest_batch`): bursts of 32 frames,
/// one `Nic::classifier` (RSS configuration load) per burst, `Classifier::decide_frame`
/// per frame, the delivered frames counted per queue and burst (`Nic::record_delivered`).
/// Throughput is per frame.
fn classify_burst(c: &mut Criterion) {
    const BURST: usize = 32;
    let mut g = c.benchmark_group("classify_burst");
    g.throughput(Throughput::Elements(BURST as u64));
    for rules in [0u32, 1024, 65536] {
        let (nic, frames) = classify_rig(rules);
        let mut n = 0usize;
        g.bench_function(format!("decide_{rules}_rules"), |b| {
            b.iter(|| {
                let c = nic.classifier();
                let mut per_q = [(0u64, 0u64, 0u64); 4];
                for _ in 0..BURST {
                    n = (n + 1) & 255;
                    let f = black_box(&frames[n]);
                    let d = c.decide_frame(f, 1).unwrap();
                    if let Some(p) = d.queue.and_then(|q| per_q.get_mut(usize::from(q))) {
                        *p = (p.0 + 1, p.1 + f.len() as u64, p.2 + u64::from(d.filter.is_some()));
                    }
                }
                for (q, &(k, bytes, via)) in per_q.iter().enumerate() {
                    nic.record_delivered(q as u16, k, bytes, via);
                }
            })
        });
    }
    g.finish();
}

fn table_updates(c: &mut Criterion) {
    let mut g = c.benchmark_group("table");
    g.throughput(Throughput::Elements(1));
    let table = FilterTable::new(Layout::PerType, 4096);
    for i in 0..2048 {
        table.insert(i, key(i), Action::Queue(1), 0).unwrap();
    }
    let mut i = 10_000u32;
    g.bench_function("insert_plus_delete_2k_resident", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            table.insert(i, key(i % 60_000 + 3000), Action::Queue(2), 0).unwrap();
            table.delete(i).unwrap();
        })
    });
    g.finish();
}

/// What the alternatives keep per rule: the id, and the hit and byte counters the
/// table's rules count with relaxed atomics too.
struct Hit {
    id: u32,
    hits: AtomicU64,
    bytes: AtomicU64,
}

impl Hit {
    fn new(id: u32) -> Arc<Hit> {
        Arc::new(Hit { id, hits: AtomicU64::new(0), bytes: AtomicU64::new(0) })
    }

    fn count(&self, bytes: u64) -> u32 {
        self.hits.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.id
    }
}

/// The alternatives we did not take: one RwLock around a HashMap, and `dashmap` (a
/// sharded map, one shard read lock per lookup: the table's map until issue 17).
struct LockedTable(RwLock<HashMap<FlowKey, Arc<Hit>, ahash::RandomState>>);
type ShardedTable = dashmap::DashMap<FlowKey, Arc<Hit>, ahash::RandomState>;

/// Lookups of 4096 resident rules, half of them hits, bursts of 32 (the datapath's
/// unit: `FilterTable::reader` once per burst), while another thread inserts and deletes
/// in a tight loop — and the table without a writer for reference.
fn concurrent(c: &mut Criterion) {
    const BURST: usize = 32;
    let mut g = c.benchmark_group("lookup_with_concurrent_writer");
    g.throughput(Throughput::Elements(BURST as u64));
    g.measurement_time(Duration::from_secs(3));
    let n = 4096u32;
    // Keys prebuilt so the loop measures the lookup, not key construction; odd ones miss.
    let keys: Vec<FlowKey> = (0..n).map(|i| key(if i % 2 == 0 { i } else { 1_000_000 + i })).collect();
    let mask = n as usize - 1;
    // Runs `bench` while a second thread calls `churn(i)` with a new i until the bench ends.
    fn with_writer<W: Fn(u32) + Send + 'static>(churn: W, bench: impl FnOnce()) {
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let writer = std::thread::spawn(move || {
            let mut i = 100_000u32;
            while !s2.load(Ordering::Relaxed) {
                i = i.wrapping_add(1);
                churn(i);
            }
        });
        bench();
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
    }
    let table = Arc::new(FilterTable::new(Layout::Shared, 1 << 16));
    for i in 0..n {
        table.insert(i, key(i), Action::Queue(0), 0).unwrap();
    }
    let mut k = 0usize;
    g.bench_function("filter_table_no_writer", |b| {
        b.iter(|| {
            let r = table.reader();
            for _ in 0..BURST {
                k = (k + 1) & mask;
                black_box(r.lookup(black_box(&keys[k]), 64, 1));
            }
        })
    });
    let t2 = table.clone();
    let churn = move |i: u32| {
        let _ = t2.insert(i, key(i % 50_000 + 10_000), Action::Queue(1), 0);
        let _ = t2.delete(i);
    };
    with_writer(churn, || {
        g.bench_function("filter_table", |b| {
            b.iter(|| {
                let r = table.reader();
                for _ in 0..BURST {
                    k = (k + 1) & mask;
                    black_box(r.lookup(black_box(&keys[k]), 64, 1));
                }
            })
        });
    });
    let sharded: Arc<ShardedTable> = Arc::new(dashmap::DashMap::with_hasher(ahash::RandomState::new()));
    for i in 0..n {
        sharded.insert(key(i), Hit::new(i));
    }
    let t2 = sharded.clone();
    let churn = move |i: u32| {
        let kk = key(i % 50_000 + 10_000);
        t2.insert(kk, Hit::new(i));
        t2.remove(&kk);
    };
    with_writer(churn, || {
        g.bench_function("dashmap", |b| {
            b.iter(|| {
                for _ in 0..BURST {
                    k = (k + 1) & mask;
                    black_box(sharded.get(black_box(&keys[k])).map(|h| h.count(64)));
                }
            })
        });
    });
    let locked = Arc::new(LockedTable(RwLock::new(HashMap::with_hasher(ahash::RandomState::new()))));
    for i in 0..n {
        locked.0.write().unwrap().insert(key(i), Hit::new(i));
    }
    let t2 = locked.clone();
    let churn = move |i: u32| {
        let kk = key(i % 50_000 + 10_000);
        t2.0.write().unwrap().insert(kk, Hit::new(i));
        t2.0.write().unwrap().remove(&kk);
    };
    with_writer(churn, || {
        g.bench_function("single_rwlock_hashmap", |b| {
            b.iter(|| {
                for _ in 0..BURST {
                    k = (k + 1) & mask;
                    black_box(locked.0.read().unwrap().get(black_box(&keys[k])).map(|h| h.count(64)));
                }
            })
        });
    });
    g.finish();
}

fn engine(c: &mut Criterion) {
    use arfsnic::model::engine::{Command, Engine};
    use arfsnic::model::profile::Profile;
    let mut g = c.benchmark_group("engine");
    // Each iteration submits 1000 ADD + 1000 DEL.
    g.throughput(Throughput::Elements(2000));
    let p = Profile::ideal();
    g.bench_function("add_then_del_zero_latency", |b| {
        b.iter_batched_ref(
            || {
                let t = Arc::new(FilterTable::new(Layout::Shared, 1 << 16));
                (Engine::new(&p, t, 0), Vec::with_capacity(64), 0u32)
            },
            |(e, out, i)| {
                for _ in 0..1000 {
                    *i += 1;
                    e.submit(0, Command::Add { id: *i, key: key(*i), action: Action::Queue(0) }, u64::from(*i), out);
                    e.submit(0, Command::Del { id: *i }, u64::from(*i), out);
                    out.clear();
                }
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, toeplitz, classify, classify_burst, table_updates, concurrent, engine);
criterion_main!(benches);
