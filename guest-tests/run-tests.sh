#!/usr/bin/env bash
# The test suite: lint, unit/property/integration tests of the emulator.
# Run from the repository root on Debian 12 (as root when guest tests need installs).
set -euo pipefail
cd "$(dirname "$0")/.."

# each step starts with the script's elapsed time, to see where CI time goes
step() { printf '\n=== [%d s] %s\n' "$SECONDS" "$*"; }

# Disk: a clean run fills about 14 GiB (two kernel trees of 1.4 GiB, two copies of the
# patched one for the bisect and virtme-ng tests, the Debian image and
# stock kernels, cargo's release, test and fuzz builds; the debug and fuzz builds are
# removed after their step where disk is short). Fail now, not 20 minutes in with a
# half-unpacked kernel tree; what is already cached here counts as done.
need_gib=${ARFSNIC_MIN_FREE_GIB:-14}
have_kib=$(df -Pk . | awk 'NR == 2 { print $4 }')
# (du exits 1 for the directories a fresh clone does not have yet: only the total counts)
cached_kib=$( (du -skc .cache target emulator/fuzz/target 2>/dev/null || true) | awk 'END { print $1 + 0 }')
short_kib=$((need_gib * 1024 * 1024 - cached_kib - have_kib))
echo "disk: $((have_kib / 1024 / 1024)) GiB free, $((cached_kib / 1024 / 1024)) GiB already built here, a clean run needs about $need_gib GiB"
if [ "$short_kib" -gt 0 ]; then
    echo "run-tests.sh: $((have_kib / 1024)) MiB free on $(df -P . | awk 'NR == 2 { print $6 }'); free $(((short_kib + 1023) / 1024)) MiB more (or set ARFSNIC_MIN_FREE_GIB if you know better)" >&2
    exit 1
fi
# One cold build per profile: incremental state would only take disk.
export CARGO_INCREMENTAL=0

step "cargo fmt --check (rustfmt.toml)"
cargo fmt --check

step "cargo clippy (all targets, warnings are errors)"
cargo clippy --locked --all-targets -- -D warnings

step "cargo test"
cargo test --locked --workspace

# The patched kernels build in the background, one after the other, one job at nice
# 19, from the fuzz smoke on through the stock-kernel VM tests (steps that keep one core
# busy: libFuzzer, a TCG guest), so that neither build costs a step of its own. Each is
# waited for before its first use; a failed build fails the run with its output.
# Interrupted, the builds go too (build.sh removes a half-built tree). Measured: the
# Debian guest's tests with a build beside them took 708 s instead of 382 s, so nothing
# after the stock-kernel steps runs beside one.
declare -A BG_PIDS=()
bg_build() { # BASE [PID to let finish first]
    mkdir -p .cache
    # setsid: the build is its own process group, so the whole make tree can be stopped.
    setsid nice -n 19 bash -c 'while [ -n "$1" ] && kill -0 "$1" 2>/dev/null; do sleep 5; done
        exec bash guest-tests/kernel/build.sh --base "$2" --jobs 1' bg "${2:-}" "$1" > ".cache/ci-build-$1.log" 2>&1 &
    BG_PIDS[$1]=$!
    echo "the patched $1 kernel: building in the background${2:+ after the one before} (one job, nice 19; output: .cache/ci-build-$1.log)"
}
bg_wait() { # BASE
    local rc=0 t=$SECONDS
    wait "${BG_PIDS[$1]}" || rc=$?
    unset "BG_PIDS[$1]"
    echo "the patched $1 kernel's background build (waited $((SECONDS - t)) s for it):"
    cat ".cache/ci-build-$1.log"
    [ "$rc" = 0 ] || { echo "run-tests.sh: the background build of the patched $1 kernel failed (exit $rc; output above)" >&2; exit 1; }
}
bg_stop() {
    local p
    for p in "${BG_PIDS[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
}
trap bg_stop EXIT

step "provisioning: QEMU 10, kernel build tools, guest packages (guest-tests/provision.sh), then the patched kernels' builds in the background"
if [ "$(id -u)" = 0 ]; then
    bash guest-tests/provision.sh
else
    echo "not root: skipping provisioning; guest-tests/provision.sh must have run" >&2
fi
# The patch's 6.12 adaptation (its build and its llc-within run) only with
# ARFSNIC_CI_612=1: beside the steps above its build cost them about as much time as
# it takes alone, and without it a fresh clone's run fits CI's 80 minutes.
CI_612=${ARFSNIC_CI_612:-0}
bg_build 7.3
if [ "$CI_612" = 1 ]; then
    bg_build 6.12 "${BG_PIDS[7.3]}"
