//! Memory under flow churn (issue 16, item 5): 1 M distinct flows through classify and the
//! command engine (see churn_driver.rs); prints VmRSS, live rules and the engine's queue
//! every 100 k flows and the growth after the first table fill. Run:
//! `cargo bench --bench churn` (docs/security.md has the numbers).

#[path = "churn_driver.rs"]
mod churn_driver;

fn main() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let p = churn_driver::profile(&root);
    let flows: u64 = std::env::var("CHURN_FLOWS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    for (what, step) in
        [("healthy", churn_driver::HEALTHY_STEP_NS), ("overloaded engine", churn_driver::OVERLOAD_STEP_NS)]
    {
        let t = std::time::Instant::now();
        let samples = churn_driver::churn(&p, flows, 100_000.min(flows), step);
        let secs = t.elapsed().as_secs_f64();
        println!("\n{what}: a new flow every {} us of device time", step / 1000);
        println!("{:>9} {:>7} {:>8} {:>10} {:>13}", "flows", "rules", "pending", "VmRSS kB", "adds rejected");
        for s in &samples {
            println!("{:>9} {:>7} {:>8} {:>10} {:>13}", s.flows, s.rules, s.pending, s.vm_rss_kb, s.adds_rejected);
        }
        let first = samples.first().map_or(0, |s| s.vm_rss_kb);
        let last = samples.last().map_or(0, |s| s.vm_rss_kb);
        println!(
            "capacity {} rules, queue depth {}; VmRSS {first} kB after the first {} flows -> {last} kB after {flows} ({:+} kB); {:.0} ns per flow",
            p.filter.capacity,
            p.engine.queue_depth,
            samples.first().map_or(0, |s| s.flows),
            last as i64 - first as i64,
            secs * 1e9 / flows as f64
        );
    }
}
