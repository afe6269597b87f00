//! A matrix run in two shards and in one process (`arfsnic matrix --shard`), joined with
//! `arfsnic compare --merge`: the merged tables have the same cells and runs in the same
//! order (the numbers come from different runs). Ignored by a plain `cargo test`;
//! `guest-tests/run-tests.sh` runs it with `--ignored`.

mod common;

use common::root;
use std::path::Path;
use std::process::Command;

fn arfsnic(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_arfsnic")).args(args).current_dir(root()).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "arfsnic {args:?}:\n{out}\n{}", String::from_utf8_lossy(&o.stderr));
    out
}

/// The merged table's scenario column (`SCENARIO@KERNEL@PROFILE`) and health, in order.
fn rows(table: &str) -> Vec<String> {
    table
        .lines()
        .skip(2)
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            format!("{} {}", w[0], w[w.len() - 1])
        })
        .collect()
}

#[test]
#[ignore = "needs QEMU 10 and the stock 6.12 and 7.3 kernels: run through guest-tests/run-tests.sh"]
fn two_shards_merge_to_the_one_process_table() {
    let dir = root().join(".cache/e2e/shards");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let m = dir.join("matrix.toml");
    std::fs::write(
        &m,
        "kernels = [\"debian-6.12\", \"debian-7.3\"]\nscenarios = [\"smoke\"]\nprofiles = [\"mlx5-cx6\"]\n",
    )
    .unwrap();
    let m = m.to_str().unwrap();
    let list = arfsnic(&["matrix", "--matrix", m, "--list"]);
    assert_eq!(list, "1/2 debian-6.12 smoke mlx5-cx6\n2/2 debian-7.3 smoke mlx5-cx6\n");
    let d = |s: &str| dir.join(s).to_str().unwrap().to_string();
    for shard in ["1/2", "2/2"] {
        arfsnic(&["matrix", "--matrix", m, "--quiet", "--shard", shard, "--out", &d("sharded")]);
    }
    arfsnic(&["matrix", "--matrix", m, "--quiet", "--shard", "1/1", "--out", &d("one")]);
    let sharded = arfsnic(&["compare", "--merge", &d("sharded"), "--out", &d("merged")]);
    let one = arfsnic(&["compare", "--merge", &d("one")]);
    println!("{sharded}");
    assert_eq!(rows(&sharded), rows(&one), "sharded:\n{sharded}\none process:\n{one}");
    assert_eq!(rows(&sharded), ["smoke@debian-6.12@mlx5-cx6 ok", "smoke@debian-7.3@mlx5-cx6 ok"]);
    let csv = std::fs::read_to_string(dir.join("merged/results.csv")).unwrap();
    assert!(csv.lines().nth(1).unwrap().starts_with("smoke@debian-6.12@mlx5-cx6,default,"), "{csv}");
    for f in ["results.json", "results.csv", "steer-rate.svg"] {
        assert!(Path::new(&d("merged")).join(f).is_file(), "no {f}");
    }
    // The same cell twice is refused, naming both files.
    let o = Command::new(env!("CARGO_BIN_EXE_arfsnic"))
        .args(["compare", "--merge", &d("sharded"), &d("one")])
        .current_dir(root())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("are the same cell"), "{err}");
}
