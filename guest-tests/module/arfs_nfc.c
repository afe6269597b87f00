// SPDX-License-Identifier: GPL-2.0
/*
 * arfs_virtio ethtool ntuple rules (ethtool -N/-n flow-type tcp4|udp4|tcp6|
 * udp6 ... action Q|-1 [loc L]): the rule store, get_rxnfc/set_rxnfc, and the
 * RULE_SET / RULE_DEL requests that install them in the device, where they
 * are checked before the aRFS filters (lowest location first).
 *
 * Like mlx5 and ixgbe, the driver keeps every rule as the user gave it
 * (struct ethtool_rx_flow_spec, by location) and answers ethtool -n from that
 * store; a rule is stored only after the device accepted it.  Turning
 * ntuple-filters off removes all rules (RULE_DEL ALL), as does detach.
 *
 * Locking: the store (arfs_priv.nfc_*) is read and changed under RTNL only:
 * ethtool holds it for get_rxnfc/set_rxnfc on virtio_net (7.x takes only the
 * instance lock for drivers that opted into it, virtio_net has not),
 * __netdev_update_features() for ndo_set_features, and the netdev notifier
 * runs under it.  arfs_detach() frees the store after it gave the device its
 * original ops back under RTNL, when none of those can reach it any more.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/ethtool.h>
#include <linux/in.h>
#include <linux/kernel.h>
#include <linux/list.h>
#include <linux/netdevice.h>
#include <linux/rtnetlink.h>
#include <linux/slab.h>
#include <linux/string.h>
/* Kbuild probes the tree for <linux/unaligned.h> (since 6.12) */
#ifdef ARFS_HAVE_LINUX_UNALIGNED_H
#include <linux/unaligned.h>
#else
#include <asm/unaligned.h>
#endif

#include "arfs.h"

static_assert(ARFS_RULE_OFF_DST_PORT_MASK + 2 == ARFS_RULE_SET_BODY_LEN);
static_assert(ARFS_RULE_OFF_SRC_MASK - ARFS_RULE_OFF_SRC_ADDR == sizeof(struct in6_addr));
static_assert(ARFS_RULE_DEL_OFF_LOCATION + 4 == ARFS_RULE_DEL_BODY_LEN);
static_assert(ARFS_RULE_LOC_MAX < RX_CLS_LOC_SPECIAL);

/* the first protocol version with RULE_SET / RULE_DEL */
#define ARFS_NFC_PROTO_VERSION	3

static struct arfs_nfc_rule *arfs_nfc_find(struct arfs_priv *p, u32 loc)
{
	struct arfs_nfc_rule *rule;

	list_for_each_entry(rule, &p->nfc_rules, node) {
		if (rule->fs.location == loc)
			return rule;
		if (rule->fs.location > loc)
			break;
	}
	return NULL;
}

/* keep the list sorted by location (there is no rule at @rule's yet) */
static void arfs_nfc_insert(struct arfs_priv *p, struct arfs_nfc_rule *rule)
{
	struct arfs_nfc_rule *pos;

	list_for_each_entry(pos, &p->nfc_rules, node)
		if (pos->fs.location > rule->fs.location)
			break;
	/* before @pos, or at the tail when the walk ended on the head */
	list_add_tail(&rule->node, &pos->node);
	p->nfc_count++;
}

static void arfs_nfc_free_all(struct arfs_priv *p)
{
	struct arfs_nfc_rule *rule, *tmp;

	list_for_each_entry_safe(rule, tmp, &p->nfc_rules, node) {
		list_del(&rule->node);
		kfree(rule);
	}
	p->nfc_count = 0;
}

/*
 * A location for RX_CLS_LOC_ANY / _FIRST (the lowest free one, the highest
 * priority) or RX_CLS_LOC_LAST (the highest free one); -ENOSPC when all are
 * taken, -EINVAL for another special value.
 */
static int arfs_nfc_pick_loc(struct arfs_priv *p, u32 special)
{
	struct arfs_nfc_rule *rule;
	int loc;

	switch (special) {
	case RX_CLS_LOC_ANY:
	case RX_CLS_LOC_FIRST:
		loc = 0;
		list_for_each_entry(rule, &p->nfc_rules, node) {
			if (rule->fs.location != loc)
				break;
			loc++;
		}
		return loc < ARFS_RULE_LOC_MAX ? loc : -ENOSPC;
	case RX_CLS_LOC_LAST:
		loc = ARFS_RULE_LOC_MAX - 1;
		list_for_each_entry_reverse(rule, &p->nfc_rules, node) {
			if (rule->fs.location != loc)
				break;
			loc--;
		}
		return loc >= 0 ? loc : -ENOSPC;
	default:
		return -EINVAL;
	}
}

