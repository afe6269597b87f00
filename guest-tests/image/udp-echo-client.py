#!/usr/bin/env python3
"""Closed-loop UDP request/response client for arfs-echo (host side, for hand tests).

Flow i: local port LOCAL_BASE+i -> REMOTE_HOST:REMOTE_BASE+i, WINDOW requests in flight per
flow: a request unanswered for 0.5 s counts as lost and a new one takes its place (its reply,
if it comes later, is counted but sends nothing), so a loss never shrinks or grows a flow's
window. Requests follow the arfs-echo format ("ARFS", flow u32 BE, seq u32 BE, reserved).
Prints one JSON line: sent, replies, bad replies, replies/s, replies per guest CPU (the CPU
arfs-echo put into bytes 12..16), flows that got replies.
"""
import argparse, json, select, socket, struct, sys, time

ap = argparse.ArgumentParser()
ap.add_argument("--host", default="127.0.0.1")
ap.add_argument("--remote-base", type=int, required=True, help="port of flow 0 on the remote side")
ap.add_argument("--local-base", type=int, required=True, help="local port of flow 0")
ap.add_argument("--flows", type=int, default=4)
ap.add_argument("--seconds", type=float, default=5)
ap.add_argument("--window", type=int, default=4)
ap.add_argument("--payload", type=int, default=64, help="bytes per request (>= 16)")
ap.add_argument("--junk", action="store_true", help="also send one short and one bad-magic request on flow 0")
a = ap.parse_args()

pad = bytes(max(0, a.payload - 16))
socks = []
for i in range(a.flows):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", a.local_base + i))
    s.connect((a.host, a.remote_base + i))
    s.setblocking(False)
    socks.append(s)
LOST_S = 0.5  # a request unanswered this long is replaced
seq = [0] * a.flows
sent = [0] * a.flows
got = [0] * a.flows
inflight = [dict() for _ in range(a.flows)]  # seq -> send time, per flow
cpus = {}
bad = 0

def send(i):
    inflight[i][seq[i]] = time.time()
    try:
        socks[i].send(b"ARFS" + struct.pack(">III", i, seq[i], 0) + pad)
        sent[i] += 1
    except (BlockingIOError, ConnectionRefusedError):
        pass  # stays in flight: replaced once it counts as lost
    seq[i] += 1

if a.junk:
    for d in (b"xx", b"XXXX" + bytes(20)):
        try:
            socks[0].send(d)
        except OSError:
            pass
p = select.epoll()
fdmap = {}
for i, s in enumerate(socks):
    p.register(s.fileno(), select.EPOLLIN)
    fdmap[s.fileno()] = i
t0 = time.time()
end = t0 + a.seconds
for i in range(a.flows):
    for _ in range(a.window):
        send(i)
while time.time() < end:
    ev = p.poll(0.1)
    now = time.time()
    for i in range(a.flows):
        for q in [q for q, t in inflight[i].items() if now - t > LOST_S]:
            del inflight[i][q]  # lost: a new request takes its place
            send(i)
    for fd, _ in ev:
        i = fdmap[fd]
        while True:
            try:
                d = socks[i].recv(65536)
            except (BlockingIOError, ConnectionRefusedError):
                break
            if len(d) < 16 or d[:4] != b"ARFS" or struct.unpack(">I", d[4:8])[0] != i:
                bad += 1
                continue
            cpu = struct.unpack(">I", d[12:16])[0]
            cpus[cpu] = cpus.get(cpu, 0) + 1
            got[i] += 1
            if inflight[i].pop(struct.unpack(">I", d[8:12])[0], None) is not None:
                send(i)
el = time.time() - t0
print(json.dumps({"sent": sum(sent), "replies": sum(got), "bad": bad, "elapsed_s": round(el, 3),
                  "replies_per_s": round(sum(got) / el, 1),
                  "replies_per_cpu": {str(k): v for k, v in sorted(cpus.items())},
                  "flows_with_replies": sum(1 for g in got if g), "flows": a.flows,
                  "replies_per_flow": got}))
sys.exit(0 if sum(got) > 0 and bad == 0 else 1)
