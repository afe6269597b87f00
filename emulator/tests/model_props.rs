//! Property tests of the NIC model: a reference model of the filter table checks the
//! command engine under random command streams, timings and capacities.

use arfsnic::model::engine::{Command, Completion, Engine, Op, Output};
use arfsnic::model::filter::{Action, FilterTable};
use arfsnic::model::profile::Profile;
use arfsnic::wire::{FlowKey, L4Proto};
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Clone, Debug)]
enum Step {
    Add { id: u32, flow: u16, v6: bool, tcp: bool, queue: u16 },
    Mod { id: u32, queue: u16 },
    Del { id: u32 },
    Flush,
    Wait { us: u64 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => (0u32..24, 0u16..24, any::<bool>(), any::<bool>(), 0u16..4)
            .prop_map(|(id, flow, v6, tcp, queue)| Step::Add { id, flow, v6, tcp, queue }),
        2 => (0u32..24, 0u16..4).prop_map(|(id, queue)| Step::Mod { id, queue }),
        3 => (0u32..24).prop_map(|id| Step::Del { id }),
        1 => Just(Step::Flush),
        4 => (0u64..200).prop_map(|us| Step::Wait { us }),
    ]
}

fn key(flow: u16, v6: bool, tcp: bool) -> FlowKey {
    let p = if tcp { L4Proto::Tcp } else { L4Proto::Udp };
    if v6 {
        FlowKey::v6(p, [0x20; 16], 1000 + flow, [0x30; 16], 80)
    } else {
        FlowKey::v4(p, [10, 0, 0, 1], 1000 + flow, [10, 0, 0, 2], 80)
    }
}

fn profile(layout: &str, capacity: usize, slots: usize, lat: &str) -> Profile {
    Profile::parse(&format!(
        "name = \"p\"\n[filter]\nlayout = \"{layout}\"\ncapacity = {capacity}\n[engine]\nslots = {slots}\nqueue_depth = 16\n\
         [engine.latency]\nadd = {lat}\nmod = {lat}\ndel = {lat}\nflush = {lat}\n"
    ))
    .unwrap()
}

/// Runs the steps; returns all outputs. Checks the invariants after every step.
fn run(p: &Profile, steps: &[Step], check: bool) -> Vec<Output> {
    let table = Arc::new(FilterTable::new(p.filter.layout, p.filter.capacity));
    let mut e = Engine::new(p, table.clone(), 0);
    let mut reference: HashMap<u32, (FlowKey, Action)> = HashMap::new();
    let mut all = Vec::new();
    let mut now = 0u64;
    let mut tag = 0u64;
    let mut pending: HashMap<u64, Command> = HashMap::new();
    for s in steps {
        let mut out = Vec::new();
        let cmd = match *s {
            Step::Add { id, flow, v6, tcp, queue } => {
                Some(Command::Add { id, key: key(flow, v6, tcp), action: Action::Queue(queue) })
            }
            Step::Mod { id, queue } => Some(Command::Mod { id, action: Action::Queue(queue) }),
            Step::Del { id } => Some(Command::Del { id }),
            Step::Flush => Some(Command::Flush),
            Step::Wait { us } => {
                now += us * 1000;
                e.advance(now, &mut out);
                None
            }
        };
        if let Some(c) = cmd {
            tag += 1;
            pending.insert(tag, c.clone());
            e.submit(tag, c, now, &mut out);
        }
        if check {
            // Apply completions to the reference in order; the table must then match it.
            for o in &out {
                if let Output::Completion(Completion { tag, status: 0, start_ns, finish_ns, enqueue_ns, op, .. }) = o {
                    assert!(finish_ns >= start_ns && start_ns >= enqueue_ns);
                    assert!(finish_ns - start_ns >= e.min_service_ns(*op), "latency below the service time");
                    match pending.get(tag).cloned() {
                        Some(Command::Add { id, key, action }) => {
                            reference.insert(id, (key, action));
                        }
                        Some(Command::Mod { id, action }) => {
                            if let Some(r) = reference.get_mut(&id) {
                                r.1 = action;
                            }
                        }
                        Some(Command::Del { id }) => {
                            reference.remove(&id);
                        }
                        Some(Command::Flush) => reference.clear(),
                        _ => {}
                    }
                }
            }
            assert_eq!(table.len(), reference.len(), "table and reference disagree at t={now}");
            for (id, (k, a)) in &reference {
                assert_eq!(table.lookup(k, 1, now), Some((*id, *a)), "rule {id} must be visible");
            }
            let cap = p.filter.capacity;
            for part in table.stats() {
                assert!(part.rules_now <= cap && part.rules_peak <= cap, "{part:?}");
            }
        }
        all.extend(out);
    }
    all
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Rules appear exactly at completion, stay until DEL/flush, never exceed capacity,
    /// and no command completes faster than its service time.
    #[test]
    fn table_follows_completions(
        steps in proptest::collection::vec(step(), 1..120),
        layout in prop_oneof![Just("per-type"), Just("shared")],
        capacity in 1usize..6,
        slots in 1usize..4,
        us in 0u64..80,
    ) {
        let p = profile(layout, capacity, slots, &format!("{{ dist = \"fixed\", us = {us} }}"));
        run(&p, &steps, true);
    }

    /// A rule is never visible before its ADD completes.
    #[test]
    fn nothing_visible_before_completion(flow in 0u16..100, us in 1u64..1000, probe in 0u64..1000) {
        let p = profile("shared", 8, 1, &format!("{{ dist = \"fixed\", us = {us} }}"));
        let table = Arc::new(FilterTable::new(p.filter.layout, p.filter.capacity));
        let mut e = Engine::new(&p, table.clone(), 0);
        let mut out = Vec::new();
        let k = key(flow, false, true);
        e.submit(1, Command::Add { id: 1, key: k, action: Action::Queue(1) }, 0, &mut out);
        let t = probe.min(us * 1000 - 1);
        e.advance(t, &mut out);
        prop_assert!(out.is_empty());
        prop_assert_eq!(table.lookup(&k, 1, t), None);
        e.advance(us * 1000, &mut out);
        prop_assert_eq!(table.lookup(&k, 1, us * 1000), Some((1, Action::Queue(1))));
    }

    /// Same seed, same inputs: identical outputs, including random latencies and faults.
    #[test]
    fn deterministic_under_seed(steps in proptest::collection::vec(step(), 1..80), seed in any::<u64>()) {
        let mut p = profile("per-type", 4, 2, "{ dist = \"lognormal\", median_us = 30, sigma = 0.8 }");
        p.engine.seed = seed;
        p.faults.add = Some(arfsnic::model::profile::ErrorFault { rate: 0.3, errno: "ENOSPC".into() });
        p.faults.lost_completion_rate = 0.1;
        let a = run(&p, &steps, false);
        let b = run(&p, &steps, false);
        prop_assert_eq!(a, b);
    }
}

#[test]
fn different_seeds_give_different_latencies() {
    let steps: Vec<Step> = (0..20)
        .flat_map(|i| [Step::Add { id: i, flow: i as u16, v6: false, tcp: true, queue: 0 }, Step::Wait { us: 1_000 }])
        .collect();
    let mut p = profile("shared", 64, 1, "{ dist = \"lognormal\", median_us = 30, sigma = 0.8 }");
    let a = run(&p, &steps, true);
    p.engine.seed = 99;
    let b = run(&p, &steps, true);
    assert_ne!(a, b);
    let adds = a.iter().filter(|o| matches!(o, Output::Completion(c) if c.op == Op::Add && c.status == 0)).count();
    assert_eq!(adds, 20);
}
