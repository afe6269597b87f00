//! virtme-ng end to end: guest-tests/e2e/vng.sh boots the patched 7.3 kernel (a
//! vng-bootable copy of guest-tests/kernel/build.sh's tree, made by
//! guest-tests/e2e/vng-kernel.sh and cached) through `vng --run` with the arfsnic NIC as
//! an extra vhost-user netdev, loads arfs_virtio built against that tree, sends UDP flows
//! from a network namespace while the guest's workers hop CPUs, and must see the driver's
//! `ndo_rx_flow_steer` calls (Steer-C > 0). Ignored by a plain `cargo test`;
//! `guest-tests/run-tests.sh` runs it with `--ignored` (2-core host, TCG: the tree copy and
//! its incremental build 76 s once, then 27 s). Prints SKIPPED and passes when not root or
//! when vng is missing (install: qemu/README.md, "virtme-ng").

mod common;

use common::root;
use std::path::PathBuf;
use std::process::Command;

/// vng as vng.sh finds it: $VNG, `vng` on PATH, or the venv under .cache/.
fn find_vng() -> Option<PathBuf> {
    if let Some(v) = std::env::var_os("VNG") {
        return Some(PathBuf::from(v));
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join("vng")).find(|f| f.is_file()))
        .unwrap_or(None);
    on_path.or_else(|| Some(root().join(".cache/vng-venv/bin/vng")).filter(|f| f.is_file()))
}

#[test]
#[ignore = "builds a vng-bootable kernel tree (once, cached) and boots it under TCG: run through guest-tests/run-tests.sh"]
fn vng_boots_the_patched_kernel_with_the_nic_and_the_driver_steers() {
    if !nix_is_root() {
        println!("SKIPPED: e2e_vng needs root (network namespace and tap device)");
        return;
    }
    let Some(vng) = find_vng() else {
        println!(
            "SKIPPED: e2e_vng: vng not found (python3 -m venv .cache/vng-venv && .cache/vng-venv/bin/pip install virtme-ng==1.42)"
        );
        return;
    };

    let o = Command::new("bash")
        .arg(root().join("guest-tests/e2e/vng-kernel.sh"))
        .args(["--base", "7.3"])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(o.status.success(), "vng-kernel.sh failed:\n{}", String::from_utf8_lossy(&o.stderr));
    let env = String::from_utf8_lossy(&o.stdout).to_string();
    let get =
        |k: &str| env.lines().find_map(|l| l.strip_prefix(k)).unwrap_or_else(|| panic!("no {k} in {env}")).to_string();
    let (kdir, kernel) = (get("KDIR="), get("KERNEL="));

    let t0 = std::time::Instant::now();
    let o = Command::new("bash")
        .arg(root().join("guest-tests/e2e/vng.sh"))
        .args(["--kdir", &kdir, "--kernel", &kernel, "--cpus", "4", "--queues", "4", "--duration", "14"])
        .env("VNG", &vng)
        .env("ARFSNIC", env!("CARGO_BIN_EXE_arfsnic"))
        .current_dir(root())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    println!("{out}\n{err}\nvng.sh took {:.0} s", t0.elapsed().as_secs_f64());
    assert!(o.status.success(), "vng.sh failed (logs in .cache/e2e/vng/)");
    assert!(out.contains("[vng] ok   arfs_virtio loaded in the guest"), "the module was not loaded");
    let steer: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("Steer-C: "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("vng.sh printed no Steer-C line");
    assert!(steer > 0, "no ndo_rx_flow_steer calls in the vng guest");
}

fn nix_is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0").unwrap_or(false)
}
