// SPDX-License-Identifier: GPL-2.0
/*
 * arfs_virtio - accelerated RFS (ndo_rx_flow_steer) for a virtio_net
 * interface backed by the arfsnic emulated NIC.
 *
 * The stock virtio_net driver has no ndo_rx_flow_steer, so the kernel never
 * asks it to steer a flow.  This module attaches to one virtio_net netdev and
 * gives it an aRFS path with the shape of the mlx5 driver (en_arfs.c):
 *
 *  - a CPU reverse map (dev->rx_cpu_rmap) built from the per-RX-queue MSI-X
 *    interrupts, NETIF_F_NTUPLE, and a copy of the device's net_device_ops
 *    with .ndo_rx_flow_steer added;
 *  - ndo_rx_flow_steer takes arfs_lock, looks the 5-tuple up in per-type hash
 *    tables (IPv4/IPv6 x TCP/UDP, hashed by ports), and either returns the
 *    existing filter id, updates the rule's queue, or allocates a new rule,
 *    queueing the rule's work on an ordered workqueue;
 *  - the work sends ADD or MOD to the device's filter engine and waits for the
 *    completion (the device emulates firmware latency), keeps the rule in the
 *    software table when the command fails, and then expires up to a quota of
 *    idle rules (rps_may_expire_flow) with DEL.
 *
 * The device is reached through in-band control frames on EtherType 0x88B5;
 * docs/control-protocol.md in the arfsnic repository describes the format.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/kernel.h>
#include <linux/netdevice.h>
#include <linux/etherdevice.h>
#include <linux/if_ether.h>
#include <linux/skbuff.h>
#include <linux/rtnetlink.h>
#include <linux/cpu_rmap.h>
#include <linux/interrupt.h>
#include <linux/irq.h>
#include <linux/irqdesc.h>
#include <linux/irqnr.h>
#include <linux/debugfs.h>
#include <linux/seq_file.h>
#include <linux/workqueue.h>
#include <linux/completion.h>
#include <linux/hash.h>
#include <linux/ktime.h>
#include <linux/delay.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/err.h>
#include <linux/rcupdate.h>
#include <linux/pkt_sched.h>
#include <linux/ctype.h>
#include <net/flow_dissector.h>
#include <net/ipv6.h>
#include "arfs_proto.h"
/* Kbuild probes the tree for headers that moved between 6.1 and 6.12 */
#ifdef ARFS_HAVE_NET_RPS_H
#include <net/rps.h>
#endif
#ifdef ARFS_HAVE_LINUX_UNALIGNED_H
#include <linux/unaligned.h>
#else
#include <asm/unaligned.h>
#endif

#ifndef RPS_NO_FILTER
#define RPS_NO_FILTER 0xffff
#endif

#ifndef CONFIG_RFS_ACCEL
#error "arfs_virtio needs a kernel with CONFIG_RFS_ACCEL"
#endif

/* ---- module parameters ------------------------------------------------ */

#define ARFS_MAX_QUEUES	64

static char ifname[IFNAMSIZ] = "eth0";
module_param_string(ifname, ifname, sizeof(ifname), 0444);
MODULE_PARM_DESC(ifname, "virtio_net interface to attach to (default eth0)");

/* a string, not an int array, so that guest init may pass irqs= empty */
static char irqs[512];
module_param_string(irqs, irqs, sizeof(irqs), 0444);
MODULE_PARM_DESC(irqs,
		 "Linux IRQ numbers of the RX queues in queue order (comma list); empty: find the virtioN-input.Q interrupts");

static unsigned int buckets = 256;
module_param(buckets, uint, 0444);
MODULE_PARM_DESC(buckets, "hash buckets per rule table (rounded up to a power of two, default 256)");

static unsigned int expire_quota = 60;
module_param(expire_quota, uint, 0644);
MODULE_PARM_DESC(expire_quota, "rules expired per expiry pass at most (default 60)");

static unsigned int expire_interval_ms = 1000;
module_param(expire_interval_ms, uint, 0644);
MODULE_PARM_DESC(expire_interval_ms,
		 "also run an expiry pass every N ms (0: only after rule work, as mlx5; default 1000)");

static bool disabled;
module_param(disabled, bool, 0644);
MODULE_PARM_DESC(disabled, "refuse steering requests with -EPERM (also in debugfs)");

static unsigned long hold_ns;
module_param(hold_ns, ulong, 0644);
MODULE_PARM_DESC(hold_ns, "extra busy time (ns) inside arfs_lock per steer call, capped at 1 ms (default 0)");

static unsigned int cmd_timeout_ms = 2000;
module_param(cmd_timeout_ms, uint, 0644);
MODULE_PARM_DESC(cmd_timeout_ms, "command completion timeout in ms (default 2000)");

#define ARFS_HOLD_NS_MAX	1000000UL
#define ARFS_STATS_PERIOD_MS	100

/* ---- control protocol v1 (arfs_proto.h) ------------------------------- */

/* largest completion body the module keeps (timestamps + CAPS) */
#define ARFS_MAX_REPLY		(ARFS_TS_LEN + ARFS_CAPS_LEN)

/* arfs_proto.h is plain numbers: check that they fit together */
static_assert(ARFS_ETH_P == ETH_P_802_EX1);
static_assert(ARFS_STATUS_MAX == MAX_ERRNO);
static_assert(ARFS_HDR_OFF_RESERVED + 4 == ARFS_HDR_LEN);
static_assert(ARFS_ADD_OFF_DST_PORT + 2 == ARFS_ADD_BODY_LEN);
static_assert(ARFS_MOD_OFF_PAD + 2 == ARFS_MOD_BODY_LEN);
static_assert(ARFS_STATS_ENTRY_OFF_VALUE + 8 == ARFS_STATS_ENTRY_LEN);
static_assert(ARFS_CAPS_OFF_PROFILE + ARFS_PROFILE_LEN == ARFS_TS_LEN + ARFS_CAPS_LEN);
static_assert(ARFS_QUERY_OFF_HITS + 8 == ARFS_TS_LEN + ARFS_QUERY_REPLY_LEN);
static_assert(ARFS_CTR_HOLD_NS + 1 == ARFS_CTR_NR);

static const u8 arfs_device_mac[ETH_ALEN] = {
	ARFS_DEVICE_MAC_0, ARFS_DEVICE_MAC_1, ARFS_DEVICE_MAC_2,
	ARFS_DEVICE_MAC_3, ARFS_DEVICE_MAC_4, ARFS_DEVICE_MAC_5,
};

static const char * const arfs_ctr_names[ARFS_CTR_NR] = {
	[ARFS_CTR_STEER_CALLS] = "steer_calls",
	[ARFS_CTR_STEER_NEW] = "steer_new",
	[ARFS_CTR_STEER_UPDATE] = "steer_update",
	[ARFS_CTR_STEER_SAME] = "steer_same",
	[ARFS_CTR_ADDS_OK] = "adds_ok",
	[ARFS_CTR_MODS_OK] = "mods_ok",
	[ARFS_CTR_DELS_OK] = "dels_ok",
	[ARFS_CTR_LOCK_ACQUIRED] = "lock_acquired",
	[ARFS_CTR_LOCK_CONTENDED] = "lock_contended",
	[ARFS_CTR_LOCK_WAIT_NS_TOTAL] = "lock_wait_ns_total",
	[ARFS_CTR_LOCK_WAIT_NS_MAX] = "lock_wait_ns_max",
	[ARFS_CTR_RULES_NOW] = "rules_now",
	[ARFS_CTR_RULES_PEAK] = "rules_peak",
	[ARFS_CTR_EXPIRE_SCANS] = "expire_scans",
	[ARFS_CTR_EXPIRE_SCANNED] = "expire_scanned",
	[ARFS_CTR_CMD_TIMEOUTS] = "cmd_timeouts",
	[ARFS_CTR_STEER_EPERM] = "steer_eperm",
	[ARFS_CTR_STEER_ENOMEM] = "steer_enomem",
	[ARFS_CTR_STEER_EPROTONOSUPPORT] = "steer_eprotonosupport",
	[ARFS_CTR_HOLD_NS] = "hold_ns",
};

enum { E_ADD, E_MOD, E_DEL, E_NR };
static const char * const arfs_err_prefix[E_NR] = { "add_err", "mod_err", "del_err" };
static const u16 arfs_err_id_base[E_NR] = {
	ARFS_ADD_ERR_ID_BASE, ARFS_MOD_ERR_ID_BASE, ARFS_DEL_ERR_ID_BASE,
};

/* driver-only diagnostics, debugfs only */
enum {
	D_RX_FRAMES,
	D_RX_COMPLETIONS,
	D_RX_EVENTS,
	D_RX_DROP_NOT_HOST,
	D_RX_DROP_SRC,
	D_RX_DROP_SHORT,
	D_RX_DROP_VERSION,
	D_RX_DROP_LEN,
	D_RX_DROP_RESERVED,
	D_RX_DROP_OP,
	D_RX_DROP_STATUS,
	D_RX_DROP_SEQ,
	D_RX_DROP_OP_MISMATCH,
	D_RX_DROP_BODY,
	D_EV_RULE_AGED,
	D_EV_RULE_AGED_UNKNOWN,
	D_EV_TABLE_FLUSHED,
	D_EV_ENGINE_STATE,
	D_EV_LOST,
	D_TX_FRAMES,
	D_TX_ERRORS,
	D_STATS_FRAMES,
	D_STEER_EINVAL,
	D_CMD_CANCELED,
	D_NR,
};

