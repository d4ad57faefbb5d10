// tcexport runtime prelude: included (inlined) at the top of every generated C++ translation unit.
//
// The float32 math functions below are branch-free polynomial approximations, written so that GCC can
// vectorise the loops that call them (std::exp / std::erf are opaque library calls that keep a loop scalar).
// Accuracy (checked by tests/test_runtime_math.py against float64): exp, log within 2 ulp; erf and tanh within
// 4e-7 absolute (5e-7 relative below 0.5); sigmoid within 3 ulp. float64 keeps the C library's functions.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

extern "C" {
typedef struct {
  int32_t abi_version;
  int32_t num_threads;
  void* blas[8];
  char* error;
  int64_t error_size;
} tc_context;
}

// Element functions are always inlined: a loop that calls one out of line stays scalar, and GCC's inliner
// stops inlining plain ``inline`` functions once a large translation unit has grown past its unit-growth budget.
#define TC_INLINE inline __attribute__((always_inline))

namespace {
typedef void (*tc_sgemm_fn)(int, int, int, int, int, int, float, const float*, int, const float*, int, float,
                            float*, int);
typedef void (*tc_dgemm_fn)(int, int, int, int, int, int, double, const double*, int, const double*, int, double,
                            double*, int);
enum { kRowMajor = 101, kNoTrans = 111, kTrans = 112 };

// NaN-propagating max / min. Written so that gcc sees a max (min) pattern behind one NaN test: the form
// ``(a != a || a > b) ? a : b`` left a loop of stride-2 loads scalar (a max pool's row: "no vectype").
template <typename T> TC_INLINE T tc_max(T a, T b) { return b != b ? b : (a < b ? b : a); }
template <typename T> TC_INLINE T tc_min(T a, T b) { return b != b ? b : (b < a ? b : a); }
template <typename T> TC_INLINE T tc_relu(T a) { return (a != a || a > T(0)) ? a : T(0); }
// c ? x : +0 as a bit mask, for a window's padding: gcc sinks the load of a select on a loop-invariant condition
// under that condition and then leaves the loop scalar (a masked load it cannot vectorise); the mask keeps it wide
TC_INLINE float tc_keep(bool c, float x) {
  uint32_t u; std::memcpy(&u, &x, 4); u &= 0u - static_cast<uint32_t>(c); std::memcpy(&x, &u, 4); return x;
}
TC_INLINE double tc_keep(bool c, double x) {
  uint64_t u; std::memcpy(&u, &x, 8); u &= uint64_t(0) - static_cast<uint64_t>(c); std::memcpy(&x, &u, 8); return x;
}
// c ? x : y for a constant y (a max pool's -inf padding), by the same bit mask
TC_INLINE float tc_keep_or(bool c, float x, float y) {
  uint32_t u, v; std::memcpy(&u, &x, 4); std::memcpy(&v, &y, 4);
  const uint32_t m = 0u - static_cast<uint32_t>(c);
  u = (u & m) | (v & ~m); std::memcpy(&x, &u, 4); return x;
}
TC_INLINE double tc_keep_or(bool c, double x, double y) {
  uint64_t u, v; std::memcpy(&u, &x, 8); std::memcpy(&v, &y, 8);
  const uint64_t m = uint64_t(0) - static_cast<uint64_t>(c);
  u = (u & m) | (v & ~m); std::memcpy(&x, &u, 8); return x;
}
template <typename T> TC_INLINE T tc_sign(T a) { return T((T(0) < a) - (a < T(0))); }
TC_INLINE int64_t tc_floordiv(int64_t a, int64_t b) { int64_t q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q; }
TC_INLINE int64_t tc_pymod(int64_t a, int64_t b) { int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
template <typename T> TC_INLINE T tc_fpymod(T a, T b) { T r = std::fmod(a, b); return (r != T(0) && ((r < T(0)) != (b < T(0)))) ? r + b : r; }

TC_INLINE float tc_bits_to_float(int32_t i) { float f; std::memcpy(&f, &i, 4); return f; }
TC_INLINE int32_t tc_float_to_bits(float f) { int32_t i; std::memcpy(&i, &f, 4); return i; }

// 16-bit floats are stored as uint16_t bit patterns and computed in float32. The conversions are plain integer
// and float arithmetic with selects instead of branches, so loops over them vectorise at every ISA level (GCC
// 12 turns _Float16 casts into libgcc calls on baseline x86-64 and keeps them scalar even with F16C). Rounding
// is to nearest even, NaN stays NaN (quiet, sign kept), overflow goes to infinity: bit-exact with PyTorch for
// every value but NaN's payload (tests/test_runtime_math.py checks every 16-bit pattern and ~4M float32s).
TC_INLINE float tc_bf16_to_float(uint16_t h) {
  return tc_bits_to_float(static_cast<int32_t>(static_cast<uint32_t>(h) << 16));
}

TC_INLINE uint16_t tc_float_to_bf16(float f) {
  const uint32_t u = static_cast<uint32_t>(tc_float_to_bits(f));
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

// float16 -> float32 is exact: normals and inf/NaN by rebiasing the exponent, subnormals by one exact float
// subtraction (m * 2^-24 as (2^-14 + m * 2^-24) - 2^-14).
TC_INLINE float tc_f16_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h);
  const uint32_t sign = (u & 0x8000u) << 16;
  const uint32_t em = (u & 0x7fffu) << 13;  // exponent and mantissa in their float32 places
  const uint32_t exp = em & 0x0f800000u;
  const uint32_t normal = em + ((127u - 15u) << 23);
  const uint32_t infnan = normal + ((128u - 16u) << 23);
  const float sub = tc_bits_to_float(static_cast<int32_t>(normal + (1u << 23))) - tc_bits_to_float(113 << 23);
  const uint32_t subnormal = static_cast<uint32_t>(tc_float_to_bits(sub));
  const uint32_t r = exp == 0x0f800000u ? infnan : (exp == 0 ? subnormal : normal);
  return tc_bits_to_float(static_cast<int32_t>(r | sign));
}

// float32 -> float16: normals round by integer addition on the bits (rebias, add half an ulp minus one, plus
// the kept lowest bit: ties go to even); below 2^-14 adding 0.5 makes the FPU round to a multiple of 2^-24,
// the subnormal step; from 65520 up the result is infinity.
TC_INLINE uint16_t tc_float_to_f16(float f) {
  const uint32_t u = static_cast<uint32_t>(tc_float_to_bits(f));
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  const uint32_t sub = static_cast<uint32_t>(tc_float_to_bits(tc_bits_to_float(static_cast<int32_t>(a)) + 0.5f))
                       - 0x3f000000u;
  const uint32_t norm = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;  // 0xc8000000: the exponent's -112 << 23
  const uint32_t big = a > 0x7f800000u ? 0x7e00u : 0x7c00u;
  const uint32_t r = a >= 0x47800000u ? big : (a < 0x38800000u ? sub : norm);
  return static_cast<uint16_t>(r | sign);
}

// A float32 value rounded to the nearest 16-bit float (an explicit cast inside a fused expression).
TC_INLINE float tc_round_f16(float f) { return tc_f16_to_float(tc_float_to_f16(f)); }
TC_INLINE float tc_round_bf16(float f) { return tc_bf16_to_float(tc_float_to_bf16(f)); }

// exp: x = k ln2 + r, |r| <= ln2/2; exp(r) by a degree-6 polynomial (Cephes expf); 2^k from the exponent bits.
// Below -87.34 the result is flushed to 0 (the true value is a denormal under 1.2e-38).
TC_INLINE float tc_exp(float x) {
  const float hi = 88.7228394f, lo = -87.3365447f;
  float xc = std::min(std::max(x, lo), hi);
  float k = std::floor(xc * 1.44269504088896341f + 0.5f);
  float r = xc - k * 0.693359375f + k * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  float y = p * tc_bits_to_float((static_cast<int32_t>(k) + 127) << 23);
  y = x > hi ? std::numeric_limits<float>::infinity() : y;
  y = x < lo ? 0.0f : y;
  return x != x ? x : y;
}

// log: x = m 2^e with m in [sqrt(1/2), sqrt(2)); log(m) by Cephes logf's polynomial.
TC_INLINE float tc_log(float x) {
  const float tiny = 1.17549435e-38f;
  float xs = x < tiny ? x * 8388608.0f : x;  // lift denormals into the normal range (2^23)
  float ebias = x < tiny ? -23.0f : 0.0f;
  int32_t bits = tc_float_to_bits(xs);
  float e = static_cast<float>(((bits >> 23) & 0xff) - 126) + ebias;
  float m = tc_bits_to_float((bits & 0x007fffff) | 0x3f000000);  // in [0.5, 1)
  bool small = m < 0.707106781186547524f;
  e = small ? e - 1.0f : e;
  m = small ? m + m - 1.0f : m - 1.0f;
  float z = m * m;
  float y = 7.0376836292e-2f;
  y = y * m - 1.1514610310e-1f;
  y = y * m + 1.1676998740e-1f;
  y = y * m - 1.2420140846e-1f;
  y = y * m + 1.4249322787e-1f;
  y = y * m - 1.6668057665e-1f;
  y = y * m + 2.0000714765e-1f;
  y = y * m - 2.4999993993e-1f;
  y = y * m + 3.3333331174e-1f;
  y = y * m * z;
  y += -2.12194440e-4f * e;
  y += -0.5f * z;
  float r = m + y + 0.693359375f * e;
  r = x == std::numeric_limits<float>::infinity() ? x : r;
  r = x == 0.0f ? -std::numeric_limits<float>::infinity() : r;
  r = x < 0.0f ? std::numeric_limits<float>::quiet_NaN() : r;
  return x != x ? x : r;
}

// erf: a rational minimax approximation x P(x^2) / Q(x^2) on [-4, 4] (the form Eigen uses); erf is +-1 in
// float32 beyond |x| = 4. No exp, no branch.
TC_INLINE float tc_erf(float x) {
  float xc = std::min(std::max(x, -4.0f), 4.0f);
  float z = xc * xc;
  float p = -2.72614225801306e-10f;
  p = p * z + 2.77068142495902e-08f;
  p = p * z - 2.10102402082508e-06f;
  p = p * z - 5.69250639462346e-05f;
  p = p * z - 7.34990630326855e-04f;
  p = p * z - 2.95459980854025e-03f;
  p = p * z - 1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * z - 2.13374055278905e-04f;
  q = q * z - 1.68282697438203e-03f;
  q = q * z - 7.37332916720468e-03f;
  q = q * z - 1.42647390514189e-02f;
  float y = xc * p / q;
  return x != x ? x : y;
}

// tanh: an odd polynomial near 0 (Cephes tanhf), 1 - 2/(exp(2|x|)+1) elsewhere; both are computed and one kept.
TC_INLINE float tc_tanh(float x) {
  float a = std::fabs(x);
  float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  float near0 = p * z * x + x;
  float far = std::copysign(1.0f - 2.0f / (tc_exp(2.0f * a) + 1.0f), x);
  return a < 0.625f ? near0 : far;
}

TC_INLINE float tc_sigmoid(float x) { return 1.0f / (1.0f + tc_exp(-x)); }

// float32 GEMM on AVX-512: our own register-blocked kernel. The loader's OpenBLAS picks its kernels by CPU
// model and runs AVX2 ones on CPUs it does not know (AMD Zen 4/5 report "Haswell"), at half this kernel's
// speed; small products also skip BLAS's per-call overhead (2-3 us at m = 1).
//   C tile (MR rows x 32 columns) in 2*MR zmm accumulators; per k: two vector loads of a B row segment, MR
//   broadcasts of A, 2*MR FMAs. Blocked as GotoBLAS is: B is copied, kc rows x nc columns at a time, into
//   contiguous kc x 32 micro-panels (from row-major, transposed or row-offset B alike: a convolution's taps,
//   each a shifted view of one zero-padded input, schedule/window_gemm.py); one micro-panel (32 KB) stays in L1
//   while A's MR-row strips stream past it from L2. B read in place (strided rows, set conflicts in L1, no
//   prefetch across rows) ran at half the speed once its operands came from L3, as in a model they do. A
//   product with few rows of A reads a row-major B in place instead: its copy would cost more than its reuse.
#if defined(__AVX512F__)
constexpr int kTcMr = 8;          // rows per micro-tile
constexpr int kTcNr = 32;         // columns per micro-tile (two zmm)
constexpr int64_t kTcKc = 256;    // k per block: a micro-panel of B is kc x 32 (32 KB, in the 48 KB L1)
constexpr int64_t kTcNc = 1024;   // columns per block: B's block is kc x nc (1 MB, in L2)
constexpr int64_t kTcMc = 256;    // rows of A per block (256 KB, in L2 next to B's)

TC_INLINE __mmask16 tc_lanes(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : n <= 0 ? static_cast<__mmask16>(0)
                                                            : static_cast<__mmask16>((1u << n) - 1);
}

// C[0..MR) x [0..32) (lanes masked by m0/m1) = (acc ? C : 0) + sum_k A(r, k) B[k * ldb + 0..32); A(r, k) is
// A[r * lda + k], or A[k * lda + r] when TA.
template <int MR, bool TA>
inline void tc_sgemm_micro(int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                           int64_t ldc, __mmask16 m0, __mmask16 m1, bool acc) {
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    c0[r] = _mm512_setzero_ps();
    c1[r] = _mm512_setzero_ps();
    // the tile's rows of C, fetched while the k loop runs: its store would otherwise wait on each line's miss
    _mm_prefetch(reinterpret_cast<const char*>(C + r * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(C + r * ldc + 16), _MM_HINT_T0);
  }
  for (int64_t k = 0; k < K; ++k) {
    const float* bk = B + k * ldb;
    const __m512 b0 = _mm512_maskz_loadu_ps(m0, bk);
    const __m512 b1 = _mm512_maskz_loadu_ps(m1, bk + 16);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512 a = _mm512_set1_ps(TA ? A[k * lda + r] : A[r * lda + k]);
      c0[r] = _mm512_fmadd_ps(a, b0, c0[r]);
      c1[r] = _mm512_fmadd_ps(a, b1, c1[r]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    if (acc) {
      c0[r] = _mm512_add_ps(c0[r], _mm512_maskz_loadu_ps(m0, C + r * ldc));
      c1[r] = _mm512_add_ps(c1[r], _mm512_maskz_loadu_ps(m1, C + r * ldc + 16));
    }
    _mm512_mask_storeu_ps(C + r * ldc, m0, c0[r]);
    _mm512_mask_storeu_ps(C + r * ldc + 16, m1, c1[r]);
  }
}

template <int MR, bool TA>
inline void tc_sgemm_rows_dispatch(int64_t rows, int64_t K, const float* A, int64_t lda, const float* B,
                                   int64_t ldb, float* C, int64_t ldc, __mmask16 m0, __mmask16 m1, bool acc) {
  if constexpr (MR > 0) {
    if (rows == MR) tc_sgemm_micro<MR, TA>(K, A, lda, B, ldb, C, ldc, m0, m1, acc);
    else tc_sgemm_rows_dispatch<MR - 1, TA>(rows, K, A, lda, B, ldb, C, ldc, m0, m1, acc);
  }
}

// One tile of ``rows`` <= MR rows.
template <bool TA>
TC_INLINE void tc_sgemm_tile(int64_t rows, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb,
                             float* C, int64_t ldc, __mmask16 m0, __mmask16 m1, bool acc) {
  if (rows == kTcMr) tc_sgemm_micro<kTcMr, TA>(K, A, lda, B, ldb, C, ldc, m0, m1, acc);
  else tc_sgemm_rows_dispatch<kTcMr - 1, TA>(rows, K, A, lda, B, ldb, C, ldc, m0, m1, acc);
}

// Shuffles through their zero-masked forms: the plain intrinsics read GCC 12's "undefined" vector, which trips
// -Wmaybe-uninitialized once inlined; with a full mask the instructions are the same.
template <int I> TC_INLINE __m512 tc_shuffle128(__m512 a, __m512 b) { return _mm512_maskz_shuffle_f32x4(0xffff, a, b, I); }
template <int I> TC_INLINE __m512 tc_permute(__m512 a) { return _mm512_maskz_permute_ps(0xffff, a, I); }
TC_INLINE __m512 tc_unpacklo(__m512 a, __m512 b) { return _mm512_maskz_unpacklo_ps(0xffff, a, b); }
TC_INLINE __m512 tc_unpackhi(__m512 a, __m512 b) { return _mm512_maskz_unpackhi_ps(0xffff, a, b); }
TC_INLINE __m512 tc_unpacklo64(__m512 a, __m512 b) {
  return _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xff, _mm512_castps_pd(a), _mm512_castps_pd(b)));
}
TC_INLINE __m512 tc_unpackhi64(__m512 a, __m512 b) {
  return _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xff, _mm512_castps_pd(a), _mm512_castps_pd(b)));
}

