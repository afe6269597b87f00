#!/usr/bin/env python3
"""arfsnic's vhost-user datapath side by side with DPDK's vhost PMD, on the same frontend.

The frontend is DPDK's virtio_user PMD in testpmd (split ring, 256 entries, one queue,
one forwarding core). The backend is either DPDK's vhost PMD in a second testpmd, or
`arfsnic serve --pktgen` (docs/performance.md, "Side by side with DPDK"):

  guest-RX  DPDK vhost `txonly`          -> virtio_user `rxonly`  (Mpps: frontend Rx-pps)
            arfsnic generator (parse, filter lookup, RSS, ring + copy)
                                          -> virtio_user `rxonly`
  guest-TX  virtio_user `txonly` -> DPDK vhost `rxonly`            (Mpps: frontend Tx-pps)
            virtio_user `txonly` -> arfsnic (parse + classify + count, then dropped)

Each launch starts both processes, lets them run WARMUP + SECONDS, and takes the median of
the frontend's per-second rate over the last SECONDS. Launches alternate the two backends
(and which one goes first), so both see the same machine noise. Output: a table of Mpps
and arfsnic/DPDK ratios on stdout, the whole record as JSON, and optionally the table
written into a markdown file between `<!-- vs-dpdk:begin -->` and `<!-- vs-dpdk:end -->`.
"""

import argparse
import datetime
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

GOALS = {("rx", 64): 0.6, ("rx", 1518): 1.0, ("tx", 64): 0.6}
QSIZE = 256
BURST = 32


def eal(prefix, main_lcore):
    # Two cores: each testpmd gets both lcores with a different main lcore, so the two
    # forwarding cores differ (forwarding runs on the lcore that is not the main one).
    return ["-l", "0,1", "--main-lcore", str(main_lcore), "--no-huge", "-m", "1024", "--no-pci",
            "--file-prefix", prefix, "--log-level", "lib.eal:error"]


def testpmd_args(mode, size):
    return ["--", "--forward-mode=" + mode, "--nb-cores=1", "--txd=%d" % QSIZE, "--rxd=%d" % QSIZE,
            "--burst=%d" % BURST, "--txpkts=%d" % size, "--txonly-multi-flow", "--stats-period", "1"]


def collect(stream, lines, rates, key):
    pat = re.compile(r"%s:\s+(\d+)" % key)
    for line in stream:
        lines.append(line)
        m = pat.search(line)
        if m:
            rates.append(int(m.group(1)))


def accumulated(text, key):
    m = re.search(r"Accumulated forward statistics.*?%s:\s+(\d+)" % key, text, re.S)
    return int(m.group(1)) if m else None


def stop(p, timeout=10):
    if p.poll() is None:
        p.send_signal(signal.SIGINT)
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def wait_socket(path, proc, timeout=20):
    t = time.time()
    while time.time() - t < timeout:
        if os.path.exists(path):
            return
        if proc.poll() is not None:
            raise RuntimeError("backend exited before creating %s" % path)
        time.sleep(0.05)
    raise RuntimeError("backend did not create %s within %d s" % (path, timeout))