else
    echo "SKIPPED: the patched 6.12 kernel's build and its llc-within run (ARFSNIC_CI_612=1 runs them: +7 min on 2 cores)" >&2
fi

step "fuzz smoke: every cargo-fuzz target 60 s from its committed corpus (docs/fuzzing.md)"
bash emulator/fuzz/smoke.sh

# Nothing below uses the debug or the fuzz build. Where disk is short (a CI machine's
# disk varies), they go now: the kernel trees, the Debian image and the release build
# still need about 9 GiB.
free_gib=$(( $(df -Pk . | awk 'NR == 2 { print $4 }') / 1024 / 1024 ))
if [ "$free_gib" -lt "${ARFSNIC_PRUNE_BELOW_GIB:-12}" ]; then
    freed=$( (du -skc target/debug emulator/fuzz/target 2>/dev/null || true) | awk 'END { print int($1 / 1024) }')
    rm -rf target/debug emulator/fuzz/target
    echo "disk: $free_gib GiB free; removed the debug and fuzz builds ($freed MiB), not needed past this point"
fi

step "end-to-end: real QEMU and guest kernels"
cargo build --locked --release
step "side by side with DPDK's vhost PMD on DPDK's virtio_user frontend, short form: it runs and every arfsnic launch moves frames (guest-tests/perf/vs-dpdk.sh; the full-size numbers are docs/performance.md's)"
if [ "$(id -u)" = 0 ] || command -v dpdk-testpmd >/dev/null 2>&1; then
    bash guest-tests/perf/vs-dpdk.sh --launches 1 --seconds 1 --warmup 1
else
    echo "SKIPPED: guest-tests/perf/vs-dpdk.sh needs dpdk-testpmd (Debian's dpdk-dev); run as root to install it" >&2
fi

step "model mode at seed scale in release: demo --model and model --bench (tests/model_mode.rs)"
cargo test --locked --release --test model_mode -- --ignored --nocapture

step "HTML report in a headless browser (tests/html_report.rs)"
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-headless-shell >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium
fi
cargo test --locked --release --test html_report -- --ignored --nocapture
if [ "$(id -u)" = 0 ]; then
    step "tap device tests (root)"
    cargo test --locked --test traffic_tap -- --ignored --test-threads=1
    step "TCP link partner (smoltcp) against arfs-echo --proto tcp on a real Linux stack in a namespace, no VM (tests/traffic_tcp.rs)"
    cargo test --locked --release --test traffic_tcp -- --ignored --test-threads=1 --nocapture
else
    echo "SKIPPED: tests/traffic_tap.rs and tests/traffic_tcp.rs need root (they create tap devices); run this script as root" >&2
fi

step "stock Debian 7.3 (trixie-backports) and its trixie chroot for module builds"
bash guest-tests/kernel/debian-kernel.sh 7.3
cargo test --locked --release --test e2e --test e2e_arfs --test e2e_ethtool --test e2e_ntuple -- --ignored --test-threads=1 --nocapture

step "Krishna Kumar's rps_flow_cnt table: stock 6.12 vs stock 7.3 (docs/scenarios.md)"
cargo test --locked --release --test e2e_sweep -- --ignored --test-threads=1 --nocapture

step "the LLC-affinity patch's kernel, built in the background since the fuzz smoke: v11 as posted on 7.3 (and the adaptation on 6.12 with ARFSNIC_CI_612=1; built once and cached)"
bg_wait 7.3
[ "$CI_612" != 1 ] || bg_wait 6.12
KERNEL_ENV=$(bash guest-tests/kernel/build.sh --base 7.3)
echo "$KERNEL_ENV"