// dst[c * ldd + 0..16) = column c of the 16 x 16 block src[r * lds + 0..16) (rows past ``rows`` and lanes
// outside ``cols_mask`` read as 0), for c < ncols.
inline void tc_transpose16(const float* src, int64_t lds, int rows, __mmask16 cols_mask, float* dst, int64_t ldd,
                           int ncols) {
  __m512 r[16], t[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_maskz_loadu_ps(cols_mask, src + i * lds) : _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int i = 0; i < 16; i += 2) {
    t[i] = tc_unpacklo(r[i], r[i + 1]);
    t[i + 1] = tc_unpackhi(r[i], r[i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 16; i += 4) {
    r[i] = tc_unpacklo64(t[i], t[i + 2]);
    r[i + 1] = tc_unpackhi64(t[i], t[i + 2]);
    r[i + 2] = tc_unpacklo64(t[i + 1], t[i + 3]);
    r[i + 3] = tc_unpackhi64(t[i + 1], t[i + 3]);
  }
  // r[4q + s], 128-bit lane L: element s of the 4 columns 4L..4L+3, for rows 4q..4q+3
#pragma GCC unroll 4
  for (int s = 0; s < 4; ++s) {
    const __m512 a = tc_shuffle128<0x88>(r[s], r[4 + s]), b = tc_shuffle128<0xdd>(r[s], r[4 + s]);
    const __m512 c = tc_shuffle128<0x88>(r[8 + s], r[12 + s]), d = tc_shuffle128<0xdd>(r[8 + s], r[12 + s]);
    t[s] = tc_shuffle128<0x88>(a, c);
    t[4 + s] = tc_shuffle128<0x88>(b, d);
    t[8 + s] = tc_shuffle128<0xdd>(a, c);
    t[12 + s] = tc_shuffle128<0xdd>(b, d);
  }
#pragma GCC unroll 16
  for (int c = 0; c < 16; ++c)
    if (c < ncols) _mm512_storeu_ps(dst + c * ldd, t[c]);
}

// Columns [j, j + width) and k in [k0, k0 + kc) of B = Bt^T (Bt: N x K, rows ldb apart) as a kc x 32 panel.
inline void tc_sgemm_pack_t(const float* Bt, int64_t ldb, int64_t j, int64_t width, int64_t k0, int64_t kc,
                            float* panel) {
  for (int64_t k = 0; k < kc; k += 16) {
    const int kn = static_cast<int>(std::min<int64_t>(16, kc - k));
    for (int h = 0; h < 2; ++h) {
      const int rows = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(16, width - 16 * h)));
      tc_transpose16(Bt + (j + 16 * h) * ldb + k0 + k, ldb, rows, tc_lanes(kn), panel + k * kTcNr + 16 * h, kTcNr,
                     kn);
    }
  }
}

