/* SPDX-License-Identifier: GPL-2.0 */
/*
 * arfsnic in-band control protocol, version 3: the wire facts shared by the
 * guest module and the emulated device (docs/control-protocol.md).
 *
 * This header holds protocol facts only.  Each numeric constant is one line
 * "#define ARFS_<NAME> <integer literal>" (decimal or 0x hex, no expression),
 * optionally followed by a comment, so that other tools can read it.
 *
 * Every multi-byte field is big-endian.  ARFS_HDR_OFF_* are offsets from the
 * start of the 16-byte header (right after the Ethernet header); all other
 * ARFS_*_OFF_* are offsets from the start of the body, i.e. right after the
 * header, except ARFS_STATS_ENTRY_OFF_*, which are relative to one entry.
 */
#ifndef ARFS_PROTO_H
#define ARFS_PROTO_H

/* ---- framing ----------------------------------------------------------- */

#define ARFS_ETH_P			0x88B5	/* ETH_P_802_EX1 */
#define ARFS_PROTO_VERSION		4
#define ARFS_PROTO_VERSION_MIN		1	/* v1 peers: no RSS ops */

/* source MAC of every device frame: 02:a5:f1:c0:00:01 */
#define ARFS_DEVICE_MAC_0		0x02
#define ARFS_DEVICE_MAC_1		0xa5
#define ARFS_DEVICE_MAC_2		0xf1
#define ARFS_DEVICE_MAC_3		0xc0
#define ARFS_DEVICE_MAC_4		0x00
#define ARFS_DEVICE_MAC_5		0x01

/* ---- header (16 bytes) ------------------------------------------------- */

#define ARFS_HDR_LEN			16
#define ARFS_HDR_OFF_VERSION		0	/* u8 */
#define ARFS_HDR_OFF_OP			1	/* u8 */
#define ARFS_HDR_OFF_LENGTH		2	/* u16: header + body */
#define ARFS_HDR_OFF_SEQ		4	/* u32 */
#define ARFS_HDR_OFF_STATUS		8	/* u16: 0 or a positive errno */
#define ARFS_HDR_OFF_FLAGS		10	/* u16 */
#define ARFS_HDR_OFF_RESERVED		12	/* u32: 0 */

#define ARFS_FLAG_NO_REPLY		0x0001	/* set on STATS */
#define ARFS_STATUS_MAX			4095	/* larger completion status: malformed */

/* ---- op codes ---------------------------------------------------------- */

#define ARFS_OP_HELLO			0x01
#define ARFS_OP_ADD			0x02
#define ARFS_OP_MOD			0x03
#define ARFS_OP_DEL			0x04
#define ARFS_OP_FLUSH			0x05
#define ARFS_OP_STATS			0x06
#define ARFS_OP_QUERY			0x07
#define ARFS_OP_DEV_STATS		0x08	/* the device's counters */
#define ARFS_OP_RSS_GET			0x09	/* v2: the device's RSS */
#define ARFS_OP_RSS_SET			0x0a	/* v2: change the device's RSS */
#define ARFS_OP_RULE_SET		0x0b	/* v3: insert or replace a user rule */
#define ARFS_OP_RULE_DEL		0x0c	/* v3: remove a user rule, or all */
#define ARFS_OP_HASH_GET		0x0d	/* v3: the RSS hash fields */
#define ARFS_OP_HASH_SET		0x0e	/* v3: change them */
#define ARFS_OP_CTX_SET			0x0f	/* v4: create or change an RSS context */
#define ARFS_OP_CTX_DEL			0x10	/* v4: remove an RSS context */
#define ARFS_OP_COMPLETION		0x80	/* completion op = this | request op */

#define ARFS_EV_RULE_AGED		0x40
#define ARFS_EV_TABLE_FLUSHED		0x41
#define ARFS_EV_ENGINE_STATE		0x42

/* ---- request bodies ---------------------------------------------------- */

#define ARFS_HELLO_BODY_LEN		0
#define ARFS_FLUSH_BODY_LEN		0

#define ARFS_ADD_BODY_LEN		44
#define ARFS_ADD_OFF_FILTER_ID		0	/* u32 */
#define ARFS_ADD_OFF_RXQ		4	/* u16 */
#define ARFS_ADD_OFF_IP_VERSION		6	/* u8: 4 or 6 */
#define ARFS_ADD_OFF_L4_PROTO		7	/* u8: 6 (TCP) or 17 (UDP) */
#define ARFS_ADD_OFF_SRC_ADDR		8	/* 16 bytes, IPv4 in the first 4 */
#define ARFS_ADD_OFF_DST_ADDR		24	/* 16 bytes, IPv4 in the first 4 */
#define ARFS_ADD_OFF_SRC_PORT		40	/* u16 */
#define ARFS_ADD_OFF_DST_PORT		42	/* u16 */
#define ARFS_ADD_ADDR_LEN		16
#define ARFS_ADD_IP_VERSION_4		4
#define ARFS_ADD_IP_VERSION_6		6

