// 2x2 / stride 2 max-pool argmax and routing over a sample's planes taken as one flat run
// (AVX-512, f32). The row-pair kernels of pool.cpp fill w/2 of 16 lanes: 7 on the 14x14 conv
// output of the examples' CNN, whose gradient routing then stores 28 floats with four masked
// stores. Here routing writes the sample's gradient as whole 16-lane vectors, each gathered
// by a permutation from 16 consecutive pooled values (a table per plane geometry), and the
// argmax takes two row pairs per vector. The choices are pool_simd.h's, so the results are
// bit for bit those of the row-pair kernels.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "xla_spawn/runtime/kernels/pool_simd.h"

namespace xs::detail {

#ifdef __AVX512F__
namespace {

// Output element t of a sample ([channels][h][w], planes back to back) takes the pooled
// gradient q(t) when its window's argmax is code(t). Over 16 consecutive t the q(t) lie within
// 16 consecutive pooled elements for planes up to 32 wide, and the pattern repeats every
// lcm(h * w, 16) elements: one permutation and one code vector per output vector of a period.
template <typename T>
struct alignas(64) Lanes {
  T v[16];
};

struct RouteTable {
  int64_t h = 0, w = 0;
  bool usable = false;               // false: some vector's q(t) span more than 16 elements
  std::vector<int64_t> base;         // per vector of the period: its first pooled element
  std::vector<Lanes<int32_t>> perm;  // lane -> q(t) - base
  std::vector<Lanes<float>> code;    // lane -> code(t), 0..3 as argmax_2x2 stores it
};

// 1024 elements: planes of 32 x 32 at most, so a period is at most 256 vectors (16 KiB of
// table). Wider rows fill all 16 lanes in the row-pair kernel anyway.
constexpr int64_t kMaxFlatPlane = 1024;

std::unique_ptr<RouteTable> build_route_table(int64_t h, int64_t w) {
  auto t = std::make_unique<RouteTable>();
  t->h = h, t->w = w;
  const int64_t plane = h * w, period = std::lcm(plane, int64_t{16}), pw = w / 2;
  for (int64_t v = 0; v < period / 16; ++v) {
    int32_t q[16];
    Lanes<int32_t> lanes;
    Lanes<float> code;
    for (int64_t l = 0; l < 16; ++l) {
      const int64_t e = 16 * v + l, r = e % plane, y = r / w, x = r % w;
      q[l] = static_cast<int32_t>(e / plane * (plane / 4) + y / 2 * pw + x / 2);
      code.v[l] = static_cast<float>(2 * (y % 2) + x % 2);
    }
    const int32_t lo = *std::min_element(q, q + 16), hi = *std::max_element(q, q + 16);
    if (hi - lo >= 16) return t;
    for (int64_t l = 0; l < 16; ++l) lanes.v[l] = q[l] - lo;
    t->base.push_back(lo);
    t->perm.push_back(lanes);
    t->code.push_back(code);
  }
  t->usable = true;
  return t;
}

const RouteTable* route_table(int64_t h, int64_t w) {
  // Per thread (kernels run on the replica's thread); a model has a handful of geometries.
  thread_local std::vector<std::unique_ptr<RouteTable>> tables;
  for (const auto& t : tables)
    if (t->h == h && t->w == w) return t->usable ? t.get() : nullptr;
  tables.push_back(build_route_table(h, w));
  return tables.back()->usable ? tables.back().get() : nullptr;
}

}  // namespace

bool route_2x2_flat(const float* idx, const float* g, int64_t channels, int64_t h, int64_t w,
                    float* out) {
  if (h % 2 != 0 || w % 2 != 0 || h * w > kMaxFlatPlane) return false;
  const RouteTable* t = route_table(h, w);
  if (t == nullptr) return false;
  const int64_t total = channels * h * w, pooled = total / 4;
  const int64_t vectors = static_cast<int64_t>(t->base.size());
  // Local copies of the table's pointers: the stores below could alias them for all the
  // compiler knows, which made it reload them on every vector.
  const int64_t* base = t->base.data();
  const Lanes<int32_t>* perm = t->perm.data();
  const Lanes<float>* code = t->code.data();
  int64_t v = 0, period_start = 0;
  for (int64_t e = 0; e < total; e += 16) {
    const int64_t q = period_start + base[v];
    const __m512i lanes = _mm512_load_si512(perm[v].v);
    __m512 gv, k;
    if (q + 16 <= pooled) {
      gv = _mm512_loadu_ps(g + q), k = _mm512_loadu_ps(idx + q);
    } else {  // the last vectors' lanes past the sample: not read
      const __mmask16 in = first_bits(pooled - q);
      gv = _mm512_maskz_loadu_ps(in, g + q), k = _mm512_maskz_loadu_ps(in, idx + q);
    }
    // maskz with all lanes: GCC 12 warns about the unmasked form's undefined source.
    gv = _mm512_maskz_permutexvar_ps(0xFFFF, lanes, gv);
    k = _mm512_maskz_permutexvar_ps(0xFFFF, lanes, k);
    const __m512 routed =
        _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(k, _mm512_load_ps(code[v].v), _CMP_EQ_OQ), gv);
    if (e + 16 <= total)
      _mm512_storeu_ps(out + e, routed);
    else
      _mm512_mask_storeu_ps(out + e, first_bits(total - e), routed);
    if (++v == vectors) v = 0, period_start += 4 * vectors;  // a period's pooled elements
  }
  return true;
}