// The sum of a vector's lanes (_mm512_reduce_add_ps trips -Wmaybe-uninitialized, see tc_shuffle128).
TC_INLINE float tc_hsum(__m512 v) {
  v = _mm512_add_ps(v, tc_shuffle128<0x4e>(v, v));
  v = _mm512_add_ps(v, tc_shuffle128<0xb1>(v, v));
  v = _mm512_add_ps(v, tc_permute<0x4e>(v));
  v = _mm512_add_ps(v, tc_permute<0xb1>(v));
  return _mm512_cvtss_f32(v);
}

// c[j] = a . Bt[j] for j < N (one row of A times a transposed B): four dot products at a time.
inline void tc_sgemv_t(int64_t N, int64_t K, const float* a, const float* Bt, int64_t ldb, float* c) {
  const int64_t kv = K - K % 16;
  const __mmask16 tail = tc_lanes(K % 16);
  int64_t j = 0;
  for (; j + 4 <= N; j += 4) {
    const float* b = Bt + j * ldb;
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t k = 0; k < kv; k += 16) {
      const __m512 x = _mm512_loadu_ps(a + k);
      s0 = _mm512_fmadd_ps(x, _mm512_loadu_ps(b + k), s0);
      s1 = _mm512_fmadd_ps(x, _mm512_loadu_ps(b + ldb + k), s1);
      s2 = _mm512_fmadd_ps(x, _mm512_loadu_ps(b + 2 * ldb + k), s2);
      s3 = _mm512_fmadd_ps(x, _mm512_loadu_ps(b + 3 * ldb + k), s3);
    }
    if (tail) {
      const __m512 x = _mm512_maskz_loadu_ps(tail, a + kv);
      s0 = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(tail, b + kv), s0);
      s1 = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(tail, b + ldb + kv), s1);
      s2 = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(tail, b + 2 * ldb + kv), s2);
      s3 = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(tail, b + 3 * ldb + kv), s3);
    }
    c[j] = tc_hsum(s0);
    c[j + 1] = tc_hsum(s1);
    c[j + 2] = tc_hsum(s2);
    c[j + 3] = tc_hsum(s3);
  }
  for (; j < N; ++j) {
    const float* b = Bt + j * ldb;
    __m512 s = _mm512_setzero_ps();
    for (int64_t k = 0; k < kv; k += 16) s = _mm512_fmadd_ps(_mm512_loadu_ps(a + k), _mm512_loadu_ps(b + k), s);
    if (tail) s = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, a + kv), _mm512_maskz_loadu_ps(tail, b + kv), s);
    c[j] = tc_hsum(s);
  }
}

