// SPDX-License-Identifier: GPL-2.0
/*
 * arfs_virtio control frames (protocol v3, arfs_proto.h): building and
 * transmitting requests, waiting for their completions, the receive handler
 * for completions and events, HELLO/CAPS, RSS_GET/RSS_SET, the plain
 * configuration requests (RULE_SET/RULE_DEL, built by arfs_nfc.c), and the
 * periodic STATS push.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/ctype.h>
#include <linux/err.h>
#include <linux/etherdevice.h>
#include <linux/ethtool.h>
#include <linux/if_ether.h>
#include <linux/jiffies.h>
#include <linux/kernel.h>
#include <linux/ktime.h>
#include <linux/log2.h>
#include <linux/math64.h>
#include <linux/netdevice.h>
#include <linux/pkt_sched.h>
#include <linux/skbuff.h>
#include <linux/slab.h>
#include <linux/string.h>
/* Kbuild probes the tree for <linux/unaligned.h> (since 6.12) */
#ifdef ARFS_HAVE_LINUX_UNALIGNED_H
#include <linux/unaligned.h>
#else
#include <asm/unaligned.h>
#endif

#include "arfs.h"

/* arfs_proto.h is plain numbers: check that they fit together */
static_assert(ARFS_ETH_P == ETH_P_802_EX1);
static_assert(ARFS_STATUS_MAX == MAX_ERRNO);
static_assert(ARFS_HDR_OFF_RESERVED + 4 == ARFS_HDR_LEN);
static_assert(ARFS_ADD_OFF_DST_PORT + 2 == ARFS_ADD_BODY_LEN);
static_assert(ARFS_MOD_OFF_PAD + 2 == ARFS_MOD_BODY_LEN);
static_assert(ARFS_STATS_ENTRY_OFF_VALUE + 8 == ARFS_STATS_ENTRY_LEN);
static_assert(ARFS_CAPS_OFF_PROFILE + ARFS_PROFILE_LEN == ARFS_TS_LEN + ARFS_CAPS_LEN);
static_assert(ARFS_QUERY_OFF_HITS + 8 == ARFS_TS_LEN + ARFS_QUERY_REPLY_LEN);
static_assert(ARFS_CTR_WORK_DELAY_NS_MAX + 1 == ARFS_CTR_NR);
static_assert(ARFS_CAPS_CAPACITY_NR == ARFS_NUM_TYPES);
static_assert(ARFS_RSS_SET_OFF_PAD2 + 2 == ARFS_RSS_SET_HDR_LEN);
static_assert(ARFS_RSS_SET_OFF_KEY == ARFS_RSS_SET_HDR_LEN);
static_assert(ARFS_TS_LEN + ARFS_RSS_REPLY_HDR_LEN == ARFS_RSS_OFF_KEY);
static_assert(ARFS_RSS_HFUNC_NO_CHANGE == ETH_RSS_HASH_NO_CHANGE);
static_assert(ARFS_RSS_HFUNC_TOEPLITZ == ETH_RSS_HASH_TOP);
static_assert(ARFS_MAX_REPLY >= ARFS_DEV_STATS_REPLY_MAX);

static const u8 arfs_device_mac[ETH_ALEN] = {
	ARFS_DEVICE_MAC_0, ARFS_DEVICE_MAC_1, ARFS_DEVICE_MAC_2,
	ARFS_DEVICE_MAC_3, ARFS_DEVICE_MAC_4, ARFS_DEVICE_MAC_5,
};

static const u16 arfs_err_id_base[ARFS_ERR_KIND_NR] = {
	[ARFS_ERR_KIND_ADD] = ARFS_ADD_ERR_ID_BASE,
	[ARFS_ERR_KIND_MOD] = ARFS_MOD_ERR_ID_BASE,
	[ARFS_ERR_KIND_DEL] = ARFS_DEL_ERR_ID_BASE,
};

