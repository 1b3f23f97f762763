// Running exact top-k of inner-product scores: an XLA FFI handler for the CPU backend.
//
// samtone_top_k_merge(scores f32[Q, C], start s32[], best f32[Q, K], best_ids s32[Q, K])
//   -> (best f32[Q, K], best_ids s32[Q, K]);  attribute n (int64).
//
// Column j of `scores` is corpus row start + j; rows with an id >= n are padding and never enter.
// best / best_ids hold, per query, a binary min-heap of the K best (score, id) pairs seen so far
// (root = the worst: the lowest score, among equal scores the highest id); initialise them with
// (-inf, -1) and order the final heap by (score descending, id ascending). Chunks must arrive in
// increasing id order: a candidate then always has a higher id than the heap's entries, so it
// enters exactly when its score is strictly greater than the root's, which keeps ties by lower id.
//
// Most candidates of a large corpus are below the root, so each row is scanned 32 floats at a time
// against the root's score (one AVX2 compare per 8 floats) and only blocks with a candidate above
// it are visited one by one. Rows are split over XLA's intra-op thread pool. NaN scores never enter.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// a is worse than b: lower score, or the same score and a higher id.
inline bool Worse(float sa, int32_t ia, float sb, int32_t ib) { return sa < sb || (sa == sb && ia > ib); }

// Replace the root of the min-heap (scores, ids)[0:k] by (s, id) and restore the heap order.
inline void ReplaceRoot(float* scores, int32_t* ids, int64_t k, float s, int32_t id) {
  int64_t i = 0;
  while (true) {
    int64_t child = 2 * i + 1;
    if (child >= k) break;
    if (child + 1 < k && Worse(scores[child + 1], ids[child + 1], scores[child], ids[child])) ++child;
    if (!Worse(scores[child], ids[child], s, id)) break;
    scores[i] = scores[child];
    ids[i] = ids[child];
    i = child;
  }
  scores[i] = s;
  ids[i] = id;
}

// Merge one row's `count` valid scores (ids first_id, first_id + 1, ...) into its heap.
void MergeRow(const float* row, int64_t count, int32_t first_id, float* heap, int32_t* heap_ids, int64_t k) {
  float root = heap[0];
  int64_t j = 0;
#if defined(__AVX2__)
  for (; j + 32 <= count; j += 32) {
    const __m256 threshold = _mm256_set1_ps(root);
    __m256 a = _mm256_cmp_ps(_mm256_loadu_ps(row + j), threshold, _CMP_GT_OQ);
    __m256 b = _mm256_cmp_ps(_mm256_loadu_ps(row + j + 8), threshold, _CMP_GT_OQ);
    __m256 c = _mm256_cmp_ps(_mm256_loadu_ps(row + j + 16), threshold, _CMP_GT_OQ);
    __m256 d = _mm256_cmp_ps(_mm256_loadu_ps(row + j + 24), threshold, _CMP_GT_OQ);
    if (!_mm256_movemask_ps(_mm256_or_ps(_mm256_or_ps(a, b), _mm256_or_ps(c, d)))) continue;
    for (int64_t t = j; t < j + 32; ++t) {
      if (row[t] > root) {
        ReplaceRoot(heap, heap_ids, k, row[t], first_id + static_cast<int32_t>(t));
        root = heap[0];
      }
    }
  }
#endif
  for (; j < count; ++j) {
    if (row[j] > root) {
      ReplaceRoot(heap, heap_ids, k, row[j], first_id + static_cast<int32_t>(j));
      root = heap[0];
    }
  }
}

// Runs body(begin, end) over [0, total) in blocks of `grain`, on the calling thread and on up to
// pool.num_threads() pool tasks. Blocks are claimed from a shared counter, so the caller never
// waits on a task that has not started (the pool may be busy or have a single thread).
template <typename Body>
void ParallelFor(ffi::ThreadPool& pool, int64_t total, int64_t grain, Body body) {
  const int64_t blocks = (total + grain - 1) / grain;
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), blocks - 1);
  if (helpers <= 0) {
    body(0, total);
    return;
  }
  struct State {
    std::atomic<int64_t> next{0};
    int64_t done = 0;
    std::mutex mutex;
    std::condition_variable finished;
  };
  auto state = std::make_shared<State>();
  // Tasks hold the state by shared_ptr; a task that starts after the call returned finds no block
  // left and touches nothing else. `body` lives on the caller's stack, which outlives every claimed block.
  auto work = [state, blocks, grain, total, &body]() {
    int64_t finished_here = 0;
    for (int64_t b; (b = state->next.fetch_add(1)) < blocks; ++finished_here) {
      body(b * grain, std::min(total, (b + 1) * grain));
    }
    if (finished_here) {
      std::lock_guard<std::mutex> lock(state->mutex);
      state->done += finished_here;
      if (state->done == blocks) state->finished.notify_all();
    }
  };
  for (int64_t h = 0; h < helpers; ++h) {
    auto task = work;
    pool.Schedule(std::move(task));
  }
  work();
  std::unique_lock<std::mutex> lock(state->mutex);
  state->finished.wait(lock, [&] { return state->done == blocks; });
}

ffi::Error TopKMerge(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> scores, ffi::Buffer<ffi::S32> start,
                     ffi::Buffer<ffi::F32> best_in, ffi::Buffer<ffi::S32> ids_in,
                     ffi::ResultBuffer<ffi::F32> best_out, ffi::ResultBuffer<ffi::S32> ids_out, int64_t n) {
  auto sd = scores.dimensions();
  auto bd = best_in.dimensions();
  if (sd.size() != 2 || bd.size() != 2 || sd[0] != bd[0] || ids_in.dimensions().size() != 2 ||
      ids_in.dimensions()[0] != bd[0] || ids_in.dimensions()[1] != bd[1]) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "samtone_top_k_merge: expected scores [Q, C], best and best_ids [Q, K]");
  }
  const int64_t rows = sd[0], columns = sd[1], k = bd[1];
  if (k <= 0) return ffi::Error::Success();
  const int32_t first_id = start.typed_data()[0];
  const int64_t count = std::max<int64_t>(0, std::min<int64_t>(columns, n - first_id));
  const float* s = scores.typed_data();
  float* heap = best_out->typed_data();
  int32_t* heap_ids = ids_out->typed_data();
  if (heap != best_in.typed_data() || heap_ids != ids_in.typed_data()) {  // the call's input_output_aliases
    return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                      "samtone_top_k_merge: best / best_ids must alias the results (input_output_aliases)");
  }
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, columns));
  ParallelFor(pool, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      MergeRow(s + r * columns, count, first_id, heap + r * k, heap_ids + r * k, k);
    }
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SamtoneTopKMerge, TopKMerge,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // scores
                                  .Arg<ffi::Buffer<ffi::S32>>()  // start
                                  .Arg<ffi::Buffer<ffi::F32>>()  // best
                                  .Arg<ffi::Buffer<ffi::S32>>()  // best_ids
                                  .Ret<ffi::Buffer<ffi::F32>>()  // best
                                  .Ret<ffi::Buffer<ffi::S32>>()  // best_ids
                                  .Attr<int64_t>("n"));