// Rows [k0, k0 + kc) and columns [j0, j0 + nc) of B as contiguous kc x 32 micro-panels (the last one narrower,
// its lanes masked by the kernel): B row k is at B + k * ldb, or at B + rows[k]; with tb, B is given as its
// transpose (N x K, rows ldb apart).
inline void tc_sgemm_pack_b(const float* B, int64_t ldb, bool tb, const int64_t* rows, int64_t k0, int64_t kc,
                            int64_t j0, int64_t nc, float* dst) {
  for (int64_t j = 0; j < nc; j += kTcNr) {
    float* panel = dst + (j / kTcNr) * kc * kTcNr;
    const int64_t width = std::min<int64_t>(kTcNr, nc - j);
    if (tb) {
      tc_sgemm_pack_t(B, ldb, j0 + j, width, k0, kc, panel);
      continue;
    }
    const __mmask16 m0 = tc_lanes(width), m1 = tc_lanes(width - 16);
    for (int64_t k = 0; k < kc; ++k) {
      const float* src = B + (rows ? rows[k0 + k] : (k0 + k) * ldb) + j0 + j;
      _mm512_store_ps(panel + k * kTcNr, _mm512_maskz_loadu_ps(m0, src));
      _mm512_store_ps(panel + k * kTcNr + 16, _mm512_maskz_loadu_ps(m1, src + 16));
    }
  }
}