static const char * const arfs_diag_names[D_NR] = {
	[D_RX_FRAMES] = "rx_ctrl_frames",
	[D_RX_COMPLETIONS] = "rx_completions",
	[D_RX_EVENTS] = "rx_events",
	[D_RX_DROP_NOT_HOST] = "rx_drop_not_host",
	[D_RX_DROP_SRC] = "rx_drop_src_mac",
	[D_RX_DROP_SHORT] = "rx_drop_short",
	[D_RX_DROP_VERSION] = "rx_drop_version",
	[D_RX_DROP_LEN] = "rx_drop_length",
	[D_RX_DROP_RESERVED] = "rx_drop_reserved",
	[D_RX_DROP_OP] = "rx_drop_op",
	[D_RX_DROP_STATUS] = "rx_drop_status",
	[D_RX_DROP_SEQ] = "rx_drop_seq",
	[D_RX_DROP_OP_MISMATCH] = "rx_drop_op_mismatch",
	[D_RX_DROP_BODY] = "rx_drop_body",
	[D_EV_RULE_AGED] = "ev_rule_aged",
	[D_EV_RULE_AGED_UNKNOWN] = "ev_rule_aged_unknown",
	[D_EV_TABLE_FLUSHED] = "ev_table_flushed",
	[D_EV_ENGINE_STATE] = "ev_engine_state",
	[D_EV_LOST] = "ev_lost",
	[D_TX_FRAMES] = "tx_ctrl_frames",
	[D_TX_ERRORS] = "tx_ctrl_errors",
	[D_STATS_FRAMES] = "stats_frames_sent",
	[D_STEER_EINVAL] = "steer_einval",
	[D_CMD_CANCELED] = "cmd_canceled",
};

/* ---- data structures -------------------------------------------------- */

enum arfs_type {
	ARFS_IPV4_TCP,
	ARFS_IPV4_UDP,
	ARFS_IPV6_TCP,
	ARFS_IPV6_UDP,
	ARFS_NUM_TYPES,
};

static const char * const arfs_type_names[ARFS_NUM_TYPES] = {
	"ipv4/tcp", "ipv4/udp", "ipv6/tcp", "ipv6/udp"
};

struct arfs_tuple {
	__be16 etype;
	u8 ip_proto;
	union {
		__be32 src_ipv4;
		struct in6_addr src_ipv6;
	};
	union {
		__be32 dst_ipv4;
		struct in6_addr dst_ipv6;
	};
	__be16 src_port;
	__be16 dst_port;
};

/* what the driver believes about the rule's hardware filter */
enum arfs_hw_state {
	ARFS_HW_NONE,		/* never installed, ADD failed, aged or flushed */
	ARFS_HW_INSTALLED,	/* last ADD/MOD completed with status 0 */
	ARFS_HW_UNKNOWN,	/* ADD timed out: the device may hold it */
};

struct arfs_priv;

struct arfs_rule {
	struct hlist_node hlist;	/* tuple hash, or a private list */
	struct hlist_node id_node;	/* filter id hash */
	struct work_struct arfs_work;
	struct arfs_priv *priv;
	struct arfs_tuple tuple;
	u8 type;
	u8 hw;
	u16 rxq;
	u16 hw_rxq;
	u32 flow_id;
	u32 filter_id;
	u64 hw_since_ns;
};

struct arfs_cmd {
	struct list_head node;
	struct completion done;
	u32 seq;
	u8 op;
	int status;		/* positive device errno, or negative local error */
	u64 sent_ns;
	u64 rcvd_ns;
	u16 reply_len;
	u8 reply[ARFS_MAX_REPLY];
};

struct arfs_priv {
	struct list_head node;		/* arfs_list, under RTNL */
	struct net_device *dev;
	netdevice_tracker dev_tracker;
	const struct net_device_ops *orig_ops;
	/* virtio_net's ops plus ndo_rx_flow_steer: writable by design */
	struct net_device_ops ops;
	netdev_features_t added_features;
	netdev_features_t added_hw_features;
	netdev_features_t added_wanted_features;
	bool steering;		/* ops/rmap/features installed */

	struct cpu_rmap *rmap;
	int rmap_irqs[ARFS_MAX_QUEUES];
	unsigned int nr_rmap;

	struct packet_type pt;
	bool pt_added;

	spinlock_t arfs_lock;	/* rule tables, rule state, stopping */
	struct hlist_head *tables[ARFS_NUM_TYPES];
	struct hlist_head *id_hash;
	unsigned int hash_bits;
	u32 last_filter_id;
	bool stopping;
	bool engine_disabled;

	struct workqueue_struct *wq;
	struct delayed_work expire_work;
	struct delayed_work stats_work;
	bool works_started;

	spinlock_t cmd_lock;	/* cmd_pending, cmd_closed */
	struct list_head cmd_pending;
	bool cmd_closed;
	atomic_t seq;

	u32 last_event_seq;
	bool have_event_seq;

	u16 caps_queue_pairs;
	u16 caps_layout;
	u32 caps_capacity[ARFS_CAPS_CAPACITY_NR];
	char caps_profile[ARFS_PROFILE_LEN + 1];
	bool caps_valid;

	struct dentry *dbg;

	atomic64_t ctr[ARFS_CTR_NR];
	atomic64_t hist[ARFS_HIST_BUCKETS];
	atomic64_t err[E_NR][ARFS_ERR_SLOTS];
	atomic64_t diag[D_NR];
};

/*
 * The attached instances, for module exit and the netdev notifier only; both
 * the list and arfs_exiting are changed under RTNL.  The data paths find
 * their instance without it: ndo_rx_flow_steer through the ops copy embedded
 * in struct arfs_priv, the receive handler through the embedded packet_type,
 * works through their work_struct.  An instance is freed only after its ops
 * were replaced by the original ones, its packet handler was removed (each
 * followed by an RCU grace period) and its works were cancelled, so those
 * paths may use it without a reference.
 */
static LIST_HEAD(arfs_list);
static bool arfs_exiting;

/* messages name the module and the interface, not the virtio_net driver */
#define arfs_info(dev, fmt, ...) pr_info("%s: " fmt, netdev_name(dev), ##__VA_ARGS__)
#define arfs_warn(dev, fmt, ...) pr_warn("%s: " fmt, netdev_name(dev), ##__VA_ARGS__)
#define arfs_err(dev, fmt, ...) pr_err("%s: " fmt, netdev_name(dev), ##__VA_ARGS__)

static inline void ctr_inc(struct arfs_priv *p, int id)
{
	atomic64_inc(&p->ctr[id]);
}

static inline void diag_inc(struct arfs_priv *p, int id)
{
	atomic64_inc(&p->diag[id]);
}

/* ---- instrumented arfs_lock ------------------------------------------- */

static void arfs_lock_bh(struct arfs_priv *p)
{
	u64 t0, wait;

	if (spin_trylock_bh(&p->arfs_lock)) {
		atomic64_inc(&p->ctr[ARFS_CTR_LOCK_ACQUIRED]);
		return;
	}
	t0 = ktime_get_ns();
	spin_lock_bh(&p->arfs_lock);
	wait = ktime_get_ns() - t0;
	atomic64_inc(&p->ctr[ARFS_CTR_LOCK_ACQUIRED]);
	atomic64_inc(&p->ctr[ARFS_CTR_LOCK_CONTENDED]);
	atomic64_add(wait, &p->ctr[ARFS_CTR_LOCK_WAIT_NS_TOTAL]);
	/* updated under the lock, so a plain compare-and-set is enough */
	if (wait > atomic64_read(&p->ctr[ARFS_CTR_LOCK_WAIT_NS_MAX]))
		atomic64_set(&p->ctr[ARFS_CTR_LOCK_WAIT_NS_MAX], wait);
}

static void arfs_unlock_bh(struct arfs_priv *p)
{
	spin_unlock_bh(&p->arfs_lock);
}

static void arfs_hold(void)
{
	unsigned long ns = READ_ONCE(hold_ns);
	u64 end;

	if (!ns)
		return;
	end = ktime_get_ns() + min(ns, ARFS_HOLD_NS_MAX);
	while (ktime_get_ns() < end)
		cpu_relax();
}

/* ---- control frames: transmit ----------------------------------------- */

