// SPDX-License-Identifier: GPL-2.0
/*
 * arfs_virtio RSS hash fields (ethtool -n/-N rx-flow-hash, netlink
 * flow-hash and input-xfrm): HASH_GET / HASH_SET to the device, which hashes
 * on the selected fields of each flow type and, under sym-xor, XORs source
 * and destination before hashing.
 *
 * The device has one field set per flow type tcp4, udp4, tcp6, udp6 and one
 * for the other IPv4 and IPv6 packets (ethtool's ip4 / ip6); it hashes on
 * addresses and ports only (RXH_IP_SRC, RXH_IP_DST, RXH_L4_B_0_1,
 * RXH_L4_B_2_3) and refuses anything else with EINVAL.  Other flow types
 * (sctp4, ah4, ...) are not separate for it: EOPNOTSUPP, which the netlink
 * dump skips.
 *
 * The ethtool core calls these under RTNL, which also guards a copy of the
 * device's fields (arfs_priv.hash_body).  Only this driver changes them, and
 * the core asks for every flow type at each netlink RSS get and after each
 * change (the notification), so after the first HASH_GET they are answered
 * from the copy, which each accepted HASH_SET updates; NETDEV_UP drops it.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/ethtool.h>
#include <linux/kernel.h>
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

static_assert(ARFS_HASH_OFF_PAD + 3 == ARFS_HASH_BODY_LEN);
static_assert(ARFS_TS_LEN + ARFS_HASH_BODY_LEN <= ARFS_MAX_REPLY);
/* the device's field bits are ethtool's */
static_assert(ARFS_HASH_IP_SRC == RXH_IP_SRC);
static_assert(ARFS_HASH_IP_DST == RXH_IP_DST);
static_assert(ARFS_HASH_L4_B_0_1 == RXH_L4_B_0_1);
static_assert(ARFS_HASH_L4_B_2_3 == RXH_L4_B_2_3);

/* the body offset of @flow_type's field set, or -EOPNOTSUPP */
static int arfs_hash_off(u32 flow_type)
{
	switch (flow_type & ~(FLOW_EXT | FLOW_MAC_EXT | FLOW_RSS)) {
	case TCP_V4_FLOW:
		return ARFS_HASH_OFF_TCP4;
	case UDP_V4_FLOW:
		return ARFS_HASH_OFF_UDP4;
	case IPV4_FLOW:
		return ARFS_HASH_OFF_IP4;
	case TCP_V6_FLOW:
		return ARFS_HASH_OFF_TCP6;
	case UDP_V6_FLOW:
		return ARFS_HASH_OFF_UDP6;
	case IPV6_FLOW:
		return ARFS_HASH_OFF_IP6;
	}
	return -EOPNOTSUPP;
}

/*
 * The device's fields (the 28-byte HASH_GET body) into @body: from the cache,
 * or from HASH_GET, which sleeps up to cmd_timeout_ms.  -EOPNOTSUPP against a
 * device older than version 3.
 */
static int arfs_hash_get(struct arfs_priv *p, u8 *body)
{
	struct arfs_cmd *cmd;
	int rc;

	if (READ_ONCE(p->proto_version) < 3)
		return -EOPNOTSUPP;
	if (p->hash_valid) {
		memcpy(body, p->hash_body, ARFS_HASH_BODY_LEN);
		return 0;
	}
	cmd = kmalloc(sizeof(*cmd), GFP_KERNEL);
	if (!cmd)
		return -ENOMEM;
	rc = arfs_cmd_exec(p, cmd, ARFS_OP_HASH_GET, NULL, 0, false);
	if (!rc) {
		/* arfs_rx_completion() checked the reply's length */
		memcpy(p->hash_body, cmd->reply + ARFS_TS_LEN, ARFS_HASH_BODY_LEN);
		memcpy(body, p->hash_body, ARFS_HASH_BODY_LEN);
		p->hash_valid = true;
	}
	kfree(cmd);
	return rc;
}

/*
 * HASH_SET: @data for the field set at @off (or none: @off < 0) and the
 * input transformation @xfrm (ARFS_HASH_XFRM_*), everything else kept; the
 * cache follows what the device accepted.
 */