#define ARFS_MOD_BODY_LEN		8
#define ARFS_MOD_OFF_FILTER_ID		0	/* u32 */
#define ARFS_MOD_OFF_RXQ		4	/* u16 */
#define ARFS_MOD_OFF_PAD		6	/* u16: 0 */

#define ARFS_DEL_BODY_LEN		4
#define ARFS_DEL_OFF_FILTER_ID		0	/* u32 */

#define ARFS_QUERY_BODY_LEN		4
#define ARFS_QUERY_OFF_FILTER_ID	0	/* u32 (request) */

#define ARFS_DEV_STATS_BODY_LEN		0
#define ARFS_RSS_GET_BODY_LEN		0

/* RSS_SET: this head, key_len key bytes, then indir_size u16 entries */
#define ARFS_RSS_SET_HDR_LEN		8
#define ARFS_RSS_SET_OFF_HFUNC		0	/* u8: ARFS_RSS_HFUNC_* */
#define ARFS_RSS_SET_OFF_PAD		1	/* u8: 0 */
#define ARFS_RSS_SET_OFF_KEY_LEN	2	/* u16: 0 keeps the key */
#define ARFS_RSS_SET_OFF_INDIR_SIZE	4	/* u16: 0 keeps the table */
#define ARFS_RSS_SET_OFF_PAD2		6	/* u16: 0 */
#define ARFS_RSS_SET_OFF_KEY		8
#define ARFS_RSS_KEY_MAX		64	/* bytes */
#define ARFS_RSS_INDIR_MAX		128	/* entries */
#define ARFS_RSS_INDIR_ENTRY_LEN	2	/* u16 queue index */
#define ARFS_RSS_HFUNC_NO_CHANGE	0	/* ETH_RSS_HASH_NO_CHANGE */
#define ARFS_RSS_HFUNC_TOEPLITZ		1	/* ETH_RSS_HASH_TOP */

/* CTX_SET: the context's ID, then an RSS_SET body for that context */
#define ARFS_CTX_SET_HDR_LEN		4
#define ARFS_CTX_OFF_ID			0	/* u32: 1 .. the device's limit - 1 */
#define ARFS_CTX_DEL_BODY_LEN		4	/* u32 context ID */

/*
 * RULE_SET: an ethtool ntuple rule (ethtool -N flow-type ...), a masked match
 * checked before the aRFS filters; a zero mask ignores its field.  Locations
 * are 0 .. ARFS_RULE_LOC_MAX - 1; the lowest matching location wins.
 */
#define ARFS_RULE_SET_BODY_LEN		84
#define ARFS_RULE_OFF_LOCATION		0	/* u32 */
#define ARFS_RULE_OFF_RXQ		4	/* u16: ARFS_RULE_ACTION_QUEUE only */
#define ARFS_RULE_OFF_ACTION		6	/* u8: ARFS_RULE_ACTION_* */
#define ARFS_RULE_OFF_FLAGS		7	/* u8: ARFS_RULE_FLAG_* (v4; 0 before) */
#define ARFS_RULE_OFF_IP_VERSION	8	/* u8: 4 or 6 */
#define ARFS_RULE_OFF_L4_PROTO		9	/* u8: 6 (TCP) or 17 (UDP) */
#define ARFS_RULE_OFF_CONTEXT		10	/* u16: RSS context (v4; 0 before) */
#define ARFS_RULE_OFF_SRC_ADDR		12	/* 16 bytes, IPv4 in the first 4 */
#define ARFS_RULE_OFF_SRC_MASK		28	/* 16 bytes */
#define ARFS_RULE_OFF_DST_ADDR		44	/* 16 bytes */
#define ARFS_RULE_OFF_DST_MASK		60	/* 16 bytes */
#define ARFS_RULE_OFF_SRC_PORT		76	/* u16 */
#define ARFS_RULE_OFF_SRC_PORT_MASK	78	/* u16 */
#define ARFS_RULE_OFF_DST_PORT		80	/* u16 */
#define ARFS_RULE_OFF_DST_PORT_MASK	82	/* u16 */
#define ARFS_RULE_ACTION_QUEUE		0
#define ARFS_RULE_ACTION_DROP		1	/* ethtool action -1 */
/* the context's table picks the queue, rxq is added (ethtool ... context N) */
#define ARFS_RULE_FLAG_RSS		0x01
#define ARFS_RULE_LOC_MAX		1024

#define ARFS_RULE_DEL_BODY_LEN		4
#define ARFS_RULE_DEL_OFF_LOCATION	0	/* u32, or ARFS_RULE_LOC_ALL */
#define ARFS_RULE_LOC_ALL		0xffffffff