step "checkpatch --strict on the guest module (the patched kernel's scripts/checkpatch.pl)"
KDIR=$(printf '%s\n' "$KERNEL_ENV" | sed -n 's/^KDIR=//p' | tail -n1)
[ -x "$KDIR/scripts/checkpatch.pl" ] || { echo "no scripts/checkpatch.pl under KDIR=$KDIR" >&2; exit 1; }
# Warnings the module keeps are listed with their reasons in guest-tests/module/README.md;
# errors fail the suite.
CP_OUT=$(mktemp)
# Only the module's own sources (kbuild leaves generated *.mod.c next to them).
mapfile -t MOD_SRC < <(git ls-files -- 'guest-tests/module/*.c' 'guest-tests/module/*.h')
[ ${#MOD_SRC[@]} -gt 0 ] || { echo "no module sources found by git ls-files" >&2; exit 1; }
"$KDIR/scripts/checkpatch.pl" --strict --no-tree --terse -f "${MOD_SRC[@]}" | tee "$CP_OUT" || true
if grep -q ': ERROR:' "$CP_OUT"; then
    echo "checkpatch found errors in guest-tests/module" >&2
    exit 1
fi

step "KTAP and JUnit outputs read by the kernel's own KTAP parser (the patched tree's tools/testing/kunit/kunit.py)"
ARFSNIC_KDIR="$KDIR" cargo test --locked --release --test cli compare_writes_ktap_and_junit -- --nocapture

step "the Debian guest (trixie image): the module built inside it, bcc's funccount against the module's counters"
bash guest-tests/image/build-debian.sh
cargo test --locked --release --test e2e_debian -- --ignored --test-threads=1 --nocapture

step "tap mode with real TCP clients: sockperf ping-pong/under-load and iperf3 -P 64 from a namespace against the Debian guest's servers, Steer-C/s from the module (guest-tests/e2e/tap-tcp.sh)"
if [ "$(id -u)" = 0 ]; then
    bash guest-tests/e2e/tap-tcp.sh
else
    echo "SKIPPED: guest-tests/e2e/tap-tcp.sh needs root (network namespace, tap device); run this script as root" >&2
fi

step "the kernel's NIC selftests on the Debian guest: results as recorded in guest-tests/selftests/expected-patched-7.3.txt (docs/selftests.md)"
bash guest-tests/selftests/run.sh --check rss_api.py ntuple.py rss_ctx.py rss_input_xfrm.py toeplitz.py

step "fidelity: the LLC-affinity patch on the emulated NIC, v11 on 7.3 (and the adaptation on 6.12 with ARFSNIC_CI_612=1; tests/e2e_llc.rs)"
LLC_SKIP=()
if [ "$CI_612" != 1 ]; then
    echo "SKIPPED: patched_6_12_llc_within_sysctl_removes_steering (ARFSNIC_CI_612=1 runs it)" >&2
    LLC_SKIP=(--skip patched_6_12)
fi
cargo test --locked --release --test e2e_llc -- --ignored --test-threads=1 --nocapture "${LLC_SKIP[@]}"

step "TCP end to end: pooled request/response and connect-request-response-close on the patched 7.3, no filter left after the expiry (tests/e2e_tcp.rs)"
cargo test --locked --release --test e2e_tcp -- --ignored --test-threads=1 --nocapture

step "the seed's pod: 16 vCPUs, 512 pooled TCP connections, work stealing; the Steer-C drop matches the topology's within-LLC share (2 LLCs) and is >= 99 % in one LLC (tests/e2e_pod.rs)"
cargo test --locked --release --test e2e_pod -- --ignored --test-threads=1 --nocapture

step "topology matrix: 3-16 vCPUs in 1-4 LLCs, every run healthy (docs/results.md)"
cargo test --locked --release --test e2e_matrix -- --ignored --test-threads=1 --nocapture

step "arfsnic matrix: two shards and one process merge to the same table (docs/ci.md, Matrices)"
cargo test --locked --release --test e2e_shards -- --ignored --test-threads=1 --nocapture

step "demo --patch: your own series built (cached by content) and run; a stale patch named, nothing cached"
cargo test --locked --release --test e2e_demo_patch -- --ignored --test-threads=1 --nocapture

step "git bisect run with arfsnic run --bisect: a toy history on the patched 7.3 tree (docs/ci.md, git bisect)"
cargo test --locked --release --test e2e_bisect -- --ignored --test-threads=1 --nocapture

step "virtme-ng: the patched 7.3 kernel booted by vng with the NIC as an extra vhost-user netdev, arfs_virtio loaded, Steer-C > 0 (qemu/README.md, virtme-ng)"
if [ "$(id -u)" = 0 ]; then
    # virtme-ng from PyPI, pinned by guest-tests/e2e/vng.sh, in a venv in the cache
    VNG_VERSION=$(sed -n 's/^VNG_VERSION=//p' guest-tests/e2e/vng.sh)
    if [ "$(.cache/vng-venv/bin/vng --version 2>/dev/null)" != "virtme-ng $VNG_VERSION" ]; then
        dpkg -s python3-venv >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-venv
        python3 -m venv .cache/vng-venv
        .cache/vng-venv/bin/pip install -q "virtme-ng==$VNG_VERSION"
    fi
fi
cargo test --locked --release --test e2e_vng -- --ignored --test-threads=1 --nocapture