static int arfs_hash_set(struct arfs_priv *p, int off, u32 data, u8 xfrm)
{
	u8 body[ARFS_HASH_BODY_LEN];
	int rc, i;

	if (READ_ONCE(p->proto_version) < 3)
		return -EOPNOTSUPP;
	memset(body, 0, sizeof(body));
	for (i = 0; i <= ARFS_HASH_OFF_IP6; i += 4)
		put_unaligned_be32(i == off ? data : ARFS_HASH_KEEP, body + i);
	body[ARFS_HASH_OFF_XFRM] = xfrm;
	rc = arfs_cmd_config(p, ARFS_OP_HASH_SET, body, sizeof(body), false);
	if (!rc && p->hash_valid) {
		if (off >= 0)
			put_unaligned_be32(data, p->hash_body + off);
		if (xfrm != ARFS_HASH_XFRM_KEEP)
			p->hash_body[ARFS_HASH_OFF_XFRM] = xfrm;
	}
	return rc;
}

int arfs_hash_fields_get(struct arfs_priv *p, u32 flow_type, u64 *data)
{
	u8 body[ARFS_HASH_BODY_LEN];
	int off = arfs_hash_off(flow_type);
	int rc;

	if (off < 0)
		return off;
	rc = arfs_hash_get(p, body);
	if (rc)
		return rc;
	*data = get_unaligned_be32(body + off);
	return 0;
}

int arfs_hash_fields_set(struct arfs_priv *p, u32 flow_type, u64 data)
{
	int off = arfs_hash_off(flow_type);

	if (off < 0)
		return off;
	/* the device's own check names the same limits: refuse early */
	if (data & ~(u64)(RXH_IP_SRC | RXH_IP_DST | RXH_L4_B_0_1 | RXH_L4_B_2_3))
		return -EINVAL;
	return arfs_hash_set(p, off, (u32)data, ARFS_HASH_XFRM_KEEP);
}

/* RXH_XFRM_* of the device (0 or RXH_XFRM_SYM_XOR) */
int arfs_hash_xfrm_get(struct arfs_priv *p, u8 *xfrm)
{
	u8 body[ARFS_HASH_BODY_LEN];
	int rc = arfs_hash_get(p, body);

	if (rc)
		return rc;
	*xfrm = body[ARFS_HASH_OFF_XFRM] == ARFS_HASH_XFRM_SYM_XOR ?
		RXH_XFRM_SYM_XOR : 0;
	return 0;
}

/* @xfrm: 0, RXH_XFRM_SYM_XOR or RXH_XFRM_NO_CHANGE; others -EOPNOTSUPP */
int arfs_hash_xfrm_set(struct arfs_priv *p, u8 xfrm)
{
	u8 cur;

	if (xfrm == RXH_XFRM_NO_CHANGE)
		return 0;
	if (xfrm & ~RXH_XFRM_SYM_XOR)
		return -EOPNOTSUPP;
	if (!arfs_hash_xfrm_get(p, &cur) && cur == xfrm)
		return 0;
	return arfs_hash_set(p, -1, 0, xfrm ? ARFS_HASH_XFRM_SYM_XOR :
				   ARFS_HASH_XFRM_NONE);
}

/* NETDEV_UP: ask the device again (it may have been reset while down) */
void arfs_hash_dev_up(struct arfs_priv *p)
{
	p->hash_valid = false;
}

#ifdef ARFS_HAVE_RXFH_FIELDS
/* rx-flow-hash since 6.17 (before: ETHTOOL_GRXFH/SRXFH in get/set_rxnfc) */
int arfs_get_rxfh_fields(struct net_device *dev, struct ethtool_rxfh_fields *f)
{
	u64 data;
	int rc;

	rc = arfs_hash_fields_get(arfs_from_ethtool(dev), f->flow_type, &data);
	if (!rc)
		f->data = data;
	return rc;
}

int arfs_set_rxfh_fields(struct net_device *dev,
			 const struct ethtool_rxfh_fields *f,
			 struct netlink_ext_ack *extack)
{
	if (f->rss_context)
		return -EOPNOTSUPP;
	return arfs_hash_fields_set(arfs_from_ethtool(dev), f->flow_type,
				    f->data);
}
#endif
