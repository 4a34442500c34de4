"""STOPGAP until the kernels branch lands: plain-PyTorch paged attention with the kernels contract.

Delete once `kernels.paged_attention_ref` / `write_kv_cache_ref` exist.
"""

from __future__ import annotations

import torch


def write_kv_cache_ref(k, v, k_cache, v_cache, slot_mapping) -> None:
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    bs = k_cache.shape[1]
    blk, off = slots // bs, slots % bs
    k_cache[blk, off] = k[keep].to(k_cache.dtype)
    v_cache[blk, off] = v[keep].to(v_cache.dtype)


def paged_attention_ref(q, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale,
                        max_query_len, max_seq_len, out=None):
    num_tokens, hq, d = q.shape
    hkv = k_cache.shape[2]
    bs = k_cache.shape[1]
    if out is None:
        out = torch.empty_like(q)
    qsl = query_start_loc.tolist()
    sl = seq_lens.tolist()
    for b in range(len(sl)):
        s, e = qsl[b], qsl[b + 1]
        if e == s:
            continue
        n = sl[b]
        nblk = -(-n // bs)
        blocks = block_tables[b, :nblk].long()
        kk = k_cache[blocks].reshape(-1, hkv, d)[:n].float()
        vv = v_cache[blocks].reshape(-1, hkv, d)[:n].float()
        kk = kk.repeat_interleave(hq // hkv, dim=1)
        vv = vv.repeat_interleave(hq // hkv, dim=1)
        qq = q[s:e].float()
        scores = torch.einsum("thd,shd->hts", qq, kk) * scale
        ql = e - s
        qpos = torch.arange(n - ql, n, device=q.device)[:, None]
        kpos = torch.arange(n, device=q.device)[None, :]
        scores = scores.masked_fill(kpos > qpos, float("-inf"))
        p = scores.softmax(-1)
        out[s:e] = torch.einsum("hts,shd->thd", p, vv).to(out.dtype)
    return out