/* the rule with the same flow type and match as @fs (action aside), if any */
static struct arfs_nfc_rule *arfs_nfc_same_match(struct arfs_priv *p,
						 const struct ethtool_rx_flow_spec *fs)
{
	struct arfs_nfc_rule *rule;

	list_for_each_entry(rule, &p->nfc_rules, node) {
		if ((rule->fs.flow_type & ~FLOW_RSS) == (fs->flow_type & ~FLOW_RSS) &&
		    !memcmp(&rule->fs.h_u, &fs->h_u, sizeof(fs->h_u)) &&
		    !memcmp(&rule->fs.m_u, &fs->m_u, sizeof(fs->m_u)))
			return rule;
	}
	return NULL;
}

/*
 * ethtool -L (RTNL): a rule "context N action Q" must keep every queue it
 * can reach; the core checks the other rules and the tables itself.
 */
int arfs_set_channels(struct net_device *dev, struct ethtool_channels *ch)
{
	struct arfs_priv *p = arfs_from_ethtool(dev);
	struct arfs_nfc_rule *rule;
	u32 nq = ch->combined_count + ch->rx_count;
	int rc;

	list_for_each_entry(rule, &p->nfc_rules, node) {
		if (!(rule->fs.flow_type & FLOW_RSS))
			continue;
		rc = arfs_ctx_check_rule(p, rule->rss_context,
					 ethtool_get_flow_spec_ring(rule->fs.ring_cookie),
					 nq);
		if (rc)
			return rc;
	}
	return p->orig_eops->set_channels(dev, ch);
}

/*
 * What the device can match: TCP/UDP over IPv4/IPv6 on addresses and ports
 * (ethtool's masks: a set bit takes part in the match), delivered to a queue
 * or dropped, or (context N, FLOW_RSS) to the queue an RSS context picks plus
 * the rule's queue.  -EOPNOTSUPP for other flow types, the VLAN and MAC
 * extensions and contexts on a device older than version 4; -EINVAL for a
 * TOS/traffic class mask, any other mask bit, a VF, a queue beyond the
 * enabled RX queues or a context rule that drops.
 */
static int arfs_nfc_check(struct arfs_priv *p,
			  const struct ethtool_rx_flow_spec *fs)
{
	size_t used;

	/* context N: version 4 devices; the queue is an offset, never a drop */
	if (fs->flow_type & FLOW_RSS) {
		if (READ_ONCE(p->proto_version) < 4)
			return -EOPNOTSUPP;
		if (fs->ring_cookie == RX_CLS_FLOW_DISC)
			return -EINVAL;
	}
	switch (fs->flow_type & ~FLOW_RSS) {
	case TCP_V4_FLOW:
	case UDP_V4_FLOW:
		if (fs->m_u.tcp_ip4_spec.tos)
			return -EINVAL;
		used = sizeof(fs->m_u.tcp_ip4_spec);
		break;
	case TCP_V6_FLOW:
	case UDP_V6_FLOW:
		if (fs->m_u.tcp_ip6_spec.tclass)
			return -EINVAL;
		used = sizeof(fs->m_u.tcp_ip6_spec);
		break;
	default:
		/* also FLOW_EXT and FLOW_MAC_EXT */
		return -EOPNOTSUPP;
	}
	if (memchr_inv((const u8 *)&fs->m_u + used, 0, sizeof(fs->m_u) - used))
		return -EINVAL;

	if (fs->ring_cookie == RX_CLS_FLOW_DISC)
		return 0;
	/* the VF byte (and the bits above it) must be 0 */
	if (upper_32_bits(fs->ring_cookie) ||
	    ethtool_get_flow_spec_ring(fs->ring_cookie) >=
	    p->dev->real_num_rx_queues)
		return -EINVAL;
	return 0;
}

/* @n big-endian words of address and mask; the value is sent masked */
static void arfs_nfc_put_addr(u8 *b, const __be32 *v, const __be32 *m,
			      unsigned int n)
{
	unsigned int i;
	__be32 x;

	for (i = 0; i < n; i++) {
		x = v[i] & m[i];
		memcpy(b + 4 * i, &x, 4);
		memcpy(b + sizeof(struct in6_addr) + 4 * i, &m[i], 4);
	}
}