// C (M x N, rows ldc apart) = op(A) op(B) on the calling thread; B row k at B + brows[k] when brows is given
// (then not transposed).
inline void tc_sgemm_own(int64_t M, int64_t N, int64_t K, bool ta, const float* A, int64_t lda, bool tb,
                         const float* B, int64_t ldb, float* C, int64_t ldc, const int64_t* brows = nullptr) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0.0f);
    return;
  }
  if (M == 1 && tb && !ta) {
    tc_sgemv_t(N, K, A, B, ldb, C);
    return;
  }
  // a row-major B is read in place by a product of few rows: each of its rows would be copied for M / 8 uses
  const bool few_rows = M <= 2 * kTcMr;
  const bool pack = tb || brows || !few_rows;
  static thread_local std::vector<float> buf;
  if (pack) {
    const int64_t width = std::min(kTcNc, (N + kTcNr - 1) / kTcNr * kTcNr);
    const size_t need = static_cast<size_t>(std::min(kTcKc, K) * width) + 16;
    if (buf.size() < need) buf.resize(need);
  }
  // 64-byte aligned inside the buffer (std::vector's own alignment is 16)
  float* bp = pack ? buf.data() + ((64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) % 64) / sizeof(float) : nullptr;
  // few rows use each packed micro-panel only M / 8 times, and a transposed B (a Linear's weight) with up to
  // kTcMc rows of A ran no faster packed a block at a time: there each micro-panel is packed just before its
  // use, still in L1. With more rows A leaves L2, and each narrow panel would stream all of it again (BERT-base
  // at batch 8: 1024 x 768 x 3072 0.87x the time with whole blocks).
  const int64_t nc_max = few_rows || (tb && M <= kTcMc) ? kTcNr : kTcNc;
  for (int64_t j0 = 0; j0 < N; j0 += nc_max) {
    const int64_t nc = std::min(nc_max, N - j0);
    for (int64_t k0 = 0; k0 < K; k0 += kTcKc) {
      const int64_t kc = std::min(kTcKc, K - k0);
      if (pack) tc_sgemm_pack_b(B, ldb, tb, brows, k0, kc, j0, nc, bp);
      for (int64_t i0 = 0; i0 < M; i0 += kTcMc) {
        const int64_t mc = std::min(kTcMc, M - i0);
        const float* a = A + (ta ? k0 * lda + i0 : i0 * lda + k0);
        // A short k block (kc <= 128) makes each tile's work short next to its store: the row strips go outside
        // so that C is written along its rows (write-allocate misses the prefetcher sees), B's block read from
        // L2 past one strip of A. A long one keeps a micro-panel of B in L1 and streams A's strips past it.
        const bool rows_outer = kc <= 128;
        const int64_t outer = rows_outer ? mc : nc, inner = rows_outer ? nc : mc;
        for (int64_t u = 0; u < outer; u += rows_outer ? kTcMr : kTcNr) {
          for (int64_t v = 0; v < inner; v += rows_outer ? kTcNr : kTcMr) {
            const int64_t i = rows_outer ? u : v, j = rows_outer ? v : u;
            const int64_t rows = std::min<int64_t>(kTcMr, mc - i), width = std::min<int64_t>(kTcNr, nc - j);
            const __mmask16 m0 = tc_lanes(width), m1 = tc_lanes(width - 16);
            const float* ai = a + (ta ? i : i * lda);
            const float* b = pack ? bp + (j / kTcNr) * kc * kTcNr : B + k0 * ldb + j0 + j;
            const int64_t ldp = pack ? kTcNr : ldb;
            float* c = C + (i0 + i) * ldc + j0 + j;
            if (ta) tc_sgemm_tile<true>(rows, kc, ai, lda, b, ldp, c, ldc, m0, m1, k0 > 0);
            else tc_sgemm_tile<false>(rows, kc, ai, lda, b, ldp, c, ldc, m0, m1, k0 > 0);
          }
        }
      }
    }
  }
}
#endif

// A GEMM kernel's scratch for one call (a gathered operand, a widened one, a product before its rounding epilogue),
// which the kernel fills before reading: this calling thread's, one per ``Slot``, grown on demand and kept. A
// std::vector per call was a fresh allocation each time, its pages faulted in and zeroed by the kernel (the
// 10.8 MB im2col of EfficientNet-b0's stem at batch 8: about 0.2 of the 2.3 ms beside its product). Pool threads
// write into the caller's (the pointer is what the kernel's lambdas capture). Slots 0-4: cpu/codegen.py's
// SCRATCH_SLOTS; 5: tc_scratch; 6: tc_sgemm_panels_t's partial sums, 7: tc_sgemm_panels' weight block (each pool
// thread its own).
template <typename T, int Slot>
inline T* tc_call_scratch(size_t n) {
  static thread_local std::vector<T> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// This thread's scratch of at least ``floats`` floats (the fused attention kernels' blocks): grown on demand and
// kept, so a kernel neither allocates per call nor puts its blocks on a thread's stack (128 KB where musl runs).
inline float* tc_scratch(size_t floats) { return tc_call_scratch<float, 5>(floats); }

// C (M x N, rows ldc apart) = A (M x K, rows lda apart) times B (K x N), or times the transpose of B (N x K) when
// tb, on the calling thread: the fused attention kernel's block products (exporter/cpu/attention.py).
inline void tc_sgemm_block(tc_sgemm_fn sgemm, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                           bool tb, const float* B, int64_t ldb, float* C, int64_t ldc) {
#if defined(__AVX512F__)
  (void)sgemm;
  tc_sgemm_own(M, N, K, false, A, lda, tb, B, ldb, C, ldc);
#else
  sgemm(kRowMajor, kNoTrans, tb ? kTrans : kNoTrans, (int)M, (int)N, (int)K, 1.0f, A, (int)lda, B, (int)ldb, 0.0f,
        C, (int)ldc);
#endif
}

// The threads a product of ``work`` multiply-adds runs on: below 64^3 a split costs more than it saves.
inline int tc_product_threads(int nt, double work) { return work >= 262144.0 ? nt : 1; }

// piece(b, p) for every batch entry b < batch and part p < parts of a product, on the pool's threads when there are
// several (the pool is not used at all otherwise: a small product is done before it wakes).
template <typename Piece>
inline void tc_product_pieces(int threads, int64_t batch, int64_t parts, const Piece& piece) {
  if (threads > 1) {
    tc_parallel_range(threads, batch * parts, batch * parts, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) piece(i / parts, i % parts);
    });
  } else {
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t p = 0; p < parts; ++p) piece(b, p);
  }
}