/*
 * HASH_SET body and HASH_GET reply (after the timestamps): which header
 * fields feed the RSS hash per flow type (ethtool rx-flow-hash), as ethtool's
 * RXH_* bits, and the input transformation (ethtool's RXH_XFRM_* bits).  In
 * HASH_SET, ARFS_HASH_KEEP in a field or ARFS_HASH_XFRM_KEEP keeps it.
 */
#define ARFS_HASH_BODY_LEN		28
#define ARFS_HASH_OFF_TCP4		0	/* u32 */
#define ARFS_HASH_OFF_UDP4		4	/* u32 */
#define ARFS_HASH_OFF_IP4		8	/* u32: other IPv4 packets */
#define ARFS_HASH_OFF_TCP6		12	/* u32 */
#define ARFS_HASH_OFF_UDP6		16	/* u32 */
#define ARFS_HASH_OFF_IP6		20	/* u32: other IPv6 packets */
#define ARFS_HASH_OFF_XFRM		24	/* u8 */
#define ARFS_HASH_OFF_PAD		25	/* 3 bytes: 0 */
#define ARFS_HASH_IP_SRC		0x10	/* RXH_IP_SRC */
#define ARFS_HASH_IP_DST		0x20	/* RXH_IP_DST */
#define ARFS_HASH_L4_B_0_1		0x40	/* RXH_L4_B_0_1: source port */
#define ARFS_HASH_L4_B_2_3		0x80	/* RXH_L4_B_2_3: destination port */
#define ARFS_HASH_KEEP			0xffffffff
#define ARFS_HASH_XFRM_NONE		0
#define ARFS_HASH_XFRM_SYM_XOR		1	/* RXH_XFRM_SYM_XOR */
#define ARFS_HASH_XFRM_KEEP		0xff	/* RXH_XFRM_NO_CHANGE */

/* STATS: u16 count, u16 pad, then count entries */
#define ARFS_STATS_HDR_LEN		4
#define ARFS_STATS_OFF_COUNT		0	/* u16 */
#define ARFS_STATS_OFF_PAD		2	/* u16: 0 */
#define ARFS_STATS_ENTRY_LEN		16
#define ARFS_STATS_ENTRY_OFF_ID		0	/* u16 */
#define ARFS_STATS_ENTRY_OFF_PAD	2	/* u16 + u32: 0 */
#define ARFS_STATS_ENTRY_OFF_VALUE	8	/* u64 */

/* ---- completion bodies ------------------------------------------------- */

/* every completion body starts with three device timestamps (ns) */
#define ARFS_TS_LEN			24
#define ARFS_TS_OFF_ENQUEUE_NS		0	/* u64 */
#define ARFS_TS_OFF_START_NS		8	/* u64 */
#define ARFS_TS_OFF_FINISH_NS		16	/* u64 */

/* CAPS: after the timestamps of HELLO's completion with status 0 */
#define ARFS_CAPS_LEN			52
#define ARFS_CAPS_OFF_QUEUE_PAIRS	24	/* u16 */
#define ARFS_CAPS_OFF_LAYOUT		26	/* u16 */
#define ARFS_CAPS_OFF_CAPACITY		28	/* 4 x u32: v4/tcp v4/udp v6/tcp v6/udp */
#define ARFS_CAPS_OFF_PROFILE		44	/* ARFS_PROFILE_LEN bytes, NUL-padded */
#define ARFS_CAPS_CAPACITY_NR		4
#define ARFS_CAPS_LAYOUT_PER_TYPE	0
#define ARFS_CAPS_LAYOUT_SHARED		1
#define ARFS_PROFILE_LEN		32

/* QUERY reply: after the timestamps of QUERY's completion with status 0 */
#define ARFS_QUERY_REPLY_LEN		12
#define ARFS_QUERY_OFF_RXQ		24	/* u16 */
#define ARFS_QUERY_OFF_PAD		26	/* u16 */
#define ARFS_QUERY_OFF_HITS		28	/* u64 */

/*
 * DEV_STATS reply: after the timestamps of DEV_STATS's completion with status
 * 0: u16 count (at most ARFS_DEV_STATS_MAX_ENTRIES), u16 pad, then count
 * entries laid out as STATS entries, ids ARFS_DEV_CTR_*
 */
#define ARFS_DEV_STATS_OFF_COUNT	24	/* u16 */
#define ARFS_DEV_STATS_OFF_PAD		26	/* u16 */
#define ARFS_DEV_STATS_OFF_ENTRIES	28
#define ARFS_DEV_STATS_MAX_ENTRIES	16