static struct sk_buff *arfs_build_frame(struct arfs_priv *p, u8 op, u32 seq,
					u16 flags, const u8 *body,
					unsigned int body_len)
{
	struct net_device *dev = p->dev;
	unsigned int len = ARFS_HDR_LEN + body_len;
	unsigned int reserve = LL_RESERVED_SPACE(dev);
	struct sk_buff *skb;
	struct ethhdr *eth;
	u8 *h;

	skb = alloc_skb(reserve + max_t(unsigned int, ETH_HLEN + len, ETH_ZLEN),
			GFP_KERNEL);
	if (!skb)
		return NULL;
	skb_reserve(skb, reserve);
	skb_reset_mac_header(skb);
	eth = skb_put(skb, ETH_HLEN);
	eth_broadcast_addr(eth->h_dest);
	ether_addr_copy(eth->h_source, dev->dev_addr);
	eth->h_proto = htons(ARFS_ETH_P);
	skb_set_network_header(skb, ETH_HLEN);

	h = skb_put_zero(skb, len);
	h[ARFS_HDR_OFF_VERSION] = ARFS_PROTO_VERSION;
	h[ARFS_HDR_OFF_OP] = op;
	put_unaligned_be16(len, h + ARFS_HDR_OFF_LENGTH);
	put_unaligned_be32(seq, h + ARFS_HDR_OFF_SEQ);
	put_unaligned_be16(0, h + ARFS_HDR_OFF_STATUS);
	put_unaligned_be16(flags, h + ARFS_HDR_OFF_FLAGS);
	put_unaligned_be32(0, h + ARFS_HDR_OFF_RESERVED);
	if (body_len)
		memcpy(h + ARFS_HDR_LEN, body, body_len);
	if (skb->len < ETH_ZLEN)
		skb_put_zero(skb, ETH_ZLEN - skb->len);

	skb->dev = dev;
	skb->protocol = htons(ARFS_ETH_P);
	skb->priority = TC_PRIO_CONTROL;
	return skb;
}

static int arfs_xmit(struct arfs_priv *p, struct sk_buff *skb)
{
	int rc = dev_queue_xmit(skb);

	if (rc == NET_XMIT_SUCCESS || rc == NET_XMIT_CN) {
		diag_inc(p, D_TX_FRAMES);
		return 0;
	}
	diag_inc(p, D_TX_ERRORS);
	return rc < 0 ? rc : -ENOBUFS;
}

static unsigned int arfs_hist_bucket(u64 ns)
{
	u64 us = div_u64(ns, NSEC_PER_USEC);
	unsigned int b;

	if (us < 2)
		return 0;
	b = ilog2(us);
	return min_t(unsigned int, b, ARFS_HIST_BUCKETS - 1);
}

/*
 * Send one request and wait for its completion.  Returns 0, a negative
 * errno of the device's status, or a local error (-ETIMEDOUT, -ECANCELED,
 * -ESHUTDOWN, -ENOMEM, transmit errors).  @force sends even after the command
 * channel was closed for teardown (used for the final FLUSH).
 */
static int arfs_cmd_exec(struct arfs_priv *p, struct arfs_cmd *cmd, u8 op,
			 const u8 *body, unsigned int body_len, bool force)
{
	unsigned long left, timeout;
	struct sk_buff *skb;
	int rc;

	memset(cmd, 0, sizeof(*cmd));
	init_completion(&cmd->done);
	INIT_LIST_HEAD(&cmd->node);
	cmd->op = op;
	cmd->seq = (u32)atomic_inc_return(&p->seq);

	skb = arfs_build_frame(p, op, cmd->seq, 0, body, body_len);
	if (!skb)
		return -ENOMEM;

	spin_lock_bh(&p->cmd_lock);
	if (p->cmd_closed && !force) {
		spin_unlock_bh(&p->cmd_lock);
		kfree_skb(skb);
		return -ESHUTDOWN;
	}
	list_add_tail(&cmd->node, &p->cmd_pending);
	spin_unlock_bh(&p->cmd_lock);

	timeout = msecs_to_jiffies(clamp_val(READ_ONCE(cmd_timeout_ms), 1, 600000));
	cmd->sent_ns = ktime_get_ns();
	rc = arfs_xmit(p, skb);
	if (!rc) {
		left = wait_for_completion_timeout(&cmd->done, timeout);
		if (left)
			goto done;
		rc = -ETIMEDOUT;
	}

	spin_lock_bh(&p->cmd_lock);
	if (list_empty(&cmd->node)) {
		/* completed (or canceled) while we gave up: take that result */
		spin_unlock_bh(&p->cmd_lock);
		goto done;
	}
	list_del_init(&cmd->node);
	spin_unlock_bh(&p->cmd_lock);
	if (rc == -ETIMEDOUT)
		ctr_inc(p, ARFS_CTR_CMD_TIMEOUTS);
	return rc;

done:
	if (cmd->status < 0) {
		diag_inc(p, D_CMD_CANCELED);
		return cmd->status;
	}
	atomic64_inc(&p->hist[arfs_hist_bucket(cmd->rcvd_ns - cmd->sent_ns)]);
	return -cmd->status;
}

/* fail every waiting command and refuse new ones (except forced) */
static void arfs_cmd_close(struct arfs_priv *p)
{
	struct arfs_cmd *cmd, *tmp;

	spin_lock_bh(&p->cmd_lock);
	p->cmd_closed = true;
	list_for_each_entry_safe(cmd, tmp, &p->cmd_pending, node) {
		list_del_init(&cmd->node);
		cmd->status = -ECANCELED;
		complete(&cmd->done);
	}
	spin_unlock_bh(&p->cmd_lock);
}

static void arfs_count_err(struct arfs_priv *p, int kind, int rc)
{
	unsigned int e = -rc;

	if (rc == -ECANCELED || rc == -ESHUTDOWN)
		return;		/* teardown, not a device answer */
	atomic64_inc(&p->err[kind][min_t(unsigned int, e, ARFS_ERR_SLOTS - 1)]);
}

static int arfs_cmd_add(struct arfs_priv *p, u32 filter_id, u16 rxq,
			const struct arfs_tuple *t)
{
	u8 b[ARFS_ADD_BODY_LEN] = {};
	struct arfs_cmd cmd;

	put_unaligned_be32(filter_id, b + ARFS_ADD_OFF_FILTER_ID);
	put_unaligned_be16(rxq, b + ARFS_ADD_OFF_RXQ);
	b[ARFS_ADD_OFF_IP_VERSION] = t->etype == htons(ETH_P_IP) ?
				     ARFS_ADD_IP_VERSION_4 : ARFS_ADD_IP_VERSION_6;
	b[ARFS_ADD_OFF_L4_PROTO] = t->ip_proto;
	if (t->etype == htons(ETH_P_IP)) {
		memcpy(b + ARFS_ADD_OFF_SRC_ADDR, &t->src_ipv4, 4);
		memcpy(b + ARFS_ADD_OFF_DST_ADDR, &t->dst_ipv4, 4);
	} else {
		memcpy(b + ARFS_ADD_OFF_SRC_ADDR, &t->src_ipv6, ARFS_ADD_ADDR_LEN);
		memcpy(b + ARFS_ADD_OFF_DST_ADDR, &t->dst_ipv6, ARFS_ADD_ADDR_LEN);
	}
	memcpy(b + ARFS_ADD_OFF_SRC_PORT, &t->src_port, 2);
	memcpy(b + ARFS_ADD_OFF_DST_PORT, &t->dst_port, 2);
	return arfs_cmd_exec(p, &cmd, ARFS_OP_ADD, b, sizeof(b), false);
}

static int arfs_cmd_mod(struct arfs_priv *p, u32 filter_id, u16 rxq)
{
	u8 b[ARFS_MOD_BODY_LEN] = {};
	struct arfs_cmd cmd;

	put_unaligned_be32(filter_id, b + ARFS_MOD_OFF_FILTER_ID);
	put_unaligned_be16(rxq, b + ARFS_MOD_OFF_RXQ);
	return arfs_cmd_exec(p, &cmd, ARFS_OP_MOD, b, sizeof(b), false);
}

static int arfs_cmd_del(struct arfs_priv *p, u32 filter_id)
{
	u8 b[ARFS_DEL_BODY_LEN];
	struct arfs_cmd cmd;

	put_unaligned_be32(filter_id, b + ARFS_DEL_OFF_FILTER_ID);
	return arfs_cmd_exec(p, &cmd, ARFS_OP_DEL, b, sizeof(b), false);
}

/* ---- STATS push ------------------------------------------------------- */

#define ARFS_STATS_MAX_ENTRIES	90

struct arfs_stats_buf {
	u8 body[ARFS_STATS_HDR_LEN + ARFS_STATS_MAX_ENTRIES * ARFS_STATS_ENTRY_LEN];
	unsigned int count;
	unsigned int max;
};

static void arfs_stats_flush(struct arfs_priv *p, struct arfs_stats_buf *sb)
{
	struct sk_buff *skb;

	if (!sb->count)
		return;
	put_unaligned_be16(sb->count, sb->body + ARFS_STATS_OFF_COUNT);
	put_unaligned_be16(0, sb->body + ARFS_STATS_OFF_PAD);
	skb = arfs_build_frame(p, ARFS_OP_STATS, (u32)atomic_inc_return(&p->seq),
			       ARFS_FLAG_NO_REPLY, sb->body,
			       ARFS_STATS_HDR_LEN + sb->count * ARFS_STATS_ENTRY_LEN);
	if (skb && !arfs_xmit(p, skb))
		diag_inc(p, D_STATS_FRAMES);
	sb->count = 0;
}

static void arfs_stats_put(struct arfs_priv *p, struct arfs_stats_buf *sb,
			   u16 id, u64 value)
{
	u8 *e;

	if (sb->count >= sb->max)
		arfs_stats_flush(p, sb);
	e = sb->body + ARFS_STATS_HDR_LEN + sb->count * ARFS_STATS_ENTRY_LEN;
	memset(e, 0, ARFS_STATS_ENTRY_LEN);
	put_unaligned_be16(id, e + ARFS_STATS_ENTRY_OFF_ID);
	put_unaligned_be64(value, e + ARFS_STATS_ENTRY_OFF_VALUE);
	sb->count++;
}