// How tc_gemm shares one product among threads: by batch, else by rows of C, else by columns (when C is
// short and wide, or when B must be packed: each thread then packs only its own columns). Pieces are whole
// micro-tiles (``row_step`` rows, ``col_step`` columns).
struct tc_gemm_split {
  int threads;
  int64_t parts;
  bool by_rows;
  int64_t row_step, col_step;

  tc_gemm_split(int nt, int64_t batch, int64_t M, int64_t N, int64_t K, bool packs_b, bool own) {
    const double work = double(batch) * double(M) * double(N) * double(K > 0 ? K : 1);
    threads = tc_product_threads(nt, work);
    row_step = own ? 8 : 1;
    col_step = own ? 32 : 1;
    const bool wide = N >= 2 * col_step * threads;
    by_rows = own ? !(wide && (packs_b || M < 8 * threads * row_step)) : (M >= N || M >= 8 * threads);
    const int64_t units = by_rows ? (M + row_step - 1) / row_step : (N + col_step - 1) / col_step;
    parts = batch >= threads ? 1 : std::min<int64_t>(units, threads);
  }

  // [lo, hi) of piece p over an extent of n (rows or columns), in whole steps
  void range(int64_t p, int64_t n, int64_t& lo, int64_t& hi) const {
    const int64_t step = by_rows ? row_step : col_step;
    const int64_t units = (n + step - 1) / step;
    lo = std::min<int64_t>(n, p * units / parts * step);
    hi = std::min<int64_t>(n, (p + 1) * units / parts * step);
  }
};

// GEMM through the BLAS the loader passes in (single-threaded: one thread pool, ours, runs the whole graph),
// or for float32 on AVX-512 through tc_sgemm_own. The work is split across the pool's threads (tc_gemm_split, runtime/pool.h);
// each piece is one BLAS call (or one own-kernel call) on a contiguous slice. With ``brows`` (B not transposed),
// B's row k is at B + brows[k] (a convolution's taps over its padded input): the own kernel gathers them as it
// packs B's micro-panels, a BLAS call gets them copied into contiguous rows of the piece's own first.
template <typename T, typename Gemm>
inline void tc_gemm(Gemm gemm, int nt, int64_t batch, int64_t M, int64_t N, int64_t K,
                    bool ta, const T* A, int64_t lda, int64_t a_batch,
                    bool tb, const T* B, int64_t ldb, int64_t b_batch, T* C, const int64_t* brows = nullptr) {
  if (M <= 0 || N <= 0 || batch <= 0) return;
#if defined(__AVX512F__)
  constexpr bool own = std::is_same<T, float>::value;
#else
  constexpr bool own = false;
#endif
  const tc_gemm_split split(nt, batch, M, N, K, own && tb && !(M == 1 && !ta), own);
  auto piece = [&](int64_t b, int64_t p) {
    const T* a = A + b * a_batch;
    const T* bb = B + b * b_batch;
    T* c = C + b * M * N;
    int64_t m0 = 0, m1 = M, n0 = 0, n1 = N;
    if (split.parts > 1 && split.by_rows) split.range(p, M, m0, m1);
    else if (split.parts > 1) split.range(p, N, n0, n1);
    a += ta ? m0 : m0 * lda;
    bb += tb ? n0 * ldb : n0;
    c += m0 * N + n0;
    const int64_t m = m1 - m0, n = n1 - n0;
    if (m <= 0 || n <= 0) return;
#if defined(__AVX512F__)
    if constexpr (own) {
      tc_sgemm_own(m, n, K, ta, a, lda, tb, bb, ldb, c, N, brows);
      return;
    }
#endif
    int64_t ld = ldb;
    std::vector<T> rows_copy;
    if (brows) {  // B's rows gathered for BLAS: K x n, rows n apart
      rows_copy.resize(static_cast<size_t>(K * n));
      for (int64_t k = 0; k < K; ++k) std::copy(bb + brows[k], bb + brows[k] + n, rows_copy.data() + k * n);
      bb = rows_copy.data();
      ld = n;
    }
    gemm(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, (int)m, (int)n, (int)K, T(1), a, (int)lda,
         bb, (int)ld, T(0), c, (int)N);
  };
  tc_product_pieces(split.threads, batch, split.parts, piece);
}

// C (M x N, rows N apart) = op(A) (M x K) times a K x N matrix stored as 32-column panels, W[p][k][j] = B[k][32p + j]
// (zero past N): a linear's weight packed once at export (exporter/front/weights_panels.py), read in place where the
// own kernel would copy a transposed weight into the same micro-panels on every call. Rows [0, M) of columns
// [n0, n1) (n0 a multiple of 32), on the calling thread.
inline void tc_sgemm_panels(int64_t M, int64_t n0, int64_t n1, int64_t K, bool ta, const float* A, int64_t lda,
                            const float* W, float* C, int64_t ldc) {
  if (K <= 0) {
    for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc + n0, C + i * ldc + n1, 0.0f);
    return;
  }