/*
 * RSS_GET reply: after the timestamps of RSS_GET's completion with status 0;
 * the key from ARFS_RSS_OFF_KEY, then indir_size u16 entries
 */
#define ARFS_RSS_REPLY_HDR_LEN		8
#define ARFS_RSS_OFF_HFUNC		24	/* u8 */
#define ARFS_RSS_OFF_PAD		25	/* u8 */
#define ARFS_RSS_OFF_KEY_LEN		26	/* u16 */
#define ARFS_RSS_OFF_INDIR_SIZE		28	/* u16 */
#define ARFS_RSS_OFF_QUEUES		30	/* u16: queue pairs */
#define ARFS_RSS_OFF_KEY		32

/* ---- event bodies ------------------------------------------------------ */

#define ARFS_EV_RULE_AGED_BODY_LEN		4
#define ARFS_EV_RULE_AGED_OFF_FILTER_ID		0	/* u32 */
#define ARFS_EV_TABLE_FLUSHED_BODY_LEN		0
#define ARFS_EV_ENGINE_STATE_BODY_LEN		4
#define ARFS_EV_ENGINE_STATE_OFF_DISABLED	0	/* u16: 0 or 1 */
#define ARFS_EV_ENGINE_STATE_OFF_PAD		2	/* u16 */

/* ---- STATS counter ids ------------------------------------------------- */

#define ARFS_CTR_STEER_CALLS		1
#define ARFS_CTR_STEER_NEW		2
#define ARFS_CTR_STEER_UPDATE		3
#define ARFS_CTR_STEER_SAME		4
#define ARFS_CTR_ADDS_OK		5
#define ARFS_CTR_MODS_OK		6
#define ARFS_CTR_DELS_OK		7
#define ARFS_CTR_LOCK_ACQUIRED		8
#define ARFS_CTR_LOCK_CONTENDED		9
#define ARFS_CTR_LOCK_WAIT_NS_TOTAL	10
#define ARFS_CTR_LOCK_WAIT_NS_MAX	11
#define ARFS_CTR_RULES_NOW		12
#define ARFS_CTR_RULES_PEAK		13
#define ARFS_CTR_EXPIRE_SCANS		14
#define ARFS_CTR_EXPIRE_SCANNED		15
#define ARFS_CTR_CMD_TIMEOUTS		16
#define ARFS_CTR_STEER_EPERM		17
#define ARFS_CTR_STEER_ENOMEM		18
#define ARFS_CTR_STEER_EPROTONOSUPPORT	19
#define ARFS_CTR_HOLD_NS		20	/* a gauge: the hold_ns parameter */
#define ARFS_CTR_LOCK_HOLD_NS_TOTAL	21	/* arfs_lock held, all holders */
#define ARFS_CTR_LOCK_HOLD_NS_MAX	22
#define ARFS_CTR_WORK_RUNS		23	/* rule works run */
#define ARFS_CTR_WORK_DELAY_NS_TOTAL	24	/* steer (queue_work) to command sent */
#define ARFS_CTR_WORK_DELAY_NS_MAX	25
#define ARFS_CTR_NR			26	/* one past the last named id */

/* ---- DEV_STATS counter ids: the device's, since its last reset --------- */

#define ARFS_DEV_CTR_RX_SPOOFED_DROPPED	1	/* forged control frames from the wire */
#define ARFS_DEV_CTR_CTRL_REQUESTS	2
#define ARFS_DEV_CTR_CTRL_BAD		3
#define ARFS_DEV_CTR_FILTER_ADDS	4
#define ARFS_DEV_CTR_FILTER_MODS	5
#define ARFS_DEV_CTR_FILTER_DELS	6
#define ARFS_DEV_CTR_FILTER_REJECTS	7
#define ARFS_DEV_CTR_FILTER_RULES	8	/* a gauge */
#define ARFS_DEV_CTR_EVENTS_SENT	9
#define ARFS_DEV_CTR_RX_PACKETS		10
#define ARFS_DEV_CTR_RX_NOT_READY	11
#define ARFS_DEV_CTR_USER_RULES		12	/* a gauge: RULE_SET rules */
#define ARFS_DEV_CTR_USER_RULE_HITS	13	/* packets steered by them */
#define ARFS_DEV_CTR_NR			14	/* one past the last id */

/* command latency histogram: id ARFS_HIST_ID_BASE + bucket */
#define ARFS_HIST_BUCKETS		24
#define ARFS_HIST_ID_BASE		0x100

/* error counters: id base + errno, errno 1 .. 254; slot 255 takes >= 255 */
#define ARFS_ADD_ERR_ID_BASE		0x200
#define ARFS_MOD_ERR_ID_BASE		0x300
#define ARFS_DEL_ERR_ID_BASE		0x400
#define ARFS_ERR_SLOTS			256

#endif /* ARFS_PROTO_H */