bool argmax_2x2_paired(const float* y, const float* bias, int64_t channels, int64_t h, int64_t w,
                       float* val, float* idx) {
  const int64_t pw = w / 2, ph = h / 2, pairs = channels * ph;
  if (h % 2 != 0 || w % 2 != 0 || w > 16 || pw == 0) return false;
  // Lanes [0, pw) are row pair r's windows, [pw, 2pw) row pair r + 1's: cell columns 2l and
  // 2l + 1 of the first source register (pair r's row) or of the second (pair r + 1's).
  alignas(64) int32_t even_lanes[16] = {};
  for (int64_t l = 0; l < 2 * pw; ++l)
    even_lanes[l] = static_cast<int32_t>(l < pw ? 2 * l : 16 + 2 * (l - pw));
  const __m512i even = _mm512_load_si512(even_lanes);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __mmask16 row = first_bits(w), second = first_bits(2 * pw) & ~first_bits(pw);
  for (int64_t r = 0; r < pairs; r += 2) {
    const bool two = r + 1 < pairs;  // row pairs run on across planes (h is even)
    const float* y0 = y + r * 2 * w;
    const __mmask16 next = two ? row : 0;
    const __m512 top0 = _mm512_maskz_loadu_ps(row, y0),
                 bottom0 = _mm512_maskz_loadu_ps(row, y0 + w);
    const __m512 top1 = _mm512_maskz_loadu_ps(next, y0 + 2 * w);
    const __m512 bottom1 = _mm512_maskz_loadu_ps(next, y0 + 3 * w);
    const __m512 b = _mm512_mask_blend_ps(second, _mm512_set1_ps(bias[r / ph]),
                                          _mm512_set1_ps(bias[two ? (r + 1) / ph : r / ph]));
    const Windows2x2x16 win =
        choose_cells16(pooled_input16<true>(_mm512_permutex2var_ps(top0, even, top1), b),
                       pooled_input16<true>(_mm512_permutex2var_ps(top0, odd, top1), b),
                       pooled_input16<true>(_mm512_permutex2var_ps(bottom0, even, bottom1), b),
                       pooled_input16<true>(_mm512_permutex2var_ps(bottom0, odd, bottom1), b),
                       first_bits(two ? 2 * pw : pw));
    store_argmax16(win, val + r * pw, idx + r * pw);
  }
  return true;
}

#endif

}  // namespace xs::detail