#if defined(__AVX512F__)
  // the own kernel's blocking: kc x nc of the weight (in L2) serves every block of kTcMc rows of A, and within it
  // a panel's kc x 32 (in L1) every row strip of the block; each output sums k in the same blocks as
  // tc_sgemm_own's. With more than one block of rows the kc x nc block is first copied, panel by panel, into this
  // thread's scratch: a sequential read the prefetcher streams, where the tiles' first reads of a weight from
  // memory stalled (a 32000-wide LM head over 512 rows took 1.2x the own kernel's time read in place).
  const bool copy = M > kTcMc;
  float* block = copy ? tc_call_scratch<float, 7>(static_cast<size_t>(kTcKc * kTcNc)) : nullptr;
  for (int64_t j0 = n0; j0 < n1; j0 += kTcNc) {
    const int64_t j1 = std::min(n1, j0 + kTcNc);
    for (int64_t k0 = 0; k0 < K; k0 += kTcKc) {
      const int64_t kc = std::min(kTcKc, K - k0);
      if (copy)
        for (int64_t j = j0; j < j1; j += kTcNr)
          std::memcpy(block + (j - j0) * kc, W + (j / kTcNr) * K * kTcNr + k0 * kTcNr, sizeof(float) * kc * kTcNr);
      for (int64_t i0 = 0; i0 < M; i0 += kTcMc) {
        const int64_t i1 = std::min(M, i0 + kTcMc);
        for (int64_t j = j0; j < j1; j += kTcNr) {
          const float* b = copy ? block + (j - j0) * kc : W + (j / kTcNr) * K * kTcNr + k0 * kTcNr;
          const int64_t width = std::min<int64_t>(kTcNr, j1 - j);
          const __mmask16 m0 = tc_lanes(width), m1 = tc_lanes(width - 16);
          for (int64_t i = i0; i < i1; i += kTcMr) {
            const int64_t rows = std::min<int64_t>(kTcMr, i1 - i);
            const float* a = A + (ta ? k0 * lda + i : i * lda + k0);
            float* c = C + i * ldc + j;
            if (ta) tc_sgemm_tile<true>(rows, kc, a, lda, b, kTcNr, c, ldc, m0, m1, k0 > 0);
            else tc_sgemm_tile<false>(rows, kc, a, lda, b, kTcNr, c, ldc, m0, m1, k0 > 0);
          }
        }
      }
    }
  }
#else
  // portable: 4 rows x one panel of accumulators at a time, the 32 columns the vector loop
  constexpr int64_t kRows = 4, kPanel = 32;
  for (int64_t j = n0; j < n1; j += kPanel) {
    const float* b = W + (j / kPanel) * K * kPanel;
    const int64_t width = std::min<int64_t>(kPanel, n1 - j);
    for (int64_t i = 0; i < M; i += kRows) {
      const int64_t rows = std::min<int64_t>(kRows, M - i);
      float acc[kRows][kPanel] = {};
      for (int64_t k = 0; k < K; ++k) {
        const float* bk = b + k * kPanel;
        for (int64_t r = 0; r < rows; ++r) {
          const float a = ta ? A[k * lda + i + r] : A[(i + r) * lda + k];
#pragma omp simd
          for (int64_t l = 0; l < kPanel; ++l) acc[r][l] += a * bk[l];
        }
      }
      for (int64_t r = 0; r < rows; ++r) std::copy(acc[r], acc[r] + width, C + (i + r) * ldc + j);
    }
  }
#endif
}

// tc_sgemm_panels shared among the pool's threads as tc_gemm shares a product: by rows of 8, else by columns in
// whole panels.
inline void tc_gemm_panels(int nt, int64_t M, int64_t N, int64_t K, bool ta, const float* A, int64_t lda,
                           const float* W, float* C) {
  if (M <= 0 || N <= 0) return;
  const tc_gemm_split split(nt, 1, M, N, K, false, true);
  tc_product_pieces(split.threads, 1, split.parts, [&](int64_t, int64_t p) {
    int64_t m0 = 0, m1 = M, n0 = 0, n1 = N;
    if (split.parts > 1 && split.by_rows) split.range(p, M, m0, m1);
    else if (split.parts > 1) split.range(p, N, n0, n1);
    if (m1 > m0 && n1 > n0)
      tc_sgemm_panels(m1 - m0, n0, n1, K, ta, A + (ta ? m0 : m0 * lda), lda, W, C + m0 * N, N);
  });
}

#if defined(__AVX512F__)
// Positions [i, i + MR) of one image times one 32-channel panel, over k in [0, kc): position r's element k at
// a[rows[k] + r] (ROWS) or a[k * lda + r]. The sums start from ct (acc) or 0; they go back to ct (a tile of MR rows
// of 32, ldct apart) or, at the last k block, transposed into C: channel m's MR positions at c + m * ldc.
template <int MR, bool ROWS>
inline void tc_sgemm_micro_t(int64_t kc, const float* a, int64_t lda, const int64_t* rows, const float* w, float* ct,
                             int64_t ldct, bool acc, float* c, int64_t ldc, int width) {
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    c0[r] = acc ? _mm512_loadu_ps(ct + r * ldct) : _mm512_setzero_ps();
    c1[r] = acc ? _mm512_loadu_ps(ct + r * ldct + 16) : _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < kc; ++k) {
    const float* ak = a + (ROWS ? rows[k] : k * lda);
    const __m512 w0 = _mm512_loadu_ps(w + k * 32), w1 = _mm512_loadu_ps(w + k * 32 + 16);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512 x = _mm512_set1_ps(ak[r]);
      c0[r] = _mm512_fmadd_ps(x, w0, c0[r]);
      c1[r] = _mm512_fmadd_ps(x, w1, c1[r]);
    }
  }
  if (c == nullptr) {
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      _mm512_storeu_ps(ct + r * ldct, c0[r]);
      _mm512_storeu_ps(ct + r * ldct + 16, c1[r]);
    }
    return;
  }
  const __mmask8 keep = static_cast<__mmask8>((1u << MR) - 1);
#pragma GCC unroll 4
  for (int h = 0; h < 4; ++h) {  // channels 8h .. 8h + 7: an 8 x 8 transpose of (position, channel)
    __m256 v[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) {
      const __m512 z = r < MR ? (h < 2 ? c0[r] : c1[r]) : _mm512_setzero_ps();
      v[r] = (h & 1) ? _mm512_extractf32x8_ps(z, 1) : _mm512_castps512_ps256(z);
    }
    const __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
    const __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
    const __m256 t4 = _mm256_unpacklo_ps(v[4], v[5]), t5 = _mm256_unpackhi_ps(v[4], v[5]);
    const __m256 t6 = _mm256_unpacklo_ps(v[6], v[7]), t7 = _mm256_unpackhi_ps(v[6], v[7]);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    const __m256 o[8] = {_mm256_permute2f128_ps(u0, u4, 0x20), _mm256_permute2f128_ps(u1, u5, 0x20),
                         _mm256_permute2f128_ps(u2, u6, 0x20), _mm256_permute2f128_ps(u3, u7, 0x20),
                         _mm256_permute2f128_ps(u0, u4, 0x31), _mm256_permute2f128_ps(u1, u5, 0x31),
                         _mm256_permute2f128_ps(u2, u6, 0x31), _mm256_permute2f128_ps(u3, u7, 0x31)};
#pragma GCC unroll 8
    for (int m = 0; m < 8; ++m)
      if (8 * h + m < width) _mm256_mask_storeu_ps(c + (8 * h + m) * ldc, keep, o[m]);
  }
}