static void arfs_nfc_put_port(u8 *b, __be16 v, __be16 m)
{
	v &= m;
	memcpy(b, &v, 2);
	memcpy(b + 2, &m, 2);
}

/* the RULE_SET body of a rule that passed arfs_nfc_check() */
static void arfs_nfc_encode(const struct ethtool_rx_flow_spec *fs, u32 ctx,
			    u8 *b)
{
	u32 flow_type = fs->flow_type & ~FLOW_RSS;
	const struct ethtool_tcpip4_spec *v4 = &fs->h_u.tcp_ip4_spec;
	const struct ethtool_tcpip4_spec *m4 = &fs->m_u.tcp_ip4_spec;
	const struct ethtool_tcpip6_spec *v6 = &fs->h_u.tcp_ip6_spec;
	const struct ethtool_tcpip6_spec *m6 = &fs->m_u.tcp_ip6_spec;

	memset(b, 0, ARFS_RULE_SET_BODY_LEN);
	put_unaligned_be32(fs->location, b + ARFS_RULE_OFF_LOCATION);
	if (fs->ring_cookie == RX_CLS_FLOW_DISC) {
		b[ARFS_RULE_OFF_ACTION] = ARFS_RULE_ACTION_DROP;
	} else {
		b[ARFS_RULE_OFF_ACTION] = ARFS_RULE_ACTION_QUEUE;
		put_unaligned_be16(ethtool_get_flow_spec_ring(fs->ring_cookie),
				   b + ARFS_RULE_OFF_RXQ);
	}
	if (fs->flow_type & FLOW_RSS) {
		b[ARFS_RULE_OFF_FLAGS] = ARFS_RULE_FLAG_RSS;
		put_unaligned_be16(ctx, b + ARFS_RULE_OFF_CONTEXT);
	}
	b[ARFS_RULE_OFF_L4_PROTO] = flow_type == TCP_V4_FLOW ||
				    flow_type == TCP_V6_FLOW ?
				    IPPROTO_TCP : IPPROTO_UDP;
	if (flow_type == TCP_V4_FLOW || flow_type == UDP_V4_FLOW) {
		b[ARFS_RULE_OFF_IP_VERSION] = 4;
		arfs_nfc_put_addr(b + ARFS_RULE_OFF_SRC_ADDR, &v4->ip4src,
				  &m4->ip4src, 1);
		arfs_nfc_put_addr(b + ARFS_RULE_OFF_DST_ADDR, &v4->ip4dst,
				  &m4->ip4dst, 1);
		arfs_nfc_put_port(b + ARFS_RULE_OFF_SRC_PORT, v4->psrc, m4->psrc);
		arfs_nfc_put_port(b + ARFS_RULE_OFF_DST_PORT, v4->pdst, m4->pdst);
	} else {
		b[ARFS_RULE_OFF_IP_VERSION] = 6;
		arfs_nfc_put_addr(b + ARFS_RULE_OFF_SRC_ADDR, v6->ip6src,
				  m6->ip6src, 4);
		arfs_nfc_put_addr(b + ARFS_RULE_OFF_DST_ADDR, v6->ip6dst,
				  m6->ip6dst, 4);
		arfs_nfc_put_port(b + ARFS_RULE_OFF_SRC_PORT, v6->psrc, m6->psrc);
		arfs_nfc_put_port(b + ARFS_RULE_OFF_DST_PORT, v6->pdst, m6->pdst);
	}
}

static int arfs_nfc_send_del(struct arfs_priv *p, u32 loc, bool force)
{
	u8 b[ARFS_RULE_DEL_BODY_LEN];

	put_unaligned_be32(loc, b + ARFS_RULE_DEL_OFF_LOCATION);
	return arfs_cmd_config(p, ARFS_OP_RULE_DEL, b, sizeof(b), force);
}

/* RULE_DEL ALL; @force: also after arfs_cmd_close() (detach) */
static int arfs_nfc_del_all(struct arfs_priv *p, bool force)
{
	int rc = arfs_nfc_send_del(p, ARFS_RULE_LOC_ALL, force);

	return rc == -ENOENT ? 0 : rc;
}

