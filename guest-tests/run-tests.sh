#!/usr/bin/env bash
# The test suite: lint, unit/property/integration tests of the emulator.
# Run from the repository root on Debian 12 (as root when guest tests need installs).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n=== %s\n' "$*"; }

step "cargo clippy (all targets, warnings are errors)"
cargo clippy --locked --all-targets -- -D warnings

step "cargo test"
cargo test --locked --workspace

step "end-to-end: real QEMU and guest kernels"
if [ "$(id -u)" = 0 ]; then
    bash guest-tests/provision.sh
else
    echo "not root: skipping provisioning; guest-tests/provision.sh must have run" >&2
fi
cargo build --locked --release
cargo test --locked --release --test e2e --test e2e_arfs -- --ignored --test-threads=1 --nocapture

step "fidelity: the LLC-affinity patch on the emulated NIC (patched 6.12, built once and cached)"
bash guest-tests/kernel/build.sh
cargo test --locked --release --test e2e_llc -- --ignored --test-threads=1 --nocapture
