//! The engine's CPU kernels, each bit-for-bit the same whatever the batch: block and
//! K-quant products (portable, AVX2 and AVX-512 VNNI), 8-bit integer GEMM for prefill,
//! dense GEMM, attention (through matmuls, or reading the key/value cache in place),
//! softmax, row-wise norms and activations, the low-rank adapter update, and the thread
//! pool they share. The architectures (`crate::models`) compose them.

pub(crate) mod attention;
pub(crate) mod blocks;
#[cfg(x86_avx2)]
pub(crate) mod cache_attention;
pub(crate) mod dense;
pub(crate) mod int_gemm;
pub(crate) mod kquants;
pub(crate) mod linear;
pub(crate) mod low_rank;
pub(crate) mod pool;
pub mod prefetch;
pub(crate) mod rows;
pub(crate) mod rowwise;
pub(crate) mod softmax;

pub use dense::{gemm_n, gemm_t, matmul_t};
pub use int_gemm::{
    integer_prefill_kernel, integer_products_fast, prefer_integer_kernel, IntegerWeight,
};
pub use linear::{integer_prefill_types, PrefillWeights, WeightPlan};
pub use pool::for_chunks;
