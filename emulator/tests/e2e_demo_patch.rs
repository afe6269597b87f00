//! `arfsnic demo --patch`: a developer's own patch series built on Debian's 7.3 source
//! (cached by content) and run across the sysctl values they name. Ignored by a plain
//! `cargo test`; `guest-tests/run-tests.sh` runs it with `--ignored` (it builds a kernel
//! from a copy of the cached v11 build, which CI has built before: under a minute on 2
//! cores; 6-7 min without it).

mod common;

use arfsnic::report::Report;
use common::root;
use std::process::Command;

/// One line, in a file of its own: applies to any tree and changes nothing that runs.
const HARMLESS: &str = "\
From: arfsnic tests <tests@arfsnic.invalid>
Subject: [PATCH] a harmless one-line file

---
diff --git a/arfsnic-harmless.txt b/arfsnic-harmless.txt
new file mode 100644
--- /dev/null
+++ b/arfsnic-harmless.txt
@@ -0,0 +1 @@
+built by emulator/tests/e2e_demo_patch.rs
";

/// A hunk whose context is in no kernel tree.
const STALE: &str = "\
--- a/net/core/dev.c
+++ b/net/core/dev.c
@@ -1,3 +1,3 @@
 this line is not in net/core/dev.c
-nor is this one
+so the patch does not apply
 at all
";

fn key_of(text: &str) -> Option<String> {
    text.lines().find_map(|l| l.strip_prefix("KEY=")).map(str::to_string)
}

#[test]
#[ignore = "builds a kernel (under a minute from the cached v11 build, 6-7 min without) and boots it: run through guest-tests/run-tests.sh"]
fn demo_builds_and_runs_your_patch_series() {
    let dir = tempfile::tempdir().unwrap();
    let series = dir.path().join("series");
    std::fs::create_dir_all(&series).unwrap();
    let v11 = std::fs::read_dir(root().join("guest-tests/kernel/patches/7.3")).unwrap().next().unwrap().unwrap().path();
    std::fs::copy(&v11, series.join("0001-v11.patch")).unwrap();
    std::fs::write(series.join("0002-harmless.patch"), HARMLESS).unwrap();

    // The default patched-7.3 key, for comparison (cached by now: built earlier in CI).
    let o = Command::new("bash").arg(root().join("guest-tests/kernel/build.sh")).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let default_key = key_of(&String::from_utf8_lossy(&o.stdout)).expect("build.sh prints KEY=");

    let out = dir.path().join("out");
    let o = Command::new(env!("CARGO_BIN_EXE_arfsnic"))
        .args(["demo", "--quiet", "--no-provision", "--scenarios", "llc-within", "--base", "7.3"])
        .args(["--sysctl", "net.core.arfs_llc_affinity=0,1", "--patch"])
        .arg(&series)
        .arg("--out")
        .arg(&out)
        .current_dir(root())
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    println!("{stdout}\n{stderr}");
    assert!(o.status.success(), "demo --patch failed: {stderr}");
    let key = stderr
        .lines()
        .find_map(|l| l.split_once("(cache key ").map(|(_, k)| k.trim_end_matches(')').to_string()))
        .expect("the demo names the cache key of the kernel it built");
    assert_ne!(key, default_key, "a different series must give a different cache key");
    let cached = root().join(".cache/kernels").join(&key);
    assert!(cached.join("bzImage").is_file() && cached.join("kernel.env").is_file());
    // The series extends the cached v11 build: its tree is the start, only the new patch
    // is applied and built.
    let seed = format!("starting from the cached build of the first 1 patch(es) (key {default_key})");
    assert!(stderr.contains(&seed), "the series was not built from the cached v11 tree: {stderr}");
    let env = std::fs::read_to_string(cached.join("kernel.env")).unwrap();
    assert!(env.lines().any(|l| l == format!("FROM_KEY={default_key}")), "{env}");
    assert!(stderr.contains("applying 0002-harmless.patch") && !stderr.contains("applying 0001-v11.patch"), "{stderr}");
    let inputs = std::fs::read_to_string(cached.join("inputs.txt")).unwrap();
    assert_eq!(inputs.lines().filter(|l| l.starts_with("patch ")).count(), 2, "{inputs}");

    // The runs are the --sysctl values, on the kernel built from the series.
    let r = Report::load(&out.join("llc-within.json"), "report").unwrap();
    // The demo's page (report::html): the table has the run rows, the plots are inline.
    let page = std::fs::read_to_string(out.join("index.html")).expect("demo writes index.html");
    assert!(page.contains("<svg") && page.contains("llc-within"), "index.html without plots or the scenario");
    let labels: Vec<&str> = r.runs.iter().map(|x| x.label.as_str()).collect();
    assert_eq!(labels, ["arfs_llc_affinity=0", "arfs_llc_affinity=1"]);
    assert!(r.kernel_image.starts_with(&cached), "{}", r.kernel_image.display());
    let rate = |i: usize| r.runs[i].driver().and_then(|d| d.steer_calls_per_s).unwrap();
    assert!(rate(0) > 20.0 && rate(1) <= 0.05 * rate(0), "v11 in the series: {} -> {}", rate(0), rate(1));

    // A second call with the same series finds it in the cache.
    let o = Command::new("bash")
        .arg(root().join("guest-tests/kernel/build.sh"))
        .args(["--base", "7.3", "--patch"])
        .arg(&series)
        .output()
        .unwrap();
    assert_eq!(key_of(&String::from_utf8_lossy(&o.stdout)).as_deref(), Some(key.as_str()));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cached:"));

    // The entry is this test's alone (1.4 GB): gone, the next run builds it from the v11
    // tree again instead of finding it.
    std::fs::remove_dir_all(&cached).unwrap();
}

#[test]
#[ignore = "unpacks Debian's 7.3 source (about 30 s): run through guest-tests/run-tests.sh"]
fn a_patch_that_does_not_apply_is_named_and_leaves_nothing_in_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("stale.patch");
    std::fs::write(&p, STALE).unwrap();
    let o = Command::new("bash")
        .arg(root().join("guest-tests/kernel/build.sh"))
        .args(["--base", "7.3", "--patch"])
        .arg(&p)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("patch stale.patch does not apply to linux-source-7.3"), "{err}");
    let key = err.lines().find_map(|l| l.split_once("key ").and_then(|(_, k)| k.split(':').next())).unwrap();
    assert!(!root().join(".cache/kernels").join(key).exists(), "no half-built {key} left in the cache");
    assert!(root().join(".cache/kernels").join(format!("{key}.failed.log")).is_file());
}
