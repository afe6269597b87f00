#!/bin/bash
# arfsnic's datapath side by side with DPDK's vhost PMD, both serving DPDK's virtio_user PMD
# (docs/performance.md, "Side by side with DPDK"). A benchmark: run it on a quiet machine.
#
#   guest-tests/perf/vs-dpdk.sh                       # 7 launches per cell, table on stdout
#   guest-tests/perf/vs-dpdk.sh --json docs/bench/vs-dpdk.json --update-doc docs/performance.md
#   guest-tests/perf/vs-dpdk.sh --launches 1 --seconds 1 --warmup 1   # does it work (CI)
#
# Installs Debian's dpdk-dev (it holds dpdk-testpmd) when missing and we are root; builds
# arfsnic in release mode. Other options: guest-tests/perf/vs_dpdk.py --help.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

if ! command -v dpdk-testpmd >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "vs-dpdk: installing dpdk-dev (dpdk-testpmd)" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q dpdk-dev >/dev/null
    else
        echo "vs-dpdk: dpdk-testpmd missing: install Debian's dpdk-dev (apt-get install dpdk-dev) and rerun" >&2
        exit 1
    fi
fi
for t in taskset python3; do
    command -v "$t" >/dev/null || { echo "vs-dpdk: $t missing (util-linux / python3)" >&2; exit 1; }
done
if [ "$(nproc)" -lt 2 ]; then
    echo "vs-dpdk: needs 2 CPUs (one forwarding core per side), this machine has $(nproc)" >&2
    exit 1
fi
cargo build --release -q -p arfsnic
exec python3 guest-tests/perf/vs_dpdk.py --arfsnic target/release/arfsnic "$@"
