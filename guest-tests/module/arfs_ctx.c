// SPDX-License-Identifier: GPL-2.0
/*
 * RSS contexts (ethtool -X DEV context new|N, netlink rss-create-act and
 * rss-delete-act): each is a key and an indirection table of the device's
 * own, set with CTX_SET and removed with CTX_DEL (protocol version 4).  The
 * ethtool core keeps the contexts' settings and IDs; the device only needs
 * them to steer.  Kernels before 6.11 have no context ops: there the file
 * builds to nothing and ethtool answers EOPNOTSUPP as before.
 */
#include <linux/ethtool.h>
#include <linux/netdevice.h>
#include <linux/random.h>
#include <linux/rtnetlink.h>
#include <linux/slab.h>
#include <linux/xarray.h>
/* Kbuild probes the tree for <linux/unaligned.h> (since 6.12) */
#ifdef ARFS_HAVE_LINUX_UNALIGNED_H
#include <linux/unaligned.h>
#else
#include <asm/unaligned.h>
#endif

#include "arfs.h"

#ifdef ARFS_HAVE_RXFH_CONTEXT

/*
 * The device hashes every context on the fields and input-xfrm of context 0
 * (HASH_SET): a context may not ask for another transformation.
 */
static int arfs_ctx_xfrm(struct arfs_priv *p, struct ethtool_rxfh_context *ctx,
			 const struct ethtool_rxfh_param *rxfh,
			 struct netlink_ext_ack *extack)
{
#ifdef ARFS_HAVE_INPUT_XFRM
	u8 xfrm = 0;

	if (arfs_hash_xfrm_get(p, &xfrm))
		xfrm = 0;
	if (rxfh->input_xfrm != RXH_XFRM_NO_CHANGE && rxfh->input_xfrm != xfrm) {
		NL_SET_ERR_MSG(extack,
			       "arfs_virtio: contexts share the input-xfrm of context 0");
		return -EOPNOTSUPP;
	}
	ctx->input_xfrm = xfrm;
#endif
	return 0;
}

/* Fill what @rxfh leaves to the driver: the defaults the device uses too */
static void arfs_ctx_defaults(struct net_device *dev,
			      struct ethtool_rxfh_context *ctx,
			      const struct ethtool_rxfh_param *rxfh,
			      u32 **indir, u8 **key)
{
	u32 i;

	if (!rxfh->indir) {
		*indir = ethtool_rxfh_context_indir(ctx);
		for (i = 0; i < ctx->indir_size; i++)
			(*indir)[i] =
				ethtool_rxfh_indir_default(i,
							   dev->real_num_rx_queues);
	}
	if (!rxfh->key) {
		*key = ethtool_rxfh_context_key(ctx);
		/* a random key, as drivers give their default context */
		get_random_bytes(*key, ctx->key_size);
	}
	if (rxfh->hfunc == ETH_RSS_HASH_NO_CHANGE)
		ctx->hfunc = ETH_RSS_HASH_TOP;
}

int arfs_create_rxfh_context(struct net_device *dev,
			     struct ethtool_rxfh_context *ctx,
			     const struct ethtool_rxfh_param *rxfh,
			     struct netlink_ext_ack *extack)
{
	struct arfs_priv *p = arfs_from_ethtool(dev);
	u32 *indir = rxfh->indir;
	u8 *key = rxfh->key;
	u8 hfunc = rxfh->hfunc;
	int rc;

	if (hfunc != ETH_RSS_HASH_NO_CHANGE && hfunc != ETH_RSS_HASH_TOP) {
		NL_SET_ERR_MSG(extack, "arfs_virtio: the device hashes with Toeplitz only");
		return -EOPNOTSUPP;
	}
	if (!p->rss_valid)
		arfs_rss_get(p, NULL, NULL, NULL);
	if (!p->rss_valid || ctx->indir_size != p->rss_indir_size ||
	    ctx->key_size != p->rss_key_size)
		return -EOPNOTSUPP;
	rc = arfs_ctx_xfrm(p, ctx, rxfh, extack);
	if (rc)
		return rc;
	arfs_ctx_defaults(dev, ctx, rxfh, &indir, &key);
	rc = arfs_rss_set_ctx(p, rxfh->rss_context, indir, key, hfunc);
	if (rc == -ENOSPC)
		NL_SET_ERR_MSG(extack, "arfs_virtio: the device has no RSS context left");
	return rc;
}