static u64 arfs_ctr_read(struct arfs_priv *p, int id)
{
	if (id == ARFS_CTR_HOLD_NS)
		return READ_ONCE(hold_ns);
	return atomic64_read(&p->ctr[id]);
}

static void arfs_stats_work(struct work_struct *work)
{
	struct arfs_priv *p = container_of(to_delayed_work(work),
					   struct arfs_priv, stats_work);
	struct arfs_stats_buf *sb;
	unsigned int room;
	int i, k;
	u64 v;

	sb = kmalloc(sizeof(*sb), GFP_KERNEL);
	if (!sb)
		goto again;
	/* entries per frame: bounded by our buffer and by the device MTU */
	room = READ_ONCE(p->dev->mtu);
	room = room > ARFS_HDR_LEN + ARFS_STATS_HDR_LEN ?
	       (room - ARFS_HDR_LEN - ARFS_STATS_HDR_LEN) / ARFS_STATS_ENTRY_LEN : 1;
	sb->max = clamp_t(unsigned int, room, 1, ARFS_STATS_MAX_ENTRIES);
	sb->count = 0;

	for (i = 1; i < ARFS_CTR_NR; i++)
		arfs_stats_put(p, sb, i, arfs_ctr_read(p, i));
	for (i = 0; i < ARFS_HIST_BUCKETS; i++)
		arfs_stats_put(p, sb, ARFS_HIST_ID_BASE + i,
			       atomic64_read(&p->hist[i]));
	for (k = 0; k < E_NR; k++) {
		for (i = 1; i < ARFS_ERR_SLOTS; i++) {
			v = atomic64_read(&p->err[k][i]);
			if (v)
				arfs_stats_put(p, sb, arfs_err_id_base[k] + i, v);
		}
	}
	arfs_stats_flush(p, sb);
	kfree(sb);
again:
	if (!READ_ONCE(p->stopping))
		schedule_delayed_work(&p->stats_work,
				      msecs_to_jiffies(ARFS_STATS_PERIOD_MS));
}

/* ---- control frames: receive ------------------------------------------ */

static void arfs_rx_completion(struct arfs_priv *p, const u8 *buf,
			       unsigned int hlen, unsigned int copied)
{
	u8 op = buf[ARFS_HDR_OFF_OP] & ~ARFS_OP_COMPLETION;
	u32 seq = get_unaligned_be32(buf + ARFS_HDR_OFF_SEQ);
	u16 status = get_unaligned_be16(buf + ARFS_HDR_OFF_STATUS);
	unsigned int need = ARFS_HDR_LEN + ARFS_TS_LEN;
	struct arfs_cmd *cmd, *found = NULL;

	diag_inc(p, D_RX_COMPLETIONS);
	if (op < ARFS_OP_HELLO || op > ARFS_OP_QUERY || op == ARFS_OP_STATS) {
		diag_inc(p, D_RX_DROP_OP);
		return;
	}
	if (status > ARFS_STATUS_MAX) {
		diag_inc(p, D_RX_DROP_STATUS);
		return;
	}
	if (!status && op == ARFS_OP_HELLO)
		need += ARFS_CAPS_LEN;
	else if (!status && op == ARFS_OP_QUERY)
		need += ARFS_QUERY_REPLY_LEN;
	if (hlen < need || copied < need) {
		diag_inc(p, D_RX_DROP_BODY);
		return;
	}

	spin_lock_bh(&p->cmd_lock);
	list_for_each_entry(cmd, &p->cmd_pending, node) {
		if (cmd->seq == seq) {
			found = cmd;
			break;
		}
	}
	if (!found) {
		spin_unlock_bh(&p->cmd_lock);
		diag_inc(p, D_RX_DROP_SEQ);
		return;
	}
	if (found->op != op) {
		spin_unlock_bh(&p->cmd_lock);
		diag_inc(p, D_RX_DROP_OP_MISMATCH);
		return;
	}
	found->rcvd_ns = ktime_get_ns();
	found->status = status;
	found->reply_len = min_t(unsigned int, need - ARFS_HDR_LEN, ARFS_MAX_REPLY);
	memcpy(found->reply, buf + ARFS_HDR_LEN, found->reply_len);
	list_del_init(&found->node);
	/* complete under the lock: the waiter may return as soon as it sees
	 * the node unlinked
	 */
	complete(&found->done);
	spin_unlock_bh(&p->cmd_lock);
}

static void arfs_rx_event(struct arfs_priv *p, const u8 *buf,
			  unsigned int hlen)
{
	u32 seq = get_unaligned_be32(buf + ARFS_HDR_OFF_SEQ);
	const u8 *body = buf + ARFS_HDR_LEN;
	u8 op = buf[ARFS_HDR_OFF_OP];
	struct arfs_rule *rule;
	bool hit = false;
	u32 filter_id, gap;
	unsigned int need;
	u16 state;
	int t, j;

	switch (op) {
	case ARFS_EV_RULE_AGED:
		need = ARFS_EV_RULE_AGED_BODY_LEN;
		break;
	case ARFS_EV_TABLE_FLUSHED:
		need = ARFS_EV_TABLE_FLUSHED_BODY_LEN;
		break;
	case ARFS_EV_ENGINE_STATE:
		need = ARFS_EV_ENGINE_STATE_BODY_LEN;
		break;
	default:
		diag_inc(p, D_RX_DROP_OP);
		return;
	}
	if (hlen < ARFS_HDR_LEN + need) {
		diag_inc(p, D_RX_DROP_BODY);
		return;
	}
	if (op == ARFS_EV_ENGINE_STATE &&
	    get_unaligned_be16(body + ARFS_EV_ENGINE_STATE_OFF_DISABLED) > 1) {
		diag_inc(p, D_RX_DROP_BODY);
		return;
	}

	diag_inc(p, D_RX_EVENTS);
	arfs_lock_bh(p);
	/* a forward gap means lost events; anything else (device restart,
	 * reordering between RX queues) just resynchronises
	 */
	gap = seq - p->last_event_seq - 1;
	if (p->have_event_seq && gap && gap < 0x80000000U)
		atomic64_add(gap, &p->diag[D_EV_LOST]);
	p->have_event_seq = true;
	p->last_event_seq = seq;

	switch (op) {
	case ARFS_EV_RULE_AGED:
		diag_inc(p, D_EV_RULE_AGED);
		filter_id = get_unaligned_be32(body + ARFS_EV_RULE_AGED_OFF_FILTER_ID);
		hlist_for_each_entry(rule, &p->id_hash[hash_32(filter_id, p->hash_bits)],
				     id_node) {
			if (rule->filter_id == filter_id) {
				rule->hw = ARFS_HW_NONE;
				hit = true;
			}
		}
		if (!hit)
			diag_inc(p, D_EV_RULE_AGED_UNKNOWN);
		break;
	case ARFS_EV_TABLE_FLUSHED:
		diag_inc(p, D_EV_TABLE_FLUSHED);
		for (t = 0; t < ARFS_NUM_TYPES; t++)
			for (j = 0; j < (1 << p->hash_bits); j++)
				hlist_for_each_entry(rule, &p->tables[t][j], hlist)
					rule->hw = ARFS_HW_NONE;
		break;
	case ARFS_EV_ENGINE_STATE:
		diag_inc(p, D_EV_ENGINE_STATE);
		state = get_unaligned_be16(body + ARFS_EV_ENGINE_STATE_OFF_DISABLED);
		if (p->engine_disabled != !!state)
			arfs_info(p->dev, "device filter engine %s\n",
				  state ? "disabled" : "enabled");
		p->engine_disabled = !!state;
		break;
	}
	arfs_unlock_bh(p);
}

static int arfs_rcv(struct sk_buff *skb, struct net_device *dev,
		    struct packet_type *pt, struct net_device *orig_dev)
{
	struct arfs_priv *p = container_of(pt, struct arfs_priv, pt);
	u8 buf[ARFS_HDR_LEN + ARFS_MAX_REPLY];
	unsigned int hlen, copied;
	u8 op;

	diag_inc(p, D_RX_FRAMES);
	if (skb->pkt_type != PACKET_HOST) {
		diag_inc(p, D_RX_DROP_NOT_HOST);
		goto drop;
	}
	if (!skb_mac_header_was_set(skb) ||
	    skb_mac_header(skb) + ETH_HLEN > skb->data ||
	    !ether_addr_equal(eth_hdr(skb)->h_source, arfs_device_mac)) {
		diag_inc(p, D_RX_DROP_SRC);
		goto drop;
	}
	if (skb->len < ARFS_HDR_LEN) {
		diag_inc(p, D_RX_DROP_SHORT);
		goto drop;
	}
	if (skb_copy_bits(skb, 0, buf, ARFS_HDR_LEN))
		goto drop;
	if (buf[ARFS_HDR_OFF_VERSION] != ARFS_PROTO_VERSION) {
		diag_inc(p, D_RX_DROP_VERSION);
		goto drop;
	}
	hlen = get_unaligned_be16(buf + ARFS_HDR_OFF_LENGTH);
	if (hlen < ARFS_HDR_LEN || hlen > skb->len) {
		diag_inc(p, D_RX_DROP_LEN);
		goto drop;
	}
	if (get_unaligned_be32(buf + ARFS_HDR_OFF_RESERVED)) {
		diag_inc(p, D_RX_DROP_RESERVED);
		goto drop;
	}
	copied = min_t(unsigned int, hlen, sizeof(buf));
	if (copied > ARFS_HDR_LEN &&
	    skb_copy_bits(skb, ARFS_HDR_LEN, buf + ARFS_HDR_LEN,
			  copied - ARFS_HDR_LEN))
		goto drop;

