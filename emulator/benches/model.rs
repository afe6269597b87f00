//! NIC model benchmarks: Toeplitz, parse, full classify, table updates, and lookups
//! under a concurrent writer (dashmap table vs a single RwLock<HashMap>).
//! Numbers: docs/performance.md.

use arfsnic::model::filter::{Action, FilterTable, Layout};
use arfsnic::model::nic::Nic;
use arfsnic::model::rss::{HashTypes, Rss, Toeplitz, MICROSOFT_KEY};
use arfsnic::wire::parse::{parse_frame_fast, parse_frame_slow};
use arfsnic::wire::{parse_frame, FlowKey, L4Proto};
use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use etherparse::PacketBuilder;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
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
        let table = Arc::new(FilterTable::new(Layout::Shared, 1 << 17));
        for i in 0..rules {
            table.insert(i, key(i), Action::Queue((i % 4) as u16), 0).unwrap();
        }
        let nic = Nic::with_parts(Rss::new(&MICROSOFT_KEY, HashTypes::ALL, 128, 4).unwrap(), table);
        // Half the frames hit a rule (when there are rules), half miss.
        let frames: Vec<Vec<u8>> =
            (0..256u32).map(|i| frame_for(&key(if i % 2 == 0 { i } else { 1_000_000 + i }), 18)).collect();
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

/// The alternative we did not take: one RwLock around a HashMap.
struct LockedTable(RwLock<HashMap<FlowKey, (u32, u16), ahash::RandomState>>);

fn concurrent(c: &mut Criterion) {
    let mut g = c.benchmark_group("lookup_with_concurrent_writer");
    g.throughput(Throughput::Elements(1));
    g.measurement_time(Duration::from_secs(3));
    let n = 4096u32;
    // Keys prebuilt so the loop measures the lookup, not key construction.
    let keys: Vec<FlowKey> = (0..n).map(key).collect();
    {
        let table = FilterTable::new(Layout::Shared, 1 << 16);
        for i in 0..n {
            table.insert(i, key(i), Action::Queue(0), 0).unwrap();
        }
        let mut k = 0usize;
        g.bench_function("filter_table_dashmap_no_writer", |b| {
            b.iter(|| {
                k = (k + 1) & (n as usize - 1);
                table.lookup(black_box(&keys[k]), 64, 1)
            })
        });
    }
    // dashmap-backed FilterTable
    {
        let table = Arc::new(FilterTable::new(Layout::Shared, 1 << 16));
        for i in 0..n {
            table.insert(i, key(i), Action::Queue(0), 0).unwrap();
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (t2, s2) = (table.clone(), stop.clone());
        let writer = std::thread::spawn(move || {
            let mut i = 100_000u32;
            while !s2.load(Ordering::Relaxed) {
                i = i.wrapping_add(1);
                let _ = t2.insert(i, key(i % 50_000 + 10_000), Action::Queue(1), 0);
                let _ = t2.delete(i);
            }
        });
        let mut k = 0usize;
        g.bench_function("filter_table_dashmap", |b| {
            b.iter(|| {
                k = (k + 1) & (n as usize - 1);
                table.lookup(black_box(&keys[k]), 64, 1)
            })
        });
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
    }
    {
        let table = Arc::new(LockedTable(RwLock::new(HashMap::with_hasher(ahash::RandomState::new()))));
        for i in 0..n {
            table.0.write().unwrap().insert(key(i), (i, 0));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (t2, s2) = (table.clone(), stop.clone());
        let writer = std::thread::spawn(move || {
            let mut i = 100_000u32;
            while !s2.load(Ordering::Relaxed) {
                i = i.wrapping_add(1);
                let kk = key(i % 50_000 + 10_000);
                t2.0.write().unwrap().insert(kk, (i, 1));
                t2.0.write().unwrap().remove(&kk);
            }
        });
        let mut k = 0usize;
        g.bench_function("single_rwlock_hashmap", |b| {
            b.iter(|| {
                k = (k + 1) & (n as usize - 1);
                table.0.read().unwrap().get(black_box(&keys[k])).copied()
            })
        });
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
    }
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

criterion_group!(benches, toeplitz, classify, table_updates, concurrent, engine);
criterion_main!(benches);
