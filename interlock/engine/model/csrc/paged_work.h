// The work items of a paged-attention call, shared by cpu_ops.cpp (bf16) and cpu_ops_f32.cpp:
// one per (sequence, kv head, tile of up to `tile_tokens` query tokens), sorted by cost (the
// keys each of its tokens reads) so the dynamic OpenMP schedule hands out the long ones first.
// Every sequence's info and block ids are checked here, before any kernel reads the cache.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <vector>

struct WorkItem {
  int32_t seq, head, tok_begin, tok_end;
  int64_t cost;
};

// q: [n, ...] rows; kv: [2, kv_heads, num_blocks, block_size, D]; seq_info: [S, 3] int64 (first
// row in q, query tokens, tokens already cached before them); block_tables: [S, max_blocks].
inline std::vector<WorkItem> paged_work_items(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& seq_info,
                                              const at::Tensor& block_tables, int64_t num_kv_heads,
                                              int64_t tile_tokens) {
  const int64_t num_blocks = kv.size(2), block_size = kv.size(3);
  const int64_t S = seq_info.size(0), max_blocks = block_tables.size(1);
  const int64_t* info = seq_info.data_ptr<int64_t>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  std::vector<WorkItem> items;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t first = info[s * 3], len = info[s * 3 + 1], start = info[s * 3 + 2];
    TORCH_CHECK(first >= 0 && len >= 0 && first + len <= q.size(0) && start >= 0, "bad sequence info");
    const int64_t used = (start + len + block_size - 1) / block_size;
    TORCH_CHECK(used <= max_blocks, "block table too short");
    for (int64_t b = 0; b < used; ++b) {
      const int64_t id = tables[s * max_blocks + b];
      TORCH_CHECK(id >= 0 && id < num_blocks, "block id ", id, " outside the cache");
    }
    for (int64_t t = 0; t < len; t += tile_tokens) {
      const int64_t e = std::min(len, t + tile_tokens);
      for (int64_t h = 0; h < num_kv_heads; ++h)
        items.push_back({static_cast<int32_t>(s), static_cast<int32_t>(h), static_cast<int32_t>(t),
                         static_cast<int32_t>(e), (start + e) * (e - t)});
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const WorkItem& a, const WorkItem& b) { return a.cost > b.cost; });
  return items;
}
