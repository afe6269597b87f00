//! Bounded by configuration (issue 16, item 5; docs/security.md "Bounds"): under churn
//! of many distinct flows the filter table stays within the profile's capacity, the
//! engine's queue within its depth, and memory is flat after the first table fill.
//! The 1 M-flow version with its numbers is `cargo bench --bench churn`.

#[path = "../benches/churn_driver.rs"]
mod churn_driver;

#[test]
fn memory_is_flat_under_flow_churn() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let p = churn_driver::profile(&root);
    for step in [churn_driver::HEALTHY_STEP_NS, churn_driver::OVERLOAD_STEP_NS] {
        let samples = churn_driver::churn(&p, 200_000, 20_000, step);
        for s in &samples {
            assert!(s.rules <= p.filter.capacity, "{s:?}");
            assert!(s.pending <= p.engine.queue_depth, "{s:?}");
        }
        let last = samples.last().unwrap();
        assert_eq!(last.flows, 200_000);
        if step == churn_driver::HEALTHY_STEP_NS {
            assert_eq!(last.adds_rejected, 0, "a healthy engine keeps up: {samples:?}");
        } else {
            assert!(last.adds_rejected > 0 && last.pending == p.engine.queue_depth, "overloaded: {samples:?}");
        }
        // The table fills within the first 20 000 flows (capacity 4096): from there on
        // the process must not grow (2 MB of slack for allocator noise).
        let base = samples[0].vm_rss_kb;
        let peak = samples.iter().map(|s| s.vm_rss_kb).max().unwrap();
        assert!(peak < base + 2048, "step {step} ns: VmRSS grew from {base} kB to {peak} kB: {samples:?}");
    }
}