/* the RULE_DEL ALL owed since ntuple-filters went off while the link was down */
static int arfs_nfc_send_pending(struct arfs_priv *p)
{
	int rc;

	if (!p->nfc_flush_pending)
		return 0;
	rc = arfs_nfc_del_all(p, false);
	if (!rc)
		p->nfc_flush_pending = false;
	return rc;
}

static int arfs_nfc_ins(struct arfs_priv *p, struct ethtool_rxnfc *info)
{
	struct ethtool_rx_flow_spec *fs = &info->fs;
	struct arfs_nfc_rule tmp = {}, *rule = NULL, *old, *same;
	u8 b[ARFS_RULE_SET_BODY_LEN];
	u32 loc = fs->location;
	int rc;

	if (!(p->dev->features & NETIF_F_NTUPLE) ||
	    READ_ONCE(p->proto_version) < ARFS_NFC_PROTO_VERSION)
		return -EOPNOTSUPP;
	rc = arfs_nfc_check(p, fs);
	if (rc)
		return rc;
	if (fs->flow_type & FLOW_RSS) {
		if (info->rss_context > U16_MAX)
			return -EINVAL;
		rc = arfs_ctx_check_rule(p, info->rss_context,
					 ethtool_get_flow_spec_ring(fs->ring_cookie),
					 p->dev->real_num_rx_queues);
		if (rc)
			return rc;
	}
	same = arfs_nfc_same_match(p, fs);
	if ((loc & RX_CLS_LOC_SPECIAL) && same) {
		/* the same match again: it replaces the rule that has it */
		loc = same->fs.location;
	} else if (loc & RX_CLS_LOC_SPECIAL) {
		rc = arfs_nfc_pick_loc(p, loc);
		if (rc < 0)
			return rc;
		loc = rc;
	} else if (loc >= ARFS_RULE_LOC_MAX) {
		return -EINVAL;
	}
	/* a down interface drops what it would send: say so at once */
	if (!netif_running(p->dev))
		return -ENETDOWN;
	rc = arfs_nfc_send_pending(p);
	if (rc)
		return rc;

	tmp.fs = *fs;
	tmp.fs.location = loc;
	tmp.rss_context = fs->flow_type & FLOW_RSS ? info->rss_context : 0;
	old = arfs_nfc_find(p, loc);
	if (!old) {
		/* allocated first: once the device took the rule, keep it */
		rule = kmemdup(&tmp, sizeof(tmp), GFP_KERNEL);
		if (!rule)
			return -ENOMEM;
	}
	arfs_nfc_encode(&tmp.fs, tmp.rss_context, b);
	rc = arfs_cmd_config(p, ARFS_OP_RULE_SET, b, sizeof(b), false);
	if (rc) {
		/* the device refused it (or did not answer): nothing changes */
		kfree(rule);
		return rc;
	}
	if (old) {
		old->fs = tmp.fs;
		old->rss_context = tmp.rss_context;
	} else {
		arfs_nfc_insert(p, rule);
	}
	/* ethtool prints "Added rule with ID <location>" */
	fs->location = loc;
	return 0;
}

static int arfs_nfc_del(struct arfs_priv *p, u32 loc)
{
	struct arfs_nfc_rule *rule;
	int rc;

	if (loc >= ARFS_RULE_LOC_MAX)
		return -EINVAL;
	rule = arfs_nfc_find(p, loc);
	if (!rule)
		return -ENOENT;
	if (!netif_running(p->dev))
		return -ENETDOWN;
	rc = arfs_nfc_send_del(p, loc, false);
	/* ENOENT: the device has already forgotten it, the store follows */
	if (rc && rc != -ENOENT)
		return rc;
	list_del(&rule->node);
	kfree(rule);
	p->nfc_count--;
	return 0;
}