	op = buf[ARFS_HDR_OFF_OP];
	if (op & ARFS_OP_COMPLETION)
		arfs_rx_completion(p, buf, hlen, copied);
	else if (op >= ARFS_EV_RULE_AGED && op <= ARFS_EV_ENGINE_STATE)
		arfs_rx_event(p, buf, hlen);
	else
		diag_inc(p, D_RX_DROP_OP);
	consume_skb(skb);
	return NET_RX_SUCCESS;
drop:
	kfree_skb(skb);
	return NET_RX_DROP;
}

/* ---- rule tables (mlx5 en_arfs.c shape) ------------------------------- */

static struct hlist_head *arfs_hash_bucket(struct arfs_priv *p, int type,
					   __be16 src_port, __be16 dst_port)
{
	/* same key mix as mlx5: only the ports select the bucket */
	unsigned long l = (__force unsigned long)src_port |
			  ((__force unsigned long)dst_port << 2);

	return &p->tables[type][hash_long(l, p->hash_bits)];
}

static int arfs_get_type(__be16 etype, u8 ip_proto)
{
	if (etype == htons(ETH_P_IP) && ip_proto == IPPROTO_TCP)
		return ARFS_IPV4_TCP;
	if (etype == htons(ETH_P_IP) && ip_proto == IPPROTO_UDP)
		return ARFS_IPV4_UDP;
	if (etype == htons(ETH_P_IPV6) && ip_proto == IPPROTO_TCP)
		return ARFS_IPV6_TCP;
	if (etype == htons(ETH_P_IPV6) && ip_proto == IPPROTO_UDP)
		return ARFS_IPV6_UDP;
	return -1;
}

static bool arfs_tuple_eq(const struct arfs_tuple *a, const struct arfs_tuple *b)
{
	if (a->src_port != b->src_port || a->dst_port != b->dst_port)
		return false;
	if (a->etype == htons(ETH_P_IP))
		return a->src_ipv4 == b->src_ipv4 && a->dst_ipv4 == b->dst_ipv4;
	return ipv6_addr_equal(&a->src_ipv6, &b->src_ipv6) &&
	       ipv6_addr_equal(&a->dst_ipv6, &b->dst_ipv6);
}

static struct arfs_rule *arfs_find_rule(struct arfs_priv *p, int type,
					const struct arfs_tuple *t)
{
	struct arfs_rule *rule;

	hlist_for_each_entry(rule, arfs_hash_bucket(p, type, t->src_port, t->dst_port),
			     hlist) {
		if (arfs_tuple_eq(&rule->tuple, t))
			return rule;
	}
	return NULL;
}

static void arfs_rule_work(struct work_struct *work);

static struct arfs_rule *arfs_alloc_rule(struct arfs_priv *p, int type,
					 const struct arfs_tuple *t,
					 u16 rxq, u32 flow_id)
{
	struct arfs_rule *rule;
	s64 now;

	rule = kzalloc(sizeof(*rule), GFP_ATOMIC);
	if (!rule)
		return NULL;
	INIT_WORK(&rule->arfs_work, arfs_rule_work);
	rule->priv = p;
	rule->tuple = *t;
	rule->type = type;
	rule->rxq = rxq;
	rule->flow_id = flow_id;
	rule->hw = ARFS_HW_NONE;
	rule->filter_id = p->last_filter_id++ % RPS_NO_FILTER;
	hlist_add_head(&rule->hlist, arfs_hash_bucket(p, type, t->src_port, t->dst_port));
	hlist_add_head(&rule->id_node, &p->id_hash[hash_32(rule->filter_id, p->hash_bits)]);

	now = atomic64_inc_return(&p->ctr[ARFS_CTR_RULES_NOW]);
	if (now > atomic64_read(&p->ctr[ARFS_CTR_RULES_PEAK]))
		atomic64_set(&p->ctr[ARFS_CTR_RULES_PEAK], now);
	return rule;
}

/* caller holds arfs_lock */
static void arfs_unlink_rule(struct arfs_priv *p, struct arfs_rule *rule)
{
	hlist_del_init(&rule->hlist);
	hlist_del_init(&rule->id_node);
	atomic64_dec(&p->ctr[ARFS_CTR_RULES_NOW]);
}

static int arfs_rx_flow_steer(struct net_device *dev, const struct sk_buff *skb,
			      u16 rxq_index, u32 flow_id);

/*
 * The instance whose ops copy @dev uses, or NULL once the original ops are
 * back.  Only those copies point at arfs_rx_flow_steer, and an instance
 * outlives the RCU readers that may still see its ops (see arfs_detach()).
 */
static struct arfs_priv *arfs_from_netdev(const struct net_device *dev)
{
	const struct net_device_ops *ops = READ_ONCE(dev->netdev_ops);

	if (ops->ndo_rx_flow_steer != arfs_rx_flow_steer)
		return NULL;
	return container_of(ops, struct arfs_priv, ops);
}

static int arfs_rx_flow_steer(struct net_device *dev, const struct sk_buff *skb,
			      u16 rxq_index, u32 flow_id)
{
	struct arfs_priv *p = arfs_from_netdev(dev);
	struct arfs_tuple t = {};
	struct arfs_rule *rule;
	struct flow_keys fk;
	int type, id;

	if (unlikely(!p))
		return -EPERM;
	ctr_inc(p, ARFS_CTR_STEER_CALLS);

	if (!skb_flow_dissect_flow_keys(skb, &fk, 0))
		goto noproto;
	if (fk.basic.n_proto != htons(ETH_P_IP) &&
	    fk.basic.n_proto != htons(ETH_P_IPV6))
		goto noproto;
	if (skb->encapsulation || (fk.control.flags & FLOW_DIS_ENCAPSULATION) ||
	    (fk.control.flags & FLOW_DIS_IS_FRAGMENT))
		goto noproto;
	type = arfs_get_type(fk.basic.n_proto, fk.basic.ip_proto);
	if (type < 0)
		goto noproto;

	t.etype = fk.basic.n_proto;
	t.ip_proto = fk.basic.ip_proto;
	if (t.etype == htons(ETH_P_IP)) {
		if (fk.control.addr_type != FLOW_DISSECTOR_KEY_IPV4_ADDRS)
			goto noproto;
		t.src_ipv4 = fk.addrs.v4addrs.src;
		t.dst_ipv4 = fk.addrs.v4addrs.dst;
	} else {
		if (fk.control.addr_type != FLOW_DISSECTOR_KEY_IPV6_ADDRS)
			goto noproto;
		t.src_ipv6 = fk.addrs.v6addrs.src;
		t.dst_ipv6 = fk.addrs.v6addrs.dst;
	}
	t.src_port = fk.ports.src;
	t.dst_port = fk.ports.dst;

	/* the rmap may name a queue the guest disabled with ethtool -L */
	if (rxq_index >= dev->real_num_rx_queues) {
		diag_inc(p, D_STEER_EINVAL);
		return -EINVAL;
	}

	arfs_lock_bh(p);
	arfs_hold();
	if (READ_ONCE(disabled) || p->engine_disabled || p->stopping) {
		arfs_unlock_bh(p);
		ctr_inc(p, ARFS_CTR_STEER_EPERM);
		return -EPERM;
	}
	rule = arfs_find_rule(p, type, &t);
	if (rule) {
		if (rule->rxq == rxq_index || work_busy(&rule->arfs_work)) {
			id = rule->filter_id;
			arfs_unlock_bh(p);
			ctr_inc(p, ARFS_CTR_STEER_SAME);
			return id;
		}
		rule->rxq = rxq_index;
		ctr_inc(p, ARFS_CTR_STEER_UPDATE);
	} else {
		rule = arfs_alloc_rule(p, type, &t, rxq_index, flow_id);
		if (!rule) {
			arfs_unlock_bh(p);
			ctr_inc(p, ARFS_CTR_STEER_ENOMEM);
			return -ENOMEM;
		}
		ctr_inc(p, ARFS_CTR_STEER_NEW);
	}
	queue_work(p->wq, &rule->arfs_work);
	id = rule->filter_id;
	arfs_unlock_bh(p);
	return id;

noproto:
	ctr_inc(p, ARFS_CTR_STEER_EPROTONOSUPPORT);
	return -EPROTONOSUPPORT;
}