template <int MR, bool ROWS>
inline void tc_sgemm_rows_t(int rows_here, int64_t kc, const float* a, int64_t lda, const int64_t* rows,
                            const float* w, float* ct, int64_t ldct, bool acc, float* c, int64_t ldc, int width) {
  if constexpr (MR > 0) {
    if (rows_here == MR) tc_sgemm_micro_t<MR, ROWS>(kc, a, lda, rows, w, ct, ldct, acc, c, ldc, width);
    else tc_sgemm_rows_t<MR - 1, ROWS>(rows_here, kc, a, lda, rows, w, ct, ldct, acc, c, ldc, width);
  }
}
#endif

// C (M x N: channels x positions, rows N apart) = W (M x K, stored as panels of 32 rows: W[p][k][j] = row 32p + j,
// a convolution's weight packed at export, exporter/front/weights_panels.py) times B (K x N: row k at
// B + rows[k], or B + k * ldb), positions [p0, p1) of one image. The product runs transposed: positions are a
// tile's rows and channels its vector lanes, so a map of 49 or 196 positions (a CNN's last stages) fills whole
// tiles where the own kernel's 32-position tiles ran partly empty, and the weight is read in place (the
// activations are broadcast from where they lie); each tile is transposed into C as it is stored.
inline void tc_sgemm_panels_t(int64_t M, int64_t N, int64_t K, const float* W, const float* B, int64_t ldb,
                              const int64_t* rows, float* C, int64_t p0, int64_t p1) {
  if (p1 <= p0) return;
  if (K <= 0) {
    for (int64_t m = 0; m < M; ++m) std::fill(C + m * N + p0, C + m * N + p1, 0.0f);
    return;
  }
#if defined(__AVX512F__)
  const int64_t panels = (M + kTcNr - 1) / kTcNr, ldct = panels * kTcNr;
  // partial sums between k blocks, (position, channel): only a product longer than one block needs them
  float* ct = K > kTcKc ? tc_call_scratch<float, 6>(static_cast<size_t>((p1 - p0) * ldct)) : nullptr;
  for (int64_t k0 = 0; k0 < K; k0 += kTcKc) {
    const int64_t kc = std::min(kTcKc, K - k0);
    const bool last = k0 + kc == K;
    const int64_t* rk = rows ? rows + k0 : nullptr;
    for (int64_t q = 0; q < panels; ++q) {
      const float* w = W + q * K * kTcNr + k0 * kTcNr;
      const int width = static_cast<int>(std::min<int64_t>(kTcNr, M - q * kTcNr));
      for (int64_t i = p0; i < p1; i += kTcMr) {
        const int here = static_cast<int>(std::min<int64_t>(kTcMr, p1 - i));
        const float* a = B + i + (rows ? 0 : k0 * ldb);
        float* t = ct ? ct + (i - p0) * ldct + q * kTcNr : nullptr;
        float* c = last ? C + q * kTcNr * N + i : nullptr;
        if (rows) tc_sgemm_rows_t<kTcMr, true>(here, kc, a, ldb, rk, w, t, ldct, k0 > 0, c, N, width);
        else tc_sgemm_rows_t<kTcMr, false>(here, kc, a, ldb, rk, w, t, ldct, k0 > 0, c, N, width);
      }
    }
  }
#else
  // portable: one position against one panel at a time, the 32 channels the vector loop
  constexpr int64_t kPanel = 32;
  for (int64_t q = 0; q * kPanel < M; ++q) {
    const float* w = W + q * K * kPanel;
    const int64_t width = std::min<int64_t>(kPanel, M - q * kPanel);
    for (int64_t i = p0; i < p1; ++i) {
      float acc[kPanel] = {};
      for (int64_t k = 0; k < K; ++k) {
        const float x = B[(rows ? rows[k] : k * ldb) + i];
#pragma omp simd
        for (int64_t l = 0; l < kPanel; ++l) acc[l] += x * w[k * kPanel + l];
      }
      for (int64_t l = 0; l < width; ++l) C[(q * kPanel + l) * N + i] = acc[l];
    }
  }
#endif
}

// tc_sgemm_panels_t over ``batch`` images (B's image b at B + b * b_batch, C's at C + b * M * N) shared among the
// pool's threads: whole images, else positions in whole tiles.
inline void tc_gemm_panels_t(int nt, int64_t batch, int64_t M, int64_t N, int64_t K, const float* W, const float* B,
                             int64_t ldb, int64_t b_batch, float* C, const int64_t* rows = nullptr) {
  if (M <= 0 || N <= 0 || batch <= 0) return;
  const int threads = tc_product_threads(nt, double(batch) * double(M) * double(N) * double(K > 0 ? K : 1));
  const int64_t units = (N + 7) / 8, parts = batch >= threads ? 1 : std::min<int64_t>(units, threads);
  tc_product_pieces(threads, batch, parts, [&](int64_t b, int64_t p) {
    const int64_t lo = std::min<int64_t>(N, p * units / parts * 8);
    const int64_t hi = std::min<int64_t>(N, (p + 1) * units / parts * 8);
    tc_sgemm_panels_t(M, N, K, W, B + b * b_batch, ldb, rows, C + b * M * N, lo, hi);
  });
}

// float64 and integer arguments keep the C library (accuracy first; these are rare in inference graphs).
TC_INLINE double tc_exp(double x) { return std::exp(x); }
TC_INLINE double tc_log(double x) { return std::log(x); }
TC_INLINE double tc_erf(double x) { return std::erf(x); }
TC_INLINE double tc_tanh(double x) { return std::tanh(x); }
TC_INLINE double tc_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
}  // namespace