int arfs_get_rxnfc(struct net_device *dev, struct ethtool_rxnfc *info,
		   u32 *rule_locs)
{
	struct arfs_priv *p = arfs_from_ethtool(dev);
	struct arfs_nfc_rule *rule;
	unsigned int n = 0;

	ASSERT_RTNL();
	switch (info->cmd) {
	case ETHTOOL_GRXCLSRLCNT:
		info->rule_cnt = p->nfc_count;
		/* the driver picks locations (RX_CLS_LOC_ANY) */
		info->data = ARFS_RULE_LOC_MAX | RX_CLS_LOC_SPECIAL;
		return 0;
	case ETHTOOL_GRXCLSRULE:
		if (info->fs.location >= ARFS_RULE_LOC_MAX)
			return -EINVAL;
		rule = arfs_nfc_find(p, info->fs.location);
		if (!rule)
			return -ENOENT;
		info->fs = rule->fs;
		/* with FLOW_RSS in fs.flow_type: the context the rule uses */
		info->rss_context = rule->rss_context;
		return 0;
	case ETHTOOL_GRXCLSRLALL:
		if (info->rule_cnt < p->nfc_count)
			return -EMSGSIZE;
		list_for_each_entry(rule, &p->nfc_rules, node)
			rule_locs[n++] = rule->fs.location;
		info->rule_cnt = n;
		info->data = ARFS_RULE_LOC_MAX;
		return 0;
	}
	/* ETHTOOL_GRXFH up to 6.16 (get_rxfh_fields later): the device's */
	if (info->cmd == ETHTOOL_GRXFH)
		return arfs_hash_fields_get(p, info->flow_type, &info->data);
	/*
	 * ETHTOOL_GRXRINGS is virtio_net's (up to 6.x; later kernels ask
	 * get_rx_ring_count instead, which the ops copy keeps as it is).
	 */
	if (p->orig_eops->get_rxnfc)
		return p->orig_eops->get_rxnfc(dev, info, rule_locs);
	if (info->cmd == ETHTOOL_GRXRINGS) {
		info->data = dev->real_num_rx_queues;
		return 0;
	}
	return -EOPNOTSUPP;
}

int arfs_set_rxnfc(struct net_device *dev, struct ethtool_rxnfc *info)
{
	struct arfs_priv *p = arfs_from_ethtool(dev);

	ASSERT_RTNL();
	switch (info->cmd) {
	case ETHTOOL_SRXCLSRLINS:
		return arfs_nfc_ins(p, info);
	case ETHTOOL_SRXCLSRLDEL:
		return arfs_nfc_del(p, info->fs.location);
	}
	/* ETHTOOL_SRXFH up to 6.16 (set_rxfh_fields later): the device's */
	if (info->cmd == ETHTOOL_SRXFH)
		return arfs_hash_fields_set(p, info->flow_type, info->data);
	if (p->orig_eops->set_rxnfc)
		return p->orig_eops->set_rxnfc(dev, info);
	return -EOPNOTSUPP;
}

/*
 * ndo_set_features of the ops copy (RTNL held): ntuple-filters going off
 * removes every user rule before virtio_net sees the change.  When the
 * device does not confirm, the change fails and the rules stay.  While the
 * interface is down the request is owed and sent when it comes up.
 */
int arfs_nfc_set_features(struct net_device *dev, netdev_features_t features)
{
	struct arfs_priv *p = container_of(dev->netdev_ops, struct arfs_priv, ops);
	int rc;

	if ((dev->features & ~features & NETIF_F_NTUPLE) && p->nfc_count) {
		if (netif_running(dev)) {
			rc = arfs_nfc_del_all(p, false);
			if (rc) {
				arfs_warn(dev, "ntuple-filters off: removing %u rules failed (%d)\n",
					  p->nfc_count, rc);
				return rc;
			}
		} else {
			p->nfc_flush_pending = true;
		}
		arfs_nfc_free_all(p);
	}
	if (p->orig_ops->ndo_set_features)
		return p->orig_ops->ndo_set_features(dev, features);
	return 0;
}

/* NETDEV_UP (RTNL held): send a RULE_DEL ALL owed from while it was down */
void arfs_nfc_dev_up(struct arfs_priv *p)
{
	int rc = arfs_nfc_send_pending(p);

	if (rc)
		arfs_warn(p->dev, "removing the ntuple rules from the device failed (%d); retried with the next rule\n",
			  rc);
}

/*
 * Detach, after the original ops are back: remove the rules from the device
 * (@tell_device: the control channel works; forced past arfs_cmd_close())
 * and free the store.
 */
void arfs_nfc_detach(struct arfs_priv *p, bool tell_device)
{
	int rc;

	if (p->nfc_count || p->nfc_flush_pending) {
		if (tell_device) {
			rc = arfs_nfc_del_all(p, true);
			if (rc)
				arfs_warn(p->dev, "RULE_DEL of the ntuple rules on detach failed: %d\n",
					  rc);
		} else if (p->nfc_count) {
			arfs_info(p->dev, "interface down: %u ntuple rules stay in the device\n",
				  p->nfc_count);
		}
	}
	arfs_nfc_free_all(p);
	p->nfc_flush_pending = false;
}