def launch(args, backend, direction, size, tag):
    d = tempfile.mkdtemp(prefix="vs-dpdk-")
    sock = os.path.join(d, "vhost.sock")
    stats = os.path.join(d, "stats.json")
    blog = open(os.path.join(d, "backend.log"), "w+")
    if backend == "dpdk":
        cmd = [args.testpmd] + eal("vh%s" % tag, 0) + ["--vdev", "net_vhost0,iface=%s,queues=1" % sock] + \
            testpmd_args("txonly" if direction == "rx" else "rxonly", size)
        # Without a terminal testpmd reads stdin for "enter to quit": give it a pipe that
        # stays open.
        b = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=blog, stderr=subprocess.STDOUT)
    else:
        cmd = ["taskset", "-c", "1", args.arfsnic, "serve", "--socket", sock, "--profile", args.profile,
               "--queues", "1", "--pktgen", str(size), "--stats", stats]
        if direction == "tx":
            cmd += ["--pktgen-dir", "tx"]
        b = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=blog, stderr=subprocess.STDOUT)
    f = None
    try:
        wait_socket(sock, b)
        fcmd = [args.testpmd] + eal("vu%s" % tag, 1) + \
            ["--vdev", "net_virtio_user0,path=%s,queues=1,queue_size=%d" % (sock, QSIZE)] + \
            testpmd_args("rxonly" if direction == "rx" else "txonly", size)
        f = subprocess.Popen(fcmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, bufsize=1)
        # Read the frontend's output as it comes; stop once the warm-up and the measured
        # seconds have been reported (start-up time varies from launch to launch).
        lines, rates = [], []
        want = 1 + int(args.warmup) + int(args.seconds)
        key = "Rx-pps" if direction == "rx" else "Tx-pps"
        reader = threading.Thread(target=collect, args=(f.stdout, lines, rates, key), daemon=True)
        reader.start()
        deadline = time.time() + 30 + args.warmup + args.seconds
        while len(rates) < want and time.time() < deadline and f.poll() is None:
            time.sleep(0.1)
        f.send_signal(signal.SIGINT)
        f.wait(20)
        reader.join(5)
        out = "".join(lines)
    finally:
        if f is not None and f.poll() is None:
            f.kill()
        stop(b)
    # The first reading covers the start-up; keep the last `seconds` after the warm-up.
    rates = rates[1:][int(args.warmup):][: int(args.seconds)]
    if not rates:
        blog.seek(0)
        raise RuntimeError("%s %s %d B: no %s readings from the frontend\n--- frontend:\n%s\n--- backend:\n%s"
                           % (backend, direction, size, key, out[-3000:], blog.read()[-3000:]))
    rec = {"mpps": statistics.median(rates) / 1e6, "per_second_mpps": [r / 1e6 for r in rates],
           "frontend_total": accumulated(out, "RX-packets" if direction == "rx" else "TX-packets")}
    if backend == "arfsnic":
        try:
            st = json.load(open(stats))
            pg = st.get("pktgen") or {}
            rec["arfsnic"] = {"delivered": pg.get("delivered"), "dropped": pg.get("dropped"),
                              "tx_classified": pg.get("tx_classified"), "tx_steered": pg.get("tx_steered"),
                              "tx_frames": sum(st.get("tx_frames", [])), "desc_errors": st.get("desc_errors")}
        except (OSError, ValueError) as e:
            rec["arfsnic"] = {"error": str(e)}
    blog.close()
    subprocess.run(["rm", "-rf", d])
    return rec


def summarize(values):
    """Median, spread, and whether the launches fall into two groups (the largest gap
    between sorted values is > 25 % and each side has at least two launches)."""
    v = sorted(values)
    s = {"median": statistics.median(v), "min": v[0], "max": v[-1], "n": len(v), "bimodal": None}
    if len(v) >= 4:
        gaps = [(v[i + 1] / v[i] if v[i] > 0 else 0, i) for i in range(len(v) - 1)]
        g, i = max(gaps)
        if g > 1.25 and i >= 1 and len(v) - i - 1 >= 2:
            s["bimodal"] = {"low": statistics.median(v[: i + 1]), "high": statistics.median(v[i + 1:]),
                            "low_n": i + 1, "high_n": len(v) - i - 1}
    return s


def group_ratios(c):
    """arfsnic/DPDK within each group of launches when both backends' launches fall into
    two groups (a machine whose launches run in a slow or a fast state, whichever
    backend it is: the medians could pair one backend's slow state with the other's
    fast one); None otherwise."""
    a, d = c["arfsnic"]["bimodal"], c["dpdk"]["bimodal"]
    if not a or not d or not d["low"] or not d["high"]:
        return None
    return a["low"] / d["low"], a["high"] / d["high"]


def table(res):
    lines = ["| direction | frame | DPDK vhost PMD (Mpps) | arfsnic (Mpps) | arfsnic / DPDK | goal | launches |",
             "|---|---|---|---|---|---|---|"]
    for c in res["cases"]:
        def cell(s):
            t = "**%.2f** (%.2f–%.2f)" % (s["median"], s["min"], s["max"])
            if s["bimodal"]:
                b = s["bimodal"]
                t += "; bimodal: %.2f ×%d / %.2f ×%d" % (b["low"], b["low_n"], b["high"], b["high_n"])
            return t
        goal = GOALS.get((c["direction"], c["size"]))
        g = group_ratios(c)
        if g:
            ratio = "**%.2f** slow, **%.2f** fast (medians' %.2f)" % (g[0], g[1], c["ratio"])
            worst = min(g)
        else:
            ratio, worst = "**%.2f**" % c["ratio"], c["ratio"]
        lines.append("| %s | %d B | %s | %s | %s | %s | %d + %d |" % (
            "guest-RX" if c["direction"] == "rx" else "guest-TX", c["size"], cell(c["dpdk"]), cell(c["arfsnic"]),
            ratio, ("≥ %.1f: %s" % (goal, "met" if worst >= goal else "not met")) if goal else "",
            c["dpdk"]["n"], c["arfsnic"]["n"]))
    m = res["machine"]
    lines.append("")
    lines.append("%s; %d cores, load average %s before / %s after; %s; %d launches per cell, %g s measured "
                 "after %g s warm-up each; arfsnic %s. Generated by guest-tests/perf/vs-dpdk.sh from %s." % (
                     res["date"], m["cores"], m["load_before"], m["load_after"], m["dpdk"], res["launches"],
                     res["seconds"], res["warmup"], m["arfsnic_commit"], res.get("json_name", "its JSON")))
    return "\n".join(lines)


