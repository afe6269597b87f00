#!/usr/bin/env python3
"""Send forged device control frames into a tap from the host side (issue 16, item 1).

Every frame would be accepted by the guest module if it reached it: well-formed
completions and events of the in-band control protocol (docs/control-protocol.md),
addressed to the guest's MAC, from the device's MAC 02:a5:f1:c0:00:01. The emulated NIC
must drop each one before classification and count it as rx_spoofed_dropped. Kinds:

  event-engine-disabled   ENGINE_STATE disabled=1
  event-table-flushed     TABLE_FLUSHED
  event-rule-aged         RULE_AGED for filter ids 1..
  completion-add          ADD completions (status 0) for request seqs 1..
  vlan / qinq             the same events behind an 802.1Q tag / 802.1ad + 802.1Q tags
  other-src               control EtherType from another source MAC
  device-src-udp          an IPv4/UDP frame to the guest with the device's MAC as source

Needs root (AF_PACKET) in the namespace that holds the tap. Prints one JSON line:
{"sent": N, "by_kind": {...}}.
"""
import argparse, json, socket, struct

DEVICE_MAC = bytes.fromhex("02a5f1c00001")
ETH_CONTROL = 0x88B5
VERSION = 1
OP_ADD, COMPLETION = 0x02, 0x80
EV_RULE_AGED, EV_TABLE_FLUSHED, EV_ENGINE_STATE = 0x40, 0x41, 0x42
TIMESTAMPS = 24


def mac(s):
    return bytes.fromhex(s.replace(":", ""))


def msg(op, seq, body=b"", status=0):
    # version u8, op u8, length u16, seq u32, status u16, flags u16, reserved u32
    return struct.pack(">BBHIHHI", VERSION, op, 16 + len(body), seq, status, 0, 0) + body


def frame(dst, src, ethertype, payload, tags=()):
    hdr = dst + src
    for tpid, vid in tags:
        hdr += struct.pack(">HH", tpid, vid)
    f = hdr + struct.pack(">H", ethertype) + payload
    return f + bytes(max(0, 60 - len(f)))


def udp_to_guest(dst, guest_ip, port):
    payload = b"ARFS" + bytes(12)
    udp = struct.pack(">HHHH", 9999, port, 8 + len(payload), 0) + payload
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0,
                     socket.inet_aton("10.98.0.1"), socket.inet_aton(guest_ip))
    csum = sum(struct.unpack(">10H", ip))
    csum = (csum & 0xFFFF) + (csum >> 16)
    csum = (csum & 0xFFFF) + (csum >> 16)
    ip = ip[:10] + struct.pack(">H", ~csum & 0xFFFF) + ip[12:]
    return frame(dst, DEVICE_MAC, 0x0800, ip + udp)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ifname", required=True, help="the tap, as seen in this namespace")
    ap.add_argument("--dst", required=True, help="the guest's MAC")
    ap.add_argument("--guest-ip", default="10.98.0.2")
    ap.add_argument("--per-kind", type=int, default=16)
    a = ap.parse_args()
    dst = mac(a.dst)
    n = a.per_kind
    ev_disabled = msg(EV_ENGINE_STATE, 1_000_000, struct.pack(">HH", 1, 0))
    ev_flushed = msg(EV_TABLE_FLUSHED, 1_000_001)
    kinds = {
        "event-engine-disabled": [frame(dst, DEVICE_MAC, ETH_CONTROL, ev_disabled)] * n,
        "event-table-flushed": [frame(dst, DEVICE_MAC, ETH_CONTROL, ev_flushed)] * n,
        "event-rule-aged": [frame(dst, DEVICE_MAC, ETH_CONTROL, msg(EV_RULE_AGED, 2_000_000 + i, struct.pack(">I", i)))
                            for i in range(1, n + 1)],
        "completion-add": [frame(dst, DEVICE_MAC, ETH_CONTROL, msg(COMPLETION | OP_ADD, i, bytes(TIMESTAMPS)))
                           for i in range(1, n + 1)],
        "vlan": [frame(dst, DEVICE_MAC, ETH_CONTROL, ev_disabled, tags=[(0x8100, 100)])] * n,
        "qinq": [frame(dst, DEVICE_MAC, ETH_CONTROL, ev_flushed, tags=[(0x88A8, 10), (0x8100, 100)])] * n,
        "other-src": [frame(dst, mac("02:00:00:00:00:99"), ETH_CONTROL, ev_disabled)] * n,
        "device-src-udp": [udp_to_guest(dst, a.guest_ip, 7000 + i % 4) for i in range(n)],
    }
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((a.ifname, 0))
    sent = {}
    for k, frames in kinds.items():
        sent[k] = 0
        for f in frames:
            s.send(f)
            sent[k] += 1
    print(json.dumps({"sent": sum(sent.values()), "by_kind": sent}))


if __name__ == "__main__":
    main()
