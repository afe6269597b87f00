//! The patch the 7.3 kernel is built with is v11 exactly as posted
//! (guest-tests/kernel/patches/7.3/): with the `index` lines and the `@@` line numbers
//! stripped, its file headers and its `+`, `-` and context lines are byte-identical to
//! the diff in the posting ("[PATCH net-next v11] net: reduce ARFS flow updates by
//! checking LLC affinity"). The posting's normalized diff is recorded as a SHA-256 below;
//! where the posting itself is at hand (`ARFSNIC_SEEDS=DIR`, or `../shared/seeds/` next to
//! the repository) the two are also compared line by line.

mod common;

use sha2::{Digest, Sha256};
use std::path::PathBuf;

/// SHA-256 of the normalized diff of the v11 posting (see `normalized`).
const POSTED_V11_DIFF_SHA256: &str = "b4d937d0e6760ff092a9fe5fd495d6d17a9503fca8985f6b4dde576e41033c78";
const SEED_FILE: &str = "llc-affinity-patch-v11-and-review.txt";

/// The diff part of a patch or mail: from the first `diff --git` to the signature
/// separator (`-- `), without `index` lines, each `@@ -a,b +c,d @@ context` reduced to
/// `@@`. What is left is what `patch` matches and changes.
fn normalized(text: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with("diff --git ") {
            inside = true;
        }
        if !inside {
            continue;
        }
        if line == "-- " {
            break;
        }
        if line.starts_with("index ") {
            continue;
        }
        if line.starts_with("@@ ") {
            out.push_str("@@\n");
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn sha256_hex(s: &str) -> String {
    Sha256::digest(s.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

fn patch_7_3() -> String {
    let dir = common::root().join("guest-tests/kernel/patches/7.3");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "patch"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 1, "patches/7.3 holds exactly the posted v11: {files:?}");
    std::fs::read_to_string(&files[0]).unwrap()
}

#[test]
fn the_7_3_patch_is_v11_as_posted() {
    let ours = normalized(&patch_7_3());
    assert!(ours.contains("+struct static_key_false arfs_llc_affinity __read_mostly;"), "{ours}");
    assert_eq!(ours.matches("diff --git ").count(), 3, "three files, as posted");
    assert_eq!(
        sha256_hex(&ours),
        POSTED_V11_DIFF_SHA256,
        "guest-tests/kernel/patches/7.3 differs from the posted v11 in its hunks:\n{ours}"
    );
    let seeds =
        std::env::var_os("ARFSNIC_SEEDS").map(PathBuf::from).unwrap_or_else(|| common::root().join("../shared/seeds"));
    match std::fs::read_to_string(seeds.join(SEED_FILE)) {
        Ok(posting) => {
            let posted = normalized(&posting);
            for (i, (a, b)) in ours.lines().zip(posted.lines()).enumerate() {
                assert_eq!(a, b, "line {} of the normalized diff", i + 1);
            }
            assert_eq!(ours, posted);
            println!("compared line by line with {}", seeds.join(SEED_FILE).display());
        }
        Err(_) => println!(
            "SKIP (line by line): {} not found (set ARFSNIC_SEEDS); compared with the recorded digest only",
            seeds.join(SEED_FILE).display()
        ),
    }
}

/// The normalization keeps every changed and context line and nothing else.
#[test]
fn normalization_drops_only_offsets_and_index_lines() {
    let a = "From x\nSubject: y\n\ndiff --git a/f b/f\nindex 1..2 100644\n--- a/f\n+++ b/f\n@@ -10,3 +10,4 @@ int f(void)\n ctx\n-old\n+new\n+more\n-- \n2.47.3\n";
    let b =
        a.replace("@@ -10,3 +10,4 @@ int f(void)", "@@ -45,3 +45,4 @@ int g(void)").replace("index 1..2", "index 3..4");
    assert_eq!(normalized(a), normalized(&b));
    assert_eq!(normalized(a), "diff --git a/f b/f\n--- a/f\n+++ b/f\n@@\n ctx\n-old\n+new\n+more\n");
    assert_ne!(normalized(a), normalized(&a.replace("+new", "+New")));
    assert_ne!(normalized(a), normalized(&a.replace(" ctx", " ctx ")));
}