def update_doc(path, text):
    doc = open(path).read()
    b, e = "<!-- vs-dpdk:begin -->", "<!-- vs-dpdk:end -->"
    if b not in doc or e not in doc:
        sys.exit("vs-dpdk: %s has no %s ... %s block to update" % (path, b, e))
    head, rest = doc.split(b, 1)
    _, tail = rest.split(e, 1)
    open(path, "w").write(head + b + "\n" + text + "\n" + e + tail)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arfsnic", default="target/release/arfsnic")
    ap.add_argument("--testpmd", default="dpdk-testpmd")
    ap.add_argument("--profile", default="configs/mlx5-cx6.toml")
    ap.add_argument("--launches", type=int, default=7, help="launches per backend and case (default 7)")
    ap.add_argument("--seconds", type=float, default=4, help="measured seconds per launch (default 4)")
    ap.add_argument("--warmup", type=float, default=2, help="seconds ignored at the start (default 2)")
    ap.add_argument("--sizes", default="64,1518")
    ap.add_argument("--directions", default="rx,tx")
    ap.add_argument("--json", help="write the record here")
    ap.add_argument("--from-json", help="no run: take the record from this file")
    ap.add_argument("--update-doc", help="markdown file with a <!-- vs-dpdk:begin/end --> block")
    a = ap.parse_args()

    if a.from_json:
        res = json.load(open(a.from_json))
        res["json_name"] = os.path.relpath(a.from_json)
    else:
        for p in (a.arfsnic, a.profile):
            if not os.path.exists(p):
                sys.exit("vs-dpdk: %s not found (run from the repository root after cargo build --release)" % p)
        ver = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "dpdk-dev"], capture_output=True, text=True)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        # The binary measured is built from the work tree: say when its sources differ from HEAD.
        changed = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "emulator", "Cargo.toml", "Cargo.lock"])
        if commit.stdout.strip() and changed.returncode == 1:
            commit.stdout = commit.stdout.strip() + "+changes"
        res = {"date": datetime.date.today().isoformat(), "launches": a.launches, "seconds": a.seconds,
               "warmup": a.warmup, "queue_size": QSIZE, "burst": BURST,
               "machine": {"cores": os.cpu_count(), "load_before": "%.1f" % os.getloadavg()[0],
                           "dpdk": "DPDK %s (Debian dpdk-dev)" % (ver.stdout.strip() or "?"),
                           "arfsnic_commit": commit.stdout.strip() or "?"},
               "cases": []}
        cases = [(d, int(s)) for d in a.directions.split(",") for s in a.sizes.split(",")]
        runs = {(d, s, b): [] for d, s in cases for b in ("dpdk", "arfsnic")}
        for n in range(a.launches):
            for d, s in cases:
                order = ("dpdk", "arfsnic") if n % 2 == 0 else ("arfsnic", "dpdk")
                for b in order:
                    r = launch(a, b, d, s, "%d%d" % (os.getpid(), n))
                    runs[(d, s, b)].append(r)
                    print("launch %d/%d %s %s %4d B: %.2f Mpps" % (n + 1, a.launches, b, d, s, r["mpps"]),
                          file=sys.stderr, flush=True)
        for d, s in cases:
            dp, ar = runs[(d, s, "dpdk")], runs[(d, s, "arfsnic")]
            sd, sa = summarize([r["mpps"] for r in dp]), summarize([r["mpps"] for r in ar])
            res["cases"].append({"direction": d, "size": s, "dpdk": sd, "arfsnic": sa,
                                 "ratio": sa["median"] / sd["median"] if sd["median"] else 0.0,
                                 "launches": {"dpdk": dp, "arfsnic": ar}})
        res["machine"]["load_after"] = "%.1f" % os.getloadavg()[0]
        if a.json:
            json.dump(res, open(a.json, "w"), indent=1)
            res["json_name"] = os.path.relpath(a.json)
    t = table(res)
    print(t)
    if a.update_doc:
        update_doc(a.update_doc, t)
    # Sanity: every arfsnic launch moved frames and saw no descriptor errors.
    bad = [(c["direction"], c["size"], r["arfsnic"]) for c in res["cases"] for r in c["launches"]["arfsnic"]
           if (r.get("arfsnic") or {}).get("desc_errors") or not r["mpps"] > 0]
    if bad:
        sys.exit("vs-dpdk: arfsnic launches with no frames or with descriptor errors: %s" % bad)


if __name__ == "__main__":
    main()