static void arfs_may_expire_flow(struct arfs_priv *p)
{
	unsigned int quota = READ_ONCE(expire_quota), n = 0;
	struct arfs_rule *rule;
	struct hlist_node *tmp;
	u64 scanned = 0;
	int t, j, rc;
	HLIST_HEAD(del_list);

	arfs_lock_bh(p);
	if (p->stopping) {
		arfs_unlock_bh(p);
		return;
	}
	ctr_inc(p, ARFS_CTR_EXPIRE_SCANS);
	for (t = 0; t < ARFS_NUM_TYPES && n < quota; t++) {
		for (j = 0; j < (1 << p->hash_bits) && n < quota; j++) {
			hlist_for_each_entry_safe(rule, tmp, &p->tables[t][j], hlist) {
				scanned++;
				if (work_pending(&rule->arfs_work) ||
				    !rps_may_expire_flow(p->dev, rule->rxq,
							 rule->flow_id,
							 rule->filter_id))
					continue;
				arfs_unlink_rule(p, rule);
				hlist_add_head(&rule->hlist, &del_list);
				if (++n >= quota)
					break;
			}
		}
	}
	atomic64_add(scanned, &p->ctr[ARFS_CTR_EXPIRE_SCANNED]);
	arfs_unlock_bh(p);

	hlist_for_each_entry_safe(rule, tmp, &del_list, hlist) {
		hlist_del(&rule->hlist);
		if (rule->hw != ARFS_HW_NONE) {
			rc = arfs_cmd_del(p, rule->filter_id);
			if (!rc)
				ctr_inc(p, ARFS_CTR_DELS_OK);
			else
				arfs_count_err(p, E_DEL, rc);
		}
		kfree(rule);
	}
}

static void arfs_rule_work(struct work_struct *work)
{
	struct arfs_rule *rule = container_of(work, struct arfs_rule, arfs_work);
	struct arfs_priv *p = rule->priv;
	struct arfs_tuple t;
	u32 filter_id;
	u16 rxq;
	u8 hw;
	int rc;

	arfs_lock_bh(p);
	if (p->stopping) {
		arfs_unlock_bh(p);
		return;
	}
	t = rule->tuple;
	rxq = rule->rxq;
	hw = rule->hw;
	filter_id = rule->filter_id;
	arfs_unlock_bh(p);

	if (hw == ARFS_HW_NONE) {
		rc = arfs_cmd_add(p, filter_id, rxq, &t);
		arfs_lock_bh(p);
		if (!rc) {
			rule->hw = ARFS_HW_INSTALLED;
			rule->hw_rxq = rxq;
			rule->hw_since_ns = ktime_get_ns();
		} else if (rc == -ETIMEDOUT) {
			rule->hw = ARFS_HW_UNKNOWN;
		}
		arfs_unlock_bh(p);
		if (!rc)
			ctr_inc(p, ARFS_CTR_ADDS_OK);
		else
			arfs_count_err(p, E_ADD, rc);
		/* on error the rule stays in the table without a filter (mlx5) */
	} else {
		rc = arfs_cmd_mod(p, filter_id, rxq);
		arfs_lock_bh(p);
		if (!rc) {
			rule->hw = ARFS_HW_INSTALLED;
			rule->hw_rxq = rxq;
		} else if (rc == -ENOENT) {
			rule->hw = ARFS_HW_NONE;
		}
		arfs_unlock_bh(p);
		if (!rc)
			ctr_inc(p, ARFS_CTR_MODS_OK);
		else
			arfs_count_err(p, E_MOD, rc);
	}

	arfs_may_expire_flow(p);
}

static void arfs_expire_work(struct work_struct *work)
{
	struct arfs_priv *p = container_of(to_delayed_work(work),
					   struct arfs_priv, expire_work);
	unsigned int ms = READ_ONCE(expire_interval_ms);

	arfs_may_expire_flow(p);
	if (!READ_ONCE(p->stopping))
		queue_delayed_work(p->wq, &p->expire_work,
				   msecs_to_jiffies(ms ? ms : 1000));
}

/* ---- debugfs ---------------------------------------------------------- */

static void arfs_print_err_lines(struct seq_file *s, struct arfs_priv *p)
{
	char name[24];
	u64 v;
	int k, e;

	for (k = 0; k < E_NR; k++) {
		for (e = 1; e < ARFS_ERR_SLOTS; e++) {
			v = atomic64_read(&p->err[k][e]);
			if (!v)
				continue;
			if (e == ARFS_ERR_SLOTS - 1)
				strscpy(name, "other", sizeof(name));
			else
				/* "%pe" prints "-ENOSPC" (or "-28") */
				snprintf(name, sizeof(name), "%pe", ERR_PTR(-e));
			seq_printf(s, "%s_%s: %llu\n", arfs_err_prefix[k],
				   name[0] == '-' ? name + 1 : name, v);
		}
	}
}

