//! `cfg(x86_avx2)`: the build targets an x86-64 CPU with AVX2 and FMA, where the engine's
//! own SIMD kernels (block products, attention) are compiled in. `cfg(x86_vnni)`: it also
//! has AVX-512 VNNI on 256-bit registers, which the block products use for their byte sums.
//! `MEMAGENT_BUILD_FEATURES`, `MEMAGENT_BUILD_FLAGS`, `MEMAGENT_BUILD_PROFILE`: what the
//! build was made for, recorded with every benchmark.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(x86_avx2)");
    println!("cargo::rustc-check-cfg=cfg(x86_vnni)");
    let features = std::env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default();
    let has = |f: &str| features.split(',').any(|x| x == f);
    // What the build was made for, recorded with every benchmark (`bench::machine`):
    // the vector instruction sets compiled in, the profile and the flags.
    let simd: Vec<&str> = features
        .split(',')
        .filter(|f| {
            f.starts_with("avx") || matches!(*f, "fma" | "f16c" | "neon" | "sve" | "dotprod")
        })
        .collect();
    println!(
        "cargo::rustc-env=MEMAGENT_BUILD_FEATURES={}",
        simd.join(" ")
    );
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    println!(
        "cargo::rustc-env=MEMAGENT_BUILD_FLAGS={}",
        flags.replace('\x1f', " ")
    );
    println!(
        "cargo::rustc-env=MEMAGENT_BUILD_PROFILE={} opt-level {}",
        std::env::var("PROFILE").unwrap_or_default(),
        std::env::var("OPT_LEVEL").unwrap_or_default()
    );
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