/* ---- transmit and commands ------------------------------------------- */

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
	h[ARFS_HDR_OFF_VERSION] = READ_ONCE(p->proto_version);
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
		arfs_diag_inc(p, ARFS_DIAG_TX_FRAMES);
		return 0;
	}
	arfs_diag_inc(p, ARFS_DIAG_TX_ERRORS);
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
int arfs_cmd_exec(struct arfs_priv *p, struct arfs_cmd *cmd, u8 op,
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

	timeout = msecs_to_jiffies(clamp_val(READ_ONCE(arfs_cmd_timeout_ms), 1, 600000));
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
		arfs_ctr_inc(p, ARFS_CTR_CMD_TIMEOUTS);
	return rc;

done:
	if (cmd->status < 0) {
		arfs_diag_inc(p, ARFS_DIAG_CMD_CANCELED);
		return cmd->status;
	}
	/* the histogram is of filter commands: the others are answered at once */
	if (op >= ARFS_OP_ADD && op <= ARFS_OP_QUERY)
		atomic64_inc(&p->hist[arfs_hist_bucket(cmd->rcvd_ns - cmd->sent_ns)]);
	return -cmd->status;
}

/* fail every waiting command and refuse new ones (except forced) */
void arfs_cmd_close(struct arfs_priv *p)
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

void arfs_count_err(struct arfs_priv *p, int kind, int rc)
{
	unsigned int e = -rc;

	if (rc == -ECANCELED || rc == -ESHUTDOWN)
		return;		/* teardown, not a device answer */
	atomic64_inc(&p->err[kind][min_t(unsigned int, e, ARFS_ERR_SLOTS - 1)]);
}

