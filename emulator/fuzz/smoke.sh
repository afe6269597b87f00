#!/usr/bin/env bash
# CI smoke of the fuzz targets (docs/fuzzing.md): install cargo-fuzz if missing, build every
# target, run each from the committed seed corpus for FUZZ_SMOKE_SECS seconds (default 60),
# with a 512 MB RSS limit and a per-input timeout. Fails on any crash, timeout, OOM or
# panic. Without a nightly toolchain it prints SKIPPED and exits 0.
#
# The targets run at the same time (five libFuzzer processes for FUZZ_SMOKE_SECS of wall
# time), so the whole smoke fits a 2-core CI machine's budget; the build has no sanitizer
# (safe Rust: the property is "no panic", which needs none) but keeps debug assertions and
# overflow checks, and is built at opt-level 1 (below).
#
# Environment: FUZZ_SMOKE_SECS (seconds per target), FUZZ_SMOKE_TARGETS (space-separated
# subset), CARGO_INSTALL_ROOT / CARGO_TARGET_DIR as for cargo.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
secs="${FUZZ_SMOKE_SECS:-60}"
targets="${FUZZ_SMOKE_TARGETS:-frame_classify control_protocol split_ring config_toml vhost_messages}"
build_flags=(-O -a -s none)
# opt-level 1 instead of 3: the cold build (the bulk of the smoke's time on a 2-core
# machine) gets much shorter, the targets stay fast enough for a 60 s smoke.
export CARGO_PROFILE_RELEASE_OPT_LEVEL="${CARGO_PROFILE_RELEASE_OPT_LEVEL:-1}"

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "SKIPPED: fuzz smoke needs a nightly toolchain (rustup toolchain install nightly)"
    exit 0
fi

# cargo install puts binaries in $CARGO_INSTALL_ROOT/bin, else $CARGO_HOME/bin.
export PATH="${CARGO_INSTALL_ROOT:-${CARGO_HOME:-$HOME/.cargo}}/bin:$PATH"
start=$(date +%s)
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz smoke: installing cargo-fuzz"
    cargo install cargo-fuzz --locked --quiet
fi
installed=$(date +%s)

echo "fuzz smoke: building the fuzz targets"
cargo +nightly fuzz build "${build_flags[@]}"
built=$(date +%s)

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# vhost_messages makes its socket directory under TMPDIR; libFuzzer's exit skips its
# cleanup, so it goes where the trap removes it.
mkdir -p "$work/tmp"
export TMPDIR="$work/tmp"
pids=()
for t in $targets; do
    timeout=10
    [ "$t" = vhost_messages ] && timeout=30
    # A copy of the seeds: libFuzzer adds what it finds to the first corpus directory.
    mkdir -p "$work/corpus/$t" "$work/artifacts/$t"
    cp corpus/"$t"/* "$work/corpus/$t/"
    cargo +nightly fuzz run "${build_flags[@]}" "$t" "$work/corpus/$t" -- \
        -max_total_time="$secs" -rss_limit_mb=512 -timeout="$timeout" -print_final_stats=1 \
        -artifact_prefix="$work/artifacts/$t/" >"$work/$t.log" 2>&1 &
    pids+=("$!")
done

failed=0
i=0
for t in $targets; do
    if wait "${pids[$i]}"; then
        status=ok
    else
        status="FAILED (exit $?)"
    fi
    if [ -n "$(ls -A "$work/artifacts/$t")" ]; then
        status="FAILED (artifacts: $(ls "$work/artifacts/$t" | tr '\n' ' '))"
    fi
    [ "$status" = ok ] || failed=1
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t.log")
    cov=$(grep -a 'DONE' "$work/$t.log" | sed -n 's/.*\(cov: [0-9]* ft: [0-9]*\).*/\1/p' | tail -1)
    echo "fuzz smoke: $t: $status, ${execs:-?} execs in ${secs} s, ${cov:-no coverage line}"
    if [ "$status" != ok ]; then
        tail -n 60 "$work/$t.log"
        mkdir -p artifacts/"$t"
        cp "$work/artifacts/$t/"* artifacts/"$t"/ 2>/dev/null || true
    fi
    i=$((i + 1))
done
done_at=$(date +%s)
echo "fuzz smoke: install $((installed - start)) s, build $((built - installed)) s, run $((done_at - built)) s"
if [ "$failed" -ne 0 ]; then
    echo "fuzz smoke: FAILED (crashing inputs copied to emulator/fuzz/artifacts/)"
    exit 1
fi
echo "fuzz smoke: passed"