int arfs_modify_rxfh_context(struct net_device *dev,
			     struct ethtool_rxfh_context *ctx,
			     const struct ethtool_rxfh_param *rxfh,
			     struct netlink_ext_ack *extack)
{
	struct arfs_priv *p = arfs_from_ethtool(dev);
	int rc;

	if (rxfh->hfunc != ETH_RSS_HASH_NO_CHANGE &&
	    rxfh->hfunc != ETH_RSS_HASH_TOP)
		return -EOPNOTSUPP;
	rc = arfs_ctx_xfrm(p, ctx, rxfh, extack);
	if (rc)
		return rc;
	if (!rxfh->indir && !rxfh->key)
		return 0;
	return arfs_rss_set_ctx(p, rxfh->rss_context, rxfh->indir, rxfh->key,
				rxfh->hfunc);
}

int arfs_remove_rxfh_context(struct net_device *dev,
			     struct ethtool_rxfh_context *ctx, u32 rss_context,
			     struct netlink_ext_ack *extack)
{
	struct arfs_priv *p = arfs_from_ethtool(dev);
	u8 body[ARFS_CTX_DEL_BODY_LEN];

	put_unaligned_be32(rss_context, body + ARFS_CTX_OFF_ID);
	return arfs_cmd_config(p, ARFS_OP_CTX_DEL, body, sizeof(body), false);
}

/*
 * A rule "context @ctx action @offset" (RTNL): every queue it can reach, an
 * entry of the context's table plus @offset, must be below @nq, the RX
 * queues in use, as drivers that add the two check (cap_rss_rxnfc_adds).
 * Context 0 is the device's own table: only @offset is checked, by the core.
 */
int arfs_ctx_check_rule(struct arfs_priv *p, u32 ctx, u32 offset, u32 nq)
{
	struct net_device *dev = p->dev;
	struct ethtool_rxfh_context *c;
	u32 i, top = 0;
	int rc = 0;

	if (!ctx)
		return 0;
	mutex_lock(&dev->ethtool->rss_lock);
	c = xa_load(&dev->ethtool->rss_ctx, ctx);
	if (c) {
		for (i = 0; i < c->indir_size; i++)
			top = max(top, ethtool_rxfh_context_indir(c)[i]);
		if (top + offset >= nq)
			rc = -EINVAL;
	} else {
		rc = -EINVAL;
	}
	mutex_unlock(&dev->ethtool->rss_lock);
	return rc;
}

/*
 * Detach, under RTNL and before the driver's own ethtool ops come back:
 * the core would call those for the contexts we created (virtio_net has no
 * context ops), so the contexts go now, on the device and in the core, as
 * netdev_rss_contexts_free() removes them at unregister.
 */
void arfs_ctx_detach(struct arfs_priv *p)
{
	struct net_device *dev = p->dev;
	struct ethtool_rxfh_context *ctx;
	unsigned long id;

	ASSERT_RTNL();
	mutex_lock(&dev->ethtool->rss_lock);
	xa_for_each(&dev->ethtool->rss_ctx, id, ctx) {
		xa_erase(&dev->ethtool->rss_ctx, id);
		arfs_remove_rxfh_context(dev, ctx, id, NULL);
		kfree(ctx);
	}
	mutex_unlock(&dev->ethtool->rss_lock);
}

#else

int arfs_ctx_check_rule(struct arfs_priv *p, u32 ctx, u32 offset, u32 nq)
{
	return ctx ? -EOPNOTSUPP : 0;
}

void arfs_ctx_detach(struct arfs_priv *p)
{
}

#endif /* ARFS_HAVE_RXFH_CONTEXT */
