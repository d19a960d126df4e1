//! `cfg(x86_avx2)`: the build targets an x86-64 CPU with AVX2 and FMA, where the engine's
//! own SIMD kernels (block products, attention) are compiled in. `cfg(x86_vnni)`: it also
//! has AVX-512 VNNI on 256-bit registers, which the block products use for their byte sums.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(x86_avx2)");
    println!("cargo::rustc-check-cfg=cfg(x86_vnni)");
    let features = std::env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default();
    let has = |f: &str| features.split(',').any(|x| x == f);
    if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("x86_64")
        && has("avx2")
        && has("fma")
    {
        println!("cargo::rustc-cfg=x86_avx2");
        if has("avx512vnni") && has("avx512vl") {
            println!("cargo::rustc-cfg=x86_vnni");
        }
    }
}