int arfs_cmd_add(struct arfs_priv *p, u32 filter_id, u16 rxq,
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

int arfs_cmd_mod(struct arfs_priv *p, u32 filter_id, u16 rxq)
{
	u8 b[ARFS_MOD_BODY_LEN] = {};
	struct arfs_cmd cmd;

	put_unaligned_be32(filter_id, b + ARFS_MOD_OFF_FILTER_ID);
	put_unaligned_be16(rxq, b + ARFS_MOD_OFF_RXQ);
	return arfs_cmd_exec(p, &cmd, ARFS_OP_MOD, b, sizeof(b), false);
}

int arfs_cmd_del(struct arfs_priv *p, u32 filter_id)
{
	u8 b[ARFS_DEL_BODY_LEN];
	struct arfs_cmd cmd;

	put_unaligned_be32(filter_id, b + ARFS_DEL_OFF_FILTER_ID);
	return arfs_cmd_exec(p, &cmd, ARFS_OP_DEL, b, sizeof(b), false);
}

/* detach: empty the device table (sent even after arfs_cmd_close()) */
void arfs_cmd_flush(struct arfs_priv *p)
{
	struct arfs_cmd *cmd;
	int rc;

	cmd = kmalloc(sizeof(*cmd), GFP_KERNEL);
	if (!cmd)
		return;
	rc = arfs_cmd_exec(p, cmd, ARFS_OP_FLUSH, NULL, ARFS_FLUSH_BODY_LEN, true);
	if (rc)
		arfs_warn(p->dev, "FLUSH on detach failed: %d\n", rc);
	kfree(cmd);
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
		arfs_diag_inc(p, ARFS_DIAG_STATS_FRAMES);
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

/*
 * Ask the device for its counters and keep them for ethtool -S.  Sleeps until
 * the completion arrives (stats work only).
 */
int arfs_dev_stats_fetch(struct arfs_priv *p)
{
	struct arfs_cmd *cmd;
	unsigned int n, i;
	const u8 *e;
	u16 id;
	int rc;

	cmd = kmalloc(sizeof(*cmd), GFP_KERNEL);
	if (!cmd)
		return -ENOMEM;
	rc = arfs_cmd_exec(p, cmd, ARFS_OP_DEV_STATS, NULL,
			   ARFS_DEV_STATS_BODY_LEN, false);
	if (!rc && cmd->reply_len >= ARFS_DEV_STATS_OFF_ENTRIES) {
		n = get_unaligned_be16(cmd->reply + ARFS_DEV_STATS_OFF_COUNT);
		n = min_t(unsigned int, n, (cmd->reply_len -
			  ARFS_DEV_STATS_OFF_ENTRIES) / ARFS_STATS_ENTRY_LEN);
		for (i = 0; i < n; i++) {
			e = cmd->reply + ARFS_DEV_STATS_OFF_ENTRIES +
			    i * ARFS_STATS_ENTRY_LEN;
			id = get_unaligned_be16(e + ARFS_STATS_ENTRY_OFF_ID);
			if (id && id < ARFS_DEV_CTR_NR)
				atomic64_set(&p->dev_ctr[id],
					     get_unaligned_be64(e + ARFS_STATS_ENTRY_OFF_VALUE));
		}
	}
	kfree(cmd);
	return rc;
}

u64 arfs_ctr_read(struct arfs_priv *p, int id)
{
	if (id == ARFS_CTR_HOLD_NS)
		return READ_ONCE(arfs_hold_ns);
	return atomic64_read(&p->ctr[id]);
}

void arfs_stats_work(struct work_struct *work)
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
	for (k = 0; k < ARFS_ERR_KIND_NR; k++) {
		for (i = 1; i < ARFS_ERR_SLOTS; i++) {
			v = atomic64_read(&p->err[k][i]);
			if (v)
				arfs_stats_put(p, sb, arfs_err_id_base[k] + i, v);
		}
	}
	arfs_stats_flush(p, sb);
	kfree(sb);
	if (++p->stats_rounds % ARFS_DEV_STATS_EVERY == 1)
		arfs_dev_stats_fetch(p);
again:
	if (!READ_ONCE(p->stopping))
		schedule_delayed_work(&p->stats_work,
				      msecs_to_jiffies(ARFS_STATS_PERIOD_MS));
}

/* ---- receive ---------------------------------------------------------- */

/*
 * Frame bytes (header included) an RSS_GET reply needs: its sizes must be
 * within the protocol limits (else more than the buffer, so it is dropped).
 */
static unsigned int arfs_rss_reply_len(const u8 *body)
{
	unsigned int key_len = get_unaligned_be16(body + ARFS_RSS_OFF_KEY_LEN);
	unsigned int n = get_unaligned_be16(body + ARFS_RSS_OFF_INDIR_SIZE);

	if (key_len > ARFS_RSS_KEY_MAX || n > ARFS_RSS_INDIR_MAX)
		return ARFS_HDR_LEN + ARFS_MAX_REPLY + 1;
	return ARFS_HDR_LEN + ARFS_RSS_OFF_KEY + key_len +
	       n * ARFS_RSS_INDIR_ENTRY_LEN;
}

static void arfs_rx_completion(struct arfs_priv *p, const u8 *buf,
			       unsigned int hlen, unsigned int copied)
{
	u8 op = buf[ARFS_HDR_OFF_OP] & ~ARFS_OP_COMPLETION;
	u32 seq = get_unaligned_be32(buf + ARFS_HDR_OFF_SEQ);
	u16 status = get_unaligned_be16(buf + ARFS_HDR_OFF_STATUS);
	unsigned int need = ARFS_HDR_LEN + ARFS_TS_LEN;
	struct arfs_cmd *cmd, *found = NULL;

	arfs_diag_inc(p, ARFS_DIAG_RX_COMPLETIONS);
	if (op < ARFS_OP_HELLO || op > ARFS_OP_CTX_DEL || op == ARFS_OP_STATS) {
		arfs_diag_inc(p, ARFS_DIAG_RX_DROP_OP);
		return;
	}
	if (status > ARFS_STATUS_MAX) {
		arfs_diag_inc(p, ARFS_DIAG_RX_DROP_STATUS);
		return;
	}
	if (!status && op == ARFS_OP_HELLO)
		need += ARFS_CAPS_LEN;
	else if (!status && op == ARFS_OP_QUERY)
		need += ARFS_QUERY_REPLY_LEN;
	else if (!status && op == ARFS_OP_HASH_GET)
		need += ARFS_HASH_BODY_LEN;
	else if (!status && op == ARFS_OP_DEV_STATS && hlen >= ARFS_HDR_LEN +
		 ARFS_DEV_STATS_OFF_ENTRIES && copied >= ARFS_HDR_LEN +
		 ARFS_DEV_STATS_OFF_ENTRIES)
		need = ARFS_HDR_LEN + ARFS_DEV_STATS_OFF_ENTRIES +
		       ARFS_STATS_ENTRY_LEN *
		       min_t(unsigned int, ARFS_DEV_STATS_MAX_ENTRIES,
			     get_unaligned_be16(buf + ARFS_HDR_LEN +
						ARFS_DEV_STATS_OFF_COUNT));
	else if (!status && op == ARFS_OP_RSS_GET && hlen >= ARFS_HDR_LEN +
		 ARFS_RSS_OFF_KEY && copied >= ARFS_HDR_LEN + ARFS_RSS_OFF_KEY)
		need = arfs_rss_reply_len(buf + ARFS_HDR_LEN);
	else if (!status && op == ARFS_OP_RSS_GET)
		need = ARFS_HDR_LEN + ARFS_RSS_OFF_KEY;
	if (hlen < need || copied < need) {
		arfs_diag_inc(p, ARFS_DIAG_RX_DROP_BODY);
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
		arfs_diag_inc(p, ARFS_DIAG_RX_DROP_SEQ);
		return;
	}
	if (found->op != op) {
		spin_unlock_bh(&p->cmd_lock);
		arfs_diag_inc(p, ARFS_DIAG_RX_DROP_OP_MISMATCH);
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
	u32 filter_id, gap;
	unsigned int need;
	u16 state;

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
		arfs_diag_inc(p, ARFS_DIAG_RX_DROP_OP);
		return;
	}
	if (hlen < ARFS_HDR_LEN + need) {
		arfs_diag_inc(p, ARFS_DIAG_RX_DROP_BODY);
		return;
	}
	if (op == ARFS_EV_ENGINE_STATE &&
	    get_unaligned_be16(body + ARFS_EV_ENGINE_STATE_OFF_DISABLED) > 1) {
		arfs_diag_inc(p, ARFS_DIAG_RX_DROP_BODY);
		return;
	}

	arfs_diag_inc(p, ARFS_DIAG_RX_EVENTS);
	arfs_lock_bh(p);
	/* a forward gap means lost events; anything else (device restart,
	 * reordering between RX queues) just resynchronises
	 */
	gap = seq - p->last_event_seq - 1;
	if (p->have_event_seq && gap && gap < 0x80000000U)
		atomic64_add(gap, &p->diag[ARFS_DIAG_EV_LOST]);
	p->have_event_seq = true;
	p->last_event_seq = seq;

	switch (op) {
	case ARFS_EV_RULE_AGED:
		arfs_diag_inc(p, ARFS_DIAG_EV_RULE_AGED);
		filter_id = get_unaligned_be32(body + ARFS_EV_RULE_AGED_OFF_FILTER_ID);
		if (!arfs_rules_aged(p, filter_id))
			arfs_diag_inc(p, ARFS_DIAG_EV_RULE_AGED_UNKNOWN);
		break;
	case ARFS_EV_TABLE_FLUSHED:
		arfs_diag_inc(p, ARFS_DIAG_EV_TABLE_FLUSHED);
		arfs_rules_flushed(p);
		break;
	case ARFS_EV_ENGINE_STATE:
		arfs_diag_inc(p, ARFS_DIAG_EV_ENGINE_STATE);
		state = get_unaligned_be16(body + ARFS_EV_ENGINE_STATE_OFF_DISABLED);
		if (p->engine_disabled != !!state)
			arfs_info(p->dev, "device filter engine %s\n",
				  state ? "disabled" : "enabled");
		WRITE_ONCE(p->engine_disabled, !!state);
		break;
	}
	arfs_unlock_bh(p);
}

int arfs_rcv(struct sk_buff *skb, struct net_device *dev,
	     struct packet_type *pt, struct net_device *orig_dev)
{
	struct arfs_priv *p = container_of(pt, struct arfs_priv, pt);
	u8 buf[ARFS_HDR_LEN + ARFS_MAX_REPLY];
	unsigned int hlen, copied;
	u8 op;

	arfs_diag_inc(p, ARFS_DIAG_RX_FRAMES);
	if (skb->pkt_type != PACKET_HOST) {
		arfs_diag_inc(p, ARFS_DIAG_RX_DROP_NOT_HOST);
		goto drop;
	}
	if (!skb_mac_header_was_set(skb) ||
	    skb_mac_header(skb) + ETH_HLEN > skb->data ||
	    !ether_addr_equal(eth_hdr(skb)->h_source, arfs_device_mac)) {
		arfs_diag_inc(p, ARFS_DIAG_RX_DROP_SRC);
		goto drop;
	}
	if (skb->len < ARFS_HDR_LEN) {
		arfs_diag_inc(p, ARFS_DIAG_RX_DROP_SHORT);
		goto drop;
	}
	if (skb_copy_bits(skb, 0, buf, ARFS_HDR_LEN))
		goto drop;
	if (buf[ARFS_HDR_OFF_VERSION] < ARFS_PROTO_VERSION_MIN ||
	    buf[ARFS_HDR_OFF_VERSION] > ARFS_PROTO_VERSION) {
		arfs_diag_inc(p, ARFS_DIAG_RX_DROP_VERSION);
		goto drop;
	}
	hlen = get_unaligned_be16(buf + ARFS_HDR_OFF_LENGTH);
	if (hlen < ARFS_HDR_LEN || hlen > skb->len) {
		arfs_diag_inc(p, ARFS_DIAG_RX_DROP_LEN);
		goto drop;
	}
	if (get_unaligned_be32(buf + ARFS_HDR_OFF_RESERVED)) {
		arfs_diag_inc(p, ARFS_DIAG_RX_DROP_RESERVED);
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
		arfs_diag_inc(p, ARFS_DIAG_RX_DROP_OP);
	consume_skb(skb);
	return NET_RX_SUCCESS;
drop:
	kfree_skb(skb);
	return NET_RX_DROP;
}

/* ---- HELLO ------------------------------------------------------------ */

void arfs_hello(struct arfs_priv *p)
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
	/* an older device answers EPROTO: step down until it accepts */
	while (rc == -EPROTO && p->proto_version > ARFS_PROTO_VERSION_MIN) {
		WRITE_ONCE(p->proto_version, p->proto_version - 1);
		rc = arfs_cmd_exec(p, cmd, ARFS_OP_HELLO, NULL,
				   ARFS_HELLO_BODY_LEN, false);
	}
	if (p->proto_version < ARFS_PROTO_VERSION)
		arfs_info(p->dev, "device speaks control protocol v%u: no ntuple rules%s\n",
			  p->proto_version,
			  p->proto_version < 2 ? ", no RSS ops" : "");
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

/* ---- RSS (ethtool -x / -X) -------------------------------------------- */

/* a command followed by @extra bytes of request body */
static struct arfs_cmd *arfs_cmd_alloc(size_t extra)
{
	return kmalloc(sizeof(struct arfs_cmd) + extra, GFP_KERNEL);
}

/*
 * Ask the device for its RSS and copy it out: @indir and @key (either may be
 * NULL) must hold the sizes of the latest RSS_GET (p->rss_indir_size,
 * p->rss_key_size); with both NULL this only refreshes those sizes.  Sleeps
 * up to cmd_timeout_ms (RTNL held by the ethtool core).  -EOPNOTSUPP against
 * a version 1 device, -EAGAIN when the device's sizes changed since the
 * caller sized its buffers.
 */
int arfs_rss_get(struct arfs_priv *p, u32 *indir, u8 *key, u8 *hfunc)
{
	unsigned int key_len, n, i;
	struct arfs_cmd *cmd;
	const u8 *r;
	int rc;

	if (READ_ONCE(p->proto_version) < 2)
		return -EOPNOTSUPP;
	cmd = arfs_cmd_alloc(0);
	if (!cmd)
		return -ENOMEM;
	rc = arfs_cmd_exec(p, cmd, ARFS_OP_RSS_GET, NULL, ARFS_RSS_GET_BODY_LEN,
			   false);
	if (rc)
		goto out;
	r = cmd->reply;
	key_len = get_unaligned_be16(r + ARFS_RSS_OFF_KEY_LEN);
	n = get_unaligned_be16(r + ARFS_RSS_OFF_INDIR_SIZE);
	/* arfs_rx_completion() checked the sizes against the reply length */
	if ((indir || key) && p->rss_valid &&
	    (key_len != p->rss_key_size || n != p->rss_indir_size)) {
		rc = -EAGAIN;
	} else {
		if (hfunc)
			*hfunc = r[ARFS_RSS_OFF_HFUNC] == ARFS_RSS_HFUNC_TOEPLITZ ?
				 ETH_RSS_HASH_TOP : ETH_RSS_HASH_UNKNOWN;
		if (key)
			memcpy(key, r + ARFS_RSS_OFF_KEY, key_len);
		for (i = 0; indir && i < n; i++)
			indir[i] = get_unaligned_be16(r + ARFS_RSS_OFF_KEY + key_len +
						      i * ARFS_RSS_INDIR_ENTRY_LEN);
	}
	p->rss_key_size = key_len;
	p->rss_indir_size = n;
	p->rss_valid = true;
out:
	kfree(cmd);
	return rc;
}

/*
 * Change the device's RSS: @indir (p->rss_indir_size entries) and @key
 * (p->rss_key_size bytes) may be NULL to keep them, @hfunc is
 * ETH_RSS_HASH_NO_CHANGE, ETH_RSS_HASH_TOP or anything else, which the device
 * refuses with EOPNOTSUPP.  The device checks every value; its errno is
 * returned, negated.
 */
/*
 * RSS_SET (@ctx 0) or CTX_SET (RSS context @ctx, version 4): the body is the
 * context's ID, if any, then hfunc, the key and the table; a NULL key or
 * table keeps the device's.
 */
int arfs_rss_set_ctx(struct arfs_priv *p, u32 ctx, const u32 *indir,
		     const u8 *key, u8 hfunc)
{
	unsigned int key_len = key ? p->rss_key_size : 0;
	unsigned int n = indir ? p->rss_indir_size : 0;
	unsigned int head = ctx ? ARFS_CTX_SET_HDR_LEN : 0;
	struct arfs_cmd *cmd;
	unsigned int i, len;
	u8 *b, *rss;
	int rc;

	if (READ_ONCE(p->proto_version) < (ctx ? 4 : 2))
		return -EOPNOTSUPP;
	if (!p->rss_valid || key_len > ARFS_RSS_KEY_MAX || n > ARFS_RSS_INDIR_MAX)
		return -EINVAL;
	len = head + ARFS_RSS_SET_HDR_LEN + key_len + n * ARFS_RSS_INDIR_ENTRY_LEN;
	cmd = arfs_cmd_alloc(len);
	if (!cmd)
		return -ENOMEM;
	b = (u8 *)(cmd + 1);
	memset(b, 0, head + ARFS_RSS_SET_HDR_LEN);
	if (ctx)
		put_unaligned_be32(ctx, b + ARFS_CTX_OFF_ID);
	rss = b + head;
	rss[ARFS_RSS_SET_OFF_HFUNC] = hfunc;
	put_unaligned_be16(key_len, rss + ARFS_RSS_SET_OFF_KEY_LEN);
	put_unaligned_be16(n, rss + ARFS_RSS_SET_OFF_INDIR_SIZE);
	if (key_len)
		memcpy(rss + ARFS_RSS_SET_OFF_KEY, key, key_len);
	for (i = 0; i < n; i++) {
		/* the device refuses entries beyond its queues */
		put_unaligned_be16(min_t(u32, indir[i], U16_MAX),
				   rss + ARFS_RSS_SET_OFF_KEY + key_len +
				   i * ARFS_RSS_INDIR_ENTRY_LEN);
	}
	rc = arfs_cmd_exec(p, cmd, ctx ? ARFS_OP_CTX_SET : ARFS_OP_RSS_SET, b,
			   len, false);
	kfree(cmd);
	return rc;
}

int arfs_rss_set(struct arfs_priv *p, const u32 *indir, const u8 *key,
		 u8 hfunc)
{
	return arfs_rss_set_ctx(p, 0, indir, key, hfunc);
}

/* ---- plain configuration requests ------------------------------------- */

/*
 * Send a request answered with a plain completion (RULE_SET, RULE_DEL; the
 * body is built by the caller) and wait for it: 0, the device's errno
 * negated, or a local error as arfs_cmd_exec().  Sleeps up to
 * cmd_timeout_ms.  @force: also after arfs_cmd_close() (detach).
 */
int arfs_cmd_config(struct arfs_priv *p, u8 op, const u8 *body,
		    unsigned int body_len, bool force)
{
	struct arfs_cmd *cmd = arfs_cmd_alloc(0);
	int rc;

	if (!cmd)
		return -ENOMEM;
	rc = arfs_cmd_exec(p, cmd, op, body, body_len, force);
	kfree(cmd);
	return rc;
}