static int arfs_stats_show(struct seq_file *s, void *unused)
{
	struct arfs_priv *p = s->private;
	int i;

	for (i = 1; i < ARFS_CTR_NR; i++)
		seq_printf(s, "%s: %llu\n", arfs_ctr_names[i], arfs_ctr_read(p, i));
	for (i = 0; i < ARFS_HIST_BUCKETS; i++)
		seq_printf(s, "cmd_latency_us_log2_%d: %lld\n", i,
			   atomic64_read(&p->hist[i]));
	arfs_print_err_lines(s, p);
	for (i = 0; i < D_NR; i++)
		seq_printf(s, "%s: %lld\n", arfs_diag_names[i],
			   atomic64_read(&p->diag[i]));
	seq_printf(s, "engine_disabled: %d\n", READ_ONCE(p->engine_disabled));
	seq_printf(s, "rx_queues: %u\n", p->dev->real_num_rx_queues);
	seq_printf(s, "rmap_queues: %u\n", p->nr_rmap);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(arfs_stats);

static const char * const arfs_hw_names[] = { "none", "installed", "unknown" };

static int arfs_rules_show(struct seq_file *s, void *unused)
{
	struct arfs_priv *p = s->private;
	u64 now = ktime_get_ns();
	struct arfs_rule *rule;
	int t, j;

	seq_puts(s, "filter_id type src sport dst dport rxq hw hw_rxq hw_age_ms flow_id\n");
	arfs_lock_bh(p);
	for (t = 0; t < ARFS_NUM_TYPES; t++) {
		for (j = 0; j < (1 << p->hash_bits); j++) {
			hlist_for_each_entry(rule, &p->tables[t][j], hlist) {
				seq_printf(s, "%u %s ", rule->filter_id, arfs_type_names[t]);
				if (rule->tuple.etype == htons(ETH_P_IP))
					seq_printf(s, "%pI4 %u %pI4 %u",
						   &rule->tuple.src_ipv4,
						   ntohs(rule->tuple.src_port),
						   &rule->tuple.dst_ipv4,
						   ntohs(rule->tuple.dst_port));
				else
					seq_printf(s, "%pI6c %u %pI6c %u",
						   &rule->tuple.src_ipv6,
						   ntohs(rule->tuple.src_port),
						   &rule->tuple.dst_ipv6,
						   ntohs(rule->tuple.dst_port));
				seq_printf(s, " %u %s %u %llu %u\n", rule->rxq,
					   arfs_hw_names[rule->hw], rule->hw_rxq,
					   rule->hw == ARFS_HW_INSTALLED ?
					   div_u64(now - rule->hw_since_ns, NSEC_PER_MSEC) : 0,
					   rule->flow_id);
			}
		}
	}
	arfs_unlock_bh(p);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(arfs_rules);

static void arfs_debugfs_init(struct arfs_priv *p)
{
	p->dbg = debugfs_create_dir(KBUILD_MODNAME, NULL);
	if (IS_ERR_OR_NULL(p->dbg)) {
		p->dbg = NULL;
		return;
	}
	debugfs_create_file("stats", 0444, p->dbg, p, &arfs_stats_fops);
	debugfs_create_file("rules", 0444, p->dbg, p, &arfs_rules_fops);
	debugfs_create_bool("disabled", 0644, p->dbg, &disabled);
	debugfs_create_ulong("hold_ns", 0644, p->dbg, &hold_ns);
}

/* ---- IRQs and the CPU reverse map ------------------------------------- */

/* does IRQ @irq carry an action named @name? */
static bool arfs_irq_has_name(unsigned int irq, const char *name)
{
	struct irqaction *action;
	struct irq_data *d;
	struct irq_desc *desc;
	unsigned long flags;
	bool found = false;

	rcu_read_lock();
	d = irq_get_irq_data(irq);
	if (d) {
		desc = irq_data_to_desc(d);
		raw_spin_lock_irqsave(&desc->lock, flags);
		for (action = desc->action; action; action = action->next) {
			if (action->name && !strcmp(action->name, name)) {
				found = true;
				break;
			}
		}
		raw_spin_unlock_irqrestore(&desc->lock, flags);
	}
	rcu_read_unlock();
	return found;
}

static int arfs_find_irq(const char *name)
{
	int irq;

	for (irq = 1; irq < nr_irqs; irq++)
		if (arfs_irq_has_name(irq, name))
			return irq;
	return -ENOENT;
}

/* parse the irqs= comma list; *n = 0 when it is empty */
static int arfs_parse_irqs(struct net_device *dev, int *list, unsigned int *n)
{
	char buf[sizeof(irqs)];
	char *s = buf, *tok;
	int rc;

	*n = 0;
	strscpy(buf, irqs, sizeof(buf));
	while ((tok = strsep(&s, ",")) != NULL) {
		tok = strim(tok);
		if (!*tok)
			continue;
		if (*n >= ARFS_MAX_QUEUES) {
			arfs_err(dev, "irqs=: more than %d entries\n", ARFS_MAX_QUEUES);
			return -EINVAL;
		}
		rc = kstrtoint(tok, 10, &list[*n]);
		if (rc) {
			arfs_err(dev, "irqs=: '%s' is not a number\n", tok);
			return rc;
		}
		(*n)++;
	}
	return 0;
}

static int arfs_collect_irqs(struct arfs_priv *p)
{
	struct net_device *dev = p->dev;
	const char *vname = dev_name(dev->dev.parent);
	unsigned int nrxq = dev->real_num_rx_queues;
	int list[ARFS_MAX_QUEUES];
	unsigned int q, n;
	char name[64];
	int irq, rc;

	rc = arfs_parse_irqs(dev, list, &n);
	if (rc)
		return rc;
	if (n) {
		if (n > nrxq)
			arfs_warn(dev, "irqs= names %u IRQs but only %u RX queues are enabled; using the first %u\n",
				  n, nrxq, nrxq);
		else if (n < nrxq)
			arfs_warn(dev, "irqs= names %u IRQs for %u RX queues; steering targets only queues 0-%u\n",
				  n, nrxq, n - 1);
		p->nr_rmap = min(n, nrxq);
		for (q = 0; q < p->nr_rmap; q++) {
			if (list[q] <= 0 || !irq_get_irq_data(list[q])) {
				arfs_err(dev, "irqs=: %d is not an IRQ\n", list[q]);
				return -EINVAL;
			}
			snprintf(name, sizeof(name), "%s-input.%u", vname, q);
			if (!arfs_irq_has_name(list[q], name))
				arfs_warn(dev, "IRQ %d is not named %s; using it for RX queue %u anyway\n",
					  list[q], name, q);
			p->rmap_irqs[q] = list[q];
		}
		return 0;
	}

	if (nrxq > ARFS_MAX_QUEUES) {
		arfs_err(dev, "%u RX queues, at most %d supported\n",
			 nrxq, ARFS_MAX_QUEUES);
		return -EINVAL;
	}
	for (q = 0; q < nrxq; q++) {
		snprintf(name, sizeof(name), "%s-input.%u", vname, q);
		irq = arfs_find_irq(name);
		if (irq < 0) {
			arfs_err(dev, "no IRQ named %s (per-queue MSI-X vectors needed: QEMU virtio-net-pci vectors=2N+2); pass irqs=\n",
				 name);
			return -ENOENT;
		}
		p->rmap_irqs[q] = irq;
	}
	p->nr_rmap = nrxq;
	return 0;
}

/*
 * The IRQ's affinity as the rmap notifier would see it: on x86 a new MSI
 * affinity stays pending until the next interrupt, so virtio_net's per-queue
 * affinity may not have reached irq_common_data yet.
 */
static void arfs_irq_affinity(unsigned int irq, struct cpumask *out)
{
	struct irq_desc *desc;
	struct irq_data *d;
	unsigned long flags;

	cpumask_clear(out);
	rcu_read_lock();
	d = irq_get_irq_data(irq);
	if (d) {
		desc = irq_data_to_desc(d);
		raw_spin_lock_irqsave(&desc->lock, flags);
#ifdef CONFIG_GENERIC_PENDING_IRQ
		if (irqd_is_setaffinity_pending(d))
			cpumask_copy(out, desc->pending_mask);
		else
#endif
			cpumask_copy(out, irq_data_get_affinity_mask(d));
		raw_spin_unlock_irqrestore(&desc->lock, flags);
	}
	rcu_read_unlock();
}

static int arfs_build_rmap(struct arfs_priv *p)
{
	cpumask_var_t mask;
	unsigned int i, j;
	int rc;

	if (!zalloc_cpumask_var(&mask, GFP_KERNEL))
		return -ENOMEM;
	p->rmap = alloc_irq_cpu_rmap(p->nr_rmap);
	if (!p->rmap) {
		free_cpumask_var(mask);
		return -ENOMEM;
	}
	for (i = 0; i < p->nr_rmap; i++) {
		rc = irq_cpu_rmap_add(p->rmap, p->rmap_irqs[i]);
		if (rc) {
			arfs_err(p->dev, "irq_cpu_rmap_add(IRQ %d): %d\n",
				 p->rmap_irqs[i], rc);
			/* undo by hand: older free_irq_cpu_rmap() trips over
			 * the failed slot
			 */
			for (j = 0; j < i; j++)
				irq_set_affinity_notifier(p->rmap_irqs[j], NULL);
			cpu_rmap_put(p->rmap);
			p->rmap = NULL;
			free_cpumask_var(mask);
			return rc;
		}
		/* the notifier only fires on later changes: seed the map */
		arfs_irq_affinity(p->rmap_irqs[i], mask);
		if (!cpumask_empty(mask))
			cpu_rmap_update(p->rmap, i, mask);
		arfs_info(p->dev, "RX queue %u: IRQ %d, affinity %*pbl\n", i,
			  p->rmap_irqs[i], cpumask_pr_args(mask));
	}
	free_cpumask_var(mask);
	return 0;
}

/* ---- HELLO ------------------------------------------------------------ */

static void arfs_hello(struct arfs_priv *p)
{
	static const char * const layouts[] = {
		[ARFS_CAPS_LAYOUT_PER_TYPE] = "per-type tables",
		[ARFS_CAPS_LAYOUT_SHARED] = "shared table",
	};
	struct arfs_cmd *cmd;
	const u8 *c;
	int rc, i;

	cmd = kmalloc(sizeof(*cmd), GFP_KERNEL);
	if (!cmd)
		return;
	rc = arfs_cmd_exec(p, cmd, ARFS_OP_HELLO, NULL, ARFS_HELLO_BODY_LEN, false);
	if (rc) {
		arfs_warn(p->dev, "HELLO got no CAPS answer (%d%s); steering anyway\n", rc,
			  rc == -ETIMEDOUT ? ": device does not speak the control protocol?" : "");
		kfree(cmd);
		return;
	}
	/* the reply is the completion body: timestamps, then CAPS */
	c = cmd->reply;
	p->caps_queue_pairs = get_unaligned_be16(c + ARFS_CAPS_OFF_QUEUE_PAIRS);
	p->caps_layout = get_unaligned_be16(c + ARFS_CAPS_OFF_LAYOUT);
	for (i = 0; i < ARFS_CAPS_CAPACITY_NR; i++)
		p->caps_capacity[i] = get_unaligned_be32(c + ARFS_CAPS_OFF_CAPACITY + 4 * i);
	memcpy(p->caps_profile, c + ARFS_CAPS_OFF_PROFILE, ARFS_PROFILE_LEN);
	p->caps_profile[ARFS_PROFILE_LEN] = '\0';
	for (i = 0; i < ARFS_PROFILE_LEN && p->caps_profile[i]; i++)
		if (!isprint(p->caps_profile[i]))
			p->caps_profile[i] = '?';
	p->caps_valid = true;
	arfs_info(p->dev, "device CAPS: %u queue pairs, %s, capacity v4/tcp %u v4/udp %u v6/tcp %u v6/udp %u, profile \"%s\", round trip %llu us\n",
		  p->caps_queue_pairs,
		  p->caps_layout < ARRAY_SIZE(layouts) ?
		  layouts[p->caps_layout] : "unknown layout",
		    p->caps_capacity[0], p->caps_capacity[1],
		    p->caps_capacity[2], p->caps_capacity[3], p->caps_profile,
		    div_u64(cmd->rcvd_ns - cmd->sent_ns, NSEC_PER_USEC));
	if (p->caps_queue_pairs != p->dev->real_num_rx_queues)
		arfs_info(p->dev, "device has %u queue pairs, %u RX queues enabled\n",
			  p->caps_queue_pairs, p->dev->real_num_rx_queues);
	kfree(cmd);
}

/* ---- attach / detach -------------------------------------------------- */

static void arfs_free_tables(struct arfs_priv *p)
{
	int t;

	for (t = 0; t < ARFS_NUM_TYPES; t++)
		kvfree(p->tables[t]);
	kvfree(p->id_hash);
}

static int arfs_alloc_tables(struct arfs_priv *p)
{
	unsigned int n = roundup_pow_of_two(clamp_val(buckets, 2, 65536));
	int t;

	p->hash_bits = ilog2(n);
	for (t = 0; t < ARFS_NUM_TYPES; t++) {
		p->tables[t] = kvcalloc(n, sizeof(struct hlist_head), GFP_KERNEL);
		if (!p->tables[t])
			return -ENOMEM;
	}
	p->id_hash = kvcalloc(n, sizeof(struct hlist_head), GFP_KERNEL);
	return p->id_hash ? 0 : -ENOMEM;
}

static bool arfs_is_virtio_net(struct net_device *dev)
{
	struct device *parent = dev->dev.parent;

	return parent && parent->driver && parent->driver->name &&
	       !strcmp(parent->driver->name, "virtio_net");
}

/* turn steering off; RTNL held.  The caller waits for RCU afterwards. */
static void arfs_steering_off_features(struct arfs_priv *p)
{
	struct net_device *dev = p->dev;

	dev->hw_features &= ~p->added_hw_features;
	dev->wanted_features &= ~p->added_wanted_features;
	if (dev->features & p->added_features) {
		dev->features &= ~p->added_features;
		netdev_features_change(dev);
	}
}

static void arfs_steering_off_ops(struct arfs_priv *p)
{
	struct net_device *dev = p->dev;

	WRITE_ONCE(dev->rx_cpu_rmap, NULL);
	WRITE_ONCE(dev->netdev_ops, p->orig_ops);
	p->steering = false;
}

static void arfs_detach(struct arfs_priv *p, bool rtnl_held)
{
	struct net_device *dev = p->dev;
	struct arfs_rule *rule;
	struct hlist_node *tmp;
	bool was_steering = p->steering;
	struct arfs_cmd *cmd;
	int t, j, rc;
	HLIST_HEAD(del_list);

	debugfs_remove_recursive(p->dbg);
	p->dbg = NULL;

	if (p->steering) {
		/* 1. the core stops calling us once NTUPLE is gone and the
		 * RCU readers in get_rps_cpu() are done; only then may the
		 * rmap and the ops go (set_rps_cpu() reads both unchecked).
		 */
		if (!rtnl_held)
			rtnl_lock();
		arfs_steering_off_features(p);
		if (!rtnl_held)
			rtnl_unlock();
		synchronize_net();
		if (!rtnl_held)
			rtnl_lock();
		arfs_steering_off_ops(p);
		if (!rtnl_held)
			rtnl_unlock();
		synchronize_net();
	}

	/* 2. stop the works and fail commands still waiting */
	spin_lock_bh(&p->arfs_lock);
	p->stopping = true;
	spin_unlock_bh(&p->arfs_lock);
	arfs_cmd_close(p);
	if (p->works_started) {
		cancel_delayed_work_sync(&p->stats_work);
		cancel_delayed_work_sync(&p->expire_work);
	}

	spin_lock_bh(&p->arfs_lock);
	for (t = 0; t < ARFS_NUM_TYPES; t++) {
		if (!p->tables[t])
			continue;
		for (j = 0; j < (1 << p->hash_bits); j++) {
			hlist_for_each_entry_safe(rule, tmp, &p->tables[t][j], hlist) {
				arfs_unlink_rule(p, rule);
				hlist_add_head(&rule->hlist, &del_list);
			}
		}
	}
	spin_unlock_bh(&p->arfs_lock);
	hlist_for_each_entry(rule, &del_list, hlist)
		cancel_work_sync(&rule->arfs_work);
	if (p->wq) {
		destroy_workqueue(p->wq);
		p->wq = NULL;
	}

	/* 3. empty the device table with one FLUSH */
	if (p->pt_added && netif_running(dev)) {
		cmd = kmalloc(sizeof(*cmd), GFP_KERNEL);
		if (cmd) {
			rc = arfs_cmd_exec(p, cmd, ARFS_OP_FLUSH, NULL, ARFS_FLUSH_BODY_LEN, true);
			if (rc)
				arfs_warn(dev, "FLUSH on detach failed: %d\n", rc);
			kfree(cmd);
		}
	}

	/* 4. stop receiving, free the rules and the rmap */
	if (p->pt_added) {
		dev_remove_pack(&p->pt);
		p->pt_added = false;
	}
	hlist_for_each_entry_safe(rule, tmp, &del_list, hlist) {
		hlist_del(&rule->hlist);
		kfree(rule);
	}
	if (p->rmap) {
		free_irq_cpu_rmap(p->rmap);
		p->rmap = NULL;
	}
	arfs_free_tables(p);
	if (was_steering)
		arfs_info(dev, "aRFS detached\n");
	netdev_put(dev, &p->dev_tracker);
	p->dev = NULL;
}

static int arfs_netdev_event(struct notifier_block *nb, unsigned long event,
			     void *ptr)
{
	struct net_device *dev = netdev_notifier_info_to_dev(ptr);
	struct arfs_priv *p, *tmp;

	/* runs under RTNL, as do attach's final section and exit's check */
	if (event != NETDEV_UNREGISTER || arfs_exiting)
		return NOTIFY_DONE;
	list_for_each_entry_safe(p, tmp, &arfs_list, node) {
		if (p->dev != dev)
			continue;
		arfs_info(dev, "interface is going away, detaching aRFS\n");
		list_del(&p->node);
		arfs_detach(p, true);
		kfree(p);
	}
	return NOTIFY_DONE;
}

static struct notifier_block arfs_netdev_nb = {
	.notifier_call = arfs_netdev_event,
};

static int __init arfs_init(void)
{
	struct net_device *dev;
	struct arfs_priv *p;
	int rc;

	/*
	 * Registered first so that an unregistration racing with the load is
	 * never missed: until p is on arfs_list the handler ignores it, and
	 * the final RTNL section re-checks the device's state.
	 */
	rc = register_netdevice_notifier(&arfs_netdev_nb);
	if (rc)
		return rc;

	p = kzalloc(sizeof(*p), GFP_KERNEL);
	if (!p) {
		rc = -ENOMEM;
		goto err_nb;
	}
	spin_lock_init(&p->arfs_lock);
	spin_lock_init(&p->cmd_lock);
	INIT_LIST_HEAD(&p->cmd_pending);
	INIT_DELAYED_WORK(&p->stats_work, arfs_stats_work);
	INIT_DELAYED_WORK(&p->expire_work, arfs_expire_work);

	rtnl_lock();
	dev = __dev_get_by_name(&init_net, ifname);
	if (!dev) {
		pr_err("interface %s not found (ifname=)\n", ifname);
		rc = -ENODEV;
	} else if (!arfs_is_virtio_net(dev)) {
		pr_err("%s is not a virtio_net interface\n", ifname);
		rc = -EINVAL;
	} else if (dev->netdev_ops->ndo_rx_flow_steer || dev->rx_cpu_rmap) {
		pr_err("%s already has an aRFS implementation\n", ifname);
		rc = -EEXIST;
	} else {
		netdev_hold(dev, &p->dev_tracker, GFP_KERNEL);
		p->dev = dev;
	}
	rtnl_unlock();
	if (rc) {
		kfree(p);
		goto err_nb;
	}

	rc = arfs_collect_irqs(p);
	if (rc)
		goto err;
	rc = arfs_build_rmap(p);
	if (rc)
		goto err;
	rc = arfs_alloc_tables(p);
	if (rc)
		goto err;
	p->wq = alloc_ordered_workqueue("%s", 0, KBUILD_MODNAME);
	if (!p->wq) {
		rc = -ENOMEM;
		goto err;
	}

	p->pt.type = htons(ARFS_ETH_P);
	p->pt.dev = dev;
	p->pt.func = arfs_rcv;
	dev_add_pack(&p->pt);
	p->pt_added = true;

	arfs_hello(p);

	arfs_debugfs_init(p);
	p->works_started = true;
	schedule_delayed_work(&p->stats_work, msecs_to_jiffies(ARFS_STATS_PERIOD_MS));
	queue_delayed_work(p->wq, &p->expire_work,
			   msecs_to_jiffies(expire_interval_ms ? expire_interval_ms : 1000));

	/* after this section the netdev notifier may detach and free p */
	rtnl_lock();
	if (dev->reg_state != NETREG_REGISTERED) {
		rtnl_unlock();
		rc = -ENODEV;
		goto err;
	}
	p->orig_ops = dev->netdev_ops;
	p->ops = *dev->netdev_ops;
	p->ops.ndo_rx_flow_steer = arfs_rx_flow_steer;
	list_add_tail(&p->node, &arfs_list);
	WRITE_ONCE(dev->netdev_ops, &p->ops);
	WRITE_ONCE(dev->rx_cpu_rmap, p->rmap);
	/* ops and rmap must be visible before the core sees NTUPLE */
	smp_wmb();
	p->added_hw_features = NETIF_F_NTUPLE & ~dev->hw_features;
	p->added_wanted_features = NETIF_F_NTUPLE & ~dev->wanted_features;
	p->added_features = NETIF_F_NTUPLE & ~dev->features;
	dev->hw_features |= NETIF_F_NTUPLE;
	dev->wanted_features |= NETIF_F_NTUPLE;
	dev->features |= NETIF_F_NTUPLE;
	p->steering = true;
	netdev_features_change(dev);
	arfs_info(dev, "aRFS attached: %u RX queues in the rmap, %u buckets per table, ntuple on\n",
		  p->nr_rmap, 1U << p->hash_bits);
	rtnl_unlock();
	return 0;

err:
	/* p never was on arfs_list on this path: the notifier ignores it */
	arfs_detach(p, false);
	kfree(p);
err_nb:
	unregister_netdevice_notifier(&arfs_netdev_nb);
	return rc;
}

static void __exit arfs_exit(void)
{
	struct arfs_priv *p, *tmp;
	LIST_HEAD(list);

	rtnl_lock();
	arfs_exiting = true;
	list_splice_init(&arfs_list, &list);
	rtnl_unlock();
	unregister_netdevice_notifier(&arfs_netdev_nb);

	list_for_each_entry_safe(p, tmp, &list, node) {
		list_del(&p->node);
		arfs_detach(p, false);
		kfree(p);
	}
}

module_init(arfs_init);
module_exit(arfs_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("aRFS (ndo_rx_flow_steer) for virtio_net on the arfsnic emulated NIC");
MODULE_AUTHOR("arfsnic developers");
