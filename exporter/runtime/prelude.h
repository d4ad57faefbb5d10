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
#include <vector>

#include <omp.h>

extern "C" {
typedef struct {
  int32_t abi_version;
  int32_t num_threads;
  void* blas[8];
  char* error;
  int64_t error_size;
} tc_context;
}

namespace {
typedef void (*tc_sgemm_fn)(int, int, int, int, int, int, float, const float*, int, const float*, int, float,
                            float*, int);
typedef void (*tc_dgemm_fn)(int, int, int, int, int, int, double, const double*, int, const double*, int, double,
                            double*, int);
enum { kRowMajor = 101, kNoTrans = 111, kTrans = 112 };

template <typename T> inline T tc_max(T a, T b) { return (a != a || a > b) ? a : b; }
template <typename T> inline T tc_min(T a, T b) { return (a != a || a < b) ? a : b; }
template <typename T> inline T tc_relu(T a) { return (a != a || a > T(0)) ? a : T(0); }
template <typename T> inline T tc_sign(T a) { return T((T(0) < a) - (a < T(0))); }
inline int64_t tc_floordiv(int64_t a, int64_t b) { int64_t q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q; }
inline int64_t tc_pymod(int64_t a, int64_t b) { int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
template <typename T> inline T tc_fpymod(T a, T b) { T r = std::fmod(a, b); return (r != T(0) && ((r < T(0)) != (b < T(0)))) ? r + b : r; }

inline float tc_bits_to_float(int32_t i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int32_t tc_float_to_bits(float f) { int32_t i; std::memcpy(&i, &f, 4); return i; }

// 16-bit floats are stored as uint16_t bit patterns and computed in float32. The conversions are plain integer
// and float arithmetic with selects instead of branches, so loops over them vectorise at every ISA level (GCC
// 12 turns _Float16 casts into libgcc calls on baseline x86-64 and keeps them scalar even with F16C). Rounding
// is to nearest even, NaN stays NaN (quiet, sign kept), overflow goes to infinity: bit-exact with PyTorch for
// every value but NaN's payload (tests/test_runtime_math.py checks every 16-bit pattern and ~4M float32s).
inline float tc_bf16_to_float(uint16_t h) {
  return tc_bits_to_float(static_cast<int32_t>(static_cast<uint32_t>(h) << 16));
}

inline uint16_t tc_float_to_bf16(float f) {
  const uint32_t u = static_cast<uint32_t>(tc_float_to_bits(f));
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

// float16 -> float32 is exact: normals and inf/NaN by rebiasing the exponent, subnormals by one exact float
// subtraction (m * 2^-24 as (2^-14 + m * 2^-24) - 2^-14).
inline float tc_f16_to_float(uint16_t h) {
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
inline uint16_t tc_float_to_f16(float f) {
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
inline float tc_round_f16(float f) { return tc_f16_to_float(tc_float_to_f16(f)); }
inline float tc_round_bf16(float f) { return tc_bf16_to_float(tc_float_to_bf16(f)); }

// exp: x = k ln2 + r, |r| <= ln2/2; exp(r) by a degree-6 polynomial (Cephes expf); 2^k from the exponent bits.
// Below -87.34 the result is flushed to 0 (the true value is a denormal under 1.2e-38).
inline float tc_exp(float x) {
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
inline float tc_log(float x) {
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
inline float tc_erf(float x) {
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
inline float tc_tanh(float x) {
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

inline float tc_sigmoid(float x) { return 1.0f / (1.0f + tc_exp(-x)); }

// GEMM through the BLAS the loader passes in (single-threaded: one thread pool, ours, runs the whole graph).
// Large products are split across the OpenMP threads by rows of C (or by columns when C is short and wide),
// and batched products by batch first; each piece is one BLAS call on a contiguous slice.
template <typename T, typename Gemm>
inline void tc_gemm(Gemm gemm, int nt, int64_t batch, int64_t M, int64_t N, int64_t K,
                    bool ta, const T* A, int64_t lda, int64_t a_batch,
                    bool tb, const T* B, int64_t ldb, int64_t b_batch, T* C) {
  if (M <= 0 || N <= 0 || batch <= 0) return;
  const double work = double(batch) * double(M) * double(N) * double(K > 0 ? K : 1);
  const int threads = work >= 262144.0 ? nt : 1;  // below 64^3 a split costs more than it saves
  const bool by_rows = M >= N || M >= 8 * threads;
  const int64_t parts = batch >= threads ? 1 : std::min<int64_t>(by_rows ? M : N, threads);
  auto piece = [&](int64_t b, int64_t p) {
    const T* a = A + b * a_batch;
    const T* bb = B + b * b_batch;
    T* c = C + b * M * N;
    int64_t m = M, n = N;
    if (parts > 1 && by_rows) {
      const int64_t m0 = p * M / parts, m1 = (p + 1) * M / parts;
      a += ta ? m0 : m0 * lda;
      c += m0 * N;
      m = m1 - m0;
    } else if (parts > 1) {
      const int64_t n0 = p * N / parts, n1 = (p + 1) * N / parts;
      bb += tb ? n0 * ldb : n0;
      c += n0;
      n = n1 - n0;
    }
    if (m > 0 && n > 0)
      gemm(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, (int)m, (int)n, (int)K, T(1), a, (int)lda,
           bb, (int)ldb, T(0), c, (int)N);
  };
  if (threads > 1) {  // no OpenMP region at all otherwise: even a one-thread region costs ~0.5 us
    #pragma omp parallel for num_threads(threads) collapse(2) schedule(static)
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t p = 0; p < parts; ++p) piece(b, p);
  } else {
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t p = 0; p < parts; ++p) piece(b, p);
  }
}

// float64 and integer arguments keep the C library (accuracy first; these are rare in inference graphs).
inline double tc_exp(double x) { return std::exp(x); }
inline double tc_log(double x) { return std::log(x); }
inline double tc_erf(double x) { return std::erf(x); }
inline double tc_tanh(double x) { return std::tanh(x); }
inline double tc_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
}  // namespace
