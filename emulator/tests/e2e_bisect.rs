//! `arfsnic run --bisect` under a real `git bisect run`, on a toy kernel history made from
//! the patched 7.3 tree the pipeline built (guest-tests/kernel/build.sh): the parent is v11
//! as posted (good), the next commit inverts its LLC test (a regression: hops within an
//! LLC call ndo_rx_flow_steer again), the last one only adds a file. The bisect must name
//! the regression; a tree that does not compile must be skipped (125). Ignored by a plain
//! `cargo test`; `guest-tests/run-tests.sh` runs it with `--ignored` (a 2.2 GB copy of the
//! kernel tree, two incremental kernel builds and three short runs: about 5 min).

mod common;

use common::root;
use std::path::Path;
use std::process::{Command, Output};

const SCENARIO: &str = "configs/scenarios/llc-bisect.toml";

fn sh(dir: &Path, program: &str, args: &[&str]) -> Output {
    let o = Command::new(program).args(args).current_dir(dir).output().unwrap();
    assert!(
        o.status.success(),
        "{program} {args:?} in {}:\n{}\n{}",
        dir.display(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn git(dir: &Path, args: &[&str]) -> String {
    let mut a = vec!["-c", "user.name=arfsnic tests", "-c", "user.email=tests@arfsnic.invalid"];
    a.extend_from_slice(args);
    String::from_utf8_lossy(&sh(dir, "git", &a).stdout).trim().to_string()
}

fn commit(dir: &Path, message: &str) -> String {
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", message]);
    git(dir, &["rev-parse", "HEAD"])
}

/// `arfsnic run --bisect` on the toy tree; (exit code, stderr).
fn bisect_step(tree: &Path, baseline: &Path, logdir: &Path) -> (i32, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_arfsnic"))
        .args(["run", "--quiet", "--bisect", "--scenario", SCENARIO, "--kdir"])
        .arg(tree)
        .arg("--baseline")
        .arg(baseline)
        .arg("--logdir")
        .arg(logdir)
        .current_dir(root())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    println!("{}", err.lines().filter(|l| !l.contains(" INFO ")).collect::<Vec<_>>().join("\n"));
    (o.status.code().unwrap_or(-1), err)
}

#[test]
#[ignore = "copies and builds a kernel tree, boots it three times: run through guest-tests/run-tests.sh"]
fn git_bisect_run_names_the_commit_that_brings_the_steers_back() {
    let o =
        Command::new("bash").arg(root().join("guest-tests/kernel/build.sh")).arg("--base").arg("7.3").output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let env = String::from_utf8_lossy(&o.stdout).to_string();
    let kdir = env.lines().find_map(|l| l.strip_prefix("KDIR=")).expect("build.sh prints KDIR=").to_string();

    // The copy lives on the repository's disk (a 2.2 GB tree does not belong in a tmpfs).
    let cache = root().join(".cache");
    let work = tempfile::Builder::new().prefix("bisect-toy.").tempdir_in(&cache).unwrap();
    let tree = work.path().join("linux");
    sh(work.path(), "cp", &["-a", "--reflink=auto", &kdir, tree.to_str().unwrap()]);
    // Debian's source package ignores everything at the top level ("/*" at the end of
    // .gitignore, for its packaging repository): a kernel git tree does not.
    let gi = tree.join(".gitignore");
    let text = std::fs::read_to_string(&gi).unwrap();
    let kept = text.split("\n# Debian packaging").next().unwrap();
    std::fs::write(&gi, format!("{kept}\n")).unwrap();
    git(&tree, &["init", "-q"]);
    let good = commit(&tree, "linux 7.3.4 with net: reduce ARFS flow updates by checking LLC affinity (v11)");

    let dev = tree.join("net/core/dev.c");
    let src = std::fs::read_to_string(&dev).unwrap();
    let test = "cpus_share_cache(old_cpu, next_cpu))";
    assert_eq!(src.matches(test).count(), 1, "v11's LLC test is not in net/core/dev.c");
    std::fs::write(&dev, src.replace(test, &format!("!{test}"))).unwrap();
    let bad = commit(&tree, "net: skip the steer when the CPUs do not share the LLC (inverted: the regression)");
    std::fs::write(tree.join("Documentation/arfsnic-toy.txt"), "a commit that changes nothing that runs\n").unwrap();
    let tip = commit(&tree, "Documentation: a file of the toy history");
    git(&tree, &["checkout", "-q", &good]);

    // The baseline: the pipeline's patched 7.3, the same source as the good commit.
    let logdir = root().join(".cache/e2e/bisect");
    std::fs::create_dir_all(&logdir).unwrap();
    let baseline = logdir.join("baseline.json");
    let o = Command::new(env!("CARGO_BIN_EXE_arfsnic"))
        .args(["run", "--quiet", "--scenario", SCENARIO, "--kernel", "patched-7.3", "--json"])
        .arg(&baseline)
        .arg("--logdir")
        .arg(&logdir)
        .current_dir(root())
        .output()
        .unwrap();
    assert!(o.status.success(), "baseline run:\n{}", String::from_utf8_lossy(&o.stderr));

    // The good commit on its own: exit 0.
    let (code, err) = bisect_step(&tree, &baseline, &logdir);
    assert_eq!(code, 0, "the good commit:\n{err}");
    assert!(err.contains("bisect: good (exit 0)"), "{err}");

    // git bisect run over good..tip.
    git(&tree, &["bisect", "start", &tip, &good]);
    let me = env!("CARGO_BIN_EXE_arfsnic");
    let scenario = root().join(SCENARIO);
    let o = Command::new("git")
        .args(["bisect", "run", me, "run", "--quiet", "--bisect", "--scenario"])
        .arg(&scenario)
        .arg("--kdir")
        .arg(&tree)
        .arg("--baseline")
        .arg(&baseline)
        .arg("--logdir")
        .arg(&logdir)
        .current_dir(&tree)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    println!("git bisect run:\n{out}");
    println!("{}", err.lines().filter(|l| l.contains("arfsnic: bisect")).collect::<Vec<_>>().join("\n"));
    assert!(o.status.success(), "git bisect run failed:\n{out}\n{err}");
    assert!(out.contains(&format!("{bad} is the first bad commit")), "git bisect named another commit:\n{out}\n{err}");
    assert!(err.contains("bisect: bad (exit 1)"), "{err}");
    git(&tree, &["bisect", "reset"]);

    // A commit that does not compile: skipped, and the log's last lines say why.
    let src = std::fs::read_to_string(&dev).unwrap();
    std::fs::write(&dev, format!("{src}\n#error \"arfsnic toy: this commit does not build\"\n")).unwrap();
    let (code, err) = bisect_step(&tree, &baseline, &logdir);
    assert_eq!(code, 125, "a tree that does not build:\n{err}");
    assert!(err.contains("does not build") && err.contains("arfsnic toy: this commit does not build"), "{err}");
}
